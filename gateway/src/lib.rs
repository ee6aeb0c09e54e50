//! Herald's gateway pod.
//!
//! - [`server`]: accepts TCP, serves HTTP/1.1, routes, upgrades `/ws`, drains;
//!   [`listener`]: what every listener does with a connection (socket
//!   options, the client's address behind a proxy).
//! - [`publish`]: the backend API's core, whatever protocol a request came
//!   by: who may call it, the checks of a publish, disconnecting a user.
//! - [`http`]: its HTTP edge (`/v1/publish`, `/v1/disconnect`, `/metrics`).
//! - [`grpc`]: its gRPC edge (`herald.v1.Publisher`), on its own listener.
//! - [`session`]: one WebSocket connection: a reader (commands) and a writer
//!   task (replies, pings, and what a socket did not take at once); who the
//!   client is and what it may do; the registry of the pod's live sessions.
//! - [`outbound`]: each connection's bounded outgoing queue, its overflow rule,
//!   and who writes it: the fan-out directly, or the writer task.
//! - [`hub`]: the pod's local subscribers by topic; fan-out.
//! - [`frame`]: server frames, encoded once per publication.
//! - [`disconnect`]: close reasons and codes.
//! - [`node`]: wires the pod together; [`config`]; [`metrics`].
//! - [`rebalance`]: moving clients off a pod that holds more than its share.
//! - [`telemetry`]: OpenTelemetry traces of the publish path (off by default).
//! - [`auth`]: verifying the JWT a client presents, into its user and grants.
//!
//! One message's way: a client's `pub` frame is read by the session reader
//! (a backend's publish comes by [`http`] or [`grpc`] instead) and is
//! passed to the broker (`router`), which gives it a seq, keeps it in
//! history and hands it to the hub; the hub encodes the `msg` frame once and
//! pushes it to every subscriber's queue without waiting; once the topic's
//! lock is released, the queues it found idle are written straight to their
//! sockets, a chunk of connections per task, one `writev` each. What a socket
//! does not take at once is left to that connection's writer task.

// Nothing a peer, a config file or a broker sends may panic the server.
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

pub mod auth;
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
pub mod publish;
pub mod rebalance;
pub mod server;
pub mod session;
pub mod telemetry;

pub use config::Config;
pub use node::Node;
pub use server::{Listeners, run, serve};
