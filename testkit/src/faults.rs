//! A real `redis-server` behind a network path the test controls: added
//! latency, packet loss, a partition, each changed while the path is in use.
//! The rig's ([`rig::faults`]: a network namespace impaired by `tc netem`
//! where the test runs as root, else the rig's TCP proxy), where an error
//! is the test failing.
//!
//! `HERALD_TEST_FAULTS=proxy` or `=netns` picks one way instead
//! ([`MODE_VAR`]).

use std::io;
use std::time::Duration;

pub use rig::faults::MODE_VAR;

/// Redis behind a path the test controls; the namespace or proxy and the
/// server go when it is dropped.
pub struct FaultyRedis {
    inner: rig::faults::FaultyRedis,
}

/// A failed step is the test failing.
fn must<T>(done: Result<T, rig::Error>) -> T {
    done.unwrap_or_else(|e| panic!("the path to redis: {e}"))
}

impl FaultyRedis {
    /// Starts the server and its path, with no fault yet.
    pub async fn start() -> io::Result<Self> {
        match rig::faults::FaultyRedis::start().await {
            Ok(inner) => Ok(Self { inner }),
            Err(e) => Err(io::Error::other(e)),
        }
    }

    /// Where herald reaches the server, across the path.
    pub fn url(&self) -> String {
        self.inner.url()
    }

    /// How the path is built: `"netns"` or `"proxy"`.
    pub fn kind(&self) -> &'static str {
        self.inner.kind()
    }

    /// Every round trip takes `round_trip` longer (half each way).
    pub fn delay(&self, round_trip: Duration) {
        must(self.inner.delay(round_trip));
    }

    /// Loses `percent` of the packets each way.
    pub fn loss(&self, percent: f64) {
        must(self.inner.loss(percent));
    }

    /// Nothing gets through, either way, until [`heal`](Self::heal);
    /// connections stay open.
    pub fn partition(&self) {
        must(self.inner.partition());
    }

    /// Ends the partition; the delay and loss set before stay.
    pub fn heal(&self) {
        must(self.inner.heal());
    }

    /// Runs `redis-cli` against the server directly, past the path's
    /// faults; its output.
    pub fn cli(&self, args: &[&str]) -> String {
        must(self.inner.cli(args))
    }
}
