//! The TCP proxy that plays a bad network (latency, loss, partitions):
//! `rig`'s ([`rig::proxy`]), re-exported where the load tool's modules
//! (`stall`, `herald-loadtest proxy`) have always found it.

pub use rig::proxy::{Faults, Proxy, RETRANSMIT, control, describe, tell};
