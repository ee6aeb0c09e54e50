//! Herald's load generator: many WebSocket clients and HTTP publishers, all on
//! this machine, with latency measured where it matters, at the client.
//!
//! Shared parts, one module per noun:
//! - [`target`]: the gateway URLs a scenario may use (loopback only).
//! - [`clients`]: opening many WebSocket clients, each from its own source
//!   address (127.0.0.2, 127.0.0.3, ...), subscribing them, and reading what
//!   they receive; the file-descriptor limit.
//! - [`latency`]: the send-time stamp the publisher puts in each payload, and
//!   percentile summaries.
//! - [`publish`]: the HTTP publish client over keep-alive connections.
//! - [`cpu`]: where the CPU went during a measurement (the machine, this
//!   tool, the gateways named with `--watch-pid`), from `/proc`.
//! - [`report`]: the human table on stdout and the JSON result file.
//! - [`cli`]: the command line of `herald-loadtest`.
//!
//! Scenarios, in [`scenarios`], each an `async fn run(Options)` returning a
//! result that [`report`] prints and saves, so tests call them as the binary does:
//! - [`scenarios::pods`]: clients spread over one or more gateways, a paced
//!   publisher on one: delivery latency, lost and duplicated messages.
//! - [`scenarios::publish`]: publish throughput over keep-alive HTTP.
//!
//! One message's way in `pods`: the publisher takes a connection from the
//! [`publish::Pool`], stamps the payload with the time
//! ([`latency::Stamp`]) and posts it; the gateway fans it out; each client's
//! reader ([`clients::Subscriber::read`]) notes the receive time minus the
//! stamp under the message's index; the scenario merges the clients'
//! records into percentiles per message ("round") and over the run.

pub mod cli;
pub mod clients;
pub mod cpu;
pub mod latency;
pub mod publish;
pub mod report;
pub mod scenarios;
pub mod target;

use std::net::SocketAddr;

pub use target::Target;

/// Everything that stops a scenario before it has a result.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("bad target {url}: {reason}")]
    Target { url: String, reason: String },
    #[error("bad options: {0}")]
    Options(String),
    #[error(
        "{needed} file descriptors are needed but this process may open only {limit} \
         (soft limit raised to the hard limit {hard}; only root can raise the hard one, \
         `ulimit -Hn`): use fewer clients, or split them over several processes"
    )]
    FdLimit { needed: u64, limit: u64, hard: u64 },
    #[error("cannot raise the file-descriptor limit: {0}")]
    Rlimit(std::io::Error),
    #[error("client {client} ({source_addr:?} -> {target}): {reason}")]
    Client {
        client: usize,
        source_addr: Option<SocketAddr>,
        target: SocketAddr,
        reason: String,
    },
    #[error("publish to {target}: {reason}")]
    Publish { target: SocketAddr, reason: String },
    #[error("writing {path}: {source}")]
    Write {
        path: String,
        source: std::io::Error,
    },
}
