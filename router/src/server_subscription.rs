//! Server-side subscriptions: a backend subscribes (or unsubscribes) every
//! live connection of a user, on every pod ([`crate::Broker::subscription`]
//! carries the command there, [`crate::Deliver::subscription`] hands it to
//! the pod's sessions).

use crate::{Since, Topic};

/// What a backend asks of every live connection of one user.
#[derive(Debug, Clone)]
pub enum ServerSubscription {
    /// Subscribe the connection, replaying from `since` where given (the
    /// same rule as a client's `sub` with `since`).
    Subscribe { topic: Topic, since: Option<Since> },
    /// Unsubscribe the connection from `topic`.
    Unsubscribe { topic: Topic },
}

impl ServerSubscription {
    /// The topic it is about.
    pub fn topic(&self) -> &Topic {
        match self {
            Self::Subscribe { topic, .. } | Self::Unsubscribe { topic } => topic,
        }
    }
}
