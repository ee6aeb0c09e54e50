//! A connection's outgoing side: its bounded queue ([`queue`]), the
//! fan-out's direct writes to a socket it finds idle ([`direct`]), and the
//! writer ([`writer`], in the connection's task) that writes the rest, the
//! pings and pongs, and the close.
//! The hub pushes publications to it; the session sends its replies and
//! replays through it.

mod direct;
mod ids;
mod queue;
mod room;
pub mod writer;

pub use direct::{IdleSockets, SocketWriter};
pub use ids::{Mark, Place};
pub use queue::{Close, Outbound, Pushed, Taken};
pub use writer::Writing;
