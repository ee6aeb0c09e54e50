//! What a client logs and hands back: each topic's stream as it came
//! ([`Log`] of [`Event`]s) and the client's [`Record`]. Its own module:
//! these are what [`check`](super::super::check) and the result read after
//! the run, apart from the client that fills them.

use std::sync::Arc;

/// One entry of a topic's stream, `at` in ms from the run's start.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// An `ok` to a `sub`: the stream goes on after `seq` in `epoch`
    /// (`recovered`: a `sub` with `since` that the history bridged).
    Start {
        epoch: Arc<str>,
        seq: u64,
        recovered: bool,
        at: u32,
    },
    /// A `msg`; `id` is the publish id in its data (`None`: none there).
    Msg { seq: u64, id: Option<u64>, at: u32 },
    /// A `reset`: continuity lost, live again after `seq` in `epoch`.
    Reset { epoch: Arc<str>, seq: u64, at: u32 },
    /// The connection was lost (`cut`: by the client itself).
    Gone { cut: bool, at: u32 },
    /// A `welcome` on a new connection to pod `gateway`.
    Welcome {
        gateway: usize,
        resumed: bool,
        at: u32,
    },
}

/// A topic's stream as one client saw it.
#[derive(Debug, Clone)]
pub struct Log {
    pub topic: usize,
    pub events: Vec<Event>,
}

/// What one client did and saw.
#[derive(Debug)]
pub struct Record {
    pub client: usize,
    /// The session it held last.
    pub session: String,
    pub logs: Vec<Log>,
    /// Connections lost, its own cuts included.
    pub lost: u32,
    /// Its own cuts.
    pub cuts: u32,
    pub resumes: u32,
    pub attempts: u32,
    /// Why reconnect attempts failed.
    pub attempt_errors: Vec<String>,
    /// `welcome` with `resumed: false` (and why): the session was gone.
    pub sessions_lost: Vec<String>,
    pub unexpected: u64,
    pub unexpected_kept: Vec<String>,
    /// Why it stopped early, if it did.
    pub failure: Option<String>,
}
