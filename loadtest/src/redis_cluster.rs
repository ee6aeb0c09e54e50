//! The six-node Redis Cluster `chaos --redis cluster` breaks: `rig`'s
//! ([`rig::cluster`]), re-exported where the load tool's modules have
//! always found it. Its error is the rig's one [`rig::Error`].

pub use rig::Error as ClusterError;
pub use rig::cluster::{CLI_TIMEOUT, NODE_TIMEOUT, RedisCluster, Shape, scratch_dir};
pub use rig::process::{blocking, poll};
