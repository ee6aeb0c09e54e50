//! The Redis engine: topics, seqs, history and sessions shared by every pod,
//! on one Redis (or Sentinel's master) or a Redis Cluster.
//!
//! - A publish is one item of a Lua script ([`scripts::PUBLISH`]): next seq,
//!   history append and trim, announcement on the topic's channel,
//!   idempotency key. Seq order is therefore the order every pod delivers
//!   in. Publishes are batched and pipelined ([`publisher`]): many per
//!   script call, many calls per round trip.
//! - Each pod keeps a pub/sub connection per Redis master ([`pubsub`]): it
//!   subscribes to a topic's channel while the pod has subscribers (sharded,
//!   at the topic's master, in a cluster), delivers in seq order, fills gaps
//!   from history and tells subscribers (`reset`) where it cannot.
//! - Commands go to the master of their key's slot ([`shards`]) over one
//!   multiplexed connection per master (pipelined, with timeouts,
//!   reconnecting by itself, to the current master with Sentinel:
//!   [`connection`]), following the cluster's redirects and failovers;
//!   session saves are batched ([`sessions`]).
//! - Every key and channel starts with the deployment's prefix
//!   ([`scripts::Keys`]), so that deployments can share a Redis; a topic's
//!   keys share its hash slot.
//! - A pod starts while Redis is away: not ready, saying why ([`reach`]),
//!   until its pub/sub connection first comes up.
//!
//! The files, one noun each:
//!
//! - [`settings`]: what the engine is told ([`RedisSettings`]), checked
//!   before anything connects.
//! - [`broker`]: the [`RedisBroker`], its start and its [`crate::Broker`]
//!   calls; [`store`]: its [`crate::SessionStore`] calls.
//! - [`recover`]: reading a topic's position and history; [`history`]:
//!   the history API's pages; [`replies`]: what
//!   the engine reads out of Redis's replies; [`call`]: one Redis call, timed
//!   and reported.
//! - [`connection`] and [`sentinel`]: reaching Redis; [`shards`] and
//!   [`slots`]: which master holds a key.
//! - [`publisher`], [`sessions`] and [`pages`]: the batched writers and the
//!   replay's reads; [`pubsub`] and [`lineage`]: following the topics this
//!   pod watches; [`scripts`]: the Lua scripts and the keys they touch;
//!   [`reach`]: whether Redis was reached yet; [`control`]: what the
//!   control channel carries (disconnects, server-side subscriptions).
//! - [`presence`]: each pod's part of a topic's presence in one hash field,
//!   replicas of the watched rooms, the pods' liveness and the cleanup of a
//!   dead pod's members.

mod broker;
mod call;
mod connection;
mod control;
mod history;
mod lineage;
mod occupancy;
mod pages;
mod presence;
mod publisher;
mod pubsub;
mod reach;
mod recover;
mod replies;
mod scripts;
mod sentinel;
mod sessions;
mod settings;
mod shards;
pub mod slots;
mod store;

use std::time::Duration;

pub use broker::{RedisBroker, StartError};
pub use scripts::DEFAULT_PREFIX;
pub use settings::{
    InvalidSetting, RedisSettings, SentinelSettings, TlsFiles, redact_url, redact_urls,
};

/// How long a topic's seq and epoch outlive its last publish. Longer than any
/// sensible history age: losing them starts a new epoch, which subscribers
/// are told about.
const META_TTL: Duration = Duration::from_secs(7 * 24 * 3600);

/// A fresh random epoch: 64 bits, hex.
fn new_epoch() -> String {
    format!("{:016x}", rand::random::<u64>())
}

fn millis(d: Duration) -> u64 {
    d.as_millis().min(u64::MAX as u128) as u64
}
