//! permessage-deflate (RFC 7692): what a connection negotiated on its
//! upgrade ([`negotiation`]), server messages compressed, client messages
//! inflated under a cap ([`inflate`]), and the counters of both.
//!
//! The server always answers `server_no_context_takeover`: each message is
//! compressed on its own, so one compressed frame is valid for every
//! subscriber that negotiated the same parameters, and the fan-out
//! compresses a publication once per [`Deflate`] among its subscribers
//! (`frame::Frames`), never once per connection. It always asks
//! `client_no_context_takeover` too (RFC 7692 7.1.1.2 lets a server ask it
//! whatever the client offered, and a client must then comply), so each
//! client message inflates on its own: no connection keeps a compressor or
//! an inflater. The deflate states that do the work are kept per thread
//! (one per window size and level, reset between messages), so their cost
//! is paid once per worker, not per connection nor per message.
//!
//! The codec is flate2 over its zlib-rs backend: flate2 is the Rust
//! ecosystem's standard deflate API (maintained under rust-lang), zlib-rs is
//! a memory-safe port of zlib, as fast as zlib-ng, and, unlike flate2's
//! default miniz_oxide backend, it takes a window size (9 to 15 bits),
//! which `server_max_window_bits` needs.

pub mod inflate;
pub mod negotiation;

use std::cell::RefCell;
use std::sync::LazyLock;

use flate2::{Compress, Compression, FlushCompress, Status};
use prometheus::{IntCounter, IntCounterVec, Opts};

/// The bit that marks a compressed message, on its first frame.
pub const RSV1: u8 = 0x40;
/// What a sync flush ends with, removed from every compressed message and
/// appended again before inflating one (RFC 7692 7.2.1, 7.2.2).
pub const TAIL: [u8; 4] = [0, 0, 0xff, 0xff];
/// The smallest and largest LZ77 window (bits) zlib can compress with; an
/// offer of `server_max_window_bits=8` is declined.
pub const MIN_WINDOW_BITS: u8 = 9;
pub const MAX_WINDOW_BITS: u8 = 15;

/// How a connection's server messages are compressed: everything that
/// changes the bytes, so that two connections with equal values can share
/// a frame (`frame::Format::WebSocketDeflate`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Deflate {
    /// The LZ77 window, 9 to 15 bits: the client's `server_max_window_bits`.
    pub window_bits: u8,
    /// zlib's level, 1 to 9.
    pub level: u8,
    /// Smaller messages go out uncompressed; 0: every message is
    /// compressed, even one that deflate makes longer.
    pub min_bytes: u32,
}

/// The compressors of this thread, one per window and level met: a fan-out
/// or a reply borrows one for the length of a message, never across an
/// await.
struct Compressors(Vec<(u8, u8, Compress)>);

thread_local! {
    static COMPRESSORS: RefCell<Compressors> = const { RefCell::new(Compressors(Vec::new())) };
}

impl Compressors {
    fn get(&mut self, window_bits: u8, level: u8) -> &mut Compress {
        let found = self
            .0
            .iter()
            .position(|(w, l, _)| *w == window_bits && *l == level);
        let at = match found {
            Some(at) => at,
            None => {
                let window = window_bits.clamp(MIN_WINDOW_BITS, MAX_WINDOW_BITS);
                let level = Compression::new(u32::from(level.clamp(1, 9)));
                self.0.push((
                    window_bits,
                    level.level() as u8,
                    Compress::new_with_window_bits(level, false, window),
                ));
                self.0.len() - 1
            }
        };
        &mut self.0[at].2
    }
}

impl Deflate {
    /// The concatenation of `parts` as one compressed message (the sync
    /// flush's tail removed), after `room` bytes left free at the front (for
    /// a frame header), and its compressed length. `None` below
    /// `min_bytes`, or where deflate would not make it smaller (unless
    /// `min_bytes` is 0): it then goes out as it is, RSV1 clear.
    pub fn compress(&self, parts: &[&[u8]], room: usize) -> Option<(Vec<u8>, usize)> {
        let len: usize = parts.iter().map(|p| p.len()).sum();
        if len < self.min_bytes as usize {
            return None;
        }
        let compressed = COMPRESSORS.with(|cell| {
            let mut compressors = cell.try_borrow_mut().ok()?;
            let compress = compressors.get(self.window_bits, self.level);
            // Each message on its own (server_no_context_takeover); also
            // what makes a state a failed call left behind usable again.
            compress.reset();
            deflate_parts(compress, parts, room, len)
        });
        let Some(out) = compressed else {
            METRICS.compress_failed.inc();
            return None;
        };
        let after = out.len() - room;
        METRICS.compressions.inc();
        METRICS.bytes_before.inc_by(len as u64);
        // Not worth it, unless every message is to be compressed.
        if after >= len && self.min_bytes > 0 {
            METRICS.bytes_after.inc_by(len as u64);
            return None;
        }
        METRICS.bytes_after.inc_by(after as u64);
        Some((out, after))
    }
}

/// Deflates `parts` (`len` bytes in all) with a sync flush into a buffer
/// whose first `room` bytes are left free; the flush's tail is cut off.
fn deflate_parts(
    compress: &mut Compress,
    parts: &[&[u8]],
    room: usize,
    len: usize,
) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(room + len / 2 + 64);
    out.resize(room, 0);
    let last = parts.len().checked_sub(1)?;
    for (i, part) in parts.iter().enumerate() {
        let flush = if i == last {
            FlushCompress::Sync
        } else {
            FlushCompress::None
        };
        let mut input: &[u8] = part;
        loop {
            if out.capacity() - out.len() < 64 {
                out.reserve(out.len().max(256));
            }
            let (before, written) = (compress.total_in(), out.len());
            match compress.compress_vec(input, &mut out, flush) {
                Ok(Status::Ok | Status::BufError | Status::StreamEnd) => {}
                Err(_) => return None,
            }
            let used = usize::try_from(compress.total_in() - before).ok()?;
            if used == 0 && out.len() == written && !input.is_empty() {
                // No progress with room to make it: never loop on it.
                return None;
            }
            input = input.get(used..)?;
            // Done with this part once it is all in and, for the last, once
            // the flush had room to finish.
            if input.is_empty() && (flush == FlushCompress::None || out.len() < out.capacity()) {
                break;
            }
        }
    }
    if !out.ends_with(&TAIL) {
        return None;
    }
    out.truncate(out.len() - TAIL.len());
    Some(out)
}

/// The counters of compression and inflation, process-wide: a frame is
/// encoded where no pod's metrics are at hand (`frame`), so every pod's
/// registry shows these same counters (one pod per process in production).
pub struct DeflateMetrics {
    pub compressions: IntCounter,
    pub compress_failed: IntCounter,
    pub bytes_before: IntCounter,
    pub bytes_after: IntCounter,
    pub bytes_in: IntCounterVec,
    pub inflations: IntCounter,
    pub refused: IntCounterVec,
    pub negotiated: IntCounterVec,
}

#[allow(clippy::unwrap_used)] // constant, valid names: tests render every metric
fn make_metrics() -> DeflateMetrics {
    let bytes = IntCounterVec::new(
        Opts::new(
            "herald_deflate_bytes_total",
            "Bytes of server messages compressed with permessage-deflate (direction=out; stage=before: the message, after: on the wire; a message deflate would not shrink counts its own size after), and of client messages inflated (direction=in; stage=before: on the wire, after: inflated).",
        ),
        &["direction", "stage"],
    )
    .unwrap();
    DeflateMetrics {
        compressions: IntCounter::new(
            "herald_deflate_compressions_total",
            "Server messages compressed: once per publication per deflate format among its subscribers, once per reply.",
        )
        .unwrap(),
        compress_failed: IntCounter::new(
            "herald_deflate_compress_failures_total",
            "Server messages the compressor failed on (sent uncompressed): none expected.",
        )
        .unwrap(),
        bytes_before: bytes.with_label_values(&["out", "before"]),
        bytes_after: bytes.with_label_values(&["out", "after"]),
        bytes_in: bytes,
        inflations: IntCounter::new(
            "herald_deflate_inflations_total",
            "Compressed client messages inflated.",
        )
        .unwrap(),
        refused: IntCounterVec::new(
            Opts::new(
                "herald_deflate_refused_total",
                "Compressed client messages refused, by reason: too_big (inflated past websocket.compression.max_inflated_bytes: a bomb, closed with 1009), corrupt (not deflate data, 1002), rsv1 (RSV1 where no compression was negotiated or on a continuation or control frame, 1002).",
            ),
            &["reason"],
        )
        .unwrap(),
        negotiated: IntCounterVec::new(
            Opts::new(
                "herald_deflate_negotiations_total",
                "WebSocket upgrades that offered permessage-deflate, by outcome: accepted, declined (no offer acceptable), disabled (websocket.compression.enabled is false).",
            ),
            &["outcome"],
        )
        .unwrap(),
    }
}

/// The process's deflate counters.
pub static METRICS: LazyLock<DeflateMetrics> = LazyLock::new(make_metrics);

/// Registers the deflate counters on a pod's registry.
pub fn register_metrics(registry: &prometheus::Registry) {
    let m = &*METRICS;
    let all: [Box<dyn prometheus::core::Collector>; 6] = [
        Box::new(m.compressions.clone()),
        Box::new(m.compress_failed.clone()),
        Box::new(m.bytes_in.clone()),
        Box::new(m.inflations.clone()),
        Box::new(m.refused.clone()),
        Box::new(m.negotiated.clone()),
    ];
    for collector in all {
        if let Err(e) = registry.register(collector) {
            tracing::error!(error = %e, "metric registration failed");
        }
    }
}

#[cfg(test)]
mod tests;
