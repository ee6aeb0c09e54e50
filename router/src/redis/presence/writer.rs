//! This pod's own parts of the topics' presence, and writing them to Redis.
//!
//! The pod keeps its part of each topic (what the gateway handed it, all
//! updates applied) and writes it whole with each change ([`WRITE`]): Redis
//! holds a copy, never the only one. A write that failed leaves the part
//! *dirty*: the next update of the topic, or the next liveness beat, writes
//! it whole again. When Redis lost the pod's fields (a restart, or another
//! pod took this one for dead), every part is written again.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

use redis::Value;

use super::Context;
use super::encoding::{encode_delta, encode_part};
use super::scripts::WRITE;
use crate::presence::{PodMembers, PresenceUpdate};
use crate::redis::call::{timed, unreadable};
use crate::{BrokerError, Topic};

/// How long a topic's presence position outlives its last member (ms): a
/// replica that still watches sees positions go on, not start again.
pub(super) const IDLE_POSITION_MS: u64 = 24 * 3600 * 1000;

/// This pod's parts, one per topic it has members (or anonymous
/// connections) in.
pub struct Writer {
    context: Arc<Context>,
    parts: Mutex<HashMap<Topic, Arc<tokio::sync::Mutex<Own>>>>,
}

/// This pod's part of one topic. One write at a time per topic (its lock):
/// each write's delta is on the part the one before wrote.
#[derive(Default)]
struct Own {
    part: PodMembers,
    /// The position of this pod's last write of it, which its field says.
    written: Option<u64>,
    /// The topic is in this instance's topic set.
    listed: bool,
    /// Redis may not hold `part`: write it whole next time.
    dirty: bool,
}

impl Writer {
    pub fn new(context: Arc<Context>) -> Self {
        Self {
            context,
            parts: Mutex::new(HashMap::new()),
        }
    }

    fn parts(&self) -> MutexGuard<'_, HashMap<Topic, Arc<tokio::sync::Mutex<Own>>>> {
        self.parts.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn own(&self, topic: &Topic) -> Arc<tokio::sync::Mutex<Own>> {
        self.parts().entry(topic.clone()).or_default().clone()
    }

    /// Applies this pod's changes to its part of `topic` and writes it.
    /// Nothing is written when nothing changed; nothing is tried when Redis
    /// is not `reached` (the part is then dirty, written by a later beat).
    /// An update applies the same twice: a caller may retry one that failed.
    pub async fn update(
        &self,
        topic: &Topic,
        update: &PresenceUpdate,
        reached: Result<(), BrokerError>,
    ) -> Result<(), BrokerError> {
        let own = self.own(topic);
        let mut guard = own.lock().await;
        let mut next = guard.part.clone();
        next.apply(update);
        if next == guard.part && !guard.dirty {
            drop(guard);
            self.drop_if_empty(topic, &own);
            return Ok(());
        }
        // A delta only continues a part Redis is known to hold.
        let delta = (!guard.dirty).then_some(update);
        guard.part = next;
        guard.dirty = true;
        let written = match reached {
            Ok(()) => self.write(topic, &mut guard, delta).await,
            Err(e) => Err(e),
        };
        drop(guard);
        self.drop_if_empty(topic, &own);
        written
    }

    /// The position of this pod's last write of `topic` (0: none): a page
    /// read from a replica waits until the replica holds it.
    pub async fn written(&self, topic: &Topic) -> u64 {
        let own = self.parts().get(topic).cloned();
        match own {
            Some(own) => own.lock().await.written.unwrap_or(0),
            None => 0,
        }
    }

    /// Writes again every part Redis may not hold (`all`: every part, as
    /// after Redis lost them).
    pub async fn rewrite(&self, all: bool) {
        let parts: Vec<(Topic, Arc<tokio::sync::Mutex<Own>>)> = self
            .parts()
            .iter()
            .map(|(topic, own)| (topic.clone(), own.clone()))
            .collect();
        for (topic, own) in parts {
            let mut guard = own.lock().await;
            if all {
                guard.dirty = true;
                guard.listed = false;
            }
            if !guard.dirty {
                continue;
            }
            if let Err(e) = self.write(&topic, &mut guard, None).await {
                tracing::warn!(%topic, error = %crate::Causes(&e), "writing this pod's presence again failed; trying again at the next beat");
                // The others would fail alike.
                return;
            }
            drop(guard);
            self.drop_if_empty(&topic, &own);
        }
    }

    /// Forgets a topic whose part is empty and written, unless another
    /// call holds it.
    fn drop_if_empty(&self, topic: &Topic, own: &Arc<tokio::sync::Mutex<Own>>) {
        let mut parts = self.parts();
        // The map's and the caller's: nobody else can reach it.
        if Arc::strong_count(own) > 2 {
            return;
        }
        let done = own
            .try_lock()
            .is_ok_and(|o| o.part.is_empty() && !o.dirty && !o.listed);
        if done {
            parts.remove(topic);
        }
    }

    /// One [`WRITE`]: the part whole, and `delta` for the others when it
    /// continues this pod's last write.
    async fn write(
        &self,
        topic: &Topic,
        own: &mut Own,
        delta: Option<&PresenceUpdate>,
    ) -> Result<(), BrokerError> {
        let context = &*self.context;
        let instance = &*context.instance;
        let listing = context.keys.topics_of(instance);
        if !own.part.is_empty() && !own.listed {
            // Listed before the field exists: a cleaner finds every field.
            let add = redis::cmd("SADD").arg(&listing).arg(topic.as_str()).clone();
            let adding = context.shards.command::<Value>(&listing, &add);
            timed(&*context.observer, "presence_list", adding).await?;
            own.listed = true;
        }
        let expected = match (delta, own.written) {
            (Some(_), Some(position)) => position.to_string(),
            _ => String::new(),
        };
        let hash = context.keys.hash(topic);
        let mut invocation = WRITE.prepare_invoke();
        invocation
            .key(&hash)
            .key(context.keys.position(topic))
            .arg(instance)
            .arg(expected)
            .arg(encode_part(&own.part))
            .arg(delta.map(encode_delta).unwrap_or_default())
            .arg(context.channels.channel(topic))
            .arg(context.publish)
            .arg(IDLE_POSITION_MS);
        let writing = context.shards.script::<Value>(&hash, &WRITE, &invocation);
        let position = match timed(&*context.observer, "presence_write", writing).await? {
            Value::Int(n) => u64::try_from(n).map_err(|_| unreadable("presence write"))?,
            _ => return Err(unreadable("presence write")),
        };
        own.written = (position > 0).then_some(position);
        // Dirty until counted too: the next write counts again.
        super::members::count(context, topic, instance, Some(&own.part)).await?;
        own.dirty = false;
        if own.part.is_empty() && own.listed {
            let remove = redis::cmd("SREM").arg(&listing).arg(topic.as_str()).clone();
            let removing = context.shards.command::<Value>(&listing, &remove);
            timed(&*context.observer, "presence_list", removing).await?;
            own.listed = false;
        }
        Ok(())
    }
}
