//! Why a connection ended, and the close code that tells the client.
//!
//! Herald's own codes are split in two ranges, so that a client library can
//! decide without knowing every code:
//!
//! | code | range | meaning |
//! |------|-------|---------|
//! | 4000 | reconnect | slow consumer: the outgoing queue overflowed or a write timed out |
//! | 4001 | reconnect | no frame from the client for `ping_interval + pong_timeout` |
//! | 4002 | reconnect | rebalancing: this pod holds more than its share; come back (to any pod) after `reconnect.after_ms` |
//! | 4003 | reconnect | the session could not be restored now (the store or broker is unavailable); resume again after a backoff |
//! | 4004 | reconnect | the token expired (no `refresh` in time, or it had expired at `hello`): get a new token, then resume |
//! | 4005 | reconnect | no command within `websocket.hello_timeout` of the upgrade |
//! | 4500 | do not reconnect | too many bad commands in a row |
//! | 4501 | do not reconnect | session taken over by a newer connection that resumed it |
//! | 4502 | do not reconnect | no valid token where one is required |
//! | 4503 | do not reconnect | a backend ended the user's access (`/v1/disconnect`) |
//! | 4504 | do not reconnect | commands kept coming over the rate limit |
//!
//! 4000-4499 mean "come back (with `resume`) after a backoff"; 4500-4999 mean
//! "do not retry without changing something". Standard codes are used where
//! RFC 6455 has one: 1002, 1003, 1007, 1009, 1008 (policy violation) for a
//! message that took longer than `websocket.message_timeout` to arrive, and
//! 1012 for a pod that is draining.

/// Herald's close codes; see the module docs.
pub mod code {
    pub const PROTOCOL_ERROR: u16 = 1002;
    pub const UNSUPPORTED_DATA: u16 = 1003;
    pub const INVALID_PAYLOAD: u16 = 1007;
    pub const POLICY_VIOLATION: u16 = 1008;
    pub const MESSAGE_TOO_BIG: u16 = 1009;
    pub const SERVICE_RESTART: u16 = 1012;
    pub const SLOW_CONSUMER: u16 = 4000;
    pub const DEAD_PEER: u16 = 4001;
    pub const REBALANCE: u16 = 4002;
    pub const UNAVAILABLE: u16 = 4003;
    pub const TOKEN_EXPIRED: u16 = 4004;
    pub const HELLO_TIMEOUT: u16 = 4005;
    pub const BAD_COMMANDS: u16 = 4500;
    pub const TAKEN_OVER: u16 = 4501;
    pub const UNAUTHORIZED: u16 = 4502;
    pub const DISCONNECTED: u16 = 4503;
    pub const RATE_LIMITED: u16 = 4504;
}

/// Why a connection ended. Each reason is one metric label value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CloseReason {
    /// The client sent a close frame.
    ClientClosed,
    /// The TCP connection ended or failed without a close handshake.
    ConnectionLost,
    /// A frame broke RFC 6455 (unmasked, bad fragmentation, reserved bits...).
    ProtocolError,
    /// A binary message: the JSON protocol speaks text only.
    UnsupportedData,
    /// A text message that is not UTF-8.
    InvalidUtf8,
    /// A message over `websocket.max_message_bytes`.
    MessageTooBig,
    /// A message that did not arrive whole within `websocket.message_timeout`
    /// of its first byte.
    MessageTimeout,
    /// The outgoing queue overflowed.
    SlowConsumer,
    /// A write did not finish within `websocket.write_timeout`.
    WriteTimeout,
    /// Nothing arrived for `ping_interval + pong_timeout`.
    DeadPeer,
    /// Too many bad commands in a row.
    BadCommands,
    /// Another connection resumed this session.
    TakenOver,
    /// The pod holds more than its share of the cluster's connections.
    Rebalance,
    /// The pod is draining.
    Shutdown,
    /// A resume could not be completed now: the session store or the
    /// broker did not answer. The stored session is left as it was.
    Unavailable,
    /// The connection's token expired without a `refresh`.
    TokenExpired,
    /// No command within `websocket.hello_timeout` of the upgrade.
    HelloTimeout,
    /// No valid token where one is required.
    Unauthorized,
    /// A backend ended the user's access; the session is gone with it.
    Disconnected,
    /// Commands kept coming over `websocket.commands_per_second`.
    RateLimited,
}

impl CloseReason {
    pub const ALL: [CloseReason; 20] = [
        CloseReason::ClientClosed,
        CloseReason::ConnectionLost,
        CloseReason::ProtocolError,
        CloseReason::UnsupportedData,
        CloseReason::InvalidUtf8,
        CloseReason::MessageTooBig,
        CloseReason::MessageTimeout,
        CloseReason::SlowConsumer,
        CloseReason::WriteTimeout,
        CloseReason::DeadPeer,
        CloseReason::BadCommands,
        CloseReason::TakenOver,
        CloseReason::Rebalance,
        CloseReason::Shutdown,
        CloseReason::Unavailable,
        CloseReason::TokenExpired,
        CloseReason::HelloTimeout,
        CloseReason::Unauthorized,
        CloseReason::Disconnected,
        CloseReason::RateLimited,
    ];

    /// Whether a connection that ended so keeps its users in the presence
    /// of its topics for its session's resume window: the client is
    /// expected to resume (a lost connection, a reconnect code, a drain, a
    /// takeover by the connection that resumes it). A close from the
    /// client, or one that tells it not to come back, leaves at once.
    pub fn stays_present(self) -> bool {
        match self {
            CloseReason::ConnectionLost | CloseReason::Shutdown | CloseReason::TakenOver => true,
            CloseReason::ClientClosed | CloseReason::Disconnected => false,
            reason => reason
                .code()
                .is_some_and(|code| (4000..4500).contains(&code)),
        }
    }

    /// The close code the server sends, if it sends one.
    pub fn code(self) -> Option<u16> {
        Some(match self {
            CloseReason::ClientClosed | CloseReason::ConnectionLost => return None,
            CloseReason::ProtocolError => code::PROTOCOL_ERROR,
            CloseReason::UnsupportedData => code::UNSUPPORTED_DATA,
            CloseReason::InvalidUtf8 => code::INVALID_PAYLOAD,
            CloseReason::MessageTooBig => code::MESSAGE_TOO_BIG,
            CloseReason::MessageTimeout => code::POLICY_VIOLATION,
            CloseReason::SlowConsumer | CloseReason::WriteTimeout => code::SLOW_CONSUMER,
            CloseReason::DeadPeer => code::DEAD_PEER,
            CloseReason::BadCommands => code::BAD_COMMANDS,
            CloseReason::TakenOver => code::TAKEN_OVER,
            CloseReason::Rebalance => code::REBALANCE,
            CloseReason::Shutdown => code::SERVICE_RESTART,
            CloseReason::Unavailable => code::UNAVAILABLE,
            CloseReason::TokenExpired => code::TOKEN_EXPIRED,
            CloseReason::HelloTimeout => code::HELLO_TIMEOUT,
            CloseReason::Unauthorized => code::UNAUTHORIZED,
            CloseReason::Disconnected => code::DISCONNECTED,
            CloseReason::RateLimited => code::RATE_LIMITED,
        })
    }

    /// The metric label and log field.
    pub fn as_str(self) -> &'static str {
        match self {
            CloseReason::ClientClosed => "client_closed",
            CloseReason::ConnectionLost => "connection_lost",
            CloseReason::ProtocolError => "protocol_error",
            CloseReason::UnsupportedData => "unsupported_data",
            CloseReason::InvalidUtf8 => "invalid_utf8",
            CloseReason::MessageTooBig => "message_too_big",
            CloseReason::MessageTimeout => "message_timeout",
            CloseReason::SlowConsumer => "slow_consumer",
            CloseReason::WriteTimeout => "write_timeout",
            CloseReason::DeadPeer => "dead_peer",
            CloseReason::BadCommands => "bad_commands",
            CloseReason::TakenOver => "taken_over",
            CloseReason::Rebalance => "rebalance",
            CloseReason::Shutdown => "shutdown",
            CloseReason::Unavailable => "unavailable",
            CloseReason::TokenExpired => "token_expired",
            CloseReason::HelloTimeout => "hello_timeout",
            CloseReason::Unauthorized => "unauthorized",
            CloseReason::Disconnected => "disconnected",
            CloseReason::RateLimited => "rate_limited",
        }
    }

    /// The reason text sent in the close frame.
    pub fn text(self) -> &'static str {
        match self {
            CloseReason::SlowConsumer => "slow consumer",
            CloseReason::WriteTimeout => "write timeout",
            CloseReason::DeadPeer => "no pong",
            CloseReason::BadCommands => "too many bad commands",
            CloseReason::TakenOver => "session resumed elsewhere",
            CloseReason::Rebalance => "rebalancing",
            CloseReason::Shutdown => "pod draining",
            CloseReason::Unavailable => "try again",
            CloseReason::TokenExpired => "token expired",
            CloseReason::HelloTimeout => "no hello",
            CloseReason::Unauthorized => "unauthorized",
            CloseReason::Disconnected => "disconnected by the server",
            CloseReason::RateLimited => "rate limited",
            CloseReason::MessageTooBig => "message too big",
            CloseReason::MessageTimeout => "message too slow",
            CloseReason::InvalidUtf8 => "invalid utf-8",
            CloseReason::UnsupportedData => "text frames only",
            _ => "",
        }
    }

    /// Whether the server waits for the client's close frame after sending its
    /// own. Not after a broken frame (the stream cannot be read any more),
    /// when the client is not reading, or when the session's reader has
    /// already stopped (a takeover, where a resume waits for this one to end).
    pub fn lingers(self) -> bool {
        matches!(
            self,
            CloseReason::BadCommands
                | CloseReason::Rebalance
                | CloseReason::Shutdown
                | CloseReason::Unavailable
                | CloseReason::TokenExpired
                | CloseReason::HelloTimeout
                | CloseReason::Unauthorized
                | CloseReason::Disconnected
                | CloseReason::RateLimited
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_reason_has_a_label_of_its_own_which_the_metrics_catalogue_explains() {
        let catalogue = include_str!("../../docs/metrics.md");
        let mut labels = std::collections::BTreeSet::new();
        for reason in CloseReason::ALL {
            let label = reason.as_str();
            assert!(labels.insert(label), "`{label}` labels two reasons");
            let row = match reason.code() {
                Some(code) => format!("| `{label}` | {code} |"),
                None => format!("| `{label}` |"),
            };
            assert!(catalogue.contains(&row), "docs/metrics.md has no `{row}`");
        }
    }

    #[test]
    fn a_message_too_slow_is_a_policy_violation() {
        let reason = CloseReason::MessageTimeout;
        assert_eq!(reason.code(), Some(1008));
        // The reader stopped mid-message: nothing will read the client's close.
        assert!(!reason.lingers());
    }
}
