//! Waiting for room in a connection's queue before there is a frame to
//! queue: a lagging client's catch-up reads its next page of history only
//! once the client's queue has room for it (issue #25), so that a client
//! that stalls holds no page and no replay turn while it stalls.

use super::queue::{Outbound, RoomWaiter};

impl Outbound {
    /// Resolves once the queue holds at most `frames` frames and `bytes`
    /// bytes (and is at most half full, as [`send`](Outbound::send) would
    /// queue a frame then), or nothing; false when the connection is
    /// closing. A catch-up asks for room for no more than its page: the
    /// client's pipe stays full (the kernel holds what it was given), while
    /// what the pod holds for it, frames encoded for it alone, stays near
    /// one page rather than half a queue.
    pub async fn room(&self, frames: usize, bytes: usize) -> bool {
        let limits = self.shared.limits;
        loop {
            let room = self.shared.room.notified();
            tokio::pin!(room);
            room.as_mut().enable();
            {
                let mut state = self.state();
                if state.close.is_some() || state.closed {
                    return false;
                }
                let fits = state.frames.len() <= frames.min(limits.frames / 2)
                    && state.bytes <= bytes.min(limits.bytes / 2);
                if fits || state.bytes == 0 {
                    return true;
                }
                state.room_waiters += 1;
            }
            // Counted until woken, or until this future is dropped.
            let waiting = RoomWaiter(self);
            room.await;
            drop(waiting);
        }
    }
}
