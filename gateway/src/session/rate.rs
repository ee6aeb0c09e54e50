//! A token bucket: how many commands a connection may send, on average and
//! in a burst.

use tokio::time::Instant;

#[derive(Debug)]
pub struct Bucket {
    per_second: f64,
    burst: f64,
    tokens: f64,
    at: Instant,
}

impl Bucket {
    /// A full bucket of `burst` tokens, refilled at `per_second`.
    pub fn new(per_second: u32, burst: u32) -> Self {
        Self {
            per_second: f64::from(per_second),
            burst: f64::from(burst),
            tokens: f64::from(burst),
            at: Instant::now(),
        }
    }

    /// Takes a token if there is one.
    pub fn take(&mut self) -> bool {
        let now = Instant::now();
        let refill = now.saturating_duration_since(self.at).as_secs_f64() * self.per_second;
        self.tokens = (self.tokens + refill).min(self.burst);
        self.at = now;
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_burst_then_the_rate() {
        let mut bucket = Bucket::new(10, 3);
        assert!((0..3).all(|_| bucket.take()));
        assert!(!bucket.take());
        tokio::time::advance(Duration::from_millis(100)).await;
        assert!(bucket.take());
        assert!(!bucket.take());
        // Idle time refills no more than the burst.
        tokio::time::advance(Duration::from_secs(60)).await;
        assert_eq!((0..10).filter(|_| bucket.take()).count(), 3);
    }
}
