//! `[websocket.compression]`: permessage-deflate (RFC 7692), negotiated on
//! the upgrade where a client offers it (see [`crate::deflate`]).

use serde::Deserialize;

use crate::deflate::negotiation::Settings;

/// Default level: zlib's 1 to 9. At 1 a JSON message shrinks to about the
/// same size as at 6 (within a few percent on 0.2-4 KiB JSON) for about a
/// third of the CPU; a publication is compressed once per pod, not per
/// subscriber, but replies are compressed per connection.
pub const DEFAULT_LEVEL: u8 = 1;
/// Messages shorter than this go out uncompressed: deflate saves little on
/// them (a 100-byte JSON frame shrinks by a third at best) and costs the
/// same fixed setup.
pub const DEFAULT_MIN_BYTES: u32 = 256;

#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct CompressionConfig {
    /// Accept a client's permessage-deflate offer.
    pub enabled: bool,
    /// Smaller server messages go out uncompressed (RSV1 clear), and so do
    /// those deflate would not shrink; 0: every message is compressed.
    pub min_bytes: u32,
    /// zlib's compression level, 1 (fastest) to 9 (smallest).
    pub level: u8,
    /// The most a client message may inflate to; over it the connection is
    /// closed with 1009. Default: `websocket.max_message_bytes`.
    pub max_inflated_bytes: Option<usize>,
}

impl Default for CompressionConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            min_bytes: DEFAULT_MIN_BYTES,
            level: DEFAULT_LEVEL,
            max_inflated_bytes: None,
        }
    }
}

impl CompressionConfig {
    /// Checks the values; the error names the key and why.
    pub fn validate(&self) -> Result<(), (&'static str, String)> {
        if !(1..=9).contains(&self.level) {
            return Err(("websocket.compression.level", "must be 1 to 9".into()));
        }
        if self.max_inflated_bytes == Some(0) {
            return Err((
                "websocket.compression.max_inflated_bytes",
                "must be at least 1".into(),
            ));
        }
        Ok(())
    }
}

impl CompressionConfig {
    /// What an upgrade may agree to; `None` where compression is off.
    pub fn settings(&self) -> Option<Settings> {
        self.enabled.then_some(Settings {
            level: self.level,
            min_bytes: self.min_bytes,
        })
    }

    /// The most a client message may inflate to, with `max_message_bytes`
    /// the connection's message limit.
    pub fn inflated_cap(&self, max_message_bytes: usize) -> usize {
        self.max_inflated_bytes.unwrap_or(max_message_bytes)
    }
}
