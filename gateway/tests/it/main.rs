//! The gateway's integration tests: one test binary, a module per story.
//!
//! One binary, not one per file: each test binary links the whole gateway
//! and the testkit, and linking 37 of them was a large share of the build.
//! A test is named by its story and what it proves,
//! `resume::after_the_window_the_session_is_fresh`; a nextest filter picks a
//! story with `test(/^resume::/)` (`.config/nextest.toml`).
//!
//! Nextest runs each test in a process of its own, as before; `cargo test`
//! runs them all in this one process, on threads. So no test changes
//! process-wide state (environment variables, rlimits, the current
//! directory), and the temporary files of a test are named for its story
//! as well as for the process.

// Tests: a failed expectation is the failure.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod abuse;
mod admin;
mod auth;
// Issue #26: binary publish data end to end (h-binary).
mod binary;
mod budgets;
mod chaos;
mod cli;
mod cluster;
mod commands;
mod config;
mod conformance;
mod continuity;
mod deflate;
// Issue #26: deltas for state topics (h-delta).
mod delta;
mod failover;
mod fanout;
mod grpc;
mod happy_path;
mod heartbeat;
mod history;
mod hooks;
mod http_api;
// Issue #25: lagging clients caught up from history (h-lag).
mod lag;
mod leftovers;
mod limits;
mod logs;
mod observability;
mod pod;
mod presence;
mod presence_pods;
// Issue #26: the herald.v1.protobuf subprotocol (h-proto).
mod protobuf;
// Issue #24: the proxies' transport (h-proxy).
mod proxy_transport;
mod python_client;
mod rebalance;
mod redis_access;
mod redis_cluster;
mod redis_down;
mod redis_faults;
mod releases;
mod reload;
mod replay;
mod replay_pace;
mod resume;
mod rfc6455;
mod rollout;
mod server_subscriptions;
mod sessions;
mod shutdown;
mod slow_consumer;
// Issue #25: SSE and HTTP-streaming (h-streams).
mod sse;
// Issue #25: HTTP-streaming's command POSTs (h-commands).
mod stream_commands;
mod tracing;
mod webhooks;
