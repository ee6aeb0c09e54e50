//! What the client's tests share: reading the event stream with a bound.

#![allow(dead_code)]

use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

use herald_client::{Client, Endpoints, Event, Events, Message};
use serde_json::{Value, json};
use testkit::{Gateway, WAIT};

/// The HMAC secret of the gateways `rooms::with_users` starts (at least 32 bytes).
pub const SECRET: &str = "herald-client-tests-hmac-secret-0123456789";

/// An HS256 token over [`SECRET`] for `user`, valid for an hour, with the
/// claims of `extra` besides (`info`, `topics`).
pub fn token(user: &str, extra: Value) -> String {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let mut claims = json!({"sub": user, "exp": now + 3600});
    if let (Some(claims), Some(extra)) = (claims.as_object_mut(), extra.as_object()) {
        claims.extend(extra.clone());
    }
    let _ = jsonwebtoken::crypto::rust_crypto::DEFAULT_PROVIDER.install_default();
    let key = jsonwebtoken::EncodingKey::from_secret(SECRET.as_bytes()).unwrap();
    jsonwebtoken::encode(&jsonwebtoken::Header::default(), &claims, &key).unwrap()
}

/// A client of `gateway` as `user` (token claims `extra` besides `sub`).
pub fn user(gateway: &Gateway, user: &str, extra: Value) -> (Client, Events) {
    let token = token(user, extra);
    Client::builder([gateway.ws_url()])
        .token(move || {
            let token = token.clone();
            async move { Ok::<_, String>(token) }
        })
        .build()
        .unwrap()
}

/// `POST path` with `body` on the gateway's API; the status and the answer.
pub async fn api(gateway: &Gateway, path: &str, body: Value) -> (u16, String) {
    testkit::http(gateway.addr, "POST", path, &[], body.to_string().as_bytes()).await
}

/// Reads events until `want` picks one, for at most [`WAIT`]; panics with
/// what came instead.
pub async fn until<T>(events: &mut Events, mut want: impl FnMut(&Event) -> Option<T>) -> T {
    let mut seen = Vec::new();
    let found = tokio::time::timeout(WAIT, async {
        while let Some(event) = events.next().await {
            if let Some(found) = want(&event) {
                return Some(found);
            }
            seen.push(format!("{event:?}"));
        }
        None
    })
    .await;
    match found {
        Ok(Some(found)) => found,
        Ok(None) => panic!("the stream ended; before that:\n{}", seen.join("\n")),
        Err(_) => panic!("not within {WAIT:?}; came instead:\n{}", seen.join("\n")),
    }
}

/// The next `n` messages, whatever else comes between them (kept in `others`).
pub async fn messages(events: &mut Events, n: usize, others: &mut Vec<Event>) -> Vec<Message> {
    let mut got = Vec::with_capacity(n);
    while got.len() < n {
        let m = until(events, |e| match e {
            Event::Message(m) => Some(Some(m.clone())),
            other => {
                others.push(other.clone());
                Some(None)
            }
        })
        .await;
        got.extend(m);
    }
    got
}

/// The seqs of `messages`.
pub fn seqs(messages: &[Message]) -> Vec<u64> {
    messages.iter().map(|m| m.seq).collect()
}

/// Endpoints the test opens and closes: while closed there is no pod to
/// go to, so a client that lost its connection stays away until the test
/// says so.
#[derive(Clone)]
pub struct Gate {
    url: Arc<Mutex<Option<String>>>,
}

impl Gate {
    pub fn open(url: &str) -> Self {
        Self {
            url: Arc::new(Mutex::new(Some(url.to_owned()))),
        }
    }

    pub fn set(&self, url: Option<&str>) {
        *self.url.lock().unwrap() = url.map(str::to_owned);
    }
}

impl Endpoints for Gate {
    fn pick(&self, _previous: Option<&str>) -> Option<String> {
        self.url.lock().unwrap().clone()
    }
}
