//! The cluster as one node's `CLUSTER NODES` reports it: every master
//! with its slots, every replica with its master; and the waits until every
//! live node agrees, holds every slot, and every replica is in sync.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use router::redis::slots::SLOTS;

use super::RedisCluster;
use crate::error::{Error, state};
use crate::process::poll;

/// A node's part in one node's view of the cluster.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Role {
    /// Its slot ranges (inclusive), ascending.
    Master(Vec<(u16, u16)>),
    /// The port of its master.
    Replica(u16),
}

/// One node's view: every node it does not take for failing, by port.
pub(super) type Topology = BTreeMap<u16, Role>;

impl RedisCluster {
    /// The ports of the masters, as the first live node sees them.
    pub fn masters(&self) -> Result<Vec<u16>, Error> {
        Ok(self
            .view()?
            .into_iter()
            .filter_map(|(port, role)| matches!(role, Role::Master(_)).then_some(port))
            .collect())
    }

    /// Ports of the replicas of the master on `port`.
    pub fn replicas_of(&self, port: u16) -> Result<Vec<u16>, Error> {
        Ok(self
            .view()?
            .into_iter()
            .filter_map(|(p, role)| (role == Role::Replica(port)).then_some(p))
            .collect())
    }

    /// The port of the master of `slot`, as the first live node sees it.
    pub fn master_of_slot(&self, slot: u16) -> Result<u16, Error> {
        let view = self.view()?;
        owner(&view, slot).ok_or_else(|| state(format!("nobody holds slot {slot}: {view:?}")))
    }

    /// The slot of `key` (CRC16/XMODEM mod 16384 of the key, or of its
    /// first non-empty `{hash tag}`): what `CLUSTER KEYSLOT` says, without
    /// asking.
    pub fn slot_of(key: &str) -> u16 {
        router::redis::slots::slot(key.as_bytes())
    }

    /// Waits, at most `within`, until every live node agrees (see
    /// [`RedisCluster::start`]).
    pub async fn wait_settled(&self, within: Duration) -> Result<(), Error> {
        poll(within, || self.settled().map(drop)).await
    }

    /// Waits, at most `within`, until every replica of the master on `port`
    /// has acknowledged all the master has written (its offset in the
    /// master's `INFO replication` reaches `master_repl_offset`). `WAIT`
    /// cannot say so from a fresh `redis-cli`: it waits for that
    /// connection's own writes, of which there are none.
    pub async fn replicated(&self, port: u16, within: Duration) -> Result<(), Error> {
        let replicas = self.replicas_of(port)?.len();
        poll(within, || {
            let info = self
                .cli(port, &["INFO", "replication"])
                .map_err(|e| e.to_string())?;
            let field = |line: &str, key: &str| -> Option<u64> {
                line.split(',')
                    .find_map(|f| f.strip_prefix(key))
                    .and_then(|v| v.trim().parse().ok())
            };
            let written = info
                .lines()
                .find_map(|l| field(l, "master_repl_offset:"))
                .ok_or("no master_repl_offset")?;
            let acked: Vec<u64> = info
                .lines()
                .filter(|l| l.starts_with("slave"))
                .filter_map(|l| field(l.split_once(':')?.1, "offset="))
                .collect();
            if acked.len() >= replicas && acked.iter().all(|&o| o >= written) {
                Ok(())
            } else {
                Err(format!("replicas at {acked:?} of {written}"))
            }
        })
        .await
    }

    /// The first live node that is not frozen: the one asked.
    pub(super) fn asked(&self) -> Result<u16, Error> {
        self.live()
            .into_iter()
            .find(|&p| !self.nodes.iter().any(|n| n.port == p && n.frozen))
            .ok_or_else(|| state("no live node"))
    }

    /// The view of the first live node that is not frozen.
    fn view(&self) -> Result<Topology, Error> {
        self.topology(self.asked()?, false)
    }

    /// The view of the node on `port`, from its `CLUSTER NODES`: `<id>
    /// <ip:port@bus> <flags> <master-id> <ping> <pong> <epoch> <link>
    /// <slots>...`, where a slot is `n`, `a-b`, or (mid-migration, on the two
    /// masters concerned only) `[n->-id]` / `[n-<-id]`, skipped here. Nodes
    /// it takes for failing are left out, unless `failing`.
    pub(super) fn topology(&self, port: u16, failing: bool) -> Result<Topology, Error> {
        Ok(parse_nodes(
            &self.cli(port, &["CLUSTER", "NODES"])?,
            failing,
        ))
    }

    /// The view every live node shares, if they all say `cluster_state:ok`,
    /// none is missing from it or taken for failing, the masters hold every
    /// slot, and every replica is in sync with its master; else why not.
    pub(super) fn settled(&self) -> Result<Topology, String> {
        let live = self.live();
        let mut shared: Option<(u16, Topology)> = None;
        for &port in &live {
            let info = self
                .cli(port, &["CLUSTER", "INFO"])
                .map_err(|e| e.to_string())?;
            let state = info.lines().find(|l| l.starts_with("cluster_state:"));
            if state.map(str::trim) != Some("cluster_state:ok") {
                return Err(format!("{port} says {state:?}"));
            }
            let view = self.topology(port, false).map_err(|e| e.to_string())?;
            match &shared {
                Some((first, seen)) if *seen != view => {
                    return Err(format!("{port} sees {view:?}, {first} sees {seen:?}"));
                }
                Some(_) => {}
                None => shared = Some((port, view)),
            }
        }
        let (_, view) = shared.ok_or("no node alive")?;
        if !view.keys().copied().eq(live.iter().copied()) {
            return Err(format!("the nodes see {view:?}, alive are {live:?}"));
        }
        let covered: u32 = view
            .values()
            .filter_map(|r| match r {
                Role::Master(slots) => Some(
                    slots
                        .iter()
                        .map(|&(a, b)| u32::from(b - a) + 1)
                        .sum::<u32>(),
                ),
                Role::Replica(_) => None,
            })
            .sum();
        if covered != SLOTS as u32 {
            return Err(format!("{covered} slots held: {view:?}"));
        }
        for (&port, role) in &view {
            if let Role::Replica(master) = role {
                let info = self
                    .cli(port, &["INFO", "replication"])
                    .map_err(|e| e.to_string())?;
                if !info.contains("master_link_status:up") {
                    return Err(format!("replica {port} is not in sync with {master} yet"));
                }
            }
        }
        Ok(view)
    }
}

/// A node's view from its `CLUSTER NODES` (see [`RedisCluster::topology`]).
fn parse_nodes(listed: &str, failing: bool) -> Topology {
    let lines: Vec<Vec<&str>> = listed
        .lines()
        .map(|l| l.split_whitespace().collect())
        .filter(|f: &Vec<&str>| f.len() >= 8)
        .collect();
    let port_of = |addr: &str| -> u16 {
        let port = addr.split('@').next().and_then(|a| a.rsplit(':').next());
        port.and_then(|p| p.parse().ok()).unwrap_or(0)
    };
    let ids: HashMap<&str, u16> = lines.iter().map(|f| (f[0], port_of(f[1]))).collect();
    lines
        .iter()
        .filter(|f| {
            failing
                || !f[2]
                    .split(',')
                    .any(|flag| flag.starts_with("fail") || flag == "handshake" || flag == "noaddr")
        })
        .map(|f| {
            let role = if f[2].split(',').any(|flag| flag == "master") {
                let mut slots: Vec<(u16, u16)> = f[8..]
                    .iter()
                    .filter(|s| !s.starts_with('['))
                    .filter_map(|s| {
                        let (a, b) = s.split_once('-').unwrap_or((s, s));
                        Some((a.parse().ok()?, b.parse().ok()?))
                    })
                    .collect();
                slots.sort_unstable();
                Role::Master(slots)
            } else {
                Role::Replica(ids.get(f[3]).copied().unwrap_or(0))
            };
            (port_of(f[1]), role)
        })
        .collect()
}

/// The master holding `slot` in `view`.
pub(super) fn owner(view: &Topology, slot: u16) -> Option<u16> {
    view.keys().copied().find(|&p| holds(view, p, slot, slot))
}

/// Whether `port` holds all of `first..=last` in `view`.
pub(super) fn holds(view: &Topology, port: u16, first: u16, last: u16) -> bool {
    matches!(view.get(&port), Some(Role::Master(slots)) if slots.iter().any(|&(a, b)| a <= first && last <= b))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What a node said mid-migration, a replica failing and a node it
    /// is still shaking hands with.
    const NODES: &str = "\
a1 127.0.0.1:7001@17001 myself,master - 0 0 1 connected 0-5460 [5461->-b2]
b2 127.0.0.1:7002@17002 master - 0 1 2 connected 5461-10922
c3 127.0.0.1:7003@17003 master - 0 1 3 connected 12000 10923-11999 12001-16383
d4 127.0.0.1:7004@17004 slave a1 0 1 1 connected
e5 127.0.0.1:7005@17005 slave,fail b2 0 1 2 disconnected
f6 127.0.0.1:7006@17006 handshake - 0 0 0 connected
";

    #[test]
    fn a_view_has_each_masters_slots_and_each_replicas_master() {
        let view = parse_nodes(NODES, false);
        assert_eq!(view.get(&7001), Some(&Role::Master(vec![(0, 5460)])));
        assert_eq!(
            view.get(&7003),
            Some(&Role::Master(vec![
                (10923, 11999),
                (12000, 12000),
                (12001, 16383)
            ]))
        );
        assert_eq!(view.get(&7004), Some(&Role::Replica(7001)));
        assert_eq!(owner(&view, 5461), Some(7002), "a slot mid-migration stays");
        assert!(holds(&view, 7003, 10923, 11999));
        assert!(!holds(&view, 7003, 11999, 12001), "not within one range");
    }

    #[test]
    fn failing_nodes_are_left_out_unless_asked_for() {
        let view = parse_nodes(NODES, false);
        assert_eq!(
            view.keys().copied().collect::<Vec<_>>(),
            [7001, 7002, 7003, 7004]
        );
        let all = parse_nodes(NODES, true);
        assert_eq!(all.get(&7005), Some(&Role::Replica(7002)));
        assert_eq!(all.len(), 6);
    }
}
