//! What a subscriber holds aside while its session reads history (a
//! subscribe handshake's replay, or a lagging subscriber's catch-up): the
//! live frames of its topic, within its queue's bounds, released by
//! [`Hub::go_live`](super::Hub::go_live) or
//! [`Hub::caught_up`](super::Hub::caught_up).

use bytes::Bytes;
use router::{Epoch, Position};
use tokio::time::Instant;

use super::Kind;
use crate::frame::Variant;

/// What a subscriber that reads history holds aside.
#[derive(Default)]
pub(super) struct Holding {
    pub(super) frames: Vec<Held>,
    bytes: usize,
    /// More came than the bounds hold: everything held was dropped, and
    /// nothing is held until the session asks again. History has it all.
    pub(super) overrun: bool,
    /// It was live and lagged: a catch-up, not a subscribe handshake, reads
    /// its history ([`Hub::caught_up`](super::Hub::caught_up)).
    pub(super) lag: bool,
}

impl Holding {
    /// Nothing held, and nothing to be until the session asks again.
    pub(super) fn overrun(lag: bool) -> Self {
        Self {
            overrun: true,
            lag,
            ..Self::default()
        }
    }

    /// Holding aside from now.
    pub(super) fn fresh(lag: bool) -> Self {
        Self {
            lag,
            ..Self::default()
        }
    }

    /// Holds `held` aside, within `max_frames` and `max_bytes` (its
    /// queue's bounds). Past them, everything is dropped, memory and all:
    /// the session reads on from history instead.
    pub(super) fn hold(&mut self, held: Held, max_frames: usize, max_bytes: usize) {
        if self.overrun {
            return;
        }
        if self.frames.len() < max_frames && self.bytes + held.frame.len() <= max_bytes {
            self.bytes += held.frame.len();
            self.frames.push(held);
        } else {
            *self = Holding::overrun(self.lag);
        }
    }
}

/// A frame held aside for a subscriber that reads history.
pub(super) struct Held {
    pub(super) kind: Kind,
    /// Full or plain: what the client makes of it when it is released.
    pub(super) variant: Variant,
    pub(super) epoch: Epoch,
    pub(super) seq: u64,
    pub(super) frame: Bytes,
    pub(super) at: Instant,
}

/// What [`Hub::caught_up`](super::Hub::caught_up) found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CaughtUp {
    /// Back on the live stream: what was held aside past the position is
    /// queued.
    Live,
    /// More arrived meanwhile than could be held: nothing was sent, it
    /// holds aside from now, and the catch-up reads on from history.
    Overrun,
    /// The queue had no room for all that was held: it lags again, from
    /// this position (the last frame queued); the catch-up reads on.
    Lagged(Position),
    /// Not a lagging subscriber of the topic any more (it left).
    Gone,
}
