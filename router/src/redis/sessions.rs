//! Session snapshots in Redis, written in batches: every save (or extend of
//! one unchanged) waiting when the writer gets to it goes out in one
//! pipeline, so a thousand sessions flushing at once cost a handful of round
//! trips, not a thousand.

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;

use tokio::sync::{mpsc, oneshot};

use super::call::timed_each;
use super::replies::parse_saved;
use super::shards::{Call, Shards};
use super::{scripts, slots};
use crate::observe::Observer;
use crate::{BrokerError, SessionSnapshot, SessionUser, Stored, SubscriptionState, Topic};

/// Saves waiting for the writer, at most.
pub const QUEUE: usize = 4096;
/// Saves in one pipeline, at most.
const BATCH: usize = 512;

pub struct Save {
    pub key: String,
    pub owner: String,
    /// `None`: only extend what the owner saved before.
    pub value: Option<Vec<u8>>,
    pub ttl_ms: u64,
    pub done: oneshot::Sender<Result<Stored, BrokerError>>,
}

pub async fn write(shards: Shards, mut saves: mpsc::Receiver<Save>, observer: Arc<dyn Observer>) {
    let mut batch = Vec::with_capacity(BATCH);
    while saves.recv_many(&mut batch, BATCH).await > 0 {
        let calls: Vec<_> = batch
            .iter()
            .map(|save| {
                let slot = slots::slot(save.key.as_bytes());
                match &save.value {
                    Some(value) => {
                        let mut invocation = scripts::SAVE_SESSION.prepare_invoke();
                        invocation
                            .key(&save.key)
                            .arg(&save.owner)
                            .arg(value)
                            .arg(save.ttl_ms);
                        Call {
                            slot,
                            script: &scripts::SAVE_SESSION,
                            invocation,
                        }
                    }
                    None => {
                        let mut invocation = scripts::EXTEND_SESSION.prepare_invoke();
                        invocation.key(&save.key).arg(&save.owner).arg(save.ttl_ms);
                        Call {
                            slot,
                            script: &scripts::EXTEND_SESSION,
                            invocation,
                        }
                    }
                }
            })
            .collect();
        let replies = timed_each(&*observer, "session_save", shards.scripts(&calls)).await;
        let mut replies = replies.into_iter();
        for save in batch.drain(..) {
            let saved = parse_saved(replies.next());
            let _ = save.done.send(saved);
        }
    }
}

/// How far Redis's clock is ahead of this pod's, as learnt from the claims'
/// answers: a claim's deadline is given in Redis's time.
#[derive(Default)]
pub struct RedisClock {
    ahead_ms: AtomicI64,
}

impl RedisClock {
    /// Redis's time `within` after `now_ms` (this pod's clock).
    pub fn deadline(&self, now_ms: u64, within: Duration) -> u64 {
        let ahead = self.ahead_ms.load(Ordering::Relaxed);
        now_ms
            .saturating_add_signed(ahead)
            .saturating_add(within.as_millis() as u64)
    }

    /// Learns from a claim sent at `sent_ms`, answered at `answered_ms` (this
    /// pod's clock), that ran at `redis_ms`: taken to be halfway, the error at
    /// most half the round trip.
    pub fn learn(&self, sent_ms: u64, answered_ms: u64, redis_ms: u64) {
        let halfway = sent_ms / 2 + answered_ms / 2;
        let ahead = i64::try_from(redis_ms).unwrap_or(i64::MAX)
            - i64::try_from(halfway).unwrap_or(i64::MAX);
        self.ahead_ms.store(ahead, Ordering::Relaxed);
    }
}

/// Whether `stored` (an owner as the store ranks it, `<owner>@<rank>`) is
/// `owner`'s own claim.
pub fn is_owned_by(stored: &str, owner: &str) -> bool {
    stored
        .strip_prefix(owner)
        .is_some_and(|rest| rest.is_empty() || rest.starts_with('@'))
}

/// The owner's line, the user's (`user <hex id> <since ms>`) if the session
/// has one, then one line per subscription: `<acked> <epoch> <topic>`, and
/// ` told` after it while the client has not acked the reset it was sent,
/// ` server` for a subscription the server made, ` delta` for one sent
/// deltas (a pod of an older release skips a line with a flag it does not
/// know: the session resumes there without it).
pub fn encode(owner: &str, snapshot: &SessionSnapshot) -> Vec<u8> {
    let mut out = format!("owner {owner}\n").into_bytes();
    out.extend(encode_body(snapshot));
    out
}

/// [`encode`] without the owner's line.
pub fn encode_body(snapshot: &SessionSnapshot) -> Vec<u8> {
    let mut out = String::new();
    if let Some(user) = &snapshot.user {
        out.push_str(&format!("user {} {}\n", hex(&user.id), user.since_ms));
    }
    for s in &snapshot.subscriptions {
        let told = if s.told { " told" } else { "" };
        let server = if s.server { " server" } else { "" };
        let delta = if s.delta { " delta" } else { "" };
        out.push_str(&format!(
            "{} {} {}{told}{server}{delta}\n",
            s.acked, s.epoch, s.topic
        ));
    }
    out.into_bytes()
}

/// The subscriptions of [`encode`]'s value (the owner's line is no
/// subscription); a line that does not parse is skipped (and logged): the
/// rest of the session is still worth resuming.
pub fn decode(value: &[u8]) -> SessionSnapshot {
    let text = String::from_utf8_lossy(value);
    let user = text.lines().find_map(|line| {
        let mut parts = line.strip_prefix("user ")?.split(' ');
        Some(SessionUser {
            id: Arc::from(unhex(parts.next()?)?),
            since_ms: parts.next()?.parse().ok()?,
        })
    });
    let subscriptions = text
        .lines()
        .filter(|line| !line.starts_with("owner ") && !line.starts_with("user "))
        .filter_map(|line| {
            let mut parts = line.split(' ');
            let parsed = (|| {
                let mut state = SubscriptionState {
                    acked: parts.next()?.parse().ok()?,
                    epoch: Arc::from(parts.next()?),
                    topic: Topic::parse(parts.next()?).ok()?,
                    told: false,
                    server: false,
                    delta: false,
                };
                // Flags, in this order; a record of an older release has
                // fewer.
                let mut flag = parts.next();
                if flag == Some("told") {
                    state.told = true;
                    flag = parts.next();
                }
                if flag == Some("server") {
                    state.server = true;
                    flag = parts.next();
                }
                if flag == Some("delta") {
                    state.delta = true;
                    flag = parts.next();
                }
                flag.is_none().then_some(state)
            })();
            if parsed.is_none() {
                tracing::warn!(line, "unreadable line in a stored session");
            }
            parsed
        })
        .collect();
    SessionSnapshot {
        user,
        subscriptions,
    }
}

/// A user id as hex: any text (a `sub` may hold spaces or newlines) as one
/// word of a session's lines, a key or a control message.
pub fn hex(text: &str) -> String {
    text.bytes().map(|b| format!("{b:02x}")).collect()
}

/// The text of [`hex`], if it is that.
pub fn unhex(hex: &str) -> Option<String> {
    if !hex.len().is_multiple_of(2) {
        return None;
    }
    let bytes = (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(hex.get(i..i + 2)?, 16).ok())
        .collect::<Option<Vec<u8>>>()?;
    String::from_utf8(bytes).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn snapshots_round_trip() {
        let snapshot = SessionSnapshot {
            user: Some(SessionUser {
                id: Arc::from("alice smith\n"),
                since_ms: 1_700_000_000_000,
            }),
            subscriptions: vec![
                SubscriptionState {
                    topic: Topic::parse("chat:a/b").unwrap_or_else(|e| panic!("{e}")),
                    epoch: Arc::from("9f3c"),
                    acked: 42,
                    told: false,
                    server: true,
                    delta: false,
                },
                SubscriptionState {
                    topic: Topic::parse("news").unwrap_or_else(|e| panic!("{e}")),
                    epoch: Arc::from("77aa"),
                    acked: 7,
                    told: true,
                    server: false,
                    delta: true,
                },
            ],
        };
        assert_eq!(decode(&encode("a1", &snapshot)), snapshot);
    }

    #[test]
    fn records_of_older_releases_still_read() {
        let old = b"owner a1\n42 9f3c news\n7 77aa chat:x told\n";
        let read = decode(old);
        let flags: Vec<(bool, bool)> = read
            .subscriptions
            .iter()
            .map(|s| (s.told, s.server))
            .collect();
        assert_eq!(flags, vec![(false, false), (true, false)]);
        let both = decode(b"3 9f3c news told server\n1 9f3c x server told\n");
        assert_eq!(both.subscriptions.len(), 1, "flags in their order only");
        assert!(both.subscriptions[0].told && both.subscriptions[0].server);
    }

    #[test]
    fn an_owner_knows_its_own_ranked_claims_only() {
        assert!(is_owned_by("3f9a@1700000000000", "3f9a"));
        assert!(is_owned_by("3f9a", "3f9a"));
        assert!(!is_owned_by("3f9ab@1700000000000", "3f9a"));
        assert!(!is_owned_by("77aa@1700000000000", "3f9a"));
        assert!(!is_owned_by("", "3f9a"));
    }
}
