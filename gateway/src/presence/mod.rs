//! Presence: who is subscribed to a topic, across pods (issue #23), for the
//! topics of namespaces with `presence = true`.
//!
//! - [`members`]: this pod's members of each topic (per connection, with
//!   the linger rule of an abnormal drop), and what changed since the
//!   broker last heard.
//! - [`diffs`]: the changes the broker hands back, gathered into one
//!   `presence_diff` per topic and interval for the local subscribers.
//!
//! The session enters and exits topics as the hub's subscriptions join and
//! leave ([`crate::session`]'s handshake), whatever their origin; this
//! module's [`Presence::tick`], every `presence.diff_interval`, writes each
//! changed topic to the broker (one `PresenceUpdate`) and sends the diffs.
//! A query ([`Presence::page`], [`Presence::counts`]) first writes its
//! topic's pending changes, so that a client that subscribed and then asks
//! sees itself.

mod diffs;
mod members;

pub use members::Who;
pub use router::{Member, PresenceChange, PresenceCounts};

use std::sync::{Arc, Mutex, MutexGuard, OnceLock, Weak};
use std::time::Duration;

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use bytes::Bytes;
use proto::json::PresenceMember;
use router::{Broker, BrokerError, Namespaces, Topic};
use serde_json::value::RawValue;
use tokio::time::Instant;

use crate::admission::ConnId;
use crate::config::{Config, PresenceConfig};
use crate::hub::Hub;
use crate::metrics::Metrics;
use diffs::{Diff, Diffs};
use members::Members;

/// A session's name in presence: a digest of its id, which is a
/// credential (an anonymous session's only one) and so never leaves the pod
/// (the control channel carries this instead).
fn session_key(session: &str) -> Arc<str> {
    use sha2::{Digest, Sha256};
    let digest = Sha256::digest(session.as_bytes());
    Arc::from(
        digest[..16]
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect::<String>(),
    )
}

/// How long a connection that lingers here stays once its session was
/// resumed on another pod. That pod writes the new connection's memberships
/// at its next interval, but in a rolling restart, thousands of resumes at
/// once, its write may wait behind others: letting go sooner would be a
/// leave and a join that never happened; a user who moved and then left
/// listed a few seconds longer is the lesser harm.
const RESUMED_GRACE: Duration = Duration::from_secs(5);

/// Writes of one topic are serialised (an update is the topic's state as
/// this pod has it then: two in flight could land in the other order); the
/// topics share this many locks.
const WRITE_LOCKS: usize = 64;

/// The pod's presence.
pub struct Presence {
    config: PresenceConfig,
    /// How long an abnormally dropped connection stays a member.
    resume_window: Duration,
    /// Whether a namespace keeps presence: else a resume tells nobody.
    used: bool,
    /// How long a drained pod's members stay listed after it exits: the
    /// spread of its clients' reconnect advice (`shutdown.drain_timeout`).
    departure: Duration,
    namespaces: Arc<Namespaces>,
    hub: Arc<Hub>,
    metrics: Arc<Metrics>,
    /// Set once the broker is built (it holds the pod's sink, which holds
    /// this: a weak handle, so that the two do not keep each other alive).
    broker: OnceLock<Weak<dyn Broker>>,
    members: Mutex<Members>,
    diffs: Mutex<Diffs>,
    writes: Box<[tokio::sync::Mutex<()>]>,
}

/// A topic's presence settings, from its namespace.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Settings {
    join_leave: bool,
    /// 0: never counts only.
    counts_only_above: u64,
}

/// Why a presence query was not answered.
#[derive(Debug, thiserror::Error)]
pub enum PresenceError {
    /// The topic's namespace does not keep presence.
    #[error("namespace `{0}` does not keep presence")]
    Disabled(String),
    /// A cursor that is not one of ours, or a limit out of range.
    #[error("{0}")]
    Malformed(String),
    /// The broker could not answer.
    #[error("the broker could not answer")]
    Broker(#[source] BrokerError),
}

/// A page of members, as the query's answer carries it.
#[derive(Debug, Clone)]
pub struct Page {
    pub counts: PresenceCounts,
    pub members: Vec<Member>,
    /// Absent on the last page.
    pub cursor: Option<String>,
}

impl Page {
    /// The members in their JSON form, borrowing from the page.
    pub fn json_members(&self) -> Vec<PresenceMember<'_>> {
        json_members(self.members.iter().map(|m| (&*m.user, m.info.as_ref())))
    }
}

fn json_members<'a>(
    members: impl Iterator<Item = (&'a str, Option<&'a Bytes>)>,
) -> Vec<PresenceMember<'a>> {
    members
        .map(|(user, info)| PresenceMember {
            user,
            info: info.and_then(raw_info),
        })
        .collect()
}

/// An `info` claim's compact JSON text as it goes into a frame. It was
/// written by [`crate::auth`] from a parsed object (or by another pod, the
/// same way): valid; anything else is left out rather than sent.
fn raw_info(info: &Bytes) -> Option<&RawValue> {
    let text = std::str::from_utf8(info).ok()?;
    serde_json::from_str::<&RawValue>(text).ok()
}

impl Presence {
    pub fn new(
        config: &Config,
        namespaces: Arc<Namespaces>,
        hub: Arc<Hub>,
        metrics: Arc<Metrics>,
    ) -> Self {
        let used = namespaces.iter().any(|(_, ns)| ns.presence);
        Self {
            config: config.presence.clone(),
            resume_window: config.session.resume_window,
            departure: config
                .shutdown
                .drain_timeout
                .min(config.session.resume_window),
            used,
            namespaces,
            hub,
            metrics,
            broker: OnceLock::new(),
            members: Mutex::new(Members::default()),
            diffs: Mutex::new(Diffs::default()),
            writes: (0..WRITE_LOCKS)
                .map(|_| tokio::sync::Mutex::new(()))
                .collect(),
        }
    }

    /// Hands presence the broker it writes to and reads from.
    pub fn attach(&self, broker: &Arc<dyn Broker>) {
        let _ = self.broker.set(Arc::downgrade(broker));
    }

    fn broker(&self) -> Result<Arc<dyn Broker>, PresenceError> {
        self.broker
            .get()
            .and_then(Weak::upgrade)
            .ok_or_else(|| PresenceError::Broker(BrokerError::unavailable("the pod is stopping")))
    }

    fn members(&self) -> MutexGuard<'_, Members> {
        self.members.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn diffs(&self) -> MutexGuard<'_, Diffs> {
        self.diffs.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The topic's settings; `None` where its namespace keeps no presence.
    fn settings(&self, topic: &Topic) -> Option<Settings> {
        let ns = self.namespaces.get(topic)?;
        ns.presence.then_some(Settings {
            join_leave: ns.join_leave,
            counts_only_above: ns.presence_counts_only_above,
        })
    }

    /// Whether `topic` keeps presence.
    pub fn is_on(&self, topic: &Topic) -> bool {
        self.settings(topic).is_some()
    }

    /// `conn` (of `who`) subscribed to `topic`.
    pub fn enter(&self, topic: &Topic, conn: ConnId, who: impl FnOnce() -> Who) {
        if !self.is_on(topic) {
            return;
        }
        let mut members = self.members();
        members.enter(topic, conn, &who());
        self.metrics.presence_members.set(members.count() as i64);
    }

    /// `conn`'s token was refreshed: its `info` is the new token's.
    pub fn refreshed(&self, conn: ConnId, info: Option<&Bytes>) {
        self.members().refresh(conn, info);
    }

    /// `conn` left `topic`: at once, unless it lingers ([`Self::linger`]).
    pub fn exit(&self, topic: &Topic, conn: ConnId) {
        if !self.is_on(topic) {
            return;
        }
        let mut members = self.members();
        members.exit(topic, conn);
        self.metrics.presence_members.set(members.count() as i64);
    }

    /// `conn`, of `session`, ended without a close from its client: its
    /// users stay members for the resume window, or until the session is
    /// resumed ([`Self::resumed`], or on another pod).
    pub fn linger(&self, conn: ConnId, session: &str) {
        let until = Instant::now() + self.resume_window;
        self.members().linger(conn, session_key(session), until);
    }

    /// `session` was resumed by a connection that entered its topics: what
    /// its earlier connection left lingering goes, and a user it still
    /// holds never leaves. The other pods are told
    /// ([`router::Broker::resumed`]), so that one where the session lingers
    /// lets go too, rather than keep a user who moved here, and may leave
    /// here, listed for the rest of the window.
    pub fn resumed(&self, session: &str) {
        let key = session_key(session);
        {
            let mut members = self.members();
            members.resumed(&key);
            self.metrics.presence_members.set(members.count() as i64);
        }
        if !self.used {
            return;
        }
        if let Ok(broker) = self.broker() {
            tokio::spawn(async move {
                if let Err(e) = broker.resumed(&key).await {
                    tracing::debug!(error = %router::Causes(&e), "presence: the other pods were not told of a resume; theirs lingers to its window's end");
                }
            });
        }
    }

    /// A session was resumed on another pod: what lingers of it here goes
    /// once that pod has written its new connection's memberships
    /// ([`RESUMED_GRACE`] from now), so that its users never leave.
    pub fn resumed_elsewhere(&self, key: &str) {
        let until = Instant::now() + RESUMED_GRACE.max(2 * self.config.diff_interval);
        self.members().resumed_elsewhere(key, until);
    }

    /// A backend ended `user`'s access: it leaves where it only lingered.
    pub fn revoked(&self, user: &str) {
        let mut members = self.members();
        members.revoke(user);
        self.metrics.presence_members.set(members.count() as i64);
    }

    /// A change the broker handed for `topic` (in position order): it goes
    /// out with the topic's next diff, where its namespace sends them and
    /// this pod has subscribers for it.
    pub fn change(&self, topic: &Topic, change: &PresenceChange) {
        let Some(settings) = self.settings(topic) else {
            return;
        };
        if settings.join_leave && self.hub.subscribers(topic) > 0 {
            self.diffs().push(topic, change.clone());
        }
    }

    /// Once per `presence.diff_interval`: lingering connections past their
    /// window leave, every changed topic is written to the broker, and the
    /// gathered diffs go to the subscribers.
    pub async fn tick(&self) {
        let topics = {
            let mut members = self.members();
            if members.expire(Instant::now()) > 0 {
                self.metrics.presence_members.set(members.count() as i64);
            }
            members.changed_topics()
        };
        for topic in topics {
            self.write(&topic).await;
        }
        let diffs = {
            let mut diffs = self.diffs();
            diffs.retain(|topic| self.hub.subscribers(topic) > 0);
            diffs.take_all(Instant::now())
        };
        for (topic, diff) in diffs {
            self.send(&topic, &diff);
        }
    }

    /// The pod is leaving, its drain over: what changed is written (the
    /// drained connections' users linger, as after any `reconnect`), and
    /// the broker keeps them listed for as long as the drain's reconnect
    /// advice spreads its clients over (`shutdown.drain_timeout`, then
    /// `presence.pod_ttl`: [`router::Broker::presence_depart`]). A client
    /// that follows the advice and resumes on another pod is neither a
    /// leave nor a join, however late in the spread it comes back; the
    /// old pod being gone, the linger cannot run the whole resume window
    /// without keeping a user who moved and then left listed that long.
    pub async fn depart(&self) {
        self.tick().await;
        let Ok(broker) = self.broker() else {
            return;
        };
        if let Err(e) = broker.presence_depart(self.departure).await {
            tracing::warn!(
                error = %router::Causes(&e),
                "presence: this pod's members could not be kept for their resume window; the other pods remove them as a dead pod's"
            );
        }
    }

    /// Writes `topic`'s changes to the broker, if it has any; put back to
    /// be written again if the broker did not take them.
    async fn write(&self, topic: &Topic) {
        let Ok(broker) = self.broker() else {
            return;
        };
        let _writing = self.writes[write_lock(topic)].lock().await;
        let Some(update) = self.members().take_update(topic) else {
            return;
        };
        if let Err(e) = broker.presence_update(topic, update.clone()).await {
            self.metrics.presence_write_failures.inc();
            tracing::warn!(error = %router::Causes(&e), %topic, "presence not written; again at the next interval");
            self.members().retry(topic, &update);
        }
    }

    /// Encodes `diff` once and pushes it to the topic's subscribers here.
    fn send(&self, topic: &Topic, diff: &Diff) {
        let counts_only = self
            .settings(topic)
            .is_some_and(|s| s.counts_only_above > 0 && diff.users > s.counts_only_above);
        let joins = json_members(diff.joins.iter().map(|(u, i)| (&**u, i.as_ref())));
        let leaves: Vec<&str> = diff.leaves.iter().map(|u| &**u).collect();
        let message = proto::ServerMessage::PresenceDiff {
            topic: topic.as_str(),
            from: diff.from,
            to: diff.to,
            joins: (!counts_only).then_some(&joins[..]),
            leaves: (!counts_only).then_some(&leaves[..]),
            users: diff.users,
            connections: diff.connections,
        };
        if self.hub.broadcast(topic, &message) > 0 {
            self.metrics.presence_diffs.inc();
        }
    }

    fn check(&self, topic: &Topic) -> Result<(), PresenceError> {
        match self.is_on(topic) {
            true => Ok(()),
            false => Err(PresenceError::Disabled(topic.namespace().to_owned())),
        }
    }

    /// A page of `topic`'s members: after `cursor` (a previous page's), at
    /// most `limit` (default and most: `presence.page_size`). This pod's
    /// own pending changes are written first, and what is pending for the
    /// topic's subscribers up to the page's position is sent before it.
    pub async fn page(
        &self,
        topic: &Topic,
        cursor: Option<&str>,
        limit: Option<u64>,
    ) -> Result<Page, PresenceError> {
        let started = Instant::now();
        self.check(topic)?;
        let max = self.config.page_size;
        let limit = match limit {
            None => max,
            Some(n) if n == 0 || n > max as u64 => {
                return Err(PresenceError::Malformed(format!(
                    "`limit` must be 1 to {max} (presence.page_size)"
                )));
            }
            Some(n) => n as usize,
        };
        let after = cursor.map(decode_cursor).transpose()?;
        let broker = self.broker()?;
        self.write(topic).await;
        let page = broker
            .presence(topic, after.as_deref(), limit)
            .await
            .map_err(PresenceError::Broker)?;
        self.send_upto(topic, page.counts.position);
        let cursor = match (page.more, page.members.last()) {
            (true, Some(last)) => Some(URL_SAFE_NO_PAD.encode(last.user.as_bytes())),
            _ => None,
        };
        self.observe("page", started);
        Ok(Page {
            counts: page.counts,
            members: page.members,
            cursor,
        })
    }

    /// `topic`'s counts, after this pod's pending changes are written.
    pub async fn counts(&self, topic: &Topic) -> Result<PresenceCounts, PresenceError> {
        let started = Instant::now();
        self.check(topic)?;
        let broker = self.broker()?;
        self.write(topic).await;
        let counts = broker
            .presence_counts(topic)
            .await
            .map_err(PresenceError::Broker)?;
        self.send_upto(topic, counts.position);
        self.observe("stats", started);
        Ok(counts)
    }

    fn send_upto(&self, topic: &Topic, position: u64) {
        let diff = self.diffs().take_upto(topic, position);
        if let Some(diff) = diff {
            self.send(topic, &diff);
        }
    }

    fn observe(&self, kind: &str, started: Instant) {
        self.metrics
            .presence_queries
            .with_label_values(&[kind])
            .observe(started.elapsed().as_secs_f64());
    }
}

/// The user id a cursor names: the last member of the page before.
fn decode_cursor(cursor: &str) -> Result<String, PresenceError> {
    let bad = || PresenceError::Malformed("`cursor` is not one this server gave".to_owned());
    let bytes = URL_SAFE_NO_PAD.decode(cursor).map_err(|_| bad())?;
    if bytes.is_empty() || bytes.len() > 256 {
        return Err(bad());
    }
    String::from_utf8(bytes).map_err(|_| bad())
}

fn write_lock(topic: &Topic) -> usize {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    topic.as_str().hash(&mut h);
    (h.finish() as usize) % WRITE_LOCKS
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cursor_names_a_user_and_anything_else_is_malformed() {
        let cursor = URL_SAFE_NO_PAD.encode("alice");
        assert_eq!(decode_cursor(&cursor).ok().as_deref(), Some("alice"));
        for bad in ["", "!!", "////", &URL_SAFE_NO_PAD.encode([0xff, 0xfe])] {
            assert!(
                matches!(decode_cursor(bad), Err(PresenceError::Malformed(_))),
                "{bad}"
            );
        }
    }
}
