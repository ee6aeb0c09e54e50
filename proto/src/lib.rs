//! Herald's wire types.
//!
//! The messages are defined once, in `proto/herald/v1/herald.proto`; [`v1`] is
//! the prost code generated from it, with the tonic server and client of its
//! `Publisher` service (checked in, guarded by `tests/bootstrap.rs`). [`json`]
//! is the JSON text form the WebSocket protocol and the HTTP API speak: the
//! same messages, an `"op"` key naming the case, the same field names.
//! `tests/lockstep.rs` keeps the two in step.

pub mod json;

/// Generated from `proto/herald/v1/herald.proto`.
#[allow(clippy::all, missing_docs)]
pub mod v1 {
    include!("gen/herald.v1.rs");
}

pub use json::{AppCode, Command, CommandError, ErrorCode, ServerMessage};
