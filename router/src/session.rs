//! What a session leaves behind when its connection ends, so that a client
//! can resume it (on any pod, once the store is shared).

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;

use crate::{BrokerError, Epoch, Topic};

/// A session's subscriptions and how far the client got in each.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SessionSnapshot {
    /// Whose session it is; `None` for an anonymous one, which anyone who
    /// knows its id may resume.
    pub user: Option<SessionUser>,
    pub subscriptions: Vec<SubscriptionState>,
}

/// The user a session belongs to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionUser {
    /// The `sub` of the token that started the session.
    pub id: Arc<str>,
    /// When the session was started (Unix ms): a [`SessionStore::revoke`]
    /// after it ends the session for good.
    pub since_ms: u64,
}

/// One subscription of a session.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SubscriptionState {
    pub topic: Topic,
    pub epoch: Epoch,
    /// The newest seq the client acked, or the topic's seq when it subscribed
    /// if it acked nothing since: a resume replays everything after it. (Not
    /// a [`crate::Position`], which is where the topic stands.)
    pub acked: u64,
    /// The client was sent a `reset` to `epoch` and `acked`, and has not
    /// acked in that epoch since: it may never have read it (its connection
    /// was dying), so a resume sends the reset again before the replay.
    pub told: bool,
    /// Made by the server (a backend's server-side subscription, or the
    /// token's `topics`), not by the client's `sub`: a resume restores it
    /// without checking the token's grants.
    pub server: bool,
    /// The client's `sub` asked for deltas and was granted them: a resume
    /// keeps sending them (after a first message in full).
    pub delta: bool,
}

/// Keeps session snapshots for the resume window.
///
/// A session has one owner at a time, the connection that serves it: a
/// resume [`claim`](Self::claim)s it, and a save by any other connection is
/// refused. A connection that was resumed elsewhere while it still looked
/// alive (half-open) cannot then write its older acks and subscriptions over
/// the newer session when it finally ends.
///
/// A store that can go back in time (Redis restarted from an older
/// snapshot) may forget a claim while its connection lives on: claims are
/// ranked, each above the one before, and a save ranked above the stored
/// owner wins. So a claim's answer names the owner to save with
/// ([`Claimed::owner`]), and a claim that reaches the store after its
/// claimant gave up on it takes nothing.
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

    /// Keeps the session `owner` saved for `ttl` from now, without sending
    /// it again: a live session's copy must not expire while its
    /// connection lives, however quiet the client.
    async fn extend(&self, id: &str, owner: &str, ttl: Duration) -> Result<Stored, BrokerError>;

    /// Saves (or extends) many sessions at once; engines that can batch do.
    /// One answer per save, in order.
    async fn save_many(
        &self,
        batch: Vec<SessionSave>,
        ttl: Duration,
    ) -> Vec<Result<Stored, BrokerError>> {
        let mut answers = Vec::with_capacity(batch.len());
        for save in batch {
            answers.push(match save.snapshot {
                Some(snapshot) => self
                    .save(&save.id, &save.owner, snapshot, ttl)
                    .await
                    .map(Stored::from),
                None => self.extend(&save.id, &save.owner, ttl).await,
            });
        }
        answers
    }

    /// Makes `owner` the session's owner and returns its snapshot, if it is
    /// there (not expired, not revoked) and belongs to `user` (`None`: an
    /// anonymous session). Another user's session is left as it was.
    async fn claim(&self, id: &str, owner: &str, user: Option<&str>) -> Result<Claim, BrokerError>;

    /// [`claim`](Self::claim) for a session that a connection of this pod
    /// served until now, `snapshot` as it left it: when the store has no
    /// copy (not saved yet, or expired), it keeps `snapshot` for `ttl`.
    /// Either way `owner` owns the session from now on, so the connection
    /// taken over cannot save over it when it ends, however late.
    async fn adopt(
        &self,
        id: &str,
        owner: &str,
        user: Option<&str>,
        snapshot: &SessionSnapshot,
        ttl: Duration,
    ) -> Result<Claim, BrokerError>;

    /// Ends `user`'s access: no session of theirs started before now can be
    /// claimed any more (for at least `ttl`, the resume window), and every
    /// pod's sink is told to close their connections ([`crate::Deliver::disconnect`]).
    async fn revoke(&self, user: &str, ttl: Duration) -> Result<(), BrokerError>;

    /// Whose the stored session `id` is, without claiming it: what a pod
    /// that does not hold a session checks before it forwards commands
    /// posted for it ([`crate::Broker::forward`]). A session revoked (or
    /// expired) is [`Whose::Nobody`], as [`SessionStore::claim`] would find
    /// it.
    async fn whose(&self, id: &str) -> Result<Whose, BrokerError> {
        let _ = id;
        Err(BrokerError::unavailable(
            "this store reads no session's user",
        ))
    }
}

/// The answer to [`SessionStore::whose`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Whose {
    /// Not stored: unknown, expired or revoked.
    Nobody,
    /// An anonymous session.
    Anonymous,
    /// The session of the user with this id.
    User(Arc<str>),
}

impl Whose {
    /// Of a stored session's user.
    pub fn of(user: Option<&SessionUser>) -> Self {
        match user {
            Some(user) => Self::User(user.id.clone()),
            None => Self::Anonymous,
        }
    }

    /// Whether the session is there and `user`'s (`None`: anonymous), the
    /// rule of [`Claim::belongs`].
    pub fn belongs(&self, user: Option<&str>) -> bool {
        match self {
            Self::Nobody => false,
            Self::Anonymous => user.is_none(),
            Self::User(id) => Some(&**id) == user,
        }
    }
}

/// The answer to [`SessionStore::claim`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Claim {
    Taken(Claimed),
    /// Unknown, expired or revoked.
    NotFound,
    /// The session belongs to another user (or to a user, and the claim
    /// came without one): not taken.
    OtherUser,
}

impl Claim {
    /// Whether a session of `stored` may be claimed by `user`.
    pub fn belongs(stored: Option<&SessionUser>, user: Option<&str>) -> bool {
        stored.map(|u| &*u.id) == user
    }
}

/// The current time in Unix milliseconds, as sessions and revocations
/// record it.
pub fn unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// A session taken over by [`SessionStore::claim`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Claimed {
    pub snapshot: SessionSnapshot,
    /// Who owned it before: the connection that last resumed or saved it
    /// (`None` for a session stored without an owner).
    pub from: Option<String>,
    /// What the claiming connection saves with from now on: the owner
    /// token it claimed with, as the store ranks it (see [`SessionStore`]).
    pub owner: Arc<str>,
}

/// One save of a [`SessionStore::save_many`] batch.
#[derive(Debug, Clone)]
pub struct SessionSave {
    pub id: Arc<str>,
    pub owner: Arc<str>,
    /// `None`: unchanged since `owner` last saved it, only
    /// [extended](SessionStore::extend).
    pub snapshot: Option<SessionSnapshot>,
}

/// What the store did with a save or an extend.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stored {
    /// Kept for the ttl from now.
    Kept,
    /// Another connection owns the session: nothing written.
    Refused,
    /// An extend found no copy to extend (Redis lost it): the session is to
    /// be saved whole.
    Gone,
}

impl From<bool> for Stored {
    /// A [`SessionStore::save`]'s answer.
    fn from(kept: bool) -> Self {
        if kept { Self::Kept } else { Self::Refused }
    }
}
