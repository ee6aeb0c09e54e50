//! A connection's outgoing queue: bounded in frames and in bytes.
//!
//! The fan-out [`push`](Outbound::push)es encoded frames and never waits;
//! when the queue is full, the connection's [`Overflow`] rule decides. The
//! session's own replies and replays [`send`](Outbound::send), which waits for
//! room instead. The writer task takes everything queued at once and writes it
//! with one vectored write. Pongs and the close frame travel beside the queue,
//! so that a full queue never delays them.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard};

use bytes::Bytes;
use serde::Deserialize;
use tokio::sync::Notify;
use tokio::time::Instant;

use crate::disconnect::CloseReason;
use crate::frame;

/// What happens when a frame does not fit in a connection's queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Overflow {
    /// Close the connection with 4000 (slow consumer): the client reconnects
    /// and resumes, and so misses nothing.
    Disconnect,
    /// Drop the new frame: the client sees a gap in `seq`.
    DropNewest,
}

/// A queue's bounds.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    pub frames: usize,
    pub bytes: usize,
    pub overflow: Overflow,
}

/// The result of [`Outbound::push`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pushed {
    Queued,
    /// Over the bounds with [`Overflow::DropNewest`]: the frame was dropped.
    Dropped,
    /// Over the bounds with [`Overflow::Disconnect`]: the connection closes.
    Overflowed,
    /// The connection is closing; the frame was not queued.
    Closed,
}

/// A request to end the connection.
#[derive(Debug, Clone)]
pub struct Close {
    pub reason: CloseReason,
    /// The close frame to send, if any.
    pub frame: Option<Bytes>,
    /// Write what is queued before the close frame.
    pub flush: bool,
}

/// What the writer takes in one go.
#[derive(Debug, Default)]
pub struct Taken {
    pub pong: Option<Bytes>,
    pub close: Option<Close>,
    /// When the oldest fan-out frame of the batch reached the queue.
    pub oldest: Option<Instant>,
}

/// The handle shared by the fan-out, the session and the writer.
#[derive(Clone)]
pub struct Outbound {
    shared: Arc<Shared>,
}

struct Shared {
    state: Mutex<State>,
    /// Wakes the writer.
    writer: Notify,
    /// Wakes a `send` waiting for room.
    room: Notify,
    limits: Limits,
}

#[derive(Default)]
struct State {
    frames: VecDeque<Bytes>,
    /// Bytes queued plus bytes the writer took and has not finished writing.
    bytes: usize,
    pong: Option<Bytes>,
    close: Option<Close>,
    /// Set once the writer took the close request: nothing more goes out.
    closed: bool,
    /// Why the connection ended, first cause wins.
    reason: Option<CloseReason>,
    /// When the oldest queued fan-out frame was handed over, for the fan-out
    /// latency (one timestamp per queue, not per frame).
    oldest: Option<Instant>,
}

impl State {
    /// A close is requested or done: nothing more is queued.
    fn is_closing(&self) -> bool {
        self.close.is_some() || self.closed
    }
}

impl Outbound {
    pub fn new(limits: Limits) -> Self {
        Self {
            shared: Arc::new(Shared {
                state: Mutex::new(State::default()),
                writer: Notify::new(),
                room: Notify::new(),
                limits,
            }),
        }
    }

    fn state(&self) -> MutexGuard<'_, State> {
        // Nothing panics while holding this lock; recover rather than cascade.
        self.shared.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Queues `frame`, handed over by the fan-out at `at`, without waiting.
    pub fn push(&self, frame: Bytes, at: Instant) -> Pushed {
        let limits = self.shared.limits;
        let mut state = self.state();
        if state.is_closing() {
            return Pushed::Closed;
        }
        if state.frames.len() >= limits.frames || state.bytes + frame.len() > limits.bytes {
            drop(state);
            return self.overflow();
        }
        state.oldest.get_or_insert(at);
        self.enqueue(state, frame);
        Pushed::Queued
    }

    /// Appends `frame`, releases the lock, and wakes the writer if it may be
    /// waiting (the queue was empty).
    fn enqueue(&self, mut state: MutexGuard<'_, State>, frame: Bytes) {
        let was_empty = state.frames.is_empty();
        state.bytes += frame.len();
        state.frames.push_back(frame);
        drop(state);
        if was_empty {
            self.shared.writer.notify_one();
        }
    }

    /// Applies the overflow rule to a frame that does not fit.
    pub fn overflow(&self) -> Pushed {
        match self.shared.limits.overflow {
            Overflow::DropNewest => Pushed::Dropped,
            Overflow::Disconnect => {
                let mut state = self.state();
                // Free the backlog now: the writer may be stuck in a write.
                let dropped: usize = state.frames.drain(..).map(|f| f.len()).sum();
                state.bytes -= dropped;
                Self::request_close(&mut state, CloseReason::SlowConsumer, false);
                drop(state);
                self.shared.writer.notify_one();
                self.shared.room.notify_waiters();
                Pushed::Overflowed
            }
        }
    }

    /// Queues `frame` once the queue is at most half full, so that live
    /// messages still find room while a replay streams in. Returns false when
    /// the connection is closing.
    pub async fn send(&self, frame: Bytes) -> bool {
        let limits = self.shared.limits;
        loop {
            let room = self.shared.room.notified();
            tokio::pin!(room);
            room.as_mut().enable();
            {
                let state = self.state();
                if state.is_closing() {
                    return false;
                }
                let fits = state.frames.len() < limits.frames / 2
                    && state.bytes + frame.len() <= limits.bytes / 2;
                if fits || state.bytes == 0 {
                    self.enqueue(state, frame);
                    return true;
                }
            }
            room.await;
        }
    }

    /// Answers a ping; only the newest ping needs an answer (RFC 6455 5.5.3).
    pub fn pong(&self, frame: Bytes) {
        let mut state = self.state();
        if state.closed {
            return;
        }
        state.pong = Some(frame);
        drop(state);
        self.shared.writer.notify_one();
    }

    /// Ends the connection for `reason`; the first request wins. The close
    /// frame carries the reason's code; `flush` writes what is queued first.
    pub fn close(&self, reason: CloseReason, flush: bool) {
        let mut state = self.state();
        Self::request_close(&mut state, reason, flush);
        drop(state);
        self.shared.writer.notify_one();
        self.shared.room.notify_waiters();
    }

    /// Echoes the client's close frame (`payload` as the client sent it, or
    /// the library's 1002 for an invalid code), unless a close is under way.
    pub fn echo_close(&self, frame: Bytes) {
        let mut state = self.state();
        if !state.is_closing() {
            state.reason.get_or_insert(CloseReason::ClientClosed);
            state.close = Some(Close {
                reason: CloseReason::ClientClosed,
                frame: Some(frame),
                flush: true,
            });
        }
        drop(state);
        self.shared.writer.notify_one();
        self.shared.room.notify_waiters();
    }

    fn request_close(state: &mut State, reason: CloseReason, flush: bool) {
        if state.is_closing() {
            return;
        }
        state.reason.get_or_insert(reason);
        let frame = reason.code().map(|code| frame::close(code, reason.text()));
        state.close = Some(Close {
            reason,
            frame,
            flush,
        });
    }

    /// Records why the connection ended, unless a reason is already known.
    pub fn note_reason(&self, reason: CloseReason) {
        self.state().reason.get_or_insert(reason);
    }

    /// Why the connection ended, if it did.
    pub fn reason(&self) -> Option<CloseReason> {
        self.state().reason
    }

    /// Whether a close frame went out or is about to.
    pub fn is_closing(&self) -> bool {
        self.state().is_closing()
    }

    /// Waits until there is something for the writer.
    pub async fn ready(&self) {
        self.shared.writer.notified().await;
    }

    /// Moves every queued frame into `batch` (unless a close says not to
    /// flush), along with a pending pong and close. After a close is taken,
    /// nothing more is queued.
    pub fn take(&self, batch: &mut Vec<Bytes>) -> Taken {
        let mut state = self.state();
        let close = state.close.take();
        if let Some(close) = &close {
            state.closed = true;
            if !close.flush {
                let dropped: usize = state.frames.drain(..).map(|f| f.len()).sum();
                state.bytes -= dropped;
            }
        }
        batch.extend(state.frames.drain(..));
        Taken {
            pong: state.pong.take(),
            close,
            oldest: state.oldest.take(),
        }
    }

    /// Gives back the room of `bytes` written (or abandoned).
    pub fn written(&self, bytes: usize) {
        let mut state = self.state();
        state.bytes = state.bytes.saturating_sub(bytes);
        drop(state);
        self.shared.room.notify_waiters();
    }

    /// Marks the queue finished: pushes fail and waiting sends return.
    pub fn finish(&self) {
        let mut state = self.state();
        state.closed = true;
        state.frames.clear();
        state.bytes = 0;
        drop(state);
        self.shared.room.notify_waiters();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn queue(overflow: Overflow) -> Outbound {
        Outbound::new(Limits {
            frames: 4,
            bytes: 100,
            overflow,
        })
    }

    #[test]
    fn bounded_in_frames_and_bytes() {
        let q = queue(Overflow::DropNewest);
        for _ in 0..4 {
            assert_eq!(
                q.push(Bytes::from_static(b"x"), Instant::now()),
                Pushed::Queued
            );
        }
        assert_eq!(
            q.push(Bytes::from_static(b"x"), Instant::now()),
            Pushed::Dropped
        );
        let mut batch = Vec::new();
        q.take(&mut batch);
        q.written(4);
        assert_eq!(
            q.push(Bytes::from(vec![0; 101]), Instant::now()),
            Pushed::Dropped
        );
        assert_eq!(
            q.push(Bytes::from(vec![0; 100]), Instant::now()),
            Pushed::Queued
        );
    }

    #[test]
    fn overflow_disconnects_and_drops_the_backlog() {
        let q = queue(Overflow::Disconnect);
        assert_eq!(
            q.push(Bytes::from(vec![0; 60]), Instant::now()),
            Pushed::Queued
        );
        assert_eq!(
            q.push(Bytes::from(vec![0; 60]), Instant::now()),
            Pushed::Overflowed
        );
        assert_eq!(
            q.push(Bytes::from_static(b"x"), Instant::now()),
            Pushed::Closed
        );
        let mut batch = Vec::new();
        let taken = q.take(&mut batch);
        assert!(batch.is_empty());
        let close = taken.close.unwrap_or_else(|| panic!("close requested"));
        assert_eq!(close.reason, CloseReason::SlowConsumer);
        assert_eq!(q.reason(), Some(CloseReason::SlowConsumer));
    }

    #[tokio::test]
    async fn send_waits_for_room() {
        let q = queue(Overflow::Disconnect);
        assert!(q.send(Bytes::from(vec![0; 50])).await);
        let waiting = {
            let q = q.clone();
            tokio::spawn(async move { q.send(Bytes::from(vec![0; 10])).await })
        };
        tokio::task::yield_now().await;
        assert!(!waiting.is_finished());
        let mut batch = Vec::new();
        q.take(&mut batch);
        q.written(50);
        assert!(matches!(waiting.await, Ok(true)));
    }
}
