//! Topic names.
//!
//! A topic is `[namespace:]name`: the namespace is 1 to 32 of `a-z 0-9 _ -`,
//! the name 1 to 128 of `A-Z a-z 0-9 _ - . = @ /`. A topic without `:` is in
//! the default namespace.

use std::fmt;
use std::sync::Arc;

/// Longest namespace, in bytes.
pub const MAX_NAMESPACE_LEN: usize = 32;
/// Longest name after the namespace, in bytes.
pub const MAX_NAME_LEN: usize = 128;

/// A validated topic name; cheap to clone.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Topic(Arc<str>);

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TopicError {
    #[error("topic is empty")]
    Empty,
    #[error("namespace must be 1 to {MAX_NAMESPACE_LEN} of a-z 0-9 _ -")]
    BadNamespace,
    #[error("topic name must be 1 to {MAX_NAME_LEN} of A-Z a-z 0-9 _ - . = @ /")]
    BadName,
}

impl Topic {
    pub fn parse(s: &str) -> Result<Self, TopicError> {
        if s.is_empty() {
            return Err(TopicError::Empty);
        }
        let name = match s.split_once(':') {
            Some((ns, name)) => {
                if !is_namespace(ns) {
                    return Err(TopicError::BadNamespace);
                }
                name
            }
            None => s,
        };
        let name_ok = !name.is_empty()
            && name.len() <= MAX_NAME_LEN
            && name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"_-.=@/".contains(&b));
        if !name_ok {
            return Err(TopicError::BadName);
        }
        Ok(Topic(Arc::from(s)))
    }

    /// The namespace, `""` for the default one.
    pub fn namespace(&self) -> &str {
        self.0.split_once(':').map_or("", |(ns, _)| ns)
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// Whether `ns` is a valid namespace name.
pub fn is_namespace(ns: &str) -> bool {
    !ns.is_empty()
        && ns.len() <= MAX_NAMESPACE_LEN
        && ns
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || b == b'-')
}

impl fmt::Display for Topic {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for Topic {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&*self.0, f)
    }
}

impl std::borrow::Borrow<str> for Topic {
    fn borrow(&self) -> &str {
        &self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        for ok in ["news", "chat:room-1", "a:b/c.d=e@f_g", "x"] {
            assert!(Topic::parse(ok).is_ok(), "{ok}");
        }
        let too_long = "n".repeat(MAX_NAME_LEN + 1);
        for (bad, why) in [
            ("", TopicError::Empty),
            (":x", TopicError::BadNamespace),
            ("Chat:x", TopicError::BadNamespace),
            ("chat:", TopicError::BadName),
            ("a:b:c", TopicError::BadName),
            ("sp ace", TopicError::BadName),
            ("é", TopicError::BadName),
            (too_long.as_str(), TopicError::BadName),
        ] {
            assert_eq!(Topic::parse(bad), Err(why), "{bad:?}");
        }
        assert_eq!(
            Topic::parse("chat:r").map(|t| t.namespace().to_owned()),
            Ok("chat".into())
        );
        assert_eq!(
            Topic::parse("r").map(|t| t.namespace().to_owned()),
            Ok(String::new())
        );
    }
}
