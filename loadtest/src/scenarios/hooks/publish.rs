//! Publishing through the publish proxy: `clients` clients with tokens, each
//! publishing at its share of `rate`, one `pub` at a time (the next after
//! the `ok`), alternately to a topic of the `hooked` namespace (the pod asks
//! the backend first) and of the `plain` one (it does not): both sides of
//! the comparison see the same machine at the same moments. Each `pub` is
//! timed from its send to its `ok`; its data, `{"k":<key>}`, names it to
//! the backend, which keeps its own time under that key.

use std::time::Duration;

use serde::Deserialize;
use tokio::task::JoinSet;
use tokio::time::{Instant, MissedTickBehavior};

use super::pods::{HOOKED, PLAIN};
use crate::clients::source_addr;
use crate::latency::micros;
use crate::raw::{self, Client, OP_CLOSE, OP_PING, OP_PONG, OP_TEXT};
use crate::{Error, Target};

/// Longest a `pub` may wait for its `ok` (the proxy's timeout is 1 s).
const PUB_TIMEOUT: Duration = Duration::from_secs(5);
/// Topics per namespace the clients spread over.
const TOPICS: usize = 8;
/// Each client's read buffer.
const BUFFER_BYTES: usize = 4 * 1024;

/// One `pub`, answered.
#[derive(Debug, Clone, Copy)]
pub struct Sample {
    pub key: u64,
    pub latency_us: u32,
    /// To the `hooked` namespace.
    pub proxied: bool,
}

/// What the clients did.
#[derive(Debug, Default)]
pub struct Done {
    pub samples: Vec<Sample>,
    pub errors: u64,
    pub first_error: Option<String>,
}

/// The key of client `client`'s `n`th publish.
fn key(client: usize, n: u64) -> u64 {
    ((client as u64) << 32) | (n & 0xffff_ffff)
}

/// Connects the clients (client `i` says `hello` with `tokens[i]`), then
/// publishes for `duration` at `rate` in all.
pub async fn run(
    target: &Target,
    tokens: &[String],
    rate: f64,
    duration: Duration,
) -> Result<Done, Error> {
    let clients = tokens.len();
    let mut connected = Vec::with_capacity(clients);
    for (client, token) in tokens.iter().enumerate() {
        let fail = crate::clients::client_failure(
            client,
            source_addr(target.addr.ip(), client),
            target.addr,
        );
        let ws = tokio::time::timeout(PUB_TIMEOUT, hello(target, client, token))
            .await
            .map_err(|_| fail("no welcome in time".to_owned()))?
            .map_err(fail)?;
        connected.push(ws);
    }
    let period = Duration::from_secs_f64(clients as f64 / rate);
    let deadline = Instant::now() + duration;
    let mut tasks = JoinSet::new();
    for (client, ws) in connected.into_iter().enumerate() {
        // Spread the clients' ticks over one period.
        let start = Instant::now() + period.mul_f64(client as f64 / clients as f64);
        tasks.spawn(publish(ws, client, start, period, deadline));
    }
    let mut all = Done::default();
    while let Some(joined) = tasks.join_next().await {
        match joined {
            Ok(mut done) => {
                all.samples.append(&mut done.samples);
                all.errors += done.errors;
                if all.first_error.is_none() {
                    all.first_error = done.first_error;
                }
            }
            Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
            Err(_) => {}
        }
    }
    Ok(all)
}

async fn hello(target: &Target, client: usize, token: &str) -> Result<Client, String> {
    let source = source_addr(target.addr.ip(), client);
    let mut ws = Client::connect(source, target, BUFFER_BYTES, client as u64)
        .await
        .map_err(|e| format!("connecting: {e}"))?;
    let hello = serde_json::json!({"op": "hello", "token": token}).to_string();
    ws.send(OP_TEXT, hello.as_bytes())
        .await
        .map_err(|e| format!("sending hello: {e}"))?;
    match reply(&mut ws).await? {
        Reply { op, .. } if op == "welcome" => Ok(ws),
        other => Err(format!("instead of welcome: {other:?}")),
    }
}

#[derive(Debug, Deserialize)]
struct Reply {
    op: String,
    id: Option<u64>,
    code: Option<String>,
    message: Option<String>,
}

/// The next text frame, answering pings meanwhile.
async fn reply(ws: &mut Client) -> Result<Reply, String> {
    loop {
        let frame = match ws.next().await {
            Ok(Some(frame)) => frame,
            Ok(None) => return Err("closed".to_owned()),
            Err(e) => return Err(format!("reading: {e}")),
        };
        match frame.opcode {
            OP_TEXT => {
                return serde_json::from_slice(frame.payload).map_err(|e| {
                    format!(
                        "not a server frame ({e}): {}",
                        String::from_utf8_lossy(frame.payload)
                    )
                });
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
}

/// One client's publishes until `deadline`; the first failure ends it.
async fn publish(
    mut ws: Client,
    client: usize,
    start: Instant,
    period: Duration,
    deadline: Instant,
) -> Done {
    let mut done = Done::default();
    let mut ticks = tokio::time::interval_at(start, period);
    ticks.set_missed_tick_behavior(MissedTickBehavior::Delay);
    let topic = client % TOPICS;
    let mut n: u64 = 0;
    loop {
        ticks.tick().await;
        if Instant::now() >= deadline {
            break;
        }
        n += 1;
        let proxied = n.is_multiple_of(2);
        let namespace = if proxied { HOOKED } else { PLAIN };
        let key = key(client, n);
        let pub_ = format!(
            r#"{{"op":"pub","id":{n},"topic":"{namespace}:lt.{topic}","data":{{"k":{key}}}}}"#
        );
        let sent = Instant::now();
        let answered = async {
            ws.send(OP_TEXT, pub_.as_bytes())
                .await
                .map_err(|e| format!("sending pub: {e}"))?;
            loop {
                let r = reply(&mut ws).await?;
                match (r.op.as_str(), r.id) {
                    ("ok", Some(id)) if id == n => return Ok(()),
                    ("err", _) => {
                        return Err(format!(
                            "{namespace} pub refused: {} {}",
                            r.code.unwrap_or_default(),
                            r.message.unwrap_or_default()
                        ));
                    }
                    // Anything else (a `reconnect`, say) is not ours to count.
                    _ => {}
                }
            }
        };
        match tokio::time::timeout(PUB_TIMEOUT, answered).await {
            Ok(Ok(())) => done.samples.push(Sample {
                key,
                latency_us: micros(sent.elapsed()),
                proxied,
            }),
            Ok(Err(e)) => {
                done.errors += 1;
                done.first_error = Some(format!("client {client}: {e}"));
                break;
            }
            Err(_) => {
                done.errors += 1;
                done.first_error = Some(format!("client {client}: no ok within {PUB_TIMEOUT:?}"));
                break;
            }
        }
    }
    let _ = ws.send(OP_CLOSE, &1000u16.to_be_bytes()).await;
    done
}

/// Each proxied publish's time less the backend's own for it (those the
/// backend has no time for are left out, and counted).
pub fn net_of_backend(
    samples: &[Sample],
    backend: &std::collections::HashMap<u64, u32>,
) -> (Vec<u32>, u64) {
    let mut net = Vec::new();
    let mut unmatched = 0;
    for s in samples.iter().filter(|s| s.proxied) {
        match backend.get(&s.key) {
            Some(&own) => net.push(s.latency_us.saturating_sub(own)),
            None => unmatched += 1,
        }
    }
    (net, unmatched)
}

/// Shared for the scenario: the samples of one namespace.
pub fn latencies(samples: &[Sample], proxied: bool) -> Vec<u32> {
    samples
        .iter()
        .filter(|s| s.proxied == proxied)
        .map(|s| s.latency_us)
        .collect()
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    #[test]
    fn the_backend_time_comes_off_each_proxied_publish() {
        let samples = [
            Sample {
                key: key(1, 2),
                latency_us: 3000,
                proxied: true,
            },
            Sample {
                key: key(1, 3),
                latency_us: 500,
                proxied: false,
            },
            Sample {
                key: key(2, 2),
                latency_us: 2500,
                proxied: true,
            },
        ];
        let backend: HashMap<u64, u32> = [(key(1, 2), 1200)].into();
        assert_eq!(net_of_backend(&samples, &backend), (vec![1800], 1));
        assert_eq!(latencies(&samples, false), vec![500]);
        assert_ne!(key(1, 2), key(2, 1));
    }
}
