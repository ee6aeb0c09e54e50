//! TEMPORARY: the router's presence seam as spec23 describes it, until
//! h-router's `presence seam:` commit is merged (then this file goes, and
//! the names come from `router`).

use std::sync::Arc;

use bytes::Bytes;
use router::{Broker, BrokerError, NamespaceSettings, Topic};

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Member {
    pub user: Arc<str>,
    pub info: Option<Bytes>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PresenceUpdate {
    pub set: Vec<(Member, u32)>,
    pub removed: Vec<Arc<str>>,
    pub anonymous: u32,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PresenceChange {
    pub position: u64,
    pub joins: Vec<Member>,
    pub leaves: Vec<Arc<str>>,
    pub users: u64,
    pub connections: u64,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PresenceCounts {
    pub position: u64,
    pub users: u64,
    pub connections: u64,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PresencePage {
    pub counts: PresenceCounts,
    pub members: Vec<Member>,
    pub more: bool,
}

pub async fn update(
    _broker: &dyn Broker,
    _topic: &Topic,
    _update: PresenceUpdate,
) -> Result<(), BrokerError> {
    Ok(())
}

pub async fn page(
    _broker: &dyn Broker,
    _topic: &Topic,
    _after: Option<&str>,
    _limit: usize,
) -> Result<PresencePage, BrokerError> {
    Ok(PresencePage::default())
}

pub async fn counts(_broker: &dyn Broker, _topic: &Topic) -> Result<PresenceCounts, BrokerError> {
    Ok(PresenceCounts::default())
}

/// The namespace's presence keys: (presence, join_leave, counts_only_above).
pub fn settings(_ns: &NamespaceSettings) -> (bool, bool, u64) {
    (true, true, 0)
}
