//! Waiting for room in a connection's queue before there is a frame to
//! queue: a lagging client's catch-up reads its next page of history only
//! once the client's queue has room for it (issue #25), so that a client
//! that stalls holds no page and no replay turn while it stalls.

use super::queue::{Outbound, RoomWaiter};

impl Outbound {
    /// Resolves once the queue is at most half full, as
    /// [`send`](Outbound::send) would queue a frame then; false when the
    /// connection is closing.
    pub async fn room(&self) -> bool {
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
                let half =
                    state.frames.len() < limits.frames / 2 && state.bytes <= limits.bytes / 2;
                if half || state.bytes == 0 {
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
