//! This pod's replicas of the presence of the topics it watches: a snapshot
//! of the topic's hash read once the channel is subscribed, then the
//! changes from the channel in position order.
//!
//! A change that skips positions (the channel lost some: a link that
//! dropped, or too many held during a read) or that cannot be read makes
//! the replica read the snapshot again and hand the difference as one
//! change. Positions handed on never go back: if Redis counted again from
//! less (it lost the keys), the replica adds an offset to Redis's
//! positions from then on, so that a client's page and the changes after it
//! (both from this pod) stay in order.
//!
//! A re-read that no longer finds an instance's part keeps it for
//! `pod_ttl`, unless that instance writes or a cleaner clears it
//! meanwhile: after Redis restarted empty, every live pod writes its parts
//! again within a beat, and its members must not leave and join again for
//! it. An instance that cleared its own part during a gap leaves `pod_ttl`
//! late at most.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use bytes::Bytes;
use redis::Value;
use tokio::sync::Notify;
use tokio::time::Instant;

use super::Context;
use super::encoding::{self, Change, Message};
use super::scripts::SNAPSHOT;
use crate::presence::{PresenceChange, PresenceCounts, PresencePage, Room};
use crate::redis::call::{timed, unreadable};
use crate::{BrokerError, Causes, Topic};

/// Changes one replica holds while its snapshot is read; past that, it
/// reads again afterwards.
const MAX_HELD: usize = 1024;
/// Longest wait between two attempts at a snapshot read.
const MAX_RETRY: Duration = Duration::from_secs(2);

/// Every replica of this pod.
pub struct Replicas {
    context: Arc<Context>,
    by_topic: Mutex<HashMap<Topic, Replica>>,
    /// Told whenever a replica moves: what a query waiting for one waits on.
    moved: Notify,
    /// Tells replicas started apart (a topic forgotten and watched again).
    generation: std::sync::atomic::AtomicU64,
}

struct Replica {
    generation: u64,
    room: Room,
    /// Redis's position of the newest change applied.
    at: u64,
    /// Added to Redis's positions in what this pod hands on.
    offset: u64,
    /// The first snapshot was read.
    synced: bool,
    /// A snapshot read is under way: changes are held.
    reading: bool,
    held: Vec<Message>,
    /// Changes were dropped while held: read again after this read.
    again: bool,
    /// Instances a re-read did not find, kept since then (see the module).
    kept: HashMap<Arc<str>, Instant>,
}

impl Replica {
    fn counts(&self) -> PresenceCounts {
        PresenceCounts {
            position: self.at + self.offset,
            users: self.room.users(),
            connections: self.room.connections(),
        }
    }
}

/// What the channel's change does to a replica.
enum Step {
    Applied,
    Ignored,
    /// Positions are missing before it, or it could not be applied.
    Gap,
}

impl Replicas {
    pub fn new(context: Arc<Context>) -> Self {
        Self {
            context,
            by_topic: Mutex::new(HashMap::new()),
            moved: Notify::new(),
            generation: std::sync::atomic::AtomicU64::new(0),
        }
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<Topic, Replica>> {
        // A sink that panicked leaves the map consistent.
        self.by_topic.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The topic's channel is subscribed (first, or again after its link
    /// dropped): (re)read its snapshot; changes from now on are held until
    /// it is read.
    pub fn subscribed(self: &Arc<Self>, topic: &Topic) {
        let mut by_topic = self.lock();
        let replica = by_topic.entry(topic.clone()).or_insert_with(|| Replica {
            generation: self
                .generation
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed),
            room: Room::new(),
            at: 0,
            offset: 0,
            synced: false,
            reading: false,
            held: Vec::new(),
            again: false,
            kept: HashMap::new(),
        });
        if replica.reading {
            // A read that began before this subscribe may miss what the
            // channel lost meanwhile.
            replica.again = true;
            return;
        }
        replica.reading = true;
        self.spawn_read(topic.clone(), replica.generation);
    }

    /// The topic is no longer subscribed on this pod.
    pub fn forget(&self, topic: &Topic) {
        self.lock().remove(topic);
    }

    /// A change from the topic's channel.
    pub fn message(self: &Arc<Self>, topic: &Topic, payload: &Bytes) {
        let Some(message) = encoding::parse_message(payload) else {
            tracing::warn!(%topic, "unreadable presence change on a herald channel; reading the room again");
            let mut by_topic = self.lock();
            if let Some(replica) = by_topic.get_mut(topic) {
                self.resync(topic, replica);
            }
            return;
        };
        let mut by_topic = self.lock();
        let Some(replica) = by_topic.get_mut(topic) else {
            return;
        };
        self.arrive(topic, replica, message);
        drop(by_topic);
        self.moved.notify_waiters();
    }

    fn arrive(self: &Arc<Self>, topic: &Topic, replica: &mut Replica, message: Message) {
        if replica.reading {
            if replica.held.len() < MAX_HELD {
                replica.held.push(message);
            } else {
                replica.again = true;
            }
            return;
        }
        match self.step(topic, replica, &message) {
            Step::Applied | Step::Ignored => {}
            Step::Gap => {
                tracing::debug!(%topic, at = replica.at, position = message.position, "presence gap");
                replica.held.push(message);
                self.resync(topic, replica);
            }
        }
    }

    /// Applies the next change; drops one applied already.
    fn step(&self, topic: &Topic, replica: &mut Replica, message: &Message) -> Step {
        if message.position <= replica.at {
            return Step::Ignored;
        }
        if message.position != replica.at + 1 {
            return Step::Gap;
        }
        replica.kept.remove(&message.instance);
        let before = (replica.room.users(), replica.room.connections());
        let delta = match &message.change {
            Change::Whole(part) => replica.room.replace(&message.instance, part.clone()),
            Change::Delta(update) => replica.room.update(&message.instance, update),
        };
        replica.at = message.position;
        let after = (replica.room.users(), replica.room.connections());
        if !delta.is_empty() || before != after {
            let counts = replica.counts();
            let change = PresenceChange {
                position: counts.position,
                joins: delta.joins,
                leaves: delta.leaves,
                users: counts.users,
                connections: counts.connections,
            };
            self.context.sink.presence(topic, &change);
        }
        Step::Applied
    }

    fn resync(self: &Arc<Self>, topic: &Topic, replica: &mut Replica) {
        if replica.reading {
            replica.again = true;
            return;
        }
        replica.reading = true;
        self.spawn_read(topic.clone(), replica.generation);
    }

    fn spawn_read(self: &Arc<Self>, topic: Topic, generation: u64) {
        let replicas = Arc::downgrade(self);
        tokio::spawn(async move {
            let mut pause = Duration::from_millis(100);
            loop {
                let Some(this) = replicas.upgrade() else {
                    return;
                };
                let read = read_room(&this.context, &topic).await;
                match read {
                    Ok((position, room)) => {
                        this.snapshot(&topic, generation, position, room);
                        return;
                    }
                    Err(e) => {
                        tracing::warn!(%topic, error = %Causes(&e), "reading a topic's presence failed; trying again");
                        let wanted = this
                            .lock()
                            .get(&topic)
                            .is_some_and(|r| r.generation == generation);
                        if !wanted {
                            return;
                        }
                    }
                }
                drop(this);
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(MAX_RETRY);
            }
        });
    }

    /// A snapshot was read: the replica takes it (handing the difference
    /// as one change, unless it is its first), then what it held.
    fn snapshot(self: &Arc<Self>, topic: &Topic, generation: u64, position: u64, mut room: Room) {
        let mut by_topic = self.lock();
        let Some(replica) = by_topic.get_mut(topic) else {
            return;
        };
        if replica.generation != generation {
            return;
        }
        if replica.synced {
            let now = Instant::now();
            for instance in replica.room.instances() {
                if room.pod(instance).is_none()
                    && let Some(part) = replica.room.pod(instance)
                {
                    room.replace(instance, part.clone());
                    replica.kept.entry(instance.clone()).or_insert(now);
                }
            }
            let handed = replica.at + replica.offset;
            let delta = replica.room.diff(&room);
            let moved = !delta.is_empty()
                || replica.room.users() != room.users()
                || replica.room.connections() != room.connections();
            // Positions handed on never go back, and a change gets one of
            // its own.
            let floor = if moved { handed + 1 } else { handed };
            if position + replica.offset < floor {
                replica.offset = floor - position;
            }
            replica.room = room;
            replica.at = position;
            if moved {
                self.context.observer.presence_resync();
                let counts = replica.counts();
                let change = PresenceChange {
                    position: counts.position,
                    joins: delta.joins,
                    leaves: delta.leaves,
                    users: counts.users,
                    connections: counts.connections,
                };
                self.context.sink.presence(topic, &change);
            }
        } else {
            replica.room = room;
            replica.at = position;
            replica.synced = true;
        }
        replica.reading = false;
        let mut held = std::mem::take(&mut replica.held);
        held.sort_by_key(|m| m.position);
        let again = std::mem::take(&mut replica.again);
        for message in held {
            self.arrive(topic, replica, message);
        }
        if again {
            self.resync(topic, replica);
        }
        drop(by_topic);
        self.moved.notify_waiters();
    }

    /// Drops the parts kept past `ttl` (see the module), each replica's as
    /// one change.
    pub fn expire_kept(&self, ttl: Duration) {
        let now = Instant::now();
        let mut by_topic = self.lock();
        for (topic, replica) in by_topic.iter_mut() {
            let expired: Vec<Arc<str>> = replica
                .kept
                .iter()
                .filter(|(_, since)| now.saturating_duration_since(**since) >= ttl)
                .map(|(instance, _)| instance.clone())
                .collect();
            if expired.is_empty() {
                continue;
            }
            let before = (replica.room.users(), replica.room.connections());
            let mut leaves = Vec::new();
            for instance in expired {
                replica.kept.remove(&instance);
                leaves.extend(replica.room.remove(&instance).leaves);
            }
            if leaves.is_empty() && before == (replica.room.users(), replica.room.connections()) {
                continue;
            }
            leaves.sort_unstable();
            // A position of this pod's own, above every one handed on.
            replica.offset += 1;
            let counts = replica.counts();
            let change = PresenceChange {
                position: counts.position,
                joins: Vec::new(),
                leaves,
                users: counts.users,
                connections: counts.connections,
            };
            self.context.sink.presence(topic, &change);
        }
        drop(by_topic);
        self.moved.notify_waiters();
    }

    /// Whether this pod keeps a replica of the topic.
    pub fn has(&self, topic: &Topic) -> bool {
        self.lock().contains_key(topic)
    }

    /// A page (`limit` 0: counts only) from the topic's replica, once it
    /// has read its snapshot and holds Redis's position `written` (this
    /// pod's own last write), waiting for that until `deadline`. `None`:
    /// no replica, or not synced by then (the caller reads Redis).
    pub async fn page(
        &self,
        topic: &Topic,
        after: Option<&str>,
        limit: usize,
        written: u64,
        deadline: Instant,
    ) -> Option<PresencePage> {
        loop {
            let moved = self.moved.notified();
            tokio::pin!(moved);
            moved.as_mut().enable();
            {
                let by_topic = self.lock();
                let replica = by_topic.get(topic)?;
                let caught_up = replica.synced && replica.at >= written;
                if caught_up || (replica.synced && Instant::now() >= deadline) {
                    let (members, more) = replica.room.page(after, limit);
                    return Some(PresencePage {
                        counts: replica.counts(),
                        members,
                        more,
                    });
                }
            }
            if tokio::time::timeout_at(deadline, moved).await.is_err() {
                let by_topic = self.lock();
                let replica = by_topic.get(topic).filter(|r| r.synced)?;
                let (members, more) = replica.room.page(after, limit);
                return Some(PresencePage {
                    counts: replica.counts(),
                    members,
                    more,
                });
            }
        }
    }

    /// Waits until the topic's replica has read its first snapshot (or
    /// `deadline`): a watch of a presence topic answers once it can answer
    /// pages.
    pub async fn synced(&self, topic: &Topic, deadline: Instant) -> bool {
        loop {
            let moved = self.moved.notified();
            tokio::pin!(moved);
            moved.as_mut().enable();
            if self.lock().get(topic).is_some_and(|r| r.synced) {
                return true;
            }
            if tokio::time::timeout_at(deadline, moved).await.is_err() {
                return false;
            }
        }
    }
}

/// Reads a topic's presence from Redis: its position and room.
pub async fn read_room(context: &Context, topic: &Topic) -> Result<(u64, Room), BrokerError> {
    let (hash, position) = (context.keys.hash(topic), context.keys.position(topic));
    let mut invocation = SNAPSHOT.prepare_invoke();
    invocation.key(&hash).key(&position);
    let read = context.reads.script::<Value>(&hash, &SNAPSHOT, &invocation);
    let value = timed(&*context.observer, "presence_read", read).await?;
    parse_snapshot(topic, value).ok_or_else(|| unreadable("presence snapshot"))
}

/// [`SNAPSHOT`]'s reply; a field that cannot be read is left out (and
/// logged): its pod rewrites it whole with its next change.
fn parse_snapshot(topic: &Topic, value: Value) -> Option<(u64, Room)> {
    let Value::Array(items) = value else {
        return None;
    };
    let mut items = items.into_iter();
    let position = match items.next()? {
        Value::BulkString(b) => std::str::from_utf8(&b).ok()?.parse().ok()?,
        Value::Int(i) => u64::try_from(i).ok()?,
        _ => return None,
    };
    let Value::Array(fields) = items.next()? else {
        return None;
    };
    let mut room = Room::new();
    let mut fields = fields.into_iter();
    while let (Some(field), Some(value)) = (fields.next(), fields.next()) {
        let (Value::BulkString(field), Value::BulkString(value)) = (field, value) else {
            return None;
        };
        let instance = String::from_utf8_lossy(&field);
        match encoding::decode_field(&Bytes::from(value)) {
            Some((_, part)) => {
                room.replace(&instance, part);
            }
            None => {
                tracing::warn!(%topic, %instance, "unreadable presence field left out");
            }
        }
    }
    Some((position, room))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn topic() -> Topic {
        Topic::parse("room:1").unwrap_or_else(|e| panic!("{e}"))
    }

    #[test]
    fn a_snapshot_leaves_out_an_unreadable_field() {
        let mut part = crate::presence::PodMembers::default();
        part.insert(Arc::from("alice"), 2, None);
        let field = [&b"5:"[..], &encoding::encode_part(&part)].concat();
        let value = Value::Array(vec![
            Value::BulkString(b"9".to_vec()),
            Value::Array(vec![
                Value::BulkString(b"pod-a".to_vec()),
                Value::BulkString(field),
                Value::BulkString(b"pod-b".to_vec()),
                Value::BulkString(b"nonsense".to_vec()),
            ]),
        ]);
        let (position, room) = parse_snapshot(&topic(), value).unwrap_or_default();
        assert_eq!(position, 9);
        assert_eq!((room.users(), room.connections()), (1, 2));
        assert!(room.pod("pod-b").is_none());
        assert_eq!(parse_snapshot(&topic(), Value::Nil), None);
    }
}
