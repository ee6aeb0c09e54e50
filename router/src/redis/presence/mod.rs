//! Presence on Redis: each pod instance's part of a topic in one field of
//! the topic's presence hash, replicas of the rooms this pod watches, and
//! the pods' liveness.
//!
//! - [`encoding`]: a part, a delta and a change message as bytes.
//! - [`scripts`]: the keys and the Lua scripts.
//! - [`writer`]: this pod's parts, written whole per change, one Lua call
//!   each (the field, the position, the change message).
//! - [`replica`]: the rooms of the watched topics, from a snapshot and the
//!   channel's changes in position order; pages and counts come from them.
//! - [`members`]: users counted across pods, for join/leave events told
//!   once (only when asked for).
//! - [`liveness`]: the beat, and the cleanup of a dead pod's members (the
//!   bound on how long they stay is documented there).
//!
//! Steady state writes nothing per member: a pod writes a topic's field
//! only when its part changed, and beats once per `pod_ttl / 5`.

pub mod encoding;
mod liveness;
mod members;
pub mod replica;
mod scripts;
mod writer;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tokio::time::Instant;

use super::call::unreadable;
use super::occupancy::Occupancy;
use super::scripts::Keys;
use super::shards::Shards;
use crate::observe::Observer;
use crate::presence::{PresenceCounts, PresencePage, PresenceSettings, PresenceUpdate};
use crate::{BrokerError, Deliver, Topic};
pub use replica::Replicas;
use scripts::PresenceKeys;
use writer::Writer;

/// What the parts of presence share.
pub struct Context {
    shards: Shards,
    /// The same Redis over connections of their own, for reading rooms
    /// whole: publishes never wait behind a 10,000-member snapshot.
    reads: Shards,
    keys: PresenceKeys,
    /// For the topics' channels.
    channels: Keys,
    sink: Arc<dyn Deliver>,
    observer: Arc<dyn Observer>,
    settings: PresenceSettings,
    /// This process's instance id: the pod's name and a random suffix.
    instance: Arc<str>,
    /// `PUBLISH`, or `SPUBLISH` in a cluster.
    publish: &'static str,
    /// How long a query waits for this pod's replica.
    timeout: Duration,
}

/// Presence on Redis, for one pod.
pub struct Presence {
    context: Arc<Context>,
    replicas: Arc<Replicas>,
    writer: Writer,
    stopped: AtomicBool,
    /// Whether it beats: a deployment with a presence namespace, or one
    /// that tracks occupancy.
    used: bool,
    /// Which topics have a subscriber anywhere, when tracked: its dead
    /// instances are cleaned with their presence.
    occupancy: Option<Arc<Occupancy>>,
}

/// This process's instance id: the pod's name (what is safe of it in a key)
/// and 64 random bits, so that a restarted pod is a new instance.
fn instance_id(pod: &str) -> String {
    let name: String = pod
        .chars()
        .take(64)
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.') {
                c
            } else {
                '_'
            }
        })
        .collect();
    format!("{name}-{:016x}", rand::random::<u64>())
}

impl Presence {
    /// Starts the liveness beat (it ends when the engine is dropped), if
    /// `used`: a deployment with no presence namespace writes nothing for
    /// presence.
    // One argument per part it shares with the broker.
    #[allow(clippy::too_many_arguments)]
    pub fn start(
        shards: Shards,
        reads: Shards,
        prefix: &str,
        sink: Arc<dyn Deliver>,
        observer: Arc<dyn Observer>,
        settings: PresenceSettings,
        timeout: Duration,
        used: bool,
    ) -> Arc<Self> {
        let cluster = shards.is_cluster();
        let instance: Arc<str> = Arc::from(instance_id(&settings.pod));
        let occupancy = settings.occupancy.then(|| {
            Occupancy::start(
                shards.clone(),
                prefix,
                instance.clone(),
                sink.clone(),
                observer.clone(),
            )
        });
        let used = used || occupancy.is_some();
        let context = Arc::new(Context {
            instance,
            shards,
            reads,
            keys: PresenceKeys::new(prefix),
            channels: Keys::new(prefix, cluster),
            sink,
            observer,
            settings,
            publish: if cluster { "SPUBLISH" } else { "PUBLISH" },
            timeout,
        });
        let presence = Arc::new(Self {
            replicas: Arc::new(Replicas::new(context.clone())),
            writer: Writer::new(context.clone()),
            context,
            stopped: AtomicBool::new(false),
            used,
            occupancy,
        });
        if used {
            let period = liveness::period(presence.context.settings.pod_ttl);
            tokio::spawn(liveness::run(Arc::downgrade(&presence), period));
        }
        presence
    }

    /// The replicas, which the pub/sub task feeds.
    pub fn replicas(&self) -> Arc<Replicas> {
        self.replicas.clone()
    }

    /// Occupancy, when tracked.
    pub fn occupancy(&self) -> Option<&Arc<Occupancy>> {
        self.occupancy.as_ref()
    }

    /// This process's instance id.
    pub fn instance(&self) -> &str {
        &self.context.instance
    }

    /// Stops beating, as a pod that died would (for tests of the cleanup).
    pub fn stop_beating(&self) {
        self.stopped.store(true, Ordering::Relaxed);
    }

    fn stopped(&self) -> bool {
        self.stopped.load(Ordering::Relaxed)
    }

    /// Stops beating, with this pod's liveness set `linger` and then
    /// `pod_ttl` ahead: its parts, written already, stay as if it still
    /// beat for `linger`, then go as a dead pod's do ([`liveness`]). The
    /// `pod_ttl` after the linger is the margin of the last clients to come
    /// back: one that resumes at the end of the linger is written by its
    /// new pod at that pod's next interval, after a reconnect on a busy
    /// machine; cleaning the part before that write would list it as a
    /// leave and a join that never were. Nothing for a pod that never beat
    /// (no presence namespace).
    pub async fn depart(&self, linger: Duration) -> Result<(), BrokerError> {
        if self.stopped.swap(true, Ordering::Relaxed) || !self.used {
            return Ok(());
        }
        let linger = linger + self.context.settings.pod_ttl;
        liveness::extend(&self.context, linger).await
    }

    /// Applies this pod's changes to its part and writes it; when Redis is
    /// not `reached`, only applies them (the beat writes the part later).
    pub async fn update(
        &self,
        topic: &Topic,
        update: &PresenceUpdate,
        reached: Result<(), BrokerError>,
    ) -> Result<(), BrokerError> {
        self.writer.update(topic, update, reached).await
    }

    /// A page from this pod's replica of the topic, when it has one (once
    /// it holds this pod's own last write), else read from Redis.
    pub async fn page(
        &self,
        topic: &Topic,
        after: Option<&str>,
        limit: usize,
    ) -> Result<PresencePage, BrokerError> {
        if self.replicas.has(topic) {
            let written = self.writer.written(topic).await;
            let deadline = Instant::now() + self.context.timeout;
            if let Some(page) = self
                .replicas
                .page(topic, after, limit, written, deadline)
                .await
            {
                return Ok(page);
            }
        }
        let (position, room) = replica::read_room(&self.context, topic).await?;
        let (members, more) = room.page(after, limit);
        Ok(PresencePage {
            counts: PresenceCounts {
                position,
                users: room.users(),
                connections: room.connections(),
            },
            members,
            more,
        })
    }

    /// The counts: from the replica in O(1); a topic this pod does not
    /// watch reads the room from Redis.
    pub async fn counts(&self, topic: &Topic) -> Result<PresenceCounts, BrokerError> {
        Ok(self.page(topic, None, 0).await?.counts)
    }

    /// Waits (until `deadline`) for the topic's replica to read its first
    /// snapshot.
    pub async fn synced(&self, topic: &Topic, deadline: Instant) -> Result<(), BrokerError> {
        if self.replicas.synced(topic, deadline).await {
            Ok(())
        } else {
            Err(unreadable("presence snapshot"))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_instance_id_is_the_pods_name_made_safe_and_a_suffix_of_its_own() {
        let one = instance_id("herald-7d9f:x y");
        let two = instance_id("herald-7d9f:x y");
        assert!(one.starts_with("herald-7d9f_x_y-"), "{one}");
        assert_eq!(one.len(), "herald-7d9f_x_y-".len() + 16);
        assert_ne!(one, two, "a restarted pod is a new instance");
        assert!(!instance_id(&"n".repeat(300)).contains(':'));
    }
}
