#![allow(clippy::unwrap_used, clippy::expect_used)] // a test: a failed unwrap is a failed test

//! Tokens, minted by PyJWT (gateway/tests/python/mint.py, as the gateway's
//! auth tests do) with the test-only HMAC key: refreshed before they expire,
//! fetched again after a token-expired close, and an unauthorized one stops
//! the client.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use common::until;
use herald_client::{Client, Cut, Error, ErrorCode, Event, State};
use serde_json::json;
use testkit::{Gateway, WAIT};
use tokio::sync::watch;

/// The HMAC secret of the gateway under test (at least 32 bytes).
const SECRET: &str = "herald-client-tests-hmac-secret-0123456789";
const ISSUER: &str = "https://issuer.test";
const AUDIENCE: &str = "herald";

async fn gateway() -> Gateway {
    let mut config = Gateway::config();
    // Topics of `prices` only for tokens that grant them.
    config.namespaces.insert(
        "prices".to_owned(),
        router::NamespaceSettings {
            subscribe: router::Subscribe::Granted,
            ..Default::default()
        },
    );
    config.auth.hmac_secret = SECRET.to_owned();
    config.auth.issuer = ISSUER.to_owned();
    config.auth.audience = AUDIENCE.to_owned();
    config.auth.leeway = Duration::ZERO;
    Gateway::with(config).await
}

/// An HS256 token for `alice` that expires `exp_in` seconds from now.
async fn mint(exp_in: i64) -> String {
    mint_with(exp_in, json!({})).await
}

/// [`mint`] with more claims (`extra`, e.g. the topics it grants).
async fn mint_with(exp_in: i64, extra: serde_json::Value) -> String {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64;
    let mut claims = json!({"sub": "alice", "exp": now + exp_in, "iss": ISSUER, "aud": AUDIENCE});
    if let (Some(claims), Some(extra)) = (claims.as_object_mut(), extra.as_object()) {
        claims.extend(extra.clone());
    }
    let spec = json!({"alg": "HS256", "secret": SECRET, "claims": claims}).to_string();
    let output = tokio::task::spawn_blocking(move || {
        let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../gateway/tests/python/mint.py");
        testkit::process::run(
            "python3",
            &[script, &spec],
            Duration::from_secs(30),
            "python3 with PyJWT (scripts/test.sh installs it in target/venv; put its bin/ first on PATH)",
        )
    })
    .await
    .unwrap();
    assert!(
        output.status.success(),
        "{}",
        testkit::process::show(&output)
    );
    String::from_utf8(output.stdout).unwrap().trim().to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_is_refreshed_before_it_expires_and_the_connection_stays() {
    let gateway = gateway().await;
    let (calls, mut called) = watch::channel(0u32);
    // Tokens that expire three seconds apart, from six seconds on: without
    // `refresh` the pod would close with 4004 before the provider is asked a
    // third time. Minted up front, all at once, so that the provider answers
    // at once: minting one (starting Python) can take longer on a loaded
    // machine than the client leaves before a short token expires.
    let minted = futures_util::future::join_all((2..=5).map(|k| mint(3 * k))).await;
    let tokens = Arc::new(std::sync::Mutex::new(std::collections::VecDeque::from(
        minted,
    )));
    let (client, mut events) = Client::builder([gateway.ws_url()])
        .token(move || {
            calls.send_modify(|n| *n += 1);
            let token = tokens.lock().unwrap().pop_front();
            async move { token.ok_or_else(|| "no token left".to_owned()) }
        })
        .build()
        .unwrap();
    client.subscribe("chat:room", None).unwrap();
    until(&mut events, |e| {
        matches!(e, Event::Subscribed { .. }).then_some(())
    })
    .await;
    let asked_thrice = async {
        tokio::select! {
            _ = called.wait_for(|n| *n >= 3) => {}
            event = until(&mut events, |e| {
                matches!(e, Event::State(State::Disconnected { .. }) | Event::Error(_)).then(|| e.clone())
            }) => panic!("{event:?}"),
        }
    };
    tokio::time::timeout(WAIT, asked_thrice)
        .await
        .expect("three tokens within WAIT");
    // The same connection still delivers.
    let published = client.publish("chat:room", &json!("after")).await.unwrap();
    let seq = until(&mut events, |e| match e {
        Event::Message(m) => Some(m.seq),
        Event::State(_) | Event::Error(_) => panic!("{e:?}"),
        _ => None,
    })
    .await;
    assert_eq!(seq, published.seq);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_token_expired_close_the_client_comes_back_with_a_new_token() {
    let gateway = gateway().await;
    let calls = Arc::new(AtomicU32::new(0));
    let counted = calls.clone();
    // The first token expired a minute ago: `hello` gets 4004.
    let (_client, mut events) = Client::builder([gateway.ws_url()])
        .token(move || {
            let first = counted.fetch_add(1, Ordering::SeqCst) == 0;
            async move { Ok::<_, String>(mint(if first { -60 } else { 600 }).await) }
        })
        .build()
        .unwrap();
    let refused = until(&mut events, |e| match e {
        Event::Error(e) => Some(e.clone()),
        Event::State(State::Connected { .. }) => panic!("connected with an expired token"),
        _ => None,
    })
    .await;
    assert!(!refused.is_terminal(), "{refused:?}");
    assert!(refused.to_string().contains("4004"), "{refused}");
    until(&mut events, |e| {
        matches!(e, Event::State(State::Connected { .. })).then_some(())
    })
    .await;
    assert_eq!(calls.load(Ordering::SeqCst), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unauthorized_token_stops_the_client() {
    let gateway = gateway().await;
    let (_client, mut events) = Client::builder([gateway.ws_url()])
        .token(|| async { Ok::<_, String>("not-a-jwt".to_owned()) })
        .build()
        .unwrap();
    let e = until(&mut events, |e| match e {
        Event::Error(e) => Some(e.clone()),
        _ => None,
    })
    .await;
    assert!(matches!(e, Error::Unauthorized(_)), "{e:?}");
    let end = tokio::time::timeout(WAIT, events.next()).await.unwrap();
    assert!(end.is_none(), "no reconnect after unauthorized: {end:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resume_with_a_token_that_grants_less_drops_the_topic_it_names() {
    let gateway = gateway().await;
    let calls = Arc::new(AtomicU32::new(0));
    let counted = calls.clone();
    // The first token grants every price, the later ones only the euro's.
    let (client, mut events) = Client::builder([gateway.ws_url()])
        .token(move || {
            let first = counted.fetch_add(1, Ordering::SeqCst) == 0;
            let grants = if first { "prices:*" } else { "prices:eur" };
            async move { Ok::<_, String>(mint_with(600, json!({"subscribe": [grants]})).await) }
        })
        .build()
        .unwrap();
    for topic in ["prices:eur", "prices:usd"] {
        client.subscribe(topic, None).unwrap();
    }
    for _ in 0..2 {
        until(&mut events, |e| {
            matches!(e, Event::Subscribed { .. }).then_some(())
        })
        .await;
    }
    client.cut(Cut::Reset).unwrap();
    // The resumed session keeps the euro; the dollar is named and dropped.
    let (code, topic) = until(&mut events, |e| match e {
        Event::Error(Error::Server { code, topic, .. }) => Some((code.clone(), topic.clone())),
        _ => None,
    })
    .await;
    assert_eq!(
        (code, topic.as_deref()),
        (ErrorCode::Forbidden, Some("prices:usd"))
    );
    // Dropped by the client too: subscribing again is a new `sub`, refused.
    client.subscribe("prices:usd", None).unwrap();
    let again = until(&mut events, |e| match e {
        Event::Error(Error::Server { code, topic, .. }) => Some((code.clone(), topic.clone())),
        _ => None,
    })
    .await;
    assert_eq!(
        (again.0, again.1.as_deref()),
        (ErrorCode::Forbidden, Some("prices:usd"))
    );
    // The next resume asks for it no more (no error).
    client.cut(Cut::Reset).unwrap();
    until(&mut events, |e| match e {
        Event::State(State::Resumed { .. }) => Some(()),
        Event::Error(e) => panic!("{e:?}"),
        _ => None,
    })
    .await;
    let seq = gateway.publish("prices:eur", json!(1)).await;
    let got = until(&mut events, |e| match e {
        Event::Message(m) => Some((m.topic.to_string(), m.seq)),
        Event::Error(e) => panic!("{e:?}"),
        _ => None,
    })
    .await;
    assert_eq!(got, ("prices:eur".to_owned(), seq));
}
