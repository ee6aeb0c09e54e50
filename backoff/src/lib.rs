//! Herald's one backoff: exponential, with full jitter.
//!
//! Every wait before a reconnect or a retry in Herald comes from here: the
//! router's Redis connections, its pub/sub links and its cluster retries, and
//! the Rust client's reconnects. Full jitter (a wait drawn uniformly between
//! zero and the attempt's ceiling; "Exponential Backoff And Jitter", AWS
//! Architecture Blog, 2015) is what spreads a crowd that lost its server at
//! the same instant: every pod of a deployment when Redis restarts, every
//! client of a pod when it dies. Equal jitter (half fixed, half random) keeps
//! a floor at which the crowd still comes back together.
//!
//! Hand-written rather than a crate: it is a multiplication and a random
//! draw, and the crates that offer it add their own retry loops and timers,
//! which every caller here already has (a `select!`, a link table, a script
//! call's redirects).
//!
//! ```
//! use std::time::Duration;
//! use herald_backoff::Backoff;
//!
//! let backoff = Backoff::new(Duration::from_millis(100), Duration::from_secs(1));
//! assert_eq!(backoff.ceiling(0), Duration::from_millis(100));
//! assert_eq!(backoff.ceiling(3), Duration::from_millis(800));
//! assert_eq!(backoff.ceiling(4), Duration::from_secs(1));
//! assert!(backoff.delay(4) <= Duration::from_secs(1));
//! ```

use std::time::Duration;

/// Exponential backoff with full jitter: attempt `n` (from 0) waits a random
/// time between zero and `first × 2^n`, at most `cap`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    /// The ceiling of the first attempt's wait.
    pub first: Duration,
    /// The largest ceiling: however many attempts failed, no wait is longer.
    pub cap: Duration,
}

impl Backoff {
    /// Waits of at most `first`, doubling per attempt up to `cap`.
    pub const fn new(first: Duration, cap: Duration) -> Self {
        Self { first, cap }
    }

    /// The longest wait before attempt `attempt`: `first × 2^attempt`, at
    /// most `cap`.
    pub fn ceiling(&self, attempt: u32) -> Duration {
        // 2^20 times any sensible `first` is past any sensible cap; the
        // shift must stop somewhere below 32.
        self.first
            .saturating_mul(1u32 << attempt.min(20))
            .min(self.cap)
    }

    /// Whether attempt `attempt` already waits up to the cap: the backoff
    /// has stopped growing (a caller may log its failures quieter from here).
    pub fn capped(&self, attempt: u32) -> bool {
        self.ceiling(attempt) >= self.cap
    }

    /// The wait before attempt `attempt`, for a `unit` in [0, 1]: the
    /// deterministic half of [`Backoff::delay`], for tests and tools that
    /// bring their own randomness.
    pub fn delay_at(&self, attempt: u32, unit: f64) -> Duration {
        // `mul_f64` panics on NaN; a NaN unit means no wait.
        let unit = if unit.is_nan() {
            0.0
        } else {
            unit.clamp(0.0, 1.0)
        };
        self.ceiling(attempt).mul_f64(unit)
    }

    /// A random wait before attempt `attempt`, uniform in
    /// [0, [`Backoff::ceiling`]].
    pub fn delay(&self, attempt: u32) -> Duration {
        self.delay_at(attempt, rand::random())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const B: Backoff = Backoff::new(Duration::from_millis(100), Duration::from_secs(5));

    #[test]
    fn ceilings_double_up_to_the_cap_and_stay_there() {
        let ceilings: Vec<u128> = (0..9).map(|n| B.ceiling(n).as_millis()).collect();
        assert_eq!(ceilings, [100, 200, 400, 800, 1600, 3200, 5000, 5000, 5000]);
        assert_eq!(B.ceiling(u32::MAX), Duration::from_secs(5));
        assert!(!B.capped(5));
        assert!(B.capped(6));
    }

    #[test]
    fn a_wait_spans_zero_to_the_ceiling() {
        assert_eq!(B.delay_at(3, 0.0), Duration::ZERO);
        assert_eq!(B.delay_at(3, 1.0), Duration::from_millis(800));
        assert_eq!(B.delay_at(3, 0.5), Duration::from_millis(400));
        // Out-of-range units are clamped, not trusted.
        assert_eq!(B.delay_at(3, 7.0), Duration::from_millis(800));
        assert_eq!(B.delay_at(3, -1.0), Duration::ZERO);
        assert_eq!(B.delay_at(3, f64::NAN), Duration::ZERO);
        for n in 0..40 {
            assert!(B.delay(n) <= B.ceiling(n));
        }
    }

    #[test]
    fn a_huge_first_wait_saturates_instead_of_overflowing() {
        let b = Backoff::new(Duration::MAX, Duration::from_secs(1));
        assert_eq!(b.ceiling(30), Duration::from_secs(1));
    }
}
