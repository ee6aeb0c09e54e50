//! Processes that must not outlive the load tool: `rig`'s ([`rig::process`]),
//! re-exported where the load tool's modules have always found them.

pub use rig::process::{command, spawn};
