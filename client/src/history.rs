//! What [`Client::history`] asks for ([`HistoryQuery`]) and the page it
//! answers with ([`HistoryPage`] of [`Publication`]s). Its own module: the
//! one request whose question and answer are types of their own.
//!
//! [`Client::history`]: crate::Client::history

use crate::Data;

/// What [`Client::history`] asks for (all optional: the first page, oldest
/// first, of the server's default size).
///
/// [`Client::history`]: crate::Client::history
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HistoryQuery {
    /// Forward: the messages after this seq (default: from the oldest
    /// kept). Reverse: those below it (default: from the newest).
    pub since: Option<u64>,
    /// The epoch `since` is of; another epoch's is `history_lost`.
    pub epoch: Option<String>,
    /// At most this many (default 100, at most the server's
    /// `history.max_limit`); 0: the topic's position only.
    pub limit: Option<u32>,
    /// Newest first.
    pub reverse: bool,
}

/// One kept message in a [`HistoryPage`].
#[derive(Debug, Clone)]
pub struct Publication {
    pub seq: u64,
    /// The publisher's JSON, or binary data, byte for byte.
    pub data: Data,
}

/// The answer to [`Client::history`]: kept messages and the topic's
/// position (`epoch`, `seq`).
///
/// [`Client::history`]: crate::Client::history
#[derive(Debug, Clone)]
pub struct HistoryPage {
    pub topic: String,
    pub epoch: String,
    pub seq: u64,
    /// In the order asked for; page on with the last one's seq as `since`.
    pub publications: Vec<Publication>,
}
