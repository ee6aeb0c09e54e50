//! Client messages inflated, under a cap on what they inflate to.
//!
//! A compressed message is inflated once it has arrived whole (its
//! compressed bytes are bounded by `websocket.max_message_bytes`, as any
//! message's), in one call, with this thread's inflater: no connection keeps
//! one, as each message inflates on its own (`client_no_context_takeover`,
//! always asked for). Output grows with what inflates, never past `cap`:
//! one byte more and it stops, so a bomb costs at most the cap's worth of
//! work and memory before it closes the connection with 1009.

use std::cell::RefCell;

use flate2::{Decompress, FlushDecompress, Status};

use super::{MAX_WINDOW_BITS, METRICS, TAIL};

/// Why a compressed message was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum InflateError {
    #[error("inflated past the cap")]
    TooBig,
    #[error("not deflate data")]
    Corrupt,
}

thread_local! {
    /// The largest window inflates any client's messages, whatever
    /// `client_max_window_bits` it used.
    static INFLATER: RefCell<Option<Decompress>> = const { RefCell::new(None) };
}

/// `compressed` (one message's payload, without the flush tail) inflated,
/// refused once it passes `cap` bytes.
pub fn inflate(compressed: &[u8], cap: usize) -> Result<Vec<u8>, InflateError> {
    let result = INFLATER.with(|cell| {
        let Ok(mut slot) = cell.try_borrow_mut() else {
            return Err(InflateError::Corrupt);
        };
        let inflater =
            slot.get_or_insert_with(|| Decompress::new_with_window_bits(false, MAX_WINDOW_BITS));
        inflater.reset(false);
        run(inflater, compressed, cap)
    });
    METRICS
        .bytes_in
        .with_label_values(&["in", "before"])
        .inc_by(compressed.len() as u64);
    match &result {
        Ok(out) => {
            METRICS.inflations.inc();
            METRICS
                .bytes_in
                .with_label_values(&["in", "after"])
                .inc_by(out.len() as u64);
        }
        Err(InflateError::TooBig) => METRICS.refused.with_label_values(&["too_big"]).inc(),
        Err(InflateError::Corrupt) => METRICS.refused.with_label_values(&["corrupt"]).inc(),
    }
    result
}

/// What this thread's inflater read and wrote for the last message it
/// inflated (compressed bytes in, inflated bytes out): the work that message
/// cost, which for a bomb must stay within the cap. For the tests and the
/// fuzz targets (`session::fuzzing`).
#[cfg(any(test, fuzzing))]
pub fn last_work() -> (u64, u64) {
    INFLATER.with(|cell| {
        cell.try_borrow()
            .ok()
            .and_then(|slot| slot.as_ref().map(|d| (d.total_in(), d.total_out())))
            .unwrap_or((0, 0))
    })
}

fn run(inflater: &mut Decompress, compressed: &[u8], cap: usize) -> Result<Vec<u8>, InflateError> {
    // Room for what a typical message inflates to, within the cap (one
    // byte over it tells a message that reaches it from one that passes it).
    let limit = cap.saturating_add(1);
    let mut out = Vec::with_capacity(compressed.len().saturating_mul(4).max(64).min(limit));
    for input in [compressed, &TAIL[..]] {
        let mut input = input;
        loop {
            if out.len() == out.capacity() {
                if out.len() >= limit {
                    return Err(InflateError::TooBig);
                }
                let grow = out.len().max(64).min(limit - out.len());
                out.reserve_exact(grow);
            }
            let (before, written) = (inflater.total_in(), out.len());
            let status = inflater
                .decompress_vec(input, &mut out, FlushDecompress::Sync)
                .map_err(|_| InflateError::Corrupt)?;
            if out.len() > cap {
                return Err(InflateError::TooBig);
            }
            let used =
                usize::try_from(inflater.total_in() - before).map_err(|_| InflateError::Corrupt)?;
            input = input.get(used..).ok_or(InflateError::Corrupt)?;
            match status {
                // A client may end a message with a final block (RFC 7692
                // 7.2.3.3): what follows it, the tail included, is ignored.
                Status::StreamEnd => return Ok(out),
                _ if input.is_empty() && out.len() < out.capacity() => break,
                _ if used == 0 && out.len() == written && out.len() < out.capacity() => {
                    return Err(InflateError::Corrupt);
                }
                _ => {}
            }
        }
    }
    Ok(out)
}
