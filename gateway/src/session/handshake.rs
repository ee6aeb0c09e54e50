//! The subscribe handshake: how a subscription starts, whoever asked for it
//! (its [`Origin`]). One place, the steps in order:
//!
//! 1. A replay's turn, when there is history to replay
//!    ([`Replays`](super::Replays)).
//! 2. [`Joining::join`]: the hub holds aside what arrives for the topic from
//!    now on. Until the handshake goes live, the [`Joining`] guard leaves the
//!    hub when dropped (and the last subscriber out releases the broker's
//!    watch), so a step that fails cannot leave the connection behind.
//! 3. [`Joining::watch`] (once per topic and pod), then the broker's
//!    recover: the topic's position and the first page of its history.
//! 4. The subscription recorded in the session, and, for a client's `sub`
//!    on a shared store, saved before the client hears `ok`.
//! 5. The answer: `ok` for a client's `sub`; `reset` for a restored
//!    subscription where continuity was lost.
//! 6. The replay ([`replay`](super::replay)), which ends in
//!    [`Joining::go_live`], consuming the guard.
//!
//! Each step's failure is a [`SubscribeError`] variant;
//! [`SubscribeError::to_command`] is the `err` the client hears of it.

use std::sync::Arc;

use bytes::Bytes;
use proto::{CommandError, ErrorCode, ServerMessage};
use router::{BrokerError, Position, Since, Topic};
use tokio::sync::OnceCell;

use super::commands::broker_error;
use super::replay::NoTurn;
use super::{Pod, Session};
use crate::admission::ConnId;
use crate::config::BrokerKind;
use crate::disconnect::CloseReason;
use crate::frame::Format;
use crate::hooks::SubscribeReply;
use crate::presence::Who;

/// Where a subscription comes from. It decides how the handshake answers:
/// a client waits for `ok` to its `sub`; a restored subscription gets no
/// `ok`, only a `reset` where its stream does not go on as it was; one the
/// server makes gets an `ok` without `id`, with its `reason`. New ones
/// (all but restored) start where a client's `sub` does: after `since`
/// when history continues it, else at the topic's seq.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Origin {
    /// The client's `sub`, with its command's id.
    Command(u64),
    /// A subscription of a resumed session, restored from its acks.
    Restored,
    /// A backend's server-side subscription (`reason: "server"`).
    Server,
    /// The token's `topics`, at a fresh `hello` (`reason: "token"`).
    Token,
}

impl Origin {
    /// The id an `err` about the subscription carries: its command's.
    pub(super) fn id(self) -> Option<u64> {
        match self {
            Origin::Command(id) => Some(id),
            Origin::Restored | Origin::Server | Origin::Token => None,
        }
    }

    /// Whether the server made it: kept without the token's grants.
    fn by_server(self) -> bool {
        matches!(self, Origin::Server | Origin::Token)
    }
}

/// Why a subscription did not start: the step that failed.
#[derive(Debug, thiserror::Error)]
pub(super) enum SubscribeError {
    /// No replay turn came within `replay.wait`, or the connection ended
    /// while it waited.
    #[error("no replay turn: {0}")]
    NoTurn(NoTurn),
    /// The broker would not deliver the topic to this pod.
    #[error("the broker did not watch the topic")]
    Watch(#[source] BrokerError),
    /// The broker could not say where the topic is, or read its history.
    #[error("the broker did not recover the topic")]
    Recover(#[source] BrokerError),
    /// The session, with the new subscription, could not be saved.
    #[error("the session was not saved")]
    Save(#[source] BrokerError),
    /// Another connection resumed the session meanwhile: this one closes.
    #[error("the session was resumed by another connection")]
    TakenOver,
}

impl SubscribeError {
    /// The `err` the client hears of it, about `topic` (for a command, with
    /// its id): `unavailable` unless the broker knew better.
    pub(super) fn to_command(&self, origin: Origin, topic: &Topic) -> CommandError {
        let id = origin.id();
        let e = match self {
            Self::NoTurn(refused) => {
                CommandError::new(id, ErrorCode::Unavailable, refused.to_string())
            }
            Self::Watch(e) | Self::Recover(e) | Self::Save(e) => broker_error(id, e),
            Self::TakenOver => CommandError::new(
                id,
                ErrorCode::Unavailable,
                "the session was resumed by another connection",
            ),
        };
        e.about(topic.as_str())
    }
}

/// A connection joining a topic: the hub holds aside what arrives for it
/// while the handshake reads the topic's position and history. Dropped
/// before [`go_live`](Self::go_live) (or [`keep`](Self::keep)), it leaves
/// the topic.
#[must_use = "dropped, it leaves the topic at once"]
pub(super) struct Joining {
    node: Arc<Pod>,
    topic: Topic,
    conn: ConnId,
    /// The topic's broker watch on this pod, made by whoever gets there
    /// first.
    watched: Arc<OnceCell<()>>,
    /// Whether a drop leaves: until live, or kept.
    leaves: bool,
}

impl Joining {
    /// Joins `session`'s connection to `topic` as a buffering subscriber.
    ///
    /// `info`: its presence `info` in this topic, where a subscribe proxy
    /// gave one (else its claims'). `delta`: sent deltas (granted).
    pub(super) fn join(session: &Session, topic: Topic, info: Option<Bytes>, delta: bool) -> Self {
        let node = session.node.clone();
        let (out, subscriptions) = (session.out.clone(), session.subscriptions.clone());
        // The namespace's lag policy, else the connection's overflow rule.
        let on_lag = node.namespaces.get(&topic).and_then(|ns| ns.on_lag());
        let joined = node
            .hub
            .join_as(&topic, session.conn, out, subscriptions, on_lag, delta);
        // Every origin counts: a command's, a restore's.
        node.presence.enter(&topic, session.conn, || {
            let mut who = session.who();
            if info.is_some() {
                who.info = info;
            }
            who
        });
        Self {
            node,
            topic,
            conn: session.conn,
            watched: joined.watched,
            leaves: true,
        }
    }

    pub(super) fn topic(&self) -> &Topic {
        &self.topic
    }

    /// Has the broker deliver the topic to this pod, unless a subscriber
    /// here did already.
    pub(super) async fn watch(&self) -> Result<(), BrokerError> {
        let broker = &self.node.broker;
        let topic = &self.topic;
        self.watched
            .get_or_try_init(|| broker.watch(topic))
            .await
            .map(|_| ())
    }

    /// Drops what the hub held aside, and holds aside from now: the replay
    /// starts over from a position it reads after this.
    pub(super) fn hold_again(&self) {
        self.node.hub.hold_again(&self.topic, self.conn);
    }

    /// Goes live after `position` (what the replay sent): the hub queues
    /// what it held aside past it, then delivers directly. Given back when
    /// more arrived meanwhile than could be held: the replay reads on from
    /// history, and tries again.
    pub(super) fn go_live(mut self, position: &Position) -> Result<(), Self> {
        if !self.node.hub.go_live(&self.topic, self.conn, position) {
            return Err(self);
        }
        self.leaves = false;
        Ok(())
    }

    /// The connection closes before the replay is done: the subscription,
    /// recorded, stays joined until [`Session::end`] leaves every topic the
    /// session has (so a late ack is still checked against what the hub
    /// sent).
    pub(super) fn keep(mut self) {
        self.leaves = false;
    }
}

impl Drop for Joining {
    fn drop(&mut self) {
        if self.leaves {
            leave_now(&self.node, self.topic.clone(), self.conn);
        }
    }
}

/// Removes `conn` from `topic` without waiting: the last subscriber out
/// releases the broker's watch in a task of its own (watches are counted,
/// so a release that lands after a new watch of the topic undoes only its
/// own).
pub(super) fn leave_now(node: &Pod, topic: Topic, conn: ConnId) {
    node.presence.exit(&topic, conn);
    if node.hub.leave(&topic, conn) {
        let broker = node.broker.clone();
        // Dropped with its runtime, there is nothing to unwatch.
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move { broker.unwatch(&topic).await });
        }
    }
}

impl Session {
    /// Who this connection is in a topic's presence: its token's user and
    /// `info`, or anonymous.
    pub(super) fn who(&self) -> Who {
        match &self.claims {
            Some(claims) => Who {
                user: Some(claims.user.clone()),
                info: claims.info.clone(),
            },
            None => Who {
                user: None,
                info: None,
            },
        }
    }

    /// The subscribe handshake (see the [module](self)): live delivery
    /// first (held aside), then the topic's position and history, then what
    /// was held aside beyond it. With `since`, the replay waits for its turn
    /// first ([`Replays`](super::Replays)), and streams at the pace the
    /// client reads. Failed, it has left the topic and recorded nothing.
    pub(super) async fn subscribe(
        &mut self,
        origin: Origin,
        topic: Topic,
        since: Option<Since>,
    ) -> Result<(), SubscribeError> {
        self.subscribe_approved(origin, topic, since, SubscribeReply::default(), false)
            .await
    }

    /// [`subscribe`](Self::subscribe), with what a subscribe proxy said:
    /// the member's `info` in the topic's presence, and `data` for the
    /// client's `ok`; `delta`: deltas asked for (a client's `sub`, or a
    /// resumed subscription that was granted them), granted where the
    /// topic's namespace has them (the `ok` says so).
    pub(super) async fn subscribe_approved(
        &mut self,
        origin: Origin,
        topic: Topic,
        since: Option<Since>,
        approved: SubscribeReply,
        delta: bool,
    ) -> Result<(), SubscribeError> {
        let node = self.node.clone();
        // Asked for where the namespace has them (still: a resume's); else
        // ignored.
        let delta = delta && node.namespaces.get(&topic).is_some_and(|ns| ns.delta);
        // 1. Before anything is held aside or read for it.
        let _turn = match since {
            Some(_) => Some(
                node.replays
                    .turn(&self.out)
                    .await
                    .map_err(SubscribeError::NoTurn)?,
            ),
            None => None,
        };
        // 2. From here on, `?` leaves the topic.
        let joining = Joining::join(self, topic.clone(), approved.info, delta);
        // 3.
        joining.watch().await.map_err(SubscribeError::Watch)?;
        let recovery = node
            .broker
            .recover(&topic, since.clone(), node.replays.page())
            .await
            .map_err(SubscribeError::Recover)?;
        let position = recovery.position.clone();
        if since.is_some() {
            let label = if recovery.recovered { "true" } else { "false" };
            node.metrics.replays.with_label_values(&[label]).inc();
        }
        let restored = origin == Origin::Restored;
        let start = match &since {
            Some(since) if recovery.recovered => since.seq,
            // A restored subscription not recovered starts at its `reset`,
            // which may be where the topic's new epoch began, all of that
            // epoch following; a client's own `sub` at the topic's seq, as
            // its `ok` says.
            _ if restored => recovery.restart,
            _ => position.seq,
        };
        let first = if recovery.recovered || restored {
            recovery.publications
        } else {
            Vec::new()
        };
        // 4. A restored subscription is sent `reset` where continuity was
        // lost, and again where it was told of one before and never acked
        // in its epoch (it may not have read it): a client that had it
        // carries on (a reset at or below what it processed in its epoch).
        let tell = restored && (!recovery.recovered || self.subscriptions.is_told(&topic));
        // Before going live: a reset among the held frames moves it on.
        if tell {
            self.subscriptions.told(&topic, &position.epoch, start);
        } else {
            // A restored subscription is still whoever's made it: the
            // server's is kept at the next resume whatever the token grants.
            let server = origin.by_server() || restored && self.subscriptions.is_server(&topic);
            self.subscriptions
                .insert(topic.clone(), position.epoch.clone(), start, server, delta);
        }
        // 5.
        match origin {
            Origin::Command(_) if self.out.format() == Format::Sse => {
                self.sse_subscribed(
                    &topic,
                    &position,
                    start,
                    since.is_some(),
                    recovery.recovered,
                )
                .await;
            }
            Origin::Command(id) => {
                if let Err(e) = self.store_subscriptions().await {
                    self.subscriptions.remove(&topic);
                    return Err(e);
                }
                self.reply(ServerMessage::Ok {
                    id,
                    topic: Some(topic.as_str()),
                    seq: Some(position.seq),
                    epoch: Some(&position.epoch),
                    recovered: since.as_ref().map(|_| recovery.recovered),
                    expires: None,
                    data: approved.data.as_deref(),
                    delta: delta.then_some(true),
                })
                .await;
            }
            Origin::Server | Origin::Token => {
                if let Err(e) = self.store_subscriptions().await {
                    self.subscriptions.remove(&topic);
                    return Err(e);
                }
                self.reply(ServerMessage::Subscribed {
                    topic: topic.as_str(),
                    seq: position.seq,
                    epoch: &position.epoch,
                    recovered: since.as_ref().map(|_| recovery.recovered),
                    reason: if origin == Origin::Server {
                        "server"
                    } else {
                        "token"
                    },
                })
                .await;
            }
            Origin::Restored if tell => {
                self.reply(ServerMessage::Reset {
                    topic: topic.as_str(),
                    epoch: &position.epoch,
                    seq: start,
                })
                .await;
            }
            Origin::Restored => {}
        }
        // 6.
        self.replay(joining, first, start, &position).await;
        Ok(())
    }

    /// With a shared store, saves the session's subscriptions before the
    /// client hears `ok` for a new one: a resume elsewhere right after (the
    /// client moved, or lost its connection before the next flush) must
    /// find it, or the client would wait for messages of a topic the resumed
    /// session does not have. Not needed with the memory store: a resume on
    /// the pod takes the live session over.
    async fn store_subscriptions(&self) -> Result<(), SubscribeError> {
        let Some(id) = self.id.as_deref() else {
            return Ok(());
        };
        if self.node.config.broker == BrokerKind::Memory {
            return Ok(());
        }
        match self.save_now(id).await {
            Ok(true) => Ok(()),
            Ok(false) => {
                // Resumed by another connection meanwhile: this one is over.
                self.out.close(CloseReason::TakenOver, true);
                Err(SubscribeError::TakenOver)
            }
            Err(e) => Err(SubscribeError::Save(e)),
        }
    }

    /// Removes this connection from a topic; the last local subscriber
    /// releases the broker's watch.
    pub(super) async fn leave(&self, topic: &Topic) {
        self.node.presence.exit(topic, self.conn);
        if self.node.hub.leave(topic, self.conn) {
            self.node.broker.unwatch(topic).await;
        }
    }
}
