//! Whom the pod admits: its WebSocket connection slots, capped in total
//! (`websocket.max_connections`) and per client address
//! (`websocket.max_connections_per_ip`). A connection holds its slot, an
//! [`Admission`], for as long as it lives.
//!
//! "Per address" is per address prefix ([`address_key`]): one IPv6 host is
//! commonly given a whole /64, and would otherwise have 2^64 caps.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use ipnet::IpNet;

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
    /// Open connections per client address prefix, when they are capped.
    per_ip: Mutex<HashMap<IpNet, usize>>,
    ipv4_prefix: u8,
    ipv6_prefix: u8,
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
            ipv4_prefix: config.ipv4_prefix,
            ipv6_prefix: config.ipv6_prefix,
            next_conn: AtomicU64::new(1),
            metrics,
        }
    }

    /// Takes one of the pod's connection slots for a client at `ip`, unless
    /// all are taken or the address (its prefix) holds its share.
    pub fn admit(self: &Arc<Self>, ip: IpAddr) -> Result<Admission, Refusal> {
        let address = address_key(ip, self.ipv4_prefix, self.ipv6_prefix);
        let max = self.max;
        self.taken
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < max).then_some(n + 1)
            })
            .map_err(|_| Refusal::AtCapacity)?;
        let per_ip = self.max_per_ip;
        if per_ip > 0 {
            let mut counts = self.per_ip.lock().unwrap_or_else(|e| e.into_inner());
            let count = counts.entry(address).or_insert(0);
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
            address,
            counted: per_ip > 0,
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
    /// The client's address prefix: its anonymous sessions' budgets are
    /// keyed by it too.
    pub address: IpNet,
    /// Whether it took one of the address's slots.
    counted: bool,
}

impl Drop for Admission {
    fn drop(&mut self) {
        self.slots.taken.fetch_sub(1, Ordering::AcqRel);
        self.slots.metrics.connections.dec();
        if self.counted {
            let mut counts = self.slots.per_ip.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(count) = counts.get_mut(&self.address) {
                *count -= 1;
                if *count == 0 {
                    counts.remove(&self.address);
                }
            }
        }
    }
}

/// The network `ip` is counted in: its first `ipv4_prefix` or `ipv6_prefix`
/// bits (an IPv4-mapped IPv6 address as the IPv4 one). Addresses in one
/// such network share the per-address caps and budgets.
pub fn address_key(ip: IpAddr, ipv4_prefix: u8, ipv6_prefix: u8) -> IpNet {
    let ip = ip.to_canonical();
    let prefix = match ip {
        IpAddr::V4(_) => ipv4_prefix.min(32),
        IpAddr::V6(_) => ipv6_prefix.min(128),
    };
    // Within range by the `min` above: `new` cannot fail.
    IpNet::new(ip, prefix).map_or_else(|_| IpNet::from(ip), |net| net.trunc())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(ip: &str, v4: u8, v6: u8) -> String {
        let ip: IpAddr = ip.parse().unwrap_or_else(|e| panic!("{ip}: {e}"));
        address_key(ip, v4, v6).to_string()
    }

    #[test]
    fn one_ipv6_host_is_one_key_however_many_addresses_it_takes() {
        // Two addresses of one /64: one key; the next /64 is another.
        assert_eq!(key("2001:db8:1:2::1", 32, 64), "2001:db8:1:2::/64");
        assert_eq!(key("2001:db8:1:2:ffff:1:2:3", 32, 64), "2001:db8:1:2::/64");
        assert_eq!(key("2001:db8:1:3::1", 32, 64), "2001:db8:1:3::/64");
        // A /48 site as one.
        assert_eq!(key("2001:db8:1:3::1", 32, 48), "2001:db8:1::/48");
        // 128: each address apart.
        assert_eq!(key("2001:db8::7", 32, 128), "2001:db8::7/128");
    }

    #[test]
    fn ipv4_is_each_address_by_default_and_a_network_when_asked() {
        assert_eq!(key("198.51.100.7", 32, 64), "198.51.100.7/32");
        assert_eq!(key("198.51.100.7", 24, 64), "198.51.100.0/24");
        assert_eq!(key("198.51.100.7", 0, 64), "0.0.0.0/0");
        // An IPv4-mapped IPv6 address is the IPv4 one, with the IPv4 prefix.
        assert_eq!(key("::ffff:198.51.100.7", 24, 64), "198.51.100.0/24");
    }
}
