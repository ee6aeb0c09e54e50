//! Where a subscription starts ([`Since`]) and what it asks for
//! ([`SubscribeOptions`]), as [`Client::subscribe`] and
//! [`Client::subscribe_with`] take them. Its own module: a subscription's
//! start, apart from the handle that asks for it.
//!
//! [`Client::subscribe`]: crate::Client::subscribe
//! [`Client::subscribe_with`]: crate::Client::subscribe_with

/// Where a subscription starts: after `seq` (of `epoch`, when known).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Since {
    pub seq: u64,
    pub epoch: Option<String>,
}

impl Since {
    /// After `seq` of `epoch` (from a [`Message`] or [`Event::Subscribed`]).
    ///
    /// [`Message`]: crate::Message
    /// [`Event::Subscribed`]: crate::Event::Subscribed
    pub fn at(seq: u64, epoch: impl Into<String>) -> Self {
        Self {
            seq,
            epoch: Some(epoch.into()),
        }
    }
}

impl From<u64> for Since {
    /// After `seq` of the topic's current epoch.
    fn from(seq: u64) -> Self {
        Self { seq, epoch: None }
    }
}

/// How a subscription starts and what it asks for (all optional).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SubscribeOptions {
    /// Start after this position (replayed from the history if it still
    /// holds it); see [`Client::subscribe`].
    ///
    /// [`Client::subscribe`]: crate::Client::subscribe
    pub since: Option<Since>,
    /// Ask for deltas: on a namespace with `delta = true` the server sends
    /// a message as a Fossil delta against the previous one where it can
    /// (the client applies it: [`Message::data`] is always whole);
    /// [`Event::Subscribed`]'s `delta` says whether it granted them.
    /// Elsewhere nothing changes.
    ///
    /// [`Message::data`]: crate::Message::data
    /// [`Event::Subscribed`]: crate::Event::Subscribed
    pub delta: bool,
}

impl From<Option<Since>> for SubscribeOptions {
    fn from(since: Option<Since>) -> Self {
        Self {
            since,
            delta: false,
        }
    }
}
