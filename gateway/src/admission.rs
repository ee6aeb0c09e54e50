//! Whom the pod admits: its WebSocket connection slots, capped in total
//! (`websocket.max_connections`) and per client address
//! (`websocket.max_connections_per_ip`). A connection holds its slot, an
//! [`Admission`], for as long as it lives.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use crate::config::WebSocketConfig;
use crate::metrics::Metrics;

/// A connection's id, unique within the pod: given with its slot.
pub type ConnId = u64;

/// The pod's connection slots.
pub struct Slots {
    max: usize,
    /// 0: addresses are not counted.
    max_per_ip: usize,
    taken: AtomicUsize,
    /// Open connections per client address, when they are capped.
    per_ip: Mutex<HashMap<IpAddr, usize>>,
    next_conn: AtomicU64,
    metrics: Arc<Metrics>,
}

/// Why a connection was not admitted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// The pod holds `websocket.max_connections`.
    AtCapacity,
    /// The client's address holds `websocket.max_connections_per_ip`.
    PerIp,
}

impl Slots {
    pub fn new(config: &WebSocketConfig, metrics: Arc<Metrics>) -> Self {
        metrics
            .connections_max
            .set(i64::try_from(config.max_connections).unwrap_or(i64::MAX));
        Self {
            max: config.max_connections,
            max_per_ip: config.max_connections_per_ip,
            taken: AtomicUsize::new(0),
            per_ip: Mutex::new(HashMap::new()),
            next_conn: AtomicU64::new(1),
            metrics,
        }
    }

    /// Takes one of the pod's connection slots for a client at `ip`, unless
    /// all are taken or the address holds its share.
    pub fn admit(self: &Arc<Self>, ip: IpAddr) -> Result<Admission, Refusal> {
        let max = self.max;
        self.taken
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < max).then_some(n + 1)
            })
            .map_err(|_| Refusal::AtCapacity)?;
        let per_ip = self.max_per_ip;
        if per_ip > 0 {
            let mut counts = self.per_ip.lock().unwrap_or_else(|e| e.into_inner());
            let count = counts.entry(ip).or_insert(0);
            if *count >= per_ip {
                drop(counts);
                self.taken.fetch_sub(1, Ordering::AcqRel);
                return Err(Refusal::PerIp);
            }
            *count += 1;
        }
        self.metrics.connections.inc();
        self.metrics.connections_opened.inc();
        Ok(Admission {
            slots: self.clone(),
            conn: self.next_conn.fetch_add(1, Ordering::Relaxed),
            ip: (per_ip > 0).then_some(ip),
        })
    }

    /// Open WebSocket connections.
    pub fn taken(&self) -> usize {
        self.taken.load(Ordering::Acquire)
    }
}

/// A connection slot, given back on drop.
pub struct Admission {
    slots: Arc<Slots>,
    pub conn: ConnId,
    /// The client's address, when connections per address are counted.
    ip: Option<IpAddr>,
}

impl Drop for Admission {
    fn drop(&mut self) {
        self.slots.taken.fetch_sub(1, Ordering::AcqRel);
        self.slots.metrics.connections.dec();
        if let Some(ip) = self.ip {
            let mut counts = self.slots.per_ip.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(count) = counts.get_mut(&ip) {
                *count -= 1;
                if *count == 0 {
                    counts.remove(&ip);
                }
            }
        }
    }
}
