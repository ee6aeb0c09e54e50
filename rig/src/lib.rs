//! The processes Herald's tests and benchmarks start, in one place: the
//! test kit (`testkit`, where an error is the test failing) and the load
//! tool (`herald-loadtest`, where it is a run that could not be set up)
//! both start their servers here. Every call returns an [`Error`]; every
//! wait is bounded; every child is killed when its handle is dropped, and
//! by the kernel when the process that started it dies ([`process`]).
//!
//! One noun per module:
//! - [`process`]: starting a child that dies with its parent, a helper
//!   program run to completion, free loopback ports, signals, the bounded
//!   poll readiness waits go through.
//! - [`redis`]: one `redis-server` ([`Redis`]), over TCP or TLS, in a
//!   scratch directory or one the caller keeps; freeze, restart, back to a
//!   dump.
//! - [`sentinel`]: a master, a replica and three sentinels that fail over
//!   quickly ([`SentinelGroup`]).
//! - [`cluster`]: a Redis Cluster of three masters and three replicas
//!   ([`RedisCluster`]) that fails over quickly and moves slots on demand.
//! - [`herald`]: a `herald` pod from a binary ([`Herald`], started as a
//!   [`Spec`] says), on free ports, ready once `/readyz` says so.
//! - [`proxy`]: a TCP proxy that plays a bad network ([`Proxy`]): latency,
//!   loss, partitions.
//! - [`mod@http`]: the hand-written HTTP exchange a probe needs.
//! - [`error`]: the one [`Error`].
//!
//! It does not link the gateway: the load tool runs against a built
//! binary. (A gateway in the test's own process is the test kit's.)

pub mod cluster;
pub mod error;
pub mod herald;
pub mod http;
pub mod process;
pub mod proxy;
pub mod redis;
pub mod sentinel;

pub use cluster::RedisCluster;
pub use error::Error;
pub use herald::{Herald, Probe, Spec};
pub use proxy::{Faults, Proxy};
pub use redis::Redis;
pub use sentinel::SentinelGroup;
