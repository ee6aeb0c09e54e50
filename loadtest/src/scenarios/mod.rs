//! The scenarios. Each is a module with `Options` (every default a named
//! constant, every size and time bounded), an `async fn run(Options)` and a
//! result that implements [`report::Outcome`](crate::report::Outcome).
//!
//! - [`fanout`]: N clients on T topics, R rounds `interval` apart: per round
//!   p50, p99 and last client; gateway CPU per round and memory. Its
//!   [`fanout::engine`] runs the rounds of `pods` and `slow` too.
//! - [`pods`]: delivery latency, loss and duplication with clients spread
//!   over one or more gateways and a paced publisher on one of them.
//! - [`slow`]: `fanout` before and after K clients that never read join:
//!   the others' latency with and without them, when the gateway closed them;
//!   with `--catch-up` ([`catch_up`]) they read again after the slow phase:
//!   disconnected, lost, duplicated, back live.
//! - [`floor`]: the same frames written to plain loopback sockets by one
//!   thread: the kernel's cost, `fanout`'s yardstick.
//! - [`publish`]: publish throughput and latency over keep-alive HTTP.
//! - [`idle`]: connections held with heartbeats running: the gateway's
//!   memory per connection, unexpected closes (none allowed).
//! - [`throughput`]: many topics, small messages, as fast as the gateway
//!   takes them: deliveries per second and per gateway CPU-second.
//! - [`wire`]: bytes on the wire per message through Herald against an
//!   HTTP/1.1 POST of the same payload.
//! - [`formats`]: bytes on the wire and gateway CPU per delivery in each
//!   wire format (JSON, protobuf, permessage-deflate, deltas), for a chat
//!   payload and a state payload, every payload checked.
//! - [`storm`]: every session cut at once (or its pod killed) and resumed:
//!   time until all are back, messages lost and duplicated.
//! - [`sse_failover`]: server-sent event streams across a pod's death:
//!   `EventSource`-style clients come back at another pod with
//!   `Last-Event-ID`; messages lost and duplicated per client.
//! - [`stall`]: a canary topic's latency on a pod that watches many topics
//!   while Redis is slow, through a burst of new topics and a pub/sub
//!   reconnect: does one slow part stop fan-out for every topic?
//! - [`presence`]: a 10,000-member room on 4 pods it runs itself, while
//!   messages flow, members churn, pods restart and one is killed: presence's
//!   Redis memory and writes, diffs per subscriber, page latency, leaves.
//! - [`hooks`]: the backend hooks (issue #24) on pods it runs, against a
//!   backend of its own: connect-proxy handshakes per second beside tokens,
//!   what the publish proxy adds to a `pub`, webhook events per second.
//! - [`chaos`]: pods, a Redis master and replica it runs itself, clients
//!   resuming across pods and publishers, while Redis is frozen, delayed,
//!   failed over and restarted from an old dump: every stream checked.

use std::time::Duration;

use crate::Error;

pub mod catch_up;
pub mod chaos;
pub mod fanout;
pub mod floor;
pub mod formats;
pub mod hooks;
pub mod idle;
pub mod pods;
pub mod presence;
pub mod publish;
pub mod slow;
pub mod sse_failover;
pub mod stall;
pub mod storm;
pub mod throughput;
pub mod wire;

/// Payload size, in bytes, when `--size` is not given.
pub const DEFAULT_SIZE: usize = 256;
/// Longest run a scenario accepts: the tool stops by itself, always.
pub const MAX_DURATION: Duration = Duration::from_secs(300);
/// Largest payload: a publish body must stay under the gateway's default
/// `http.max_body_bytes` (64 KiB) with the topic around it.
pub const MAX_SIZE: usize = 60 * 1024;

/// A topic of this run's own (`loadtest.<scenario>.<pid>.<µs>`), so that a
/// run against a shared Redis never sees an earlier run's history.
pub fn unique_topic(scenario: &str) -> String {
    format!(
        "loadtest.{scenario}.{}.{}",
        std::process::id(),
        crate::latency::now_micros()
    )
}

/// Refuses a duration of zero or over [`MAX_DURATION`], and a size over [`MAX_SIZE`].
fn check_bounds(duration: Duration, size: usize) -> Result<(), Error> {
    if duration.is_zero() || duration > MAX_DURATION {
        return Err(Error::Options(format!(
            "--duration must be over 0s and at most {}s",
            MAX_DURATION.as_secs()
        )));
    }
    if size > MAX_SIZE {
        return Err(Error::Options(format!(
            "--size must be at most {MAX_SIZE} bytes"
        )));
    }
    Ok(())
}
