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
//!   loss, partitions; and a failover's "virtual IP" (switch, cut).
//! - [`faults`]: a `redis-server` behind a network path whose latency,
//!   loss and partitions the caller controls ([`FaultyRedis`]): `tc netem`
//!   in a namespace of its own where it may, else the [`proxy`].
//! - [`mod@http`]: the hand-written HTTP exchange a probe needs.
//! - [`error`]: the one [`Error`].
//!
//! It does not link the gateway: the load tool runs against a built
//! binary. (A gateway in the test's own process is the test kit's.)
//!
//! Two pods sharing a Redis, as a benchmark run starts them:
//!
//! ```no_run
//! # async fn run(bin: &std::path::Path, out: &std::path::Path) -> Result<(), rig::Error> {
//! use rig::{Herald, Redis, Spec};
//!
//! // Its log and directory kept in the run's: `out/redis/redis.log`.
//! let redis = Redis::start_in(out.join("redis"), None, &[]).await?;
//! let pod = |name: &str| {
//!     Spec::new(bin)
//!         .env("HERALD_BROKER", "redis")
//!         .env("HERALD_REDIS__URL", redis.url())
//!         .log(out.join(format!("{name}.log")))
//! };
//! let a = Herald::start(pod("pod-a")).await?;
//! let b = Herald::start(pod("pod-b")).await?;
//! println!("{} (pid {:?}) and {}", a.ws_url(), a.pid(), b.ws_url());
//! // Dropped: both pods and the server are killed.
//! # Ok(())
//! # }
//! ```

pub mod cluster;
pub mod error;
pub mod faults;
pub mod herald;
pub mod http;
pub mod process;
pub mod proxy;
pub mod redis;
pub mod sentinel;

pub use cluster::RedisCluster;
pub use error::Error;
pub use faults::FaultyRedis;
pub use herald::{Herald, Probe, Spec};
pub use proxy::{Faults, Proxy};
pub use redis::Redis;
pub use sentinel::SentinelGroup;
