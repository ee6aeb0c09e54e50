//! What the client's tests share: reading the event stream with a bound.

#![allow(dead_code)]

use std::sync::{Arc, Mutex};

use herald_client::{Endpoints, Event, Events, Message};
use testkit::WAIT;

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
