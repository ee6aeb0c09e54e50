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
//! - [`history`]: the history API's core (a client's `history`, `GET
//!   /v1/history`, gRPC `History`): its bounds, the broker's read, the
//!   outcome counted.
//! - [`http`]: its HTTP edge (`/v1/publish`, `/v1/disconnect`, `/metrics`,
//!   and `/v1/admin/status`, whose [`admin::Status`] `herald status` prints).
//! - [`grpc`]: its gRPC edge (`herald.v1.Publisher`), on its own listener,
//!   behind [`grpc::gate`] (the API key on a call's headers, a request slot,
//!   a bound on its message) and [`grpc::connections`] (connection caps).
//! - [`stream_commands`]: HTTP-streaming's command POSTs
//!   (`POST /stream/<session>`), taken by any pod: queued on the session
//!   here, or forwarded through the broker to the pod that holds it.
//! - [`session`]: one WebSocket connection: its reader (commands), who the
//!   client is and what it may do, what a resume needs (its subscriptions
//!   and acks); the registry of the pod's live sessions.
//! - [`streams`]: the WebSocket's fallbacks on the same port (issue #25):
//!   `GET /sse` and `POST /stream`, read off the raw socket, each a
//!   [`session`] over a plain HTTP response.
//! - [`outbound`]: a connection's outgoing side: its bounded queue, the
//!   fan-out's direct writes to it, and the writer (replies, pings, and what
//!   a socket did not take at once), which runs in the connection's task.
//! - [`hub`]: the pod's local subscribers by topic; fan-out (a state topic's
//!   deltas computed there, once per publication).
//! - [`hooks`]: the application's backend, asked: the connect, refresh,
//!   subscribe, publish and rpc proxies.
//! - [`webhooks`]: the events the backend is told of (issue #24): a
//!   bounded queue and one batching, signing, retrying sender per pod.
//! - [`presence`]: who is subscribed to a topic, across pods: this pod's
//!   members, written to the broker, and the diffs its subscribers get.
//! - [`frame`]: server frames, encoded once per publication in each format
//!   (JSON or the `herald.v1.protobuf` subprotocol, over a WebSocket or a
//!   stream) and form (plain, full or delta); [`payload`]: what a
//!   publication's data is (JSON text or bytes); [`deflate`]:
//!   permessage-deflate, negotiated, compressed once per publication,
//!   client messages inflated under a cap; [`subprotocol`]: what a `/ws`
//!   connection speaks (`Sec-WebSocket-Protocol`: the JSON protocol, or
//!   `herald.v1.protobuf`).
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
//! metrics, frame, payload, disconnect and signal are below them all.
//! `scripts/module-deps.py` prints the graph and fails the lints on a cycle.
//!
//! [`architecture`] (`docs/architecture.md`) follows a publish, a replay
//! and a resume through these modules and the router's.

pub mod admin;
pub mod admission;
#[doc = include_str!("../../docs/architecture.md")]
pub mod architecture {}
pub mod auth;
pub mod budget;
pub mod config;
pub mod deflate;
pub mod disconnect;
pub mod frame;
pub mod grpc;
pub mod history;
pub mod hooks;
pub mod http;
pub mod hub;
pub mod listener;
pub mod metrics;
pub mod node;
pub mod outbound;
pub mod payload;
pub mod presence;
pub mod process;
pub mod publish;
pub mod rebalance;
pub mod reload;
pub mod server;
pub mod session;
pub mod signal;
pub mod stream_commands;
pub mod streams;
pub mod subprotocol;
pub mod telemetry;
pub mod webhooks;

pub use config::Config;
pub use node::Node;
pub use server::{Listeners, run, serve};
