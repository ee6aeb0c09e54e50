//! Handshakes: `count` clients, at most `concurrency` at once, each connects
//! (from its own source address), upgrades, says `hello` and reads its
//! `welcome`, then closes. With [`Auth::Proxy`] the `hello` has no token and
//! the upgrade carries `Cookie: session=<user>`, so the pod asks the connect
//! proxy; with [`Auth::Token`] the `hello` carries an HS256 token the pod
//! verifies itself. The rate is handshakes over the wall time of the batch;
//! each handshake is timed from before its TCP connect to its `welcome`.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use serde::Deserialize;
use tokio::task::JoinSet;
use tokio::time::Instant;

use super::backend::SESSION_COOKIE;
use crate::Target;
use crate::clients::source_addr;
use crate::latency::micros;
use crate::raw::{self, Client, OP_CLOSE, OP_PING, OP_PONG, OP_TEXT};

/// Longest one handshake may take, connect to `welcome`.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Longest a batch runs: no handshake starts after it (those left are
/// counted as failed), so a pod that stalls ends the batch in bounded time.
pub const BATCH_LIMIT: Duration = Duration::from_secs(120);
/// Each client's read buffer: a `welcome` is ~120 bytes.
const BUFFER_BYTES: usize = 1024;

/// How the clients authenticate.
#[derive(Clone)]
pub enum Auth {
    /// No token: the pod asks the connect proxy (user by cookie).
    Proxy,
    /// Client `i` says `hello` with token `i % len`.
    Token(Arc<[String]>),
}

/// A batch of handshakes.
pub struct Batch {
    /// Client numbers `first..first + count` (users `u<n>`, source addresses).
    pub first: usize,
    pub count: usize,
    pub concurrency: usize,
    pub auth: Auth,
}

/// What a batch did.
#[derive(Debug, Default)]
pub struct Done {
    /// Each successful handshake's time, µs.
    pub latency_us: Vec<u32>,
    pub failed: u64,
    pub first_failure: Option<String>,
    /// From the first connect to the last `welcome` (or failure).
    pub wall: Duration,
}

/// Runs `batch` against `target`.
pub async fn run(target: &Target, batch: Batch) -> Done {
    let next = Arc::new(AtomicUsize::new(0));
    let target = Arc::new(target.clone());
    let started = Instant::now();
    let mut workers = JoinSet::new();
    for _ in 0..batch.concurrency.clamp(1, batch.count.max(1)) {
        let (next, target, auth) = (Arc::clone(&next), Arc::clone(&target), batch.auth.clone());
        let (first, count) = (batch.first, batch.count);
        workers.spawn(async move {
            let mut done = Done::default();
            loop {
                let n = next.fetch_add(1, Ordering::Relaxed);
                if n >= count {
                    return done;
                }
                if started.elapsed() >= BATCH_LIMIT {
                    // This one, and every one no worker has taken yet.
                    let taken = next.swap(count, Ordering::Relaxed);
                    done.failed += 1 + count.saturating_sub(taken) as u64;
                    done.first_failure
                        .get_or_insert_with(|| format!("not started within {BATCH_LIMIT:?}"));
                    return done;
                }
                let client = first + n;
                let began = Instant::now();
                let attempt =
                    tokio::time::timeout(HANDSHAKE_TIMEOUT, handshake(&target, client, &auth))
                        .await
                        .unwrap_or_else(|_| {
                            Err(format!("no welcome within {HANDSHAKE_TIMEOUT:?}"))
                        });
                match attempt {
                    Ok(()) => done.latency_us.push(micros(began.elapsed())),
                    Err(e) => {
                        done.failed += 1;
                        done.first_failure
                            .get_or_insert_with(|| format!("client {client}: {e}"));
                    }
                }
            }
        });
    }
    let mut all = Done::default();
    while let Some(joined) = workers.join_next().await {
        match joined {
            Ok(mut done) => {
                all.latency_us.append(&mut done.latency_us);
                all.failed += done.failed;
                if all.first_failure.is_none() {
                    all.first_failure = done.first_failure;
                }
            }
            Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
            Err(_) => {}
        }
    }
    all.wall = started.elapsed();
    all
}

#[derive(Deserialize)]
struct Frame {
    op: String,
}

/// One handshake: connect, upgrade, `hello`, `welcome`, close.
async fn handshake(target: &Target, client: usize, auth: &Auth) -> Result<(), String> {
    let source = source_addr(target.addr.ip(), client);
    let cookie = format!("{SESSION_COOKIE}=u{client}");
    let (headers, hello): (Vec<(&str, &str)>, String) = match auth {
        Auth::Proxy => (vec![("Cookie", &cookie)], r#"{"op":"hello"}"#.to_owned()),
        Auth::Token(tokens) => {
            let token = tokens.get(client % tokens.len().max(1)).ok_or("no token")?;
            (
                Vec::new(),
                serde_json::json!({"op": "hello", "token": token}).to_string(),
            )
        }
    };
    let mut ws =
        Client::connect_with_headers(source, target, BUFFER_BYTES, client as u64, &headers)
            .await
            .map_err(|e| format!("connecting: {e}"))?;
    ws.send(OP_TEXT, hello.as_bytes())
        .await
        .map_err(|e| format!("sending hello: {e}"))?;
    loop {
        let frame = match ws.next().await {
            Ok(Some(frame)) => frame,
            Ok(None) => return Err("closed before welcome".to_owned()),
            Err(e) => return Err(format!("reading: {e}")),
        };
        match frame.opcode {
            OP_TEXT => {
                let op = serde_json::from_slice::<Frame>(frame.payload).map(|f| f.op);
                if op.as_deref().is_ok_and(|op| op == "welcome") {
                    break;
                }
                return Err(format!(
                    "instead of welcome: {}",
                    String::from_utf8_lossy(frame.payload)
                ));
            }
            OP_PING => {
                let ping = frame.payload.to_vec();
                ws.send(OP_PONG, &ping)
                    .await
                    .map_err(|e| format!("pong: {e}"))?;
            }
            OP_CLOSE => {
                return Err(format!(
                    "closed before welcome: {}",
                    raw::describe_close(frame.payload)
                ));
            }
            op => return Err(format!("unexpected opcode {op}")),
        }
    }
    // Going away politely: 1000, then the socket is dropped.
    let _ = ws.send(OP_CLOSE, &1000u16.to_be_bytes()).await;
    Ok(())
}
