//! What can go wrong, typed: the server's `err` codes, the close codes that
//! say "do not come back", and failures on this side.

use std::fmt;

/// The `code` of a server `err` (docs/protocol.md, "Error codes").
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorCode {
    Malformed,
    UnknownOp,
    MissingField,
    BadTopic,
    UnknownNamespace,
    Forbidden,
    Unauthorized,
    TokenExpired,
    RateLimited,
    NotSubscribed,
    AlreadySubscribed,
    TooManySubscriptions,
    /// The broker cannot take the request now: the client retries a `sub`.
    Unavailable,
    Internal,
    /// The namespace has no presence ([`crate::Client::presence`]).
    Disabled,
    /// [`crate::Client::history`] from a `since` out of the kept window or
    /// of another epoch: nothing partial is answered.
    HistoryLost,
    /// A code this client does not know (a newer server).
    Other(String),
}

impl ErrorCode {
    /// The code as the server spells it.
    pub fn parse(code: &str) -> Self {
        match code {
            "malformed" => Self::Malformed,
            "unknown_op" => Self::UnknownOp,
            "missing_field" => Self::MissingField,
            "bad_topic" => Self::BadTopic,
            "unknown_namespace" => Self::UnknownNamespace,
            "forbidden" => Self::Forbidden,
            "unauthorized" => Self::Unauthorized,
            "token_expired" => Self::TokenExpired,
            "rate_limited" => Self::RateLimited,
            "not_subscribed" => Self::NotSubscribed,
            "already_subscribed" => Self::AlreadySubscribed,
            "too_many_subscriptions" => Self::TooManySubscriptions,
            "unavailable" => Self::Unavailable,
            "internal" => Self::Internal,
            "disabled" => Self::Disabled,
            "history_lost" => Self::HistoryLost,
            other => Self::Other(other.to_owned()),
        }
    }

    pub fn as_str(&self) -> &str {
        match self {
            Self::Malformed => "malformed",
            Self::UnknownOp => "unknown_op",
            Self::MissingField => "missing_field",
            Self::BadTopic => "bad_topic",
            Self::UnknownNamespace => "unknown_namespace",
            Self::Forbidden => "forbidden",
            Self::Unauthorized => "unauthorized",
            Self::TokenExpired => "token_expired",
            Self::RateLimited => "rate_limited",
            Self::NotSubscribed => "not_subscribed",
            Self::AlreadySubscribed => "already_subscribed",
            Self::TooManySubscriptions => "too_many_subscriptions",
            Self::Unavailable => "unavailable",
            Self::Internal => "internal",
            Self::Disabled => "disabled",
            Self::HistoryLost => "history_lost",
            Self::Other(code) => code,
        }
    }

    /// Worth trying again later: the server was busy, not the request wrong.
    pub fn is_transient(&self) -> bool {
        matches!(self, Self::Unavailable | Self::RateLimited)
    }
}

impl fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A client error. Those that end the client ([`Error::is_terminal`]) are
/// the last event of the stream.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// No valid token (an `err` `unauthorized`, close 4502, or a `refresh`
    /// refused as another user's): the client stops; a new token provider
    /// is needed, not a retry.
    #[error("unauthorized: {0}")]
    Unauthorized(String),
    /// The server closed the connection with a code that says "do not
    /// reconnect" (1002, 1003, 1007-1010, 4500-4999).
    #[error("closed by the server with {code} (terminal){}", reason_suffix(.reason))]
    Closed { code: u16, reason: String },
    /// An `err` reply. `topic` names the subscription it was about, when
    /// the client knows it (a refused `sub`, say).
    #[error("{code}: {message}{}", topic.as_deref().map(|t| format!(" (topic {t})")).unwrap_or_default())]
    Server {
        code: ErrorCode,
        message: String,
        topic: Option<String>,
    },
    /// A connection attempt failed; the client backs off and tries again.
    #[error("connecting to {url}: {reason}")]
    Connect {
        url: String,
        reason: String,
        /// Nothing listened there (the pod is gone).
        refused: bool,
    },
    /// The token provider failed; the client backs off and asks again.
    #[error("token provider: {0}")]
    Token(String),
    /// A frame the client could not read (it is skipped).
    #[error("unreadable server frame ({reason}): {frame}")]
    Protocol { reason: String, frame: String },
    /// The connection ended before the reply to a `pub` or an `rpc` came: it
    /// may or may not have been published (or run by the backend). (For
    /// `presence` and `history`: ask again.)
    #[error("the connection ended before the reply")]
    ConnectionLost,
    /// `data` to publish (or for `hello`, `rpc`) that is not JSON.
    #[error("data is not JSON: {0}")]
    Data(String),
    /// A URL the client cannot use (only `ws://` is supported).
    #[error("bad url {url}: {reason}")]
    Url { url: String, reason: String },
    /// The client has stopped (closed, or after a terminal error).
    #[error("the client has stopped")]
    Stopped,
}

fn reason_suffix(reason: &str) -> String {
    if reason.is_empty() {
        String::new()
    } else {
        format!(": {reason}")
    }
}

impl Error {
    /// Whether the client stops after this error (no reconnect).
    pub fn is_terminal(&self) -> bool {
        matches!(
            self,
            Self::Unauthorized(_) | Self::Closed { .. } | Self::Stopped | Self::Url { .. }
        )
    }
}

/// Whether a close code asks the client to come back: Herald's 4000-4499,
/// 1012 (draining), and anything a proxy may send (1000, 1001, 1006, 1011).
/// 1002, 1003, 1007-1010 (this client broke the protocol, or sent too much)
/// and 4500-4999 mean "not without changing something".
pub fn reconnects_after(code: u16) -> bool {
    !matches!(code, 1002 | 1003 | 1007..=1010 | 4500..=4999)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn close_codes_split_into_reconnect_and_terminal() {
        for code in [
            1000, 1001, 1006, 1011, 1012, 4000, 4001, 4002, 4003, 4004, 4499,
        ] {
            assert!(reconnects_after(code), "{code}");
        }
        for code in [
            1002, 1003, 1007, 1008, 1009, 4500, 4501, 4502, 4503, 4504, 4999,
        ] {
            assert!(!reconnects_after(code), "{code}");
        }
    }

    #[test]
    fn codes_read_back_as_written() {
        for code in [
            "malformed",
            "unknown_op",
            "bad_topic",
            "forbidden",
            "unauthorized",
            "token_expired",
            "unavailable",
            "disabled",
            "history_lost",
            "something_new",
        ] {
            assert_eq!(ErrorCode::parse(code).as_str(), code);
        }
        assert_eq!(ErrorCode::parse("history_lost"), ErrorCode::HistoryLost);
        assert_eq!(ErrorCode::parse("disabled"), ErrorCode::Disabled);
        assert!(ErrorCode::parse("unavailable").is_transient());
        assert!(!ErrorCode::parse("forbidden").is_transient());
    }
}
