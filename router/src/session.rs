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
#[async_trait]
pub trait SessionStore: Send + Sync + 'static {
    /// Keeps `snapshot` for `ttl`, replacing any earlier one.
    async fn save(
        &self,
        id: &str,
        snapshot: SessionSnapshot,
        ttl: Duration,
    ) -> Result<(), BrokerError>;

    /// Saves many snapshots at once; engines that can batch do.
    async fn save_many(
        &self,
        batch: Vec<(Arc<str>, SessionSnapshot)>,
        ttl: Duration,
    ) -> Result<(), BrokerError> {
        for (id, snapshot) in batch {
            self.save(&id, snapshot, ttl).await?;
        }
        Ok(())
    }

    /// The snapshot saved under `id`, unless it expired.
    async fn load(&self, id: &str) -> Result<Option<SessionSnapshot>, BrokerError>;
}
