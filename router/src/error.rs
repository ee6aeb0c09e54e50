//! What fails in a broker, and how a log line shows why.

use std::error::Error;
use std::fmt;

/// Why a broker call failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BrokerError {
    #[error("topic `{0}` is in no configured namespace")]
    UnknownNamespace(String),
    #[error("broker unavailable: {0}")]
    Unavailable(String),
}

/// An error and every cause under it, on one line: `top: cause: root`.
///
/// For log fields (`error = %Causes(&e)`): `Display` of an error is its own
/// message only, and a log that drops the cause (the Redis error under a
/// failed publish, the I/O error under a failed read) is the one the
/// operator needed.
pub struct Causes<'a>(pub &'a (dyn Error + 'static));

impl fmt::Display for Causes<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)?;
        let mut source = self.0.source();
        while let Some(cause) = source {
            write!(f, ": {cause}")?;
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
}
