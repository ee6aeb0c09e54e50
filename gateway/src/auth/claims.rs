//! What a verified token says: who the client is, until when, and which
//! topics it may subscribe to and publish on.

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use serde::Deserialize;
use serde_json::value::RawValue;

use super::Refused;

/// Longest `sub`, in bytes.
const MAX_USER_BYTES: usize = 256;
/// Most patterns in one grant claim (`subscribe`, `publish`).
const MAX_GRANTS: usize = 256;
/// Longest pattern in a grant claim, in bytes.
const MAX_GRANT_BYTES: usize = 256;

/// What a verified token says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Claims {
    /// `sub`: required, 1 to 256 bytes.
    pub user: Arc<str>,
    /// `exp` (required, so always `Some` for now).
    pub expires: Option<SystemTime>,
    /// Claim `subscribe`: the topics the client may subscribe to.
    pub subscribe: Grants,
    /// Claim `publish`: the topics the client may publish on.
    pub publish: Grants,
    /// Claim `topics`: topic names the server subscribes a fresh session
    /// to at `hello` (checked there against the namespaces and
    /// `session.max_subscriptions`). At most 256 of at most 256 bytes.
    pub topics: Box<[Box<str>]>,
    /// Claim `info`: a JSON object shown with the user in a topic's
    /// presence, as compact JSON text. Bounded by `presence.max_info_bytes`
    /// ([`Claims::check_info`]): the verifier does not know the pod's limit.
    pub info: Option<Bytes>,
}

impl Claims {
    /// Refuses an `info` claim longer than `max_bytes` of compact JSON: it
    /// is copied into every page and diff of every topic the user is in.
    pub fn check_info(&self, max_bytes: usize) -> Result<(), Refused> {
        match &self.info {
            Some(info) if info.len() > max_bytes => Err(Refused::InfoTooLong(max_bytes)),
            _ => Ok(()),
        }
    }

    /// When a connection on this token must close: its `exp` plus `leeway`,
    /// on the pod's monotonic clock (`now` and `now_instant` read together).
    /// `None` where that lies beyond what the clocks can hold: `exp` is
    /// checked only to be a whole number of seconds, and a "never expires"
    /// `i64::MAX` is common; such a token lives as long as its connection.
    pub fn deadline(
        &self,
        leeway: Duration,
        now: SystemTime,
        now_instant: tokio::time::Instant,
    ) -> Option<tokio::time::Instant> {
        let at = self.expires?.checked_add(leeway)?;
        match at.duration_since(now) {
            Ok(left) => now_instant.checked_add(left),
            Err(_) => Some(now_instant),
        }
    }
}

/// Topic patterns: an exact topic name, or a prefix ending in `*`
/// (`"prices:*"`; `"*"` is every topic). A `*` anywhere else is refused, as
/// topic names cannot contain one. At most 256 patterns of at most 256 bytes
/// each; a token with more is refused as unauthorized.
///
/// A prefix never crosses a namespace's border: its `*` stands for the rest
/// of a topic's name, never for part of its namespace. `"chat:*"` and
/// `"chat:room-*"` cover topics of namespace `chat`; `"room-*"` (no `:`)
/// covers topics of the default namespace only; so `"chat*"` covers `chat`
/// and `chat-2` but not `chat:lobby`, nor `chatops:deploy-keys`. Only `"*"`
/// alone reaches every namespace.
///
/// The default grants nothing.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Grants {
    /// `*`: every topic.
    all: bool,
    exact: Box<[Box<str>]>,
    /// The patterns ending in `*`, without it.
    prefixes: Box<[Box<str>]>,
}

impl Grants {
    /// Whether some pattern covers `topic`.
    pub fn allows(&self, topic: &str) -> bool {
        self.all
            || self.exact.iter().any(|exact| **exact == *topic)
            || self
                .prefixes
                .iter()
                .any(|prefix| prefix_covers(prefix, topic))
    }

    /// Whether nothing is granted.
    pub fn is_empty(&self) -> bool {
        !self.all && self.exact.is_empty() && self.prefixes.is_empty()
    }

    /// Grants from a claim's patterns; the error names what is wrong.
    pub(super) fn parse(patterns: Vec<String>) -> Result<Self, &'static str> {
        if patterns.len() > MAX_GRANTS {
            return Err("more than 256 topic patterns in a grant");
        }
        let (mut all, mut exact, mut prefixes) = (false, Vec::new(), Vec::new());
        for pattern in patterns {
            if pattern.is_empty() || pattern.len() > MAX_GRANT_BYTES {
                return Err("a topic pattern must be 1 to 256 bytes");
            }
            match pattern.find('*') {
                None => exact.push(pattern.into_boxed_str()),
                Some(0) if pattern.len() == 1 => all = true,
                Some(star) if star == pattern.len() - 1 => {
                    let mut prefix = pattern;
                    prefix.truncate(star);
                    prefixes.push(prefix.into_boxed_str());
                }
                Some(_) => return Err("`*` may only end a topic pattern"),
            }
        }
        Ok(Grants {
            all,
            exact: exact.into(),
            prefixes: prefixes.into(),
        })
    }
}

/// Whether the pattern `prefix*` covers `topic`: the topic starts with the
/// prefix, within the prefix's own namespace (the part before the first
/// `:`, or the default namespace where it has none).
fn prefix_covers(prefix: &str, topic: &str) -> bool {
    let Some(rest) = topic.strip_prefix(prefix) else {
        return false;
    };
    // A prefix with a `:` has fixed the namespace already; one without may
    // only go on within the default namespace's names, which hold no `:`.
    prefix.contains(':') || !rest.contains(':')
}

/// The claims Herald reads, as raw JSON: jsonwebtoken has checked `exp`,
/// `nbf`, `iss`, `aud` and that `sub` is a string; the rest is checked here,
/// so that a claim of the wrong type is refused as such rather than as a
/// token that is not JSON.
#[derive(Debug, Deserialize)]
pub(super) struct Payload {
    #[serde(default)]
    sub: Option<Box<RawValue>>,
    #[serde(default)]
    exp: Option<Box<RawValue>>,
    #[serde(default)]
    iat: Option<Box<RawValue>>,
    #[serde(default)]
    subscribe: Option<Box<RawValue>>,
    #[serde(default)]
    publish: Option<Box<RawValue>>,
    #[serde(default)]
    topics: Option<Box<RawValue>>,
    info: Option<Box<RawValue>>,
}

impl Payload {
    /// The claims, checked. `now` and `leeway` in seconds since the epoch.
    pub fn into_claims(self, now: u64, leeway: u64) -> Result<Claims, Refused> {
        let user: String = parse(self.sub.as_deref(), "`sub` must be a string")?
            .ok_or(Refused::Claims("`sub` is required"))?;
        if user.is_empty() || user.len() > MAX_USER_BYTES {
            return Err(Refused::Claims("`sub` must be 1 to 256 bytes"));
        }
        let expires = match numeric_date(self.exp.as_deref(), "`exp` must be a number")? {
            Some(exp) => Some(
                UNIX_EPOCH
                    .checked_add(Duration::from_secs(exp))
                    .ok_or(Refused::Claims("`exp` is out of range"))?,
            ),
            None => return Err(Refused::Claims("`exp` is required")),
        };
        // jsonwebtoken never looks at `iat`; a token issued in the future was
        // minted by a clock (or an issuer) not to be trusted yet.
        if let Some(iat) = numeric_date(self.iat.as_deref(), "`iat` must be a number")?
            && iat > now.saturating_add(leeway)
        {
            return Err(Refused::NotYetValid);
        }
        let granted = [&self.subscribe, &self.publish, &self.topics, &self.info];
        with_grants(user, expires, granted)
    }
}

/// The claims the application's backend vouches for in its connect or
/// refresh proxy's reply (docs/hooks.md): a token's claims by other names
/// (`user` for `sub`, `expires` for `exp`), as raw JSON, under the same
/// checks ([`Vouched::into_claims`]), so that a connection let in by the
/// backend is held to a token's bounds.
#[derive(Debug, Default, Deserialize)]
pub struct Vouched {
    #[serde(default)]
    pub user: Option<Box<RawValue>>,
    #[serde(default)]
    pub expires: Option<Box<RawValue>>,
    #[serde(default)]
    pub subscribe: Option<Box<RawValue>>,
    #[serde(default)]
    pub publish: Option<Box<RawValue>>,
    #[serde(default)]
    pub topics: Option<Box<RawValue>>,
    #[serde(default)]
    pub info: Option<Box<RawValue>>,
}

impl Vouched {
    /// The claims, checked as a token's are, except that `user` may be
    /// missing or empty (an anonymous client: an empty [`Claims::user`],
    /// which the session admits only where anonymous clients are) and
    /// `expires` may be missing (the claims hold as long as the
    /// connection). `info` is bounded by [`Claims::check_info`] still.
    pub fn into_claims(self) -> Result<Claims, Refused> {
        let user: String =
            parse(self.user.as_deref(), "`user` must be a string")?.unwrap_or_default();
        if user.len() > MAX_USER_BYTES {
            return Err(Refused::Claims("`user` must be at most 256 bytes"));
        }
        let expires = numeric_date(self.expires.as_deref(), "`expires` must be a number")?
            .map(|exp| {
                UNIX_EPOCH
                    .checked_add(Duration::from_secs(exp))
                    .ok_or(Refused::Claims("`expires` is out of range"))
            })
            .transpose()?;
        let granted = [&self.subscribe, &self.publish, &self.topics, &self.info];
        with_grants(user, expires, granted)
    }
}

/// Claims of `user` until `expires`, with the claims a token and a
/// backend's reply share (`subscribe`, `publish`, `topics`, `info`, in that
/// order), checked.
fn with_grants(
    user: String,
    expires: Option<SystemTime>,
    [subscribe, publish, topics, info]: [&Option<Box<RawValue>>; 4],
) -> Result<Claims, Refused> {
    let subscribe = grants(
        subscribe.as_deref(),
        "`subscribe` must be an array of strings",
    )?;
    let publish = grants(publish.as_deref(), "`publish` must be an array of strings")?;
    let topics = self::topics(topics.as_deref())?;
    let info = parse::<serde_json::Map<String, serde_json::Value>>(
        info.as_deref(),
        "`info` must be a JSON object",
    )?
    .map(|object| Bytes::from(serde_json::Value::Object(object).to_string()));
    Ok(Claims {
        user: Arc::from(user),
        expires,
        subscribe,
        publish,
        topics,
        info,
    })
}

/// A claim as `T`; `None` when it is missing or `null`.
fn parse<T: for<'a> Deserialize<'a>>(
    raw: Option<&RawValue>,
    wrong_type: &'static str,
) -> Result<Option<T>, Refused> {
    match raw {
        None => Ok(None),
        Some(raw) => {
            serde_json::from_str::<Option<T>>(raw.get()).map_err(|_| Refused::Claims(wrong_type))
        }
    }
}

/// A NumericDate (RFC 7519 2): whole or fractional seconds since the epoch,
/// rounded as jsonwebtoken rounds them.
fn numeric_date(raw: Option<&RawValue>, wrong_type: &'static str) -> Result<Option<u64>, Refused> {
    let Some(number) = parse::<serde_json::Number>(raw, wrong_type)? else {
        return Ok(None);
    };
    if let Some(seconds) = number.as_u64() {
        return Ok(Some(seconds));
    }
    match number.as_f64() {
        Some(seconds) if seconds.is_finite() && seconds >= 0.0 && seconds < u64::MAX as f64 => {
            Ok(Some(seconds.round() as u64))
        }
        _ => Err(Refused::Claims(wrong_type)),
    }
}

/// Claim `topics`: an array of at most [`MAX_GRANTS`] strings of 1 to
/// [`MAX_GRANT_BYTES`] bytes each (what each names is checked at `hello`).
fn topics(raw: Option<&RawValue>) -> Result<Box<[Box<str>]>, Refused> {
    let topics = parse::<Vec<String>>(raw, "`topics` must be an array of strings")?;
    let topics = topics.unwrap_or_default();
    if topics.len() > MAX_GRANTS {
        return Err(Refused::Claims("more than 256 topics in `topics`"));
    }
    if topics
        .iter()
        .any(|t| t.is_empty() || t.len() > MAX_GRANT_BYTES)
    {
        return Err(Refused::Claims(
            "a topic in `topics` must be 1 to 256 bytes",
        ));
    }
    Ok(topics.into_iter().map(String::into_boxed_str).collect())
}

fn grants(raw: Option<&RawValue>, wrong_type: &'static str) -> Result<Grants, Refused> {
    let patterns = parse::<Vec<String>>(raw, wrong_type)?.unwrap_or_default();
    Grants::parse(patterns).map_err(Refused::Claims)
}
