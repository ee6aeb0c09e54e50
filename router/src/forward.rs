//! Commands posted for a session (HTTP-streaming's `POST /stream/<session>`,
//! issue #25) on a pod that does not hold it: handed to every pod
//! ([`crate::Broker::forward`]) and run by the one that does
//! ([`crate::Deliver::forward`]), so that no load balancer needs sticky
//! sessions.

use bytes::Bytes;

/// Commands for one session, in the order they were posted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Forward {
    /// The session's key: a digest of its id, which is a credential (an
    /// anonymous session's only one) and so never leaves the pod. One word
    /// of hex digits.
    pub session: String,
    /// The user the poster proved to be (`None`: anonymous): the holder
    /// runs the commands only on a session of that user's.
    pub user: Option<String>,
    /// The commands, one JSON text each, without a newline (the poster
    /// split its body at them).
    pub commands: Vec<Bytes>,
}
