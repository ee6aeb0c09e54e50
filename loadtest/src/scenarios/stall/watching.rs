//! The watching connections: each opened and subscribed to its share of
//! the watched topics ([`open`]), then held, answering pings, its close
//! noted ([`keep`]). Its own module: the load the pod carries, apart from
//! the canary that measures it.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::watch;

use super::{BUFFER_BYTES, LISTED, lock};
use crate::Error;
use crate::Target;
use crate::clients::{client_failure, source_addr};
use crate::raw::{self, Client};

/// Client `client`, connected and subscribed to `topics` within `within`.
pub(super) async fn open(
    client: usize,
    target: &Target,
    topics: &[String],
    within: Duration,
) -> Result<Client, Error> {
    let source = source_addr(target.addr.ip(), client);
    let fail = client_failure(client, source, target.addr);
    let opening = async {
        let mut c = Client::connect(source, target, BUFFER_BYTES, client as u64)
            .await
            .map_err(|e| fail(e.to_string()))?;
        let topics: Vec<&str> = topics.iter().map(String::as_str).collect();
        c.subscribe(&topics).await.map_err(|e| {
            let hint = if e.contains("too_many_subscriptions") {
                " (raise HERALD_SESSION__MAX_SUBSCRIPTIONS)"
            } else {
                ""
            };
            fail(format!("{e}{hint}"))
        })?;
        Ok(c)
    };
    tokio::time::timeout(within, opening)
        .await
        .map_err(|_| fail(format!("not subscribed within {within:?}")))?
}

/// Holds a watching connection: answers pings until the run stops, and
/// notes a close that came before.
pub(super) async fn keep(
    mut client: Client,
    c: usize,
    closed: Arc<Mutex<Vec<String>>>,
    mut stop: watch::Receiver<bool>,
) {
    let reason = loop {
        let frame = tokio::select! {
            _ = stop.wait_for(|s| *s) => return,
            frame = client.next() => frame,
        };
        let ping = match frame {
            Ok(Some(frame)) if frame.opcode == raw::OP_PING => frame.payload.to_vec(),
            Ok(Some(frame)) if frame.opcode == raw::OP_CLOSE => {
                break format!("closed: {}", raw::describe_close(frame.payload));
            }
            // A `reset` for a topic nobody publishes to: not the canary's business.
            Ok(Some(_)) => continue,
            Ok(None) => break "EOF".to_owned(),
            Err(e) => break e.to_string(),
        };
        if let Err(e) = client.send(raw::OP_PONG, &ping).await {
            break format!("sending a pong: {e}");
        }
    };
    let mut closed = lock(&closed);
    if closed.len() < LISTED {
        closed.push(format!("connection {c}: {reason}"));
    }
}
