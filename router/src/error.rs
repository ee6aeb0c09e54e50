//! What fails in a broker, and how a log line shows why.

use std::error::Error;
use std::fmt;
use std::time::Duration;

/// Why a broker call failed: what the client is told ([`BrokerError`]'s
/// variant), and why, for the log (its source: [`Unavailable`], down to
/// Redis's own error).
#[derive(Debug, Clone, thiserror::Error)]
pub enum BrokerError {
    #[error("topic `{0}` is in no configured namespace")]
    UnknownNamespace(String),
    /// The broker cannot do it now; the client may try again.
    #[error("broker unavailable")]
    Unavailable(#[source] Unavailable),
}

impl BrokerError {
    /// [`Unavailable::Other`]: the string form, for a case with no typed
    /// cause.
    pub fn unavailable(why: impl Into<String>) -> Self {
        Self::Unavailable(Unavailable::Other(why.into()))
    }
}

/// Why the broker could not serve a call.
#[derive(Debug, Clone, thiserror::Error)]
pub enum Unavailable {
    /// A Redis call failed: no connection, a broken or timed-out one, or an
    /// error reply. `call` names it as the metrics do (`publish`,
    /// `session_load`, ...).
    #[error("redis: {call} failed")]
    Redis {
        call: &'static str,
        #[source]
        source: redis::RedisError,
    },
    /// Redis answered with a reply of a shape the engine does not read (a
    /// script of another version, a key of another type).
    #[error("redis: an unreadable {reply} reply")]
    Protocol { reply: &'static str },
    /// The call waited longer than the command timeout allows.
    #[error("redis: {0} timed out")]
    TimedOut(&'static str),
    /// Redis, or the writer in front of it, never answered this one call.
    #[error("redis: a {0} went unanswered")]
    Unanswered(&'static str),
    /// A task of the engine's own ended: the broker is being dropped.
    #[error("redis: the {0} ended")]
    Ended(&'static str),
    /// Redis was not reached since the pod started: why not, as `/readyz`
    /// says it.
    #[error("{0}")]
    NotReached(String),
    /// Claims were run too late, twice: see `scripts::CLAIM_SESSION`'s
    /// deadline.
    #[error(
        "redis: claims run later than {0:?} after they are sent: Redis or the network holds them back, or Redis's clock is ahead of this pod's"
    )]
    ClaimsLate(Duration),
    /// Said in words, where there is no typed cause
    /// ([`BrokerError::unavailable`]).
    #[error("{0}")]
    Other(String),
}

/// An error and every cause under it, on one line: `top: cause: root`.
///
/// For log fields (`error = %Causes(&e)`): `Display` of an error is its own
/// message only, and a log that drops the cause (the Redis error under a
/// failed publish, the I/O error under a failed read) is the one the
/// operator needed. A cause whose message the one above it already ends
/// with (redis-rs's errors show their source, and so do some others) is
/// not repeated.
pub struct Causes<'a>(pub &'a (dyn Error + 'static));

impl fmt::Display for Causes<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut above = self.0.to_string();
        f.write_str(&above)?;
        let mut source = self.0.source();
        while let Some(cause) = source {
            let message = cause.to_string();
            if !above.ends_with(&message) {
                write!(f, ": {message}")?;
            }
            above = message;
            source = cause.source();
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("publish failed")]
    struct Outer(#[source] std::io::Error);

    #[test]
    fn causes_shows_the_whole_chain() {
        let e = Outer(std::io::Error::other("connection reset"));
        assert_eq!(Causes(&e).to_string(), "publish failed: connection reset");
        let alone = std::io::Error::other("alone");
        assert_eq!(Causes(&alone).to_string(), "alone");
    }

    #[test]
    fn causes_shows_a_redis_error_under_a_broker_error_once() {
        // redis-rs's I/O error shows its source's message as its own.
        let redis = redis::RedisError::from(std::io::Error::new(
            std::io::ErrorKind::ConnectionRefused,
            "connection refused",
        ));
        let e = BrokerError::Unavailable(Unavailable::Redis {
            call: "publish",
            source: redis,
        });
        assert_eq!(
            Causes(&e).to_string(),
            "broker unavailable: redis: publish failed: connection refused"
        );
        assert_eq!(e.to_string(), "broker unavailable");
    }

    #[test]
    fn the_string_form_has_no_source() {
        let e = BrokerError::unavailable("redis pub/sub is reconnecting");
        assert_eq!(
            Causes(&e).to_string(),
            "broker unavailable: redis pub/sub is reconnecting"
        );
        let Some(cause) = e.source() else {
            panic!("no cause")
        };
        assert!(cause.source().is_none());
    }
}
