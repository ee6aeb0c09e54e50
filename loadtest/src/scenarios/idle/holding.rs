//! The clients one process holds ([`Holding`], from [`hold`]): connected
//! and subscribed, each answering pings until the end, their closes
//! counted into a [`Tally`]. Its own module: the same code holds the
//! clients in this process or in each worker process.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};
use tokio::task::{JoinHandle, JoinSet};

use super::{BUFFER_BYTES, CLOSES_LISTED, COMPRESSION};
use crate::clients::{
    CONNECT_CONCURRENCY, CONNECT_TIMEOUT, FD_MARGIN, client_failure, source_addr,
};
use crate::memory::rss_bytes;
use crate::streams::{Conn, Incoming, Transport};
use crate::{Error, Target};

/// What a share of the clients saw, by gateway index.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Tally {
    pub connected: Vec<u64>,
    /// Unexpected closes.
    pub closed: Vec<u64>,
    pub pings: u64,
    /// The first few unexpected closes, with their reasons.
    pub closes: Vec<String>,
    /// Resident memory of the processes holding the clients, at the end.
    pub holders_rss_bytes: u64,
}

impl Tally {
    pub(super) fn add(&mut self, other: Tally) {
        for (mine, theirs) in [
            (&mut self.connected, other.connected),
            (&mut self.closed, other.closed),
        ] {
            mine.resize(mine.len().max(theirs.len()), 0);
            for (m, t) in mine.iter_mut().zip(theirs) {
                *m += t;
            }
        }
        self.pings += other.pings;
        self.holders_rss_bytes += other.holders_rss_bytes;
        let room = CLOSES_LISTED.saturating_sub(self.closes.len());
        self.closes.extend(other.closes.into_iter().take(room));
    }
}

/// Counters the clients of one process share.
struct Counters {
    closed: Vec<AtomicU64>,
    pings: AtomicU64,
    /// Set when the scenario is done: closes after it are expected.
    stopping: AtomicBool,
    closes: Mutex<Vec<String>>,
}

/// The clients of this process, connected and held until [`Holding::finish`].
pub struct Holding {
    connected: Vec<u64>,
    counters: Arc<Counters>,
    tasks: Vec<JoinHandle<()>>,
}

/// Connects clients `first..first + count`, each to its gateway from its
/// source address, subscribes each to `topic`, and holds them: each answers
/// pings from the moment it is subscribed.
pub async fn hold(
    gateways: &[Target],
    first: usize,
    count: usize,
    topic: &str,
    transport: Transport,
) -> Result<Holding, Error> {
    if gateways.is_empty() {
        return Err(Error::Options("no gateway to connect to".to_owned()));
    }
    crate::clients::raise_fd_limit(count as u64 + FD_MARGIN)?;
    let counters = Arc::new(Counters {
        closed: gateways.iter().map(|_| AtomicU64::new(0)).collect(),
        pings: AtomicU64::new(0),
        stopping: AtomicBool::new(false),
        closes: Mutex::new(Vec::new()),
    });
    let gateways: Arc<[Target]> = gateways.into();
    let topic: Arc<str> = topic.into();
    let next = Arc::new(AtomicUsize::new(first));
    let failed = Arc::new(AtomicBool::new(false));
    let end = first + count;
    let mut workers = JoinSet::new();
    for _ in 0..CONNECT_CONCURRENCY.min(count) {
        let (gateways, topic, next, failed, counters) = (
            gateways.clone(),
            topic.clone(),
            next.clone(),
            failed.clone(),
            counters.clone(),
        );
        workers.spawn(async move {
            let mut held = Vec::new();
            loop {
                let client = next.fetch_add(1, Ordering::Relaxed);
                if client >= end || failed.load(Ordering::Relaxed) {
                    return Ok(held);
                }
                let gateway = client % gateways.len();
                match open(client, &gateways[gateway], &topic, transport).await {
                    Ok(c) => held.push((gateway, tokio::spawn(keep(c, gateway, counters.clone())))),
                    Err(e) => {
                        failed.store(true, Ordering::Relaxed);
                        return Err((e, held));
                    }
                }
            }
        });
    }
    let mut connected = vec![0; gateways.len()];
    let mut tasks = Vec::with_capacity(count);
    let mut first_error = None;
    while let Some(joined) = workers.join_next().await {
        let held = match joined {
            Ok(Ok(held)) => held,
            Ok(Err((e, held))) => {
                first_error.get_or_insert(e);
                held
            }
            Err(e) => std::panic::resume_unwind(e.into_panic()),
        };
        for (gateway, task) in held {
            connected[gateway] += 1;
            tasks.push(task);
        }
    }
    if let Some(e) = first_error {
        tasks.iter().for_each(JoinHandle::abort);
        return Err(e);
    }
    Ok(Holding {
        connected,
        counters,
        tasks,
    })
}

/// One client, connected and subscribed within [`CONNECT_TIMEOUT`].
async fn open(
    client: usize,
    target: &Target,
    topic: &str,
    transport: Transport,
) -> Result<Conn, Error> {
    let source = source_addr(target.addr.ip(), client);
    let fail = client_failure(client, source, target.addr);
    let opening = async {
        let (c, _) = Conn::subscribed(
            transport,
            source,
            target,
            &[topic],
            BUFFER_BYTES,
            client as u64,
            COMPRESSION.load(Ordering::Relaxed),
        )
        .await
        .map_err(|e| {
            let hint = if e.contains(" 503") {
                " (over the gateway's websocket.max_connections: \
                 HERALD_WEBSOCKET__MAX_CONNECTIONS)"
            } else {
                ""
            };
            fail(format!("{e}{hint}"))
        })?;
        // Memory "with compression negotiated" must be that: a gateway that
        // declined the offer fails the run rather than measure without.
        if transport == Transport::Ws && COMPRESSION.load(Ordering::Relaxed) && !c.compressed() {
            return Err(fail(
                "permessage-deflate offered, not negotiated (websocket.compression off?)"
                    .to_owned(),
            ));
        }
        Ok(c)
    };
    tokio::time::timeout(CONNECT_TIMEOUT, opening)
        .await
        .map_err(|_| fail(format!("not subscribed within {CONNECT_TIMEOUT:?}")))?
}

/// Holds one client: answers pings (or counts a stream's heartbeats) until
/// the connection ends, and counts the end as unexpected unless the
/// scenario is stopping.
async fn keep(mut client: Conn, gateway: usize, counters: Arc<Counters>) {
    let reason = loop {
        let ping = match client.next().await {
            Ok(Some(frame)) => match frame {
                Incoming::Ping(ping) => ping,
                Incoming::Heartbeat => {
                    counters.pings.fetch_add(1, Ordering::Relaxed);
                    continue;
                }
                Incoming::Closed(reason) => break format!("closed: {reason}"),
                // Nothing is published on the topic; a `reset` would be news
                // but not a close.
                Incoming::Frame(..) | Incoming::Other => continue,
            },
            Ok(None) => break "EOF".to_owned(),
            Err(e) => break e.to_string(),
        };
        if let Err(e) = client.pong(&ping).await {
            break format!("sending a pong: {e}");
        }
        counters.pings.fetch_add(1, Ordering::Relaxed);
    };
    if counters.stopping.load(Ordering::Acquire) {
        return;
    }
    counters.closed[gateway].fetch_add(1, Ordering::Relaxed);
    let mut closes = counters.closes.lock().unwrap_or_else(|p| p.into_inner());
    if closes.len() < CLOSES_LISTED {
        closes.push(format!("a client of gateway {gateway}: {reason}"));
    }
}

impl Holding {
    /// Stops counting, closes every client, and says what happened.
    pub fn finish(self) -> Tally {
        let counters = &self.counters;
        counters.stopping.store(true, Ordering::Release);
        let tally = Tally {
            connected: self.connected,
            closed: counters
                .closed
                .iter()
                .map(|c| c.load(Ordering::Relaxed))
                .collect(),
            pings: counters.pings.load(Ordering::Relaxed),
            closes: counters
                .closes
                .lock()
                .map(|c| c.clone())
                .unwrap_or_else(|p| p.into_inner().clone()),
            holders_rss_bytes: rss_bytes(std::process::id()).unwrap_or(0),
        };
        self.tasks.iter().for_each(JoinHandle::abort);
        tally
    }
}
