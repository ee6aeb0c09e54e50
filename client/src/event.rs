//! What the application reads from [`crate::Events`].

use std::sync::Arc;
use std::time::Duration;

use crate::{Applied, Data, Error};

/// One thing that happened, in the order it happened.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum Event {
    /// A message, at most once per (topic, epoch, seq) and in seq order
    /// within an epoch.
    Message(Message),
    /// A `sub` was answered: the subscription continues after `seq` in
    /// `epoch`. `recovered` is `None` for a subscription without `since`,
    /// `Some(true)` when the history bridged the gap from the position asked
    /// for (or the one the client had), `Some(false)` when it could not:
    /// resync the topic from its source, then carry on from here.
    Subscribed {
        topic: Arc<str>,
        epoch: Arc<str>,
        seq: u64,
        recovered: Option<bool>,
        /// Deltas asked for ([`crate::SubscribeOptions::delta`]) and
        /// granted (the namespace has them).
        delta: bool,
    },
    /// Continuity lost for good (history gone, or Redis lost the topic):
    /// resync the topic, then carry on live after `seq` in `epoch`.
    Reset {
        topic: Arc<str>,
        epoch: Arc<str>,
        seq: u64,
    },
    /// The connection's state changed.
    State(State),
    /// Something failed. After a terminal one ([`Error::is_terminal`]) the
    /// stream ends; the others are for information (the client carries on).
    Error(Error),
    /// The server subscribed this connection on its own: a backend's
    /// `POST /v1/subscribe` ([`Origin::Server`]) or the token's `topics`
    /// ([`Origin::Token`]). The topic is the client's subscription from now
    /// on (messages, acks, resumes), as if [`crate::Client::subscribe`] had
    /// made it. `recovered` as in [`Event::Subscribed`] (a backend's
    /// `since`).
    ServerSubscribed {
        topic: Arc<str>,
        epoch: Arc<str>,
        seq: u64,
        recovered: Option<bool>,
        origin: Origin,
    },
    /// The server ended a subscription (`reason`: `server`, a backend's
    /// `POST /v1/unsubscribe`): no more messages of the topic.
    Unsubscribed { topic: Arc<str>, reason: String },
    /// The members of a topic tracked with
    /// [`crate::Client::track_presence`] changed. After each (re)load of
    /// every page, `loaded` is true and `change` holds what differs from
    /// what was told before (every member, the first time); then each
    /// `presence_diff` merged. Applying the joins and leaves in order gives
    /// the members.
    Presence {
        topic: Arc<str>,
        change: Applied,
        loaded: bool,
        /// The topic's presence position and counts after the change.
        position: u64,
        users: u64,
        connections: u64,
    },
    /// A `msg` dropped by the seq rule (a redelivery after a resume), only
    /// with [`crate::Builder::report_dropped`]: for load tools and tests
    /// that count what the wire brought.
    Dropped {
        topic: Arc<str>,
        epoch: Arc<str>,
        seq: u64,
    },
}

/// Who made a subscription the client did not ask for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Origin {
    /// A backend, through the HTTP or gRPC API.
    Server,
    /// The token's `topics` claim, at `hello`.
    Token,
}

/// A message of a topic.
#[derive(Debug, Clone)]
pub struct Message {
    pub topic: Arc<str>,
    pub epoch: Arc<str>,
    pub seq: u64,
    /// The publisher's JSON, or binary data, byte for byte; whole even
    /// where it travelled as a delta.
    pub data: Data,
}

/// The connection's life.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum State {
    /// Attempt `attempt` (from 1 after each connection) to reach `url`.
    Connecting { url: String, attempt: u32 },
    /// A new session began. `resume_refused` says why, when the client
    /// asked to resume one (`not_found`, `other_user`): the client
    /// subscribes again with `since`.
    Connected {
        url: String,
        session: String,
        resume_refused: Option<String>,
    },
    /// The session was resumed: every subscription is back, and the server
    /// replays what was not acked.
    Resumed { url: String, session: String },
    /// The connection ended; unless the next event is a terminal error, the
    /// client comes back (after `advice`'s delay, or a backoff).
    Disconnected {
        url: String,
        /// The server's close code, if it sent one.
        close: Option<u16>,
        /// The server's `reconnect` advice, if it gave one.
        advice: Option<Advice>,
        cause: Cause,
    },
}

/// The server's `reconnect` advice: come back (to any pod) after `after`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Advice {
    pub after: Duration,
    /// `draining`, `rebalance`.
    pub reason: String,
}

/// Why a connection ended.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Cause {
    /// The server closed it (see `close`).
    Closed,
    /// It broke, without a close frame.
    Lost(String),
    /// Nothing came for the server's ping interval and the grace after it:
    /// taken for dead.
    Silent,
    /// The application cut it ([`crate::Client::cut`]).
    Cut,
}
