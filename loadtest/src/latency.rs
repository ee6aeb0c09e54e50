//! Latency as the client sees it. The publisher puts its send time in the
//! payload ([`Stamp`]: microseconds since the UNIX epoch, a JSON number);
//! each client subtracts it from the time it read the frame. Publisher and
//! clients run on the same machine, so they read the same clock.
//!
//! A "round" is one message delivered to every client; its maximum is the
//! round's "last client", the figure a fan-out is judged by.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

/// Microseconds since the UNIX epoch, by the wall clock (the only clock two
/// processes share).
pub fn now_micros() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64)
}

/// A duration in whole microseconds, saturating (one sample is a `u32`:
/// over an hour, which no bounded scenario reaches).
pub fn micros(d: Duration) -> u32 {
    u32::try_from(d.as_micros()).unwrap_or(u32::MAX)
}

/// What the publisher embeds in each payload: `{"t":<send time, µs since the
/// epoch>,"i":<message index>,"p":"xxx…"}`, padded with `p` to the size asked.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Stamp {
    /// Send time, microseconds since the UNIX epoch.
    pub t: u64,
    /// The message's index within its run, from 0.
    pub i: u64,
}

/// Bytes of `{"t":,"i":,"p":""}` around the numbers and the padding.
const STAMP_OVERHEAD: usize = r#"{"t":,"i":,"p":""}"#.len();

impl Stamp {
    /// Stamps message `i` with the time now.
    pub fn now(i: u64) -> Self {
        Self { t: now_micros(), i }
    }

    /// The payload as JSON text of exactly `size` bytes, or of the smallest
    /// size that holds the stamp (about 40 bytes) when `size` is smaller.
    pub fn encode(&self, size: usize) -> String {
        let (t, i) = (self.t.to_string(), self.i.to_string());
        let pad = size.saturating_sub(STAMP_OVERHEAD + t.len() + i.len());
        let mut out = String::with_capacity(size.max(STAMP_OVERHEAD + 40));
        out.push_str(r#"{"t":"#);
        out.push_str(&t);
        out.push_str(r#","i":"#);
        out.push_str(&i);
        out.push_str(r#","p":""#);
        out.extend(std::iter::repeat_n('x', pad));
        out.push_str(r#""}"#);
        out
    }

    /// Microseconds from this stamp to `received_us` (0 if the clock stepped back).
    pub fn latency_to(&self, received_us: u64) -> u32 {
        u32::try_from(received_us.saturating_sub(self.t)).unwrap_or(u32::MAX)
    }
}

/// Percentiles of a set of samples, in microseconds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Summary {
    pub count: u64,
    pub p50_us: u32,
    pub p90_us: u32,
    pub p99_us: u32,
    pub p999_us: u32,
    pub max_us: u32,
    pub mean_us: f64,
}

impl Summary {
    /// Summarises `samples` (sorting them in place). Percentiles are
    /// nearest-rank: p99 is the smallest sample at least 99% of all are at or below.
    pub fn of(samples: &mut [u32]) -> Self {
        if samples.is_empty() {
            return Self::default();
        }
        samples.sort_unstable();
        let n = samples.len();
        let rank = |p: f64| samples[((p * n as f64).ceil() as usize).clamp(1, n) - 1];
        let sum: u64 = samples.iter().map(|&s| u64::from(s)).sum();
        Self {
            count: n as u64,
            p50_us: rank(0.50),
            p90_us: rank(0.90),
            p99_us: rank(0.99),
            p999_us: rank(0.999),
            max_us: samples[n - 1],
            mean_us: sum as f64 / n as f64,
        }
    }

    /// `p50 / p99 / max` in milliseconds, for tables.
    pub fn brief(&self) -> String {
        if self.count == 0 {
            return "no samples".to_owned();
        }
        format!(
            "{} / {} / {} ms",
            ms(self.p50_us),
            ms(self.p99_us),
            ms(self.max_us)
        )
    }
}

/// Microseconds as milliseconds with three decimals.
pub fn ms(us: u32) -> String {
    format!("{:.3}", f64::from(us) / 1000.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stamp_fills_the_size_asked_and_reads_back() {
        for size in [0, 40, 64, 1024, 65_000] {
            let stamp = Stamp {
                t: 1_733_000_000_123_456,
                i: 42,
            };
            let text = stamp.encode(size);
            assert!(text.len() == size || size < 45, "{size}: {}", text.len());
            let back: Stamp = serde_json::from_str(&text).expect("JSON");
            assert_eq!(back, stamp);
        }
    }

    #[test]
    fn latency_never_goes_negative() {
        let stamp = Stamp { t: 1000, i: 0 };
        assert_eq!(stamp.latency_to(1500), 500);
        assert_eq!(stamp.latency_to(900), 0);
    }

    #[test]
    fn percentiles_are_nearest_rank() {
        let mut samples: Vec<u32> = (1..=1000).rev().collect();
        let s = Summary::of(&mut samples);
        assert_eq!(
            (s.count, s.p50_us, s.p90_us, s.p99_us, s.p999_us, s.max_us),
            (1000, 500, 900, 990, 999, 1000)
        );
        assert_eq!(Summary::of(&mut [7]).p99_us, 7);
        assert_eq!(Summary::of(&mut []).count, 0);
    }
}
