//! The subscribers: every client connected and subscribed to its topics
//! ([`connect_all`]), then read in a task of its own that checks each
//! topic's seqs without parsing JSON ([`read`]). Its own module: the
//! receiving side, apart from the publishing and the counting of the run.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use tokio::sync::watch;
use tokio::task::JoinSet;

use super::{BUFFER_BYTES, Options, PROGRESS_BATCH, Seen};
use crate::Error;
use crate::clients::{CONNECT_CONCURRENCY, CONNECT_TIMEOUT, client_failure, source_addr};
use crate::streams::{Conn, Incoming};

/// Connects and subscribes every client, [`CONNECT_CONCURRENCY`] at once:
/// (client, the seq of each subscription's `ok`, the client).
pub(super) async fn connect_all(
    options: &Options,
    topics: &Arc<[String]>,
) -> Result<Vec<(usize, Vec<u64>, Conn)>, Error> {
    let mut all = Vec::with_capacity(options.clients);
    let mut pending = JoinSet::new();
    for client in 0..options.clients {
        if pending.len() >= CONNECT_CONCURRENCY
            && let Some(done) = pending.join_next().await
        {
            all.push(joined(done)?);
        }
        let target = options.gateway.clone();
        let transport = options.transport;
        let compression = options.compression;
        let mine: Vec<String> = options
            .topics_of(client)
            .map(|t| topics[t].clone())
            .collect();
        pending.spawn(async move {
            let source = source_addr(target.addr.ip(), client);
            let fail = client_failure(client, source, target.addr);
            let opening = async {
                let names: Vec<&str> = mine.iter().map(String::as_str).collect();
                let (c, seqs) = Conn::subscribed(
                    transport,
                    source,
                    &target,
                    &names,
                    BUFFER_BYTES,
                    client as u64,
                    compression,
                )
                .await
                .map_err(fail)?;
                Ok((client, seqs, c))
            };
            tokio::time::timeout(CONNECT_TIMEOUT, opening)
                .await
                .map_err(|_| fail(format!("not subscribed within {CONNECT_TIMEOUT:?}")))?
        });
    }
    while let Some(done) = pending.join_next().await {
        all.push(joined(done)?);
    }
    Ok(all)
}

type Opened = Result<(usize, Vec<u64>, Conn), Error>;

fn joined(done: Result<Opened, tokio::task::JoinError>) -> Opened {
    match done {
        Ok(opened) => opened,
        Err(e) => std::panic::resume_unwind(e.into_panic()),
    }
}

/// Reads one client's frames until `stop`, checking each topic's seqs.
pub(super) async fn read(
    client: usize,
    mut c: Conn,
    initial: Vec<u64>,
    options: Options,
    progress: Arc<AtomicU64>,
    mut stop: watch::Receiver<bool>,
) -> Seen {
    let first = client * options.subscriptions % options.topics;
    let mut seen = Seen {
        client,
        last: initial.clone(),
        initial,
        received: 0,
        wire_bytes: 0,
        duplicated: 0,
        unexpected: 0,
        end: None,
    };
    let mut pending = 0u64;
    loop {
        // Both futures are cancel-safe: a frame half read stays buffered.
        let frame = tokio::select! {
            biased;
            changed = stop.changed() => {
                if changed.is_err() || *stop.borrow() {
                    break;
                }
                continue;
            }
            frame = c.next() => frame,
        };
        let pong = match frame {
            Ok(Some(frame)) => match frame {
                Incoming::Frame(payload, wire_bytes) => {
                    match crate::raw::msg_topic_seq(payload)
                        .and_then(|(topic, seq)| Some((topic_index(topic)?, seq)))
                        .map(|(t, seq)| (((t + options.topics - first) % options.topics), seq))
                        .filter(|(j, _)| *j < options.subscriptions)
                    {
                        Some((j, seq)) if seq > seen.last[j] => {
                            seen.last[j] = seq;
                            seen.received += 1;
                            seen.wire_bytes += wire_bytes as u64;
                            pending += 1;
                        }
                        Some(_) => seen.duplicated += 1,
                        None => seen.unexpected += 1,
                    }
                    None
                }
                Incoming::Ping(ping) => Some(ping),
                Incoming::Heartbeat => None,
                Incoming::Closed(reason) => {
                    seen.end = Some(format!("closed: {reason}"));
                    break;
                }
                Incoming::Other => {
                    seen.unexpected += 1;
                    None
                }
            },
            Ok(None) => {
                seen.end = Some("EOF".to_owned());
                break;
            }
            Err(e) => {
                seen.end = Some(e.to_string());
                break;
            }
        };
        if let Some(ping) = pong
            && let Err(e) = c.pong(&ping).await
        {
            seen.end = Some(format!("sending a pong: {e}"));
            break;
        }
        if pending >= PROGRESS_BATCH || (pending > 0 && !c.has_frame()) {
            progress.fetch_add(pending, Ordering::Relaxed);
            pending = 0;
        }
    }
    progress.fetch_add(pending, Ordering::Relaxed);
    seen
}

/// The index of a topic `<prefix>.<index>`.
fn topic_index(topic: &[u8]) -> Option<usize> {
    let dot = topic.iter().rposition(|&b| b == b'.')?;
    std::str::from_utf8(&topic[dot + 1..]).ok()?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_topic_s_index_ends_its_name() {
        assert_eq!(topic_index(b"loadtest.throughput.1.2.17"), Some(17));
    }
}
