//! Presence: who is subscribed to a topic, across pods.
//!
//! Each pod owns its part of a topic's presence (its users' connection
//! counts and infos, and its anonymous connections) and hands the broker
//! only what changed ([`PresenceUpdate`]), coalesced by the gateway. The
//! broker merges every pod's part into one [`Room`], gives each change a
//! position (like a topic's seq), and tells every pod that watches the topic
//! what changed ([`PresenceChange`], through [`crate::Deliver::presence`]) in
//! position order. A page or counts answer at a position, so that a client
//! can apply exactly the changes after it.
//!
//! - [`room`]: the pure merge of the pods' parts: members, counts, pages.

pub mod room;

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;

pub use room::{PodMembers, Room};

/// How long a pod's liveness lasts without a refresh, unless configured
/// otherwise (`presence.pod_ttl`). A pod refreshes it every fifth of that.
pub const DEFAULT_POD_TTL: Duration = Duration::from_secs(10);

/// What the engines are told about presence.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PresenceSettings {
    /// How long this pod's members outlive its last liveness refresh (Redis:
    /// a pod killed without a goodbye). Refreshed every `pod_ttl / 5`.
    pub pod_ttl: Duration,
    /// This pod's name, for the instance id its presence is kept under (a
    /// random suffix per process is added, so that a restarted pod is a new
    /// instance and never mistaken for the old one).
    pub pod: String,
    /// Whether the engine tracks which topics have a subscriber on some pod
    /// ([`crate::Deliver::occupancy`]): with Redis, a write per topic's
    /// first and last local subscriber, and liveness beats.
    pub occupancy: bool,
    /// Whether the engine tells exactly one pod of each member's join and
    /// leave ([`crate::Deliver::members`]): with Redis, a count per user
    /// and topic kept with each write of a pod's part.
    pub members: bool,
}

impl Default for PresenceSettings {
    fn default() -> Self {
        Self {
            pod_ttl: DEFAULT_POD_TTL,
            pod: "herald".to_owned(),
            occupancy: false,
            members: false,
        }
    }
}

/// One member of a topic's presence.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Member {
    /// The token's `sub`.
    pub user: Arc<str>,
    /// The token's `info` claim: compact JSON object text.
    pub info: Option<Bytes>,
}

/// This pod's state for one topic, as the gateway hands it to the broker:
/// changes only, since this pod's previous update of the topic.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PresenceUpdate {
    /// Users whose connection count on this pod is now `connections` (> 0;
    /// an entry with 0 is read as a removal), with their info.
    pub set: Vec<(Member, u32)>,
    /// Users with no connection on this pod any more.
    pub removed: Vec<Arc<str>>,
    /// This pod's anonymous connections on the topic now.
    pub anonymous: u32,
}

/// What changed in a topic's presence, as every watching pod's sink is told
/// (in position order).
///
/// A user is in `joins` when they became a member (their first connection
/// anywhere), in `leaves` when they stopped being one (their last), and at
/// most once in either: a user who left and came back between two positions
/// is not in the change at all. A change of `info` alone is not a join: a
/// member's info is that of the first pod instance (by id) that holds them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PresenceChange {
    /// The topic's presence position after this change; each change's is
    /// above the one before (by one, unless this pod's replica skipped some:
    /// then this change holds all of them).
    pub position: u64,
    pub joins: Vec<Member>,
    pub leaves: Vec<Arc<str>>,
    /// Members after the change.
    pub users: u64,
    /// Connections after the change, anonymous ones included.
    pub connections: u64,
}

impl PresenceChange {
    /// Whether no member came or went (the counts may still have moved).
    pub fn is_quiet(&self) -> bool {
        self.joins.is_empty() && self.leaves.is_empty()
    }
}

/// A topic's presence counts at a position.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PresenceCounts {
    pub position: u64,
    pub users: u64,
    pub connections: u64,
}

/// One page of a topic's members, ordered by user id (bytewise).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PresencePage {
    /// Where the page stands: it holds every change up to `counts.position`.
    pub counts: PresenceCounts,
    pub members: Vec<Member>,
    /// Whether members follow the last of this page (ask again after it).
    pub more: bool,
}

/// A room with its position: the embedded engine's presence of one topic,
/// of which this pod is the only instance.
#[derive(Debug, Clone, Default)]
pub struct Ledger {
    room: Room,
    position: u64,
}

impl Ledger {
    /// The instance id the embedded engine keeps this pod's part under.
    const LOCAL: &'static str = "local";

    /// Applies this pod's changes; what changed for the room, at the next
    /// position, unless nothing did (no member came or went and the counts
    /// stayed: then the position stays too).
    pub fn update(&mut self, update: &PresenceUpdate) -> Option<PresenceChange> {
        let before = (self.room.users(), self.room.connections());
        let delta = self.room.update(Self::LOCAL, update);
        if delta.is_empty() && before == (self.room.users(), self.room.connections()) {
            return None;
        }
        self.position += 1;
        Some(PresenceChange {
            position: self.position,
            joins: delta.joins,
            leaves: delta.leaves,
            users: self.room.users(),
            connections: self.room.connections(),
        })
    }

    pub fn counts(&self) -> PresenceCounts {
        PresenceCounts {
            position: self.position,
            users: self.room.users(),
            connections: self.room.connections(),
        }
    }

    pub fn page(&self, after: Option<&str>, limit: usize) -> PresencePage {
        let (members, more) = self.room.page(after, limit);
        PresencePage {
            counts: self.counts(),
            members,
            more,
        }
    }

    /// Nobody is in the room.
    pub fn is_empty(&self) -> bool {
        self.room.is_empty()
    }
}
