//! A connection's outgoing side: its bounded queue ([`queue`]), the
//! fan-out's direct writes to a socket it finds idle ([`direct`]), and the
//! writer task ([`writer`]) that writes the rest, the pings and the close.
//! The hub pushes publications to it; the session sends its replies and
//! replays through it.

mod direct;
mod queue;
pub mod writer;

pub use direct::{IdleSockets, SocketWriter};
pub use queue::{Close, Outbound, Pushed, Taken};
pub use writer::Writing;
