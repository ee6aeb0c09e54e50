//! `[streams]`: the WebSocket's fallbacks on the clients' listener (issue
//! #25): Server-Sent Events (`GET /sse`) and HTTP-streaming (`POST /stream`).
//! Both draw on the WebSocket's admission, budgets and `[websocket]` timers.

use serde::Deserialize;

/// Topics one `GET /sse` may name, by default.
pub const DEFAULT_STREAMS_MAX_TOPICS: usize = 16;
/// The cookie a browser's `EventSource` may carry its token in.
pub const DEFAULT_STREAMS_TOKEN_COOKIE: &str = "herald_token";
/// The most one stream topic can have: SSE ids carry a position per topic.
const MAX_STREAMS_MAX_TOPICS: usize = 256;

#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct StreamsConfig {
    /// Serve `/sse` and `/stream`; off, they are `404` as any unknown path.
    pub enabled: bool,
    /// Topics one `GET /sse` may name (`400 too_many_topics` beyond): each
    /// costs its event ids up to 40 bytes.
    pub max_topics: usize,
    /// The cookie read for a token when neither `Authorization` nor
    /// `?token=` gives one (an `EventSource` sends cookies, not headers).
    pub token_cookie: String,
}

impl Default for StreamsConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            max_topics: DEFAULT_STREAMS_MAX_TOPICS,
            token_cookie: DEFAULT_STREAMS_TOKEN_COOKIE.to_owned(),
        }
    }
}

impl StreamsConfig {
    /// The refusal of a bad setting: its key and why.
    pub(super) fn check(&self) -> Result<(), (&'static str, &'static str)> {
        if self.max_topics == 0 || self.max_topics > MAX_STREAMS_MAX_TOPICS {
            return Err(("streams.max_topics", "must be in 1..=256"));
        }
        let token = |c: char| c.is_ascii_alphanumeric() || "!#$%&'*+-.^_`|~".contains(c);
        if self.token_cookie.is_empty() || !self.token_cookie.chars().all(token) {
            return Err(("streams.token_cookie", "must be a cookie name (RFC 6265)"));
        }
        Ok(())
    }
}
