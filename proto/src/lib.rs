//! Herald's wire types.
//!
//! The messages are defined once, in `proto/herald/v1/herald.proto` (and the
//! proxies' in `hooks.proto`, the same package); [`v1`] is the prost code
//! generated from them, with the tonic servers and clients of the
//! `Publisher` and `ProxyBackend` services (checked in, guarded by
//! `tests/bootstrap.rs`). [`json`]
//! is the JSON text form the WebSocket protocol and the HTTP API speak: the
//! same messages, an `"op"` key naming the case, the same field names.
//! `tests/lockstep.rs` keeps the two in step. [`binary`] reads the protobuf
//! form of a client's command (the `herald.v1.protobuf` subprotocol) into
//! the same [`Command`] as the JSON form.

pub mod binary;
pub mod json;

/// Generated from `proto/herald/v1/herald.proto` and `hooks.proto`.
#[allow(clippy::all, missing_docs)]
pub mod v1 {
    include!("gen/herald.v1.rs");
}

pub use json::{AppCode, Command, CommandError, ErrorCode, ServerMessage};
