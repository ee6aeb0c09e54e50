//! Herald's gateway pod.
//!
//! - [`server`]: accepts TCP, serves HTTP/1.1, routes, upgrades `/ws`, drains;
//!   [`listener`]: what every listener does with a connection (socket
//!   options, the client's address behind a proxy); [`admission`]: the
//!   WebSocket connection slots, in total and per client address;
//!   [`budget`]: what a user or an anonymous address may hold and touch
//!   across its connections.
//! - [`publish`]: the backend API's core, whatever protocol a request came
//!   by: who may call it, the checks of a publish, disconnecting a user.
//! - [`http`]: its HTTP edge (`/v1/publish`, `/v1/disconnect`, `/metrics`,
//!   and `/v1/admin/status`, whose [`admin::Status`] `herald status` prints).
//! - [`grpc`]: its gRPC edge (`herald.v1.Publisher`), on its own listener,
//!   behind [`grpc::gate`] (the API key on a call's headers, a request slot,
//!   a bound on its message) and [`grpc::connections`] (connection caps).
//! - [`session`]: one WebSocket connection: its reader (commands), who the
//!   client is and what it may do, what a resume needs (its subscriptions
//!   and acks); the registry of the pod's live sessions.
//! - [`outbound`]: a connection's outgoing side: its bounded queue, the
//!   fan-out's direct writes to it, and the writer (replies, pings, and what
//!   a socket did not take at once), which runs in the connection's task.
//! - [`hub`]: the pod's local subscribers by topic; fan-out.
//! - [`frame`]: server frames, encoded once per publication.
//! - [`disconnect`]: close reasons and codes; [`signal`]: a one-time signal
//!   between a connection's parts.
//! - [`node`]: builds the pod's parts and wires them together (sessions
//!   get theirs as a [`session::Pod`]); [`config`]; [`metrics`].
//! - [`rebalance`]: moving clients off a pod that holds more than its share.
//! - [`reload`]: what changes without a restart (API keys, the log level).
//! - [`process`]: the herald process around it all: binds the listeners,
//!   reloads on SIGHUP or a file change, stops on SIGTERM (the binary's
//!   `main.rs` parses the command line and calls [`process::run`]).
//! - [`telemetry`]: OpenTelemetry traces of the publish path (off by default).
//! - [`auth`]: verifying the JWT a client presents, into its user and grants.
//!
//! Dependencies between these modules run one way, as a message does: the
//! process runs the server; the edges (server, http, grpc) use the node,
//! which builds the rest; session -> hub -> outbound; config, auth,
//! metrics, frame, disconnect and signal are below them all.
//! `scripts/module-deps.py` prints the graph and fails the lints on a cycle.
//!
//! ## A publish, to a subscriber's socket
//!
//! 1. [`http::publish`] (or the gRPC `Publish` in [`grpc`], or a client's
//!    `pub` read by its [`session`]) checks the request and calls
//!    [`publish::publish_data`].
//! 2. [`router::Broker::publish`] gives it the topic's next seq and keeps it
//!    in history; with Redis, every pod that watches the topic gets it
//!    through pub/sub.
//! 3. The engine hands it to the pod's sink, [`router::Deliver::deliver`] of
//!    the [`hub::Hub`], which encodes the `msg` frame once
//!    ([`frame::publication`]) and
//! 4. [`outbound::Outbound::push`]es it to every subscriber's bounded queue,
//!    under the topic's lock and without waiting, listing the queues nobody
//!    was writing in an [`outbound::IdleSockets`];
//! 5. once the lock is released, [`outbound::IdleSockets::spawn`] writes
//!    those straight to their sockets, a chunk of connections per task. What
//!    a socket does not take at once is left to the connection's writer.
//!
//! ## A `sub` with `since`, through replay
//!
//! 1. The connection's session ([`session::serve_upgraded`]) reads the
//!    command, checks it against the client's grants, takes one of the
//!    pod's replay turns ([`session::Replays`]), and joins the topic:
//!    [`hub::Hub::join`] holds aside what arrives from now on (within the
//!    queue's bounds; past them, it is read from history instead).
//! 2. [`router::Broker::watch`] (once per topic and pod), then
//!    [`router::Broker::recover`]: the topic's position, and the first page
//!    of its history after `since`.
//! 3. The replay goes to the client's queue a page at a time, each read
//!    ([`router::Broker::history`]) once the queue has taken the one before,
//!    then [`hub::Hub::go_live`] releases what was held aside beyond it, and
//!    delivery goes on as above.

pub mod admin;
pub mod admission;
pub mod auth;
pub mod budget;
pub mod config;
pub mod disconnect;
pub mod frame;
pub mod grpc;
pub mod http;
pub mod hub;
pub mod listener;
pub mod metrics;
pub mod node;
pub mod outbound;
pub mod process;
pub mod publish;
pub mod rebalance;
pub mod reload;
pub mod server;
pub mod session;
pub mod signal;
pub mod telemetry;

pub use config::Config;
pub use node::Node;
pub use server::{Listeners, run, serve};
