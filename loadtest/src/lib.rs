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
//! - [`report`]: the human table on stdout and the JSON result file; and
//!   `herald-loadtest report`, BENCHMARKS.md rendered from the result files
//!   read back through their types.
//! - [`raw`]: a lean WebSocket client on a bare TCP socket, for counting a
//!   frame's bytes and holding tens of thousands of idle connections.
//! - [`streams`]: lean clients of the HTTP stream transports on bare TCP
//!   sockets (server-sent events, reconnecting with `Last-Event-ID` as
//!   `EventSource` does; the NDJSON stream of `POST /stream`), and
//!   [`streams::Conn`], a client of any transport, for the scenarios that
//!   run each (`--transport ws|sse|stream`).
//! - [`codec`]: the client's side of Herald's wire formats (JSON and the
//!   `herald.v1.protobuf` subprotocol, with deltas): a `sub` in each, the
//!   server frames read back, Fossil deltas applied to their bases.
//! - [`memory`]: a process's resident memory, from `/proc`.
//! - [`metrics`]: a gateway's `/metrics`, for what a client cannot see (when
//!   the gateway closed a client that does not read).
//! - [`sessions`]: clients that keep a session (the project's own
//!   `herald_client`, with a checker around it): they ack, and when their
//!   connection goes they resume it, after a jittered backoff, at any gateway.
//! - [`proxy`], [`redis_cluster`], [`process`]: the TCP proxy that adds
//!   latency, loss and partitions, the six-node Redis Cluster `chaos`
//!   breaks, and children that die with the load tool: [`rig`]'s (the crate
//!   that starts what tests and benchmarks run), re-exported here.
//! - [`token`]: HS256 client tokens minted for a run (a user and an
//!   `info` claim per client).
//! - [`cli`]: the command line of `herald-loadtest` (clap).
//! - [`mod@bench`]: `herald-loadtest run`, one run of `scripts/bench.sh`: the
//!   servers it needs started from built binaries (herald pods, Redis, a
//!   Redis Cluster, a delaying proxy, through `rig`), the scenario run
//!   against them, and again against the build before.
//!
//! Scenarios, in [`scenarios`], each an `async fn run(Options)` returning a
//! result that [`report`] prints and saves, so tests call them as the binary does:
//! - [`scenarios::fanout`]: N clients on T topics, R paced rounds: per round
//!   p50/p99/last client, gateway CPU and memory per round; with `--floor`,
//!   as multiples of the floor. Its [`scenarios::fanout::engine`] (connect,
//!   publish rounds, drain, merge) runs `pods` and `slow` too.
//! - [`scenarios::pods`]: clients spread over one or more gateways, a paced
//!   publisher on one: delivery latency, lost and duplicated messages.
//! - [`scenarios::slow`]: `fanout` without and then with clients that never
//!   read: the others' latency, when the gateway closed the slow ones.
//! - [`scenarios::floor`]: the same frames written to plain loopback sockets
//!   by one thread (readers in a second process): the kernel's cost.
//! - [`scenarios::publish`]: publish throughput over keep-alive HTTP.
//! - [`scenarios::idle`]: connections held with heartbeats: gateway memory
//!   per connection, unexpected closes; over several processes if need be.
//! - [`scenarios::throughput`]: deliveries per second and per gateway CPU-second.
//! - [`scenarios::wire`]: bytes on the wire per message, Herald against HTTP POST.
//! - [`scenarios::formats`]: bytes and gateway CPU per delivery in each wire
//!   format (JSON, protobuf, deflate, deltas), every payload checked.
//! - [`scenarios::storm`]: every connection cut at once (or a gateway
//!   killed); the time until every session is resumed, lost and duplicated
//!   messages per client.
//! - [`scenarios::sse_failover`]: SSE clients round-robin over two pods,
//!   one killed: each comes back at the other with `Last-Event-ID`; lost
//!   and duplicated messages per client.
//! - [`scenarios::stall`]: a canary topic's latency and longest silence
//!   on a pod watching 20,000 topics with Redis 200 ms away, through a burst
//!   of new topics and a pub/sub reconnect.
//! - [`scenarios::chaos`]: a soak with its own Redis and pods while Redis
//!   is frozen, delayed, failed over and restored from an old dump (or, on
//!   a Redis Cluster, while masters are killed, failed over and slots
//!   migrated); every client's stream checked against what the publishers
//!   were answered.
//! - [`scenarios::presence`]: a 10,000-member room on 4 pods it runs: its
//!   presence memory and writes in Redis, diffs per subscriber through a
//!   rolling restart, page latency, a killed pod's leaves.
//! - [`scenarios::hooks`]: the backend hooks on pods it runs, against a
//!   backend inside the tool: connect-proxy handshakes per second beside
//!   token ones, what the publish proxy adds to a `pub`, webhooks per second.
//!
//! One message's way in `fanout` (and `pods`, `slow`), driven by
//! [`scenarios::fanout::engine`]: the publisher takes a connection from the
//! [`publish::Pool`], stamps the payload with the time
//! ([`latency::Stamp`]) and posts it; the gateway fans it out; each client's
//! reader ([`clients::Subscriber::read`]) notes the receive time minus the
//! stamp under the message's index; the scenario merges the clients'
//! records into percentiles per round (a round's maximum is its "last
//! client") and over the run.

pub mod bench;
pub mod cli;
pub mod clients;
pub mod codec;
pub mod cpu;
pub mod latency;
pub mod memory;
pub mod metrics;
pub mod process;
pub mod proxy;
pub mod publish;
pub mod raw;
pub mod redis_cluster;
pub mod report;
pub mod scenarios;
pub mod sessions;
pub mod streams;
pub mod target;
pub mod token;

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
    #[error("reading the metrics of {target}: {reason}")]
    Scrape { target: SocketAddr, reason: String },
    #[error("worker process: {0}")]
    Worker(String),
    /// `chaos`: a process it runs (redis-server, herald) or its proxy failed.
    #[error("chaos cluster: {0}")]
    Cluster(String),
    /// A process the rig could not start, ask or break as asked (a
    /// `redis-server`, the Redis Cluster, a `herald` pod): the run stops.
    #[error("{0}")]
    Rig(#[from] rig::Error),
    #[error("writing {path}: {source}")]
    Write {
        path: String,
        source: std::io::Error,
    },
}
