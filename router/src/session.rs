//! What a session leaves behind when its connection ends, so that a client
//! can resume it (on any pod, once the store is shared).

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;

use crate::{BrokerError, Epoch, Topic};

/// A session's subscriptions and how far the client got in each.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SessionSnapshot {
    pub subscriptions: Vec<SubscriptionState>,
}

/// One subscription of a session.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SubscriptionState {
    pub topic: Topic,
    pub epoch: Epoch,
    /// The newest seq the client acked, or the topic's seq when it subscribed
    /// if it acked nothing since: a resume replays everything after it.
    pub position: u64,
}

/// Keeps session snapshots for the resume window.
///
/// A session has one owner at a time, the connection that serves it: a
/// resume [`claim`](Self::claim)s it, and a save by any other connection is
/// refused. A connection that was resumed elsewhere while it still looked
/// alive (half-open) cannot then write its older acks and subscriptions over
/// the newer session when it finally ends.
#[async_trait]
pub trait SessionStore: Send + Sync + 'static {
    /// Keeps `snapshot` for `ttl`, replacing any earlier one, unless another
    /// connection than `owner` claimed the session. Returns whether it was
    /// kept.
    async fn save(
        &self,
        id: &str,
        owner: &str,
        snapshot: SessionSnapshot,
        ttl: Duration,
    ) -> Result<bool, BrokerError>;

    /// Saves many snapshots at once (those claimed by another connection are
    /// not); engines that can batch do.
    async fn save_many(&self, batch: Vec<SessionSave>, ttl: Duration) -> Result<(), BrokerError> {
        for save in batch {
            self.save(&save.id, &save.owner, save.snapshot, ttl).await?;
        }
        Ok(())
    }

    /// Makes `owner` the session's owner, and returns its snapshot unless it
    /// expired.
    async fn claim(&self, id: &str, owner: &str) -> Result<Option<Claimed>, BrokerError>;
}

/// A session taken over by [`SessionStore::claim`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Claimed {
    pub snapshot: SessionSnapshot,
    /// Who owned it before: the connection that last resumed or saved it
    /// (`None` for a session stored without an owner).
    pub from: Option<String>,
}

/// One save of a [`SessionStore::save_many`] batch.
#[derive(Debug, Clone)]
pub struct SessionSave {
    pub id: Arc<str>,
    pub owner: Arc<str>,
    pub snapshot: SessionSnapshot,
}
