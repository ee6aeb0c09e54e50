//! What makes the webhooks pod's events: `clients` anonymous clients, all at
//! once, each connects (`connection.open`), subscribes to a topic of its own
//! (`topic.occupied`), publishes `publishes` messages with up to [`WINDOW`]
//! unanswered (`client.publish` each), and closes (`connection.close`, and
//! its topic's `topic.vacated`): `clients × (publishes + 4)` events, as fast
//! as the pod takes them. The backend counts what arrives.

use std::time::Duration;

use serde::Deserialize;
use tokio::task::JoinSet;
use tokio::time::Instant;

use super::pods::EVENTS;
use crate::Target;
use crate::clients::source_addr;
use crate::raw::{self, Client, OP_CLOSE, OP_PING, OP_PONG, OP_TEXT};

/// `pub`s a client has unanswered at most.
pub const WINDOW: u64 = 16;
/// Longest one client may take for all of its publishes.
const CLIENT_TIMEOUT: Duration = Duration::from_secs(60);
/// Topics the clients spread over.
const TOPICS: usize = 8;
const BUFFER_BYTES: usize = 16 * 1024;

/// What the clients did.
#[derive(Debug, Default)]
pub struct Done {
    /// Clients that connected (each an open and, at its end, a close event).
    pub connected: u64,
    /// Clients whose own topic was subscribed (its occupied and vacated).
    pub subscribed: u64,
    /// Publishes answered `ok`.
    pub published: u64,
    pub errors: u64,
    pub first_error: Option<String>,
    /// From the first connect to the last client's close.
    pub wall: Duration,
}

/// Runs the clients against `target`, client numbers from `first`.
pub async fn run(target: &Target, first: usize, clients: usize, publishes: u64) -> Done {
    let started = Instant::now();
    let mut tasks = JoinSet::new();
    for client in first..first + clients {
        let target = target.clone();
        tasks.spawn(async move {
            let mut progress = Progress::default();
            let result = tokio::time::timeout(
                CLIENT_TIMEOUT,
                one(&target, client, publishes, &mut progress),
            )
            .await
            .unwrap_or_else(|_| Err(format!("not done within {CLIENT_TIMEOUT:?}")));
            (client, progress, result)
        });
    }
    let mut done = Done::default();
    while let Some(joined) = tasks.join_next().await {
        match joined {
            Ok((client, progress, result)) => {
                done.published += progress.published;
                done.connected += u64::from(progress.connected);
                done.subscribed += u64::from(progress.subscribed);
                if let Err(e) = result {
                    done.errors += 1;
                    done.first_error
                        .get_or_insert_with(|| format!("client {client}: {e}"));
                }
            }
            Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
            Err(_) => {}
        }
    }
    done.wall = started.elapsed();
    done
}

#[derive(Deserialize)]
struct Reply {
    op: String,
    id: Option<u64>,
    code: Option<String>,
}

/// How far one client got.
#[derive(Default)]
struct Progress {
    /// Upgraded (its open event, and its close when the socket goes).
    connected: bool,
    subscribed: bool,
    published: u64,
}

/// One client.
async fn one(
    target: &Target,
    client: usize,
    publishes: u64,
    progress: &mut Progress,
) -> Result<(), String> {
    let source = source_addr(target.addr.ip(), client);
    let mut ws = Client::connect(source, target, BUFFER_BYTES, client as u64)
        .await
        .map_err(|e| format!("connecting: {e}"))?;
    progress.connected = true;
    let topic = format!("{EVENTS}:lt.{}", client % TOPICS);
    // Its own topic: `sub` id 0, the `pub`s 1 and on.
    let hello = r#"{"op":"hello"}"#.to_owned();
    let sub = format!(r#"{{"op":"sub","id":0,"topic":"{EVENTS}:own.{client}"}}"#);
    for command in [hello, sub] {
        ws.send(OP_TEXT, command.as_bytes())
            .await
            .map_err(|e| format!("sending {command}: {e}"))?;
    }
    let mut sent = 0u64;
    while progress.published < publishes || !progress.subscribed {
        while progress.subscribed && sent < publishes && sent - progress.published < WINDOW {
            sent += 1;
            let pub_ = format!(r#"{{"op":"pub","id":{sent},"topic":"{topic}","data":{sent}}}"#);
            ws.send(OP_TEXT, pub_.as_bytes())
                .await
                .map_err(|e| format!("sending pub: {e}"))?;
        }
        let frame = match ws.next().await {
            Ok(Some(frame)) => frame,
            Ok(None) => return Err("closed".to_owned()),
            Err(e) => return Err(format!("reading: {e}")),
        };
        match frame.opcode {
            OP_TEXT => {
                let reply: Reply = serde_json::from_slice(frame.payload)
                    .map_err(|e| format!("not a server frame: {e}"))?;
                match (reply.op.as_str(), reply.id) {
                    ("ok", Some(0)) => progress.subscribed = true,
                    ("ok", Some(_)) => progress.published += 1,
                    ("err", _) => {
                        return Err(format!(
                            "refused: {} (id {:?})",
                            reply.code.unwrap_or_default(),
                            reply.id
                        ));
                    }
                    _ => {}
                }
            }
            OP_PING => {
                let ping = frame.payload.to_vec();
                ws.send(OP_PONG, &ping)
                    .await
                    .map_err(|e| format!("pong: {e}"))?;
            }
            OP_CLOSE => return Err(format!("closed: {}", raw::describe_close(frame.payload))),
            op => return Err(format!("unexpected opcode {op}")),
        }
    }
    let _ = ws.send(OP_CLOSE, &1000u16.to_be_bytes()).await;
    Ok(())
}
