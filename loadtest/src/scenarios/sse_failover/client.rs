//! The `EventSource`-style clients: each stream opened on its gateway
//! ([`open_all`]), then read and, when it ends, reopened with
//! `Last-Event-ID` at the next gateway ([`follow`]), into a [`Record`].
//! Its own module: what one client does, apart from the run that starts
//! them and the counting that judges their records.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::JoinSet;
use tokio::time::Instant;

use super::{BUFFER_BYTES, LISTED, Options, RETRY_CAP, Record};
use crate::Error;
use crate::clients::{CONNECT_CONCURRENCY, CONNECT_TIMEOUT, client_failure, source_addr};
use crate::raw::msg_topic_seq;
use crate::sessions::Phase;
use crate::streams::{Sse, SseClient};

/// Opens every client's stream on its gateway, [`CONNECT_CONCURRENCY`] at
/// once, and reads its `ok`.
pub(super) async fn open_all(
    options: &Options,
    topics: &Arc<[String]>,
) -> Result<Vec<(usize, SseClient)>, Error> {
    let mut all = Vec::with_capacity(options.clients);
    let mut pending = JoinSet::new();
    let join = |done: Result<Result<(usize, SseClient), Error>, tokio::task::JoinError>| match done
    {
        Ok(opened) => opened,
        Err(e) => std::panic::resume_unwind(e.into_panic()),
    };
    for client in 0..options.clients {
        if pending.len() >= CONNECT_CONCURRENCY
            && let Some(done) = pending.join_next().await
        {
            all.push(join(done)?);
        }
        let target = options.gateways[client % options.gateways.len()].clone();
        let topic = topics[client % options.topics].clone();
        pending.spawn(async move {
            let source = source_addr(target.addr.ip(), client);
            let fail = client_failure(client, source, target.addr);
            let opening = async {
                let mut c = SseClient::connect(source, &target, &[&topic], None, BUFFER_BYTES)
                    .await
                    .map_err(|e| fail(e.to_string()))?;
                loop {
                    match c.next().await {
                        Ok(Some(Sse::Event { data, .. })) if data.starts_with(br#"{"op":"ok""#) => {
                            break;
                        }
                        Ok(Some(Sse::Event { data, .. })) => {
                            return Err(fail(format!(
                                "before ok: {}",
                                String::from_utf8_lossy(data)
                            )));
                        }
                        Ok(Some(Sse::Comment)) => {}
                        Ok(None) => return Err(fail("the stream ended before ok".to_owned())),
                        Err(e) => return Err(fail(e.to_string())),
                    }
                }
                Ok((client, c))
            };
            tokio::time::timeout(CONNECT_TIMEOUT, opening)
                .await
                .map_err(|_| fail(format!("no ok within {CONNECT_TIMEOUT:?}")))?
        });
    }
    while let Some(done) = pending.join_next().await {
        all.push(join(done)?);
    }
    Ok(all)
}

/// One client: reads its stream, and when it ends (or the tool cuts it)
/// comes back as `EventSource` does, until told to stop.
pub(super) async fn follow(
    client: usize,
    first: SseClient,
    options: Arc<Options>,
    topics: Arc<[String]>,
    progress: Arc<AtomicU64>,
    mut phases: watch::Receiver<Phase>,
) -> Record {
    let topic_index = client % options.topics;
    let topic = topics[topic_index].as_str();
    let mut record = Record {
        client,
        topic: topic_index,
        seqs: Vec::new(),
        lost_at: Vec::new(),
        back_at: Vec::new(),
        attempts: 0,
        attempt_errors: Vec::new(),
        resets: 0,
        unrecovered: 0,
        unexpected: 0,
        failure: None,
    };
    let n = options.gateways.len();
    let mut gateway = client % n;
    let mut stream = Some(first);
    let (mut last_id, mut retry_ms) = (None::<String>, None::<u64>);
    let mut newest = 0u64;
    let mut reconnecting = false;
    let mut failures = 0u32;
    loop {
        let Some(c) = stream.as_mut() else {
            // Back as EventSource: wait, then the same stream by its last id.
            let base = retry_ms.map_or(options.retry, Duration::from_millis);
            let wait = base
                .saturating_mul(1 << failures.min(6))
                .min(RETRY_CAP)
                .mul_f64(0.5 + rand::random::<f64>() / 2.0);
            tokio::select! {
                biased;
                _ = stop(&mut phases) => break,
                _ = tokio::time::sleep(wait) => {}
            }
            gateway = (gateway + 1) % n;
            let target = &options.gateways[gateway];
            record.attempts += 1;
            let source = source_addr(target.addr.ip(), client);
            let topics = [topic];
            let opening =
                SseClient::connect(source, target, &topics, last_id.as_deref(), BUFFER_BYTES);
            match tokio::time::timeout(CONNECT_TIMEOUT, opening).await {
                Ok(Ok(c)) => {
                    stream = Some(c);
                    reconnecting = true;
                    failures = 0;
                    record.back_at.push(Instant::now());
                }
                Ok(Err(e)) => {
                    failures += 1;
                    note(&mut record.attempt_errors, e.to_string());
                }
                Err(_) => {
                    failures += 1;
                    note(&mut record.attempt_errors, "timed out".to_owned());
                }
            }
            continue;
        };
        let item = tokio::select! {
            biased;
            changed = phases.changed() => {
                let now = if changed.is_err() { Phase::Stop } else { *phases.borrow() };
                match now {
                    Phase::Stop => break,
                    Phase::Cut => {
                        last_id = c.last_id.clone();
                        retry_ms = c.retry_ms;
                        stream = None;
                        record.lost_at.push(Instant::now());
                    }
                    Phase::Running => {}
                }
                continue;
            }
            item = c.next() => item,
        };
        match item {
            Ok(Some(Sse::Event { data, .. })) => {
                if let Some((t, seq)) = msg_topic_seq(data) {
                    if t != topic.as_bytes() {
                        record.unexpected += 1;
                        continue;
                    }
                    record.seqs.push(seq);
                    if seq > newest {
                        newest = seq;
                        progress.fetch_add(1, Ordering::Relaxed);
                    }
                } else if data.starts_with(br#"{"op":"reset""#) {
                    record.resets += 1;
                } else if data.starts_with(br#"{"op":"ok""#) {
                    let text = String::from_utf8_lossy(data);
                    if reconnecting && text.contains(r#""recovered":false"#) {
                        record.unrecovered += 1;
                    }
                } else if data.starts_with(br#"{"op":"reconnect""#) {
                    // The stream ends after it; the retry it set is kept.
                } else if data.starts_with(br#"{"op":"err""#) {
                    record
                        .failure
                        .get_or_insert_with(|| String::from_utf8_lossy(data).into_owned());
                } else {
                    record.unexpected += 1;
                }
            }
            Ok(Some(Sse::Comment)) => {}
            ended => {
                if let Err(e) = ended {
                    note(&mut record.attempt_errors, format!("stream: {e}"));
                }
                last_id = c.last_id.clone();
                retry_ms = c.retry_ms;
                stream = None;
                record.lost_at.push(Instant::now());
            }
        }
    }
    record
}

/// Resolves once the scenario says stop.
async fn stop(phases: &mut watch::Receiver<Phase>) {
    while *phases.borrow_and_update() != Phase::Stop {
        if phases.changed().await.is_err() {
            return;
        }
    }
}

fn note(errors: &mut Vec<String>, e: String) {
    if errors.len() < LISTED {
        errors.push(e);
    }
}
