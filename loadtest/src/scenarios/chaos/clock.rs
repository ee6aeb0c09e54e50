//! [`Clock`]: the run's time base, milliseconds from its start, that the
//! clients, publishers and faults stamp their logs with. Its own module:
//! every part of the scenario shares it, and it depends on none of them.

use std::time::Duration;

use tokio::time::Instant;

/// Milliseconds from the run's start, the time base of every log.
#[derive(Debug, Clone)]
pub struct Clock {
    start: Instant,
}

impl Clock {
    pub fn new() -> Self {
        Self {
            start: Instant::now(),
        }
    }

    pub fn elapsed(&self) -> Duration {
        Instant::now().saturating_duration_since(self.start)
    }

    pub fn ms(&self) -> u64 {
        self.elapsed().as_millis() as u64
    }

    pub fn ms32(&self) -> u32 {
        u32::try_from(self.ms()).unwrap_or(u32::MAX)
    }
}

impl Default for Clock {
    fn default() -> Self {
        Self::new()
    }
}
