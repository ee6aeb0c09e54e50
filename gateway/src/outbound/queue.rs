//! A connection's outgoing queue, bounded in frames and in bytes.
//!
//! The fan-out [`push`](Outbound::push)es encoded frames and never waits;
//! when the queue is full, the connection's [`Overflow`] rule decides. The
//! session's own replies and replays [`send`](Outbound::send), which waits for
//! room instead. Pongs, pings and the close frame travel beside the queue, so
//! that a full queue never delays them.
//!
//! Two parties write it to the socket, never at once: the fan-out, straight
//! to a socket it found idle ([`super::direct`]), and the connection's writer
//! task ([`super::writer`]), which [`take`](Outbound::take)s everything
//! queued and writes it under the write timeout. The queue's lock is held
//! across a direct write, and the writer marks the batch it writes, so the
//! two never interleave bytes.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard};

use bytes::{Buf, Bytes};
use tokio::net::tcp::OwnedWriteHalf;
use tokio::sync::Notify;
use tokio::time::Instant;

use super::direct::{IdleSockets, Socket, SocketWriter};
use super::ids::{EventIds, Mark};
use crate::config::{Limits, Overflow};
use crate::disconnect::CloseReason;
use crate::frame::{self, Format};
use crate::signal::Signal;

/// Slices handed to one `writev` by the writer (Linux allows 1024).
pub(crate) const MAX_IOV: usize = 256;

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
    /// No room, and nothing done: [`Outbound::offer`]'s only.
    Full,
}

/// A request to end the connection.
#[derive(Debug, Clone)]
pub struct Close {
    pub reason: CloseReason,
    /// The close frame to send, if any.
    pub frame: Option<Bytes>,
    /// Write what is queued before the close frame.
    pub flush: bool,
    /// The client's close came before this one went out: this one answers
    /// it, so the writer waits for no other.
    pub answers: bool,
}

impl Close {
    /// Whether the writer waits for the client's close after writing this one.
    pub fn lingers(&self) -> bool {
        self.reason.lingers() && !self.answers
    }
}

/// What the writer took in one go, in write order in its batch.
#[derive(Debug)]
pub struct Taken {
    /// Queued frames in the batch (control frames and the close not counted).
    pub frames: u64,
    /// Their bytes, to give back with [`Outbound::written`].
    pub bytes: usize,
    pub close: Option<Close>,
    /// When the oldest fan-out frame of the batch reached the queue.
    pub oldest: Option<Instant>,
}

/// The handle shared by the fan-out, the session and the writer.
#[derive(Clone)]
pub struct Outbound {
    pub(super) shared: Arc<Shared>,
}

/// `repr(C)`, in this order: what a fan-out's push and direct write touch
/// (the reference counts before it, the socket, the bounds, the lock and
/// the queue's head) lies together at the front, a cache line or two, not
/// spread over five (issue #16). The `Notify`s are seldom used.
#[repr(C)]
pub(super) struct Shared {
    /// For direct writes; without it, the writer writes everything.
    pub(super) socket: Option<Socket>,
    pub(super) limits: Limits,
    state: Mutex<State>,
    /// Wakes the writer.
    writer: Notify,
    /// Wakes a `send` waiting for room.
    pub(super) room: Notify,
    /// The connection is over: its reader or its writer ended it, and the
    /// other stops too.
    stopped: Signal,
    /// How this connection's frames are written.
    format: Format,
}

/// `repr(C)`: the fields a push and a direct write read first (see
/// [`Shared`]).
#[derive(Default)]
#[repr(C)]
pub(super) struct State {
    pub(super) frames: VecDeque<Bytes>,
    /// Bytes queued plus bytes the writer took and has not finished writing.
    pub(super) bytes: usize,
    /// When the oldest queued fan-out frame was handed over, for the fan-out
    /// latency (one timestamp per queue, not per frame).
    pub(super) oldest: Option<Instant>,
    /// The front frame is partly written: its rest goes before anything else.
    partial: bool,
    /// The writer is writing a batch: direct writes wait their turn.
    pub(super) writing: bool,
    /// Set once the writer took the close request: nothing more goes out.
    pub(super) closed: bool,
    /// `send`s waiting for room: a direct write, which frees room once per
    /// delivery, wakes them only when there are some (`Notify` takes a lock
    /// even when nobody waits).
    pub(super) room_waiters: u32,
    pub(super) close: Option<Close>,
    pub(super) pong: Option<Bytes>,
    pub(super) ping: Option<Bytes>,
    /// Why the connection ended, first cause wins.
    reason: Option<CloseReason>,
    /// An SSE connection's event ids; `None` for every other format.
    pub(super) ids: Option<EventIds>,
}

impl State {
    /// A close is requested or done: nothing more is queued.
    fn is_closing(&self) -> bool {
        self.close.is_some() || self.closed
    }

    pub(super) fn append(&mut self, frame: Bytes) {
        self.bytes += frame.len();
        self.frames.push_back(frame);
    }

    /// Drops the queued frames, but not the rest of one partly written.
    fn drop_backlog(&mut self) {
        let keep = usize::from(self.partial);
        let dropped: usize = self.frames.drain(keep..).map(|f| f.len()).sum();
        self.bytes -= dropped;
    }

    /// Removes `written` bytes from the front of the queue; returns the
    /// frames completed.
    pub(super) fn consume(&mut self, written: usize) -> u64 {
        self.bytes -= written;
        let mut left = written;
        let mut completed = 0;
        while left > 0 {
            let Some(front) = self.frames.front_mut() else {
                break;
            };
            if left < front.len() {
                front.advance(left);
                self.partial = true;
                break;
            }
            left -= front.len();
            self.frames.pop_front();
            completed += 1;
            self.partial = false;
        }
        completed
    }
}

impl Outbound {
    /// A queue written by its writer alone.
    pub fn new(limits: Limits) -> Self {
        Self::build(limits, None, Format::default())
    }

    /// A queue of frames in `format`, written by its writer alone.
    pub fn formatted(limits: Limits, format: Format) -> Self {
        Self::build(limits, None, format)
    }

    /// A queue that fan-outs may also write straight to `socket`, and the
    /// writer's handle on that socket.
    pub fn with_socket(limits: Limits, socket: OwnedWriteHalf) -> (Self, SocketWriter) {
        Self::with_socket_as(limits, socket, Format::default())
    }

    /// [`with_socket`](Self::with_socket), for frames in `format`.
    pub fn with_socket_as(
        limits: Limits,
        socket: OwnedWriteHalf,
        format: Format,
    ) -> (Self, SocketWriter) {
        let out = Self::build(limits, Some(Socket::Tcp(socket)), format);
        (out.clone(), SocketWriter(out))
    }

    /// How this connection's frames are written: whoever encodes for it
    /// encodes in this.
    pub fn format(&self) -> Format {
        self.shared.format
    }

    pub(super) fn build(limits: Limits, socket: Option<Socket>, format: Format) -> Self {
        Self {
            shared: Arc::new(Shared {
                state: Mutex::new(State::default()),
                writer: Notify::new(),
                room: Notify::new(),
                stopped: Signal::default(),
                limits,
                socket,
                format,
            }),
        }
    }

    pub(super) fn state(&self) -> MutexGuard<'_, State> {
        // Nothing panics while holding this lock; recover rather than cascade.
        self.shared.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(super) fn wake_writer(&self) {
        self.shared.writer.notify_one();
    }

    /// Ends the connection for its reader and its writer: whichever of them
    /// is done says so, and the other stops.
    pub fn stop(&self) {
        self.shared.stopped.set();
    }

    /// Resolves once [`stop`](Self::stop) was called.
    pub async fn stopped(&self) {
        self.shared.stopped.wait().await;
    }

    /// Wakes the connection's loop for a server-side command
    /// ([`stopped_or_poked`](Self::stopped_or_poked)).
    pub fn poke(&self) {
        self.shared.stopped.poke();
    }

    /// [`stopped`](Self::stopped), or a [`poke`](Self::poke): `true` when
    /// stopped.
    pub async fn stopped_or_poked(&self) -> bool {
        self.shared.stopped.wait_or_poked().await
    }

    #[cfg(test)]
    pub(crate) fn is_stopped(&self) -> bool {
        self.shared.stopped.is_set()
    }

    /// Queues `frame`, handed over by the fan-out at `at`, without waiting.
    /// A connection nobody is writing to joins `idle`, which writes it.
    pub fn push(&self, frame: Bytes, at: Instant, idle: &mut IdleSockets) -> Pushed {
        self.push_marked(frame, None, at, idle)
    }

    /// [`push`](Self::push) of a frame that moves its topic to `mark`.
    pub fn push_marked(
        &self,
        frame: Bytes,
        mark: Option<Mark<'_>>,
        at: Instant,
        idle: &mut IdleSockets,
    ) -> Pushed {
        match self.offer(frame, mark, at, idle) {
            Pushed::Full => self.overflow_as(self.shared.limits.overflow),
            pushed => pushed,
        }
    }

    /// [`push_marked`](Self::push_marked) without the overflow rule: a
    /// frame that does not fit is [`Pushed::Full`], for the caller to
    /// decide (a lagging subscriber's topic is caught up from history).
    pub fn offer(
        &self,
        frame: Bytes,
        mark: Option<Mark<'_>>,
        at: Instant,
        idle: &mut IdleSockets,
    ) -> Pushed {
        let limits = self.shared.limits;
        let mut state = self.state();
        if state.is_closing() {
            return Pushed::Closed;
        }
        if state.frames.len() >= limits.frames || state.bytes + frame.len() > limits.bytes {
            return Pushed::Full;
        }
        state.oldest.get_or_insert(at);
        let nobody_writing = state.frames.is_empty() && !state.writing;
        state.append_event(frame, mark);
        drop(state);
        if nobody_writing {
            idle.0.push(self.clone());
        }
        Pushed::Queued
    }

    /// The rule for a frame that does not fit, as `queue.overflow` says.
    pub fn overflow_rule(&self) -> Overflow {
        self.shared.limits.overflow
    }

    /// Appends `frame`, releases the lock, and wakes the writer if it may be
    /// waiting (the queue was empty).
    fn enqueue(&self, mut state: MutexGuard<'_, State>, frame: Bytes, mark: Option<Mark<'_>>) {
        let was_empty = state.frames.is_empty();
        state.append_event(frame, mark);
        drop(state);
        if was_empty {
            self.wake_writer();
        }
    }

    /// Applies `rule` (the connection's overflow rule, or a namespace's
    /// `on_lag`) to a frame that does not fit.
    pub fn overflow_as(&self, rule: Overflow) -> Pushed {
        match rule {
            Overflow::DropNewest => Pushed::Dropped,
            Overflow::Disconnect => {
                let mut state = self.state();
                // Free the backlog now: the writer may be stuck in a write.
                state.drop_backlog();
                self.request_close(&mut state, CloseReason::SlowConsumer, false);
                self.closing(state);
                Pushed::Overflowed
            }
        }
    }

    /// Queues `frame` once the queue is at most half full, so that live
    /// messages still find room while a replay streams in. Returns false when
    /// the connection is closing.
    pub async fn send(&self, frame: Bytes) -> bool {
        self.send_marked(frame, None).await
    }

    /// [`send`](Self::send) of a frame that moves its topic to `mark`.
    pub async fn send_marked(&self, frame: Bytes, mark: Option<Mark<'_>>) -> bool {
        let limits = self.shared.limits;
        loop {
            let room = self.shared.room.notified();
            tokio::pin!(room);
            room.as_mut().enable();
            {
                let mut state = self.state();
                if state.is_closing() {
                    return false;
                }
                let fits = state.frames.len() < limits.frames / 2
                    && state.bytes + frame.len() <= limits.bytes / 2;
                if fits || state.bytes == 0 {
                    self.enqueue(state, frame, mark);
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

    /// Answers a ping; only the newest ping needs an answer (RFC 6455 5.5.3).
    pub fn pong(&self, frame: Bytes) {
        self.control(frame, |state| &mut state.pong);
    }

    /// Sends a heartbeat ping, ahead of anything queued.
    pub fn ping(&self, frame: Bytes) {
        self.control(frame, |state| &mut state.ping);
    }

    /// Puts a control frame in its `slot` beside the queue, replacing one not
    /// written yet, unless the connection is closed.
    fn control(&self, frame: Bytes, slot: fn(&mut State) -> &mut Option<Bytes>) {
        let mut state = self.state();
        if state.closed {
            return;
        }
        *slot(&mut state) = Some(frame);
        drop(state);
        self.wake_writer();
    }

    /// Ends the connection for `reason`; the first request wins. The close
    /// frame carries the reason's code; `flush` writes what is queued first.
    pub fn close(&self, reason: CloseReason, flush: bool) {
        let mut state = self.state();
        self.request_close(&mut state, reason, flush);
        self.closing(state);
    }

    /// Queues `advice` (a `reconnect`) as the last message, beyond the
    /// bounds (the connection ends right after it), and closes for `reason`
    /// once everything queued is written.
    pub fn close_after(&self, advice: Bytes, reason: CloseReason) {
        let mut state = self.state();
        if !state.is_closing() {
            state.append(advice);
        }
        self.request_close(&mut state, reason, true);
        self.closing(state);
    }

    /// Echoes the client's close frame (`payload` as the client sent it, or
    /// the library's 1002 for an invalid code), unless a close is under way:
    /// one asked for and not written yet answers the client's instead.
    pub fn echo_close(&self, frame: Bytes) {
        let mut state = self.state();
        let closed = state.closed;
        match &mut state.close {
            Some(ours) => ours.answers = true,
            None if !closed => {
                state.reason.get_or_insert(CloseReason::ClientClosed);
                state.close = Some(Close {
                    reason: CloseReason::ClientClosed,
                    frame: Some(frame),
                    flush: true,
                    answers: true,
                });
            }
            None => {}
        }
        self.closing(state);
    }

    /// Releases the lock after a close request: the writer writes the close,
    /// and a `send` waiting for room gives up.
    fn closing(&self, state: MutexGuard<'_, State>) {
        drop(state);
        self.wake_writer();
        self.shared.room.notify_waiters();
    }

    fn request_close(&self, state: &mut State, reason: CloseReason, flush: bool) {
        if state.is_closing() {
            return;
        }
        state.reason.get_or_insert(reason);
        // A stream has no close frame, and no close to wait for: its
        // response just ends.
        let stream = self.shared.format.is_stream();
        let frame = match stream {
            true => None,
            false => reason.code().map(|code| frame::close(code, reason.text())),
        };
        state.close = Some(Close {
            reason,
            frame,
            flush,
            answers: stream,
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

    /// Whether the writer took the close (or finished): no close frame is
    /// left to send.
    pub fn close_taken(&self) -> bool {
        self.state().closed
    }

    /// Waits until there may be something for the writer.
    pub async fn ready(&self) {
        self.shared.writer.notified().await;
    }

    /// Moves what is to be written into `batch`, in order: the rest of a
    /// partly written frame, the pong, the ping, the queued frames (unless a
    /// close says not to flush) and the close frame. `None` when there is
    /// nothing, or after the close was taken. Until [`written`](Self::written),
    /// the batch is the writer's: direct writes leave the socket alone.
    pub fn take(&self, batch: &mut Vec<Bytes>) -> Option<Taken> {
        let mut state = self.state();
        if state.closed || state.writing {
            return None;
        }
        let close = state.close.take();
        if close.is_none()
            && state.frames.is_empty()
            && state.pong.is_none()
            && state.ping.is_none()
        {
            return None;
        }
        if let Some(close) = &close {
            state.closed = true;
            if !close.flush {
                state.drop_backlog();
            }
        }
        let state = &mut *state;
        let frames = state.frames.len() as u64;
        let bytes = state.frames.iter().map(Bytes::len).sum();
        // Taken whole, allocation and all: a queue that the writer empties
        // holds no memory until it has frames again.
        let mut queued = std::mem::take(&mut state.frames).into_iter();
        // Nothing may come between the bytes of one frame.
        if state.partial {
            batch.extend(queued.next());
        }
        batch.extend(state.pong.take());
        batch.extend(state.ping.take());
        batch.extend(queued);
        batch.extend(close.as_ref().and_then(|c| c.frame.clone()));
        state.partial = false;
        state.writing = true;
        Some(Taken {
            frames,
            bytes,
            close,
            oldest: state.oldest.take(),
        })
    }

    /// Ends the writer's batch: gives back the room of its `bytes`.
    pub fn written(&self, bytes: usize) {
        let mut state = self.state();
        state.bytes = state.bytes.saturating_sub(bytes);
        state.writing = false;
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

/// A `send` counted in [`State::room_waiters`] while it waits.
pub(super) struct RoomWaiter<'a>(pub(super) &'a Outbound);

impl Drop for RoomWaiter<'_> {
    fn drop(&mut self) {
        let mut state = self.0.state();
        state.room_waiters = state.room_waiters.saturating_sub(1);
    }
}

#[cfg(test)]
mod tests {
    use std::io;
    use std::time::Duration;

    use tokio::io::AsyncReadExt;
    use tokio::net::{TcpListener, TcpStream};

    use super::*;
    use crate::metrics::Metrics;

    /// Bounds every wait, so that a hang fails the test.
    const STEP: Duration = Duration::from_secs(10);

    fn limits(overflow: Overflow) -> Limits {
        Limits {
            frames: 4,
            bytes: 100,
            overflow,
        }
    }

    fn push(q: &Outbound, frame: Bytes) -> Pushed {
        q.push(frame, Instant::now(), &mut IdleSockets::default())
    }

    /// A queue on the server side of a loopback connection, and its client.
    async fn connected(limits: Limits) -> io::Result<(Outbound, TcpStream)> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let client = TcpStream::connect(listener.local_addr()?).await?;
        let (server, _) = listener.accept().await?;
        let (_, write) = server.into_split();
        Ok((Outbound::with_socket(limits, write).0, client))
    }

    #[test]
    fn bounded_in_frames_and_bytes() {
        let q = Outbound::new(limits(Overflow::DropNewest));
        for _ in 0..4 {
            assert_eq!(push(&q, Bytes::from_static(b"x")), Pushed::Queued);
        }
        assert_eq!(push(&q, Bytes::from_static(b"x")), Pushed::Dropped);
        let mut batch = Vec::new();
        let taken = q.take(&mut batch).map(|t| t.bytes);
        assert_eq!(taken, Some(4));
        q.written(4);
        assert_eq!(push(&q, Bytes::from(vec![0; 101])), Pushed::Dropped);
        assert_eq!(push(&q, Bytes::from(vec![0; 100])), Pushed::Queued);
    }

    #[test]
    fn overflow_disconnects_and_drops_the_backlog() {
        let q = Outbound::new(limits(Overflow::Disconnect));
        assert_eq!(push(&q, Bytes::from(vec![0; 60])), Pushed::Queued);
        assert_eq!(push(&q, Bytes::from(vec![0; 60])), Pushed::Overflowed);
        assert_eq!(push(&q, Bytes::from_static(b"x")), Pushed::Closed);
        let mut batch = Vec::new();
        let taken = q
            .take(&mut batch)
            .unwrap_or_else(|| panic!("a close to take"));
        let close = taken.close.unwrap_or_else(|| panic!("close requested"));
        assert_eq!(close.reason, CloseReason::SlowConsumer);
        assert_eq!(batch, close.frame.into_iter().collect::<Vec<_>>());
        assert_eq!(q.reason(), Some(CloseReason::SlowConsumer));
        assert!(q.take(&mut batch).is_none(), "nothing after the close");
    }

    #[tokio::test]
    async fn send_waits_for_room() {
        let q = Outbound::new(limits(Overflow::Disconnect));
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
        assert!(matches!(
            tokio::time::timeout(STEP, waiting).await,
            Ok(Ok(true))
        ));
    }

    /// What an idle connection's outgoing side holds, and where the fields
    /// a direct write touches lie (issue #16): printed with `--nocapture`.
    #[test]
    fn sizes_of_the_outgoing_side() {
        use std::mem::{offset_of, size_of};
        let writer = super::super::writer::run(
            SocketWriter(Outbound::new(limits(Overflow::Disconnect))),
            Outbound::new(limits(Overflow::Disconnect)),
            Arc::new(super::super::Writing {
                write_timeout: Duration::from_secs(5),
                close_timeout: Duration::from_secs(2),
                metrics: Arc::new(Metrics::new()),
                clock: Instant::now(),
            }),
        );
        println!(
            "Shared {} (state at {}, socket at {}, writer at {}, room at {}), State {} \
             (frames at {}, pong at {}, close at {}), writer future {}",
            size_of::<Shared>(),
            offset_of!(Shared, state),
            offset_of!(Shared, socket),
            offset_of!(Shared, writer),
            offset_of!(Shared, room),
            size_of::<State>(),
            offset_of!(State, frames),
            offset_of!(State, pong),
            offset_of!(State, close),
            std::mem::size_of_val(&writer),
        );
    }

    #[tokio::test]
    async fn a_direct_write_wakes_a_send_waiting_for_room() -> io::Result<()> {
        let (q, mut client) = connected(limits(Overflow::Disconnect)).await?;
        let mut idle = IdleSockets::default();
        q.push(Bytes::from(vec![1; 60]), Instant::now(), &mut idle);
        let waiting = {
            let q = q.clone();
            tokio::spawn(async move { q.send(Bytes::from(vec![2; 10])).await })
        };
        let deadline = Instant::now() + STEP;
        while q.state().room_waiters == 0 {
            assert!(Instant::now() < deadline, "the send never waited");
            tokio::task::yield_now().await;
        }
        idle.write(&Metrics::new());
        assert!(matches!(
            tokio::time::timeout(STEP, waiting).await,
            Ok(Ok(true))
        ));
        assert_eq!(q.state().room_waiters, 0, "no longer counted");
        let mut got = [0; 60];
        tokio::time::timeout(STEP, client.read_exact(&mut got)).await??;
        Ok(())
    }

    #[tokio::test]
    async fn a_fan_out_writes_to_an_idle_connection_itself() -> io::Result<()> {
        let (q, mut client) = connected(limits(Overflow::Disconnect)).await?;
        let mut idle = IdleSockets::default();
        assert_eq!(
            q.push(Bytes::from_static(b"one"), Instant::now(), &mut idle),
            Pushed::Queued
        );
        assert_eq!(
            q.push(Bytes::from_static(b"two"), Instant::now(), &mut idle),
            Pushed::Queued
        );
        assert_eq!(idle.0.len(), 1, "listed once, when it became busy");
        let metrics = Metrics::new();
        idle.write(&metrics);
        let mut got = [0; 6];
        tokio::time::timeout(STEP, client.read_exact(&mut got)).await??;
        assert_eq!(&got, b"onetwo");
        assert_eq!(metrics.delivered.get(), 2);
        assert!(
            q.take(&mut Vec::new()).is_none(),
            "nothing left for the writer"
        );
        Ok(())
    }

    #[tokio::test]
    async fn the_writer_finishes_what_the_socket_did_not_take_before_control_frames()
    -> io::Result<()> {
        let big = Limits {
            frames: 4,
            bytes: 64 << 20,
            overflow: Overflow::Disconnect,
        };
        let (q, _client) = connected(big).await?;
        // More than loopback buffers hold while the client does not read.
        let frame = Bytes::from(vec![7; 32 << 20]);
        let mut idle = IdleSockets::default();
        q.push(frame.clone(), Instant::now(), &mut idle);
        idle.write(&Metrics::new());
        tokio::time::timeout(STEP, q.ready())
            .await
            .map_err(|_| io::Error::other("the writer was not woken"))?;
        q.pong(Bytes::from_static(b"pong"));
        let mut batch = Vec::new();
        let taken = q
            .take(&mut batch)
            .unwrap_or_else(|| panic!("the rest to take"));
        assert_eq!(taken.frames, 1);
        let rest = batch[0].len();
        assert!(
            0 < rest && rest < frame.len(),
            "partly written: {rest} left"
        );
        assert_eq!(
            &batch[1][..],
            b"pong",
            "after the partial frame, not inside it"
        );
        assert_eq!(taken.bytes, rest);
        Ok(())
    }

    #[tokio::test]
    async fn direct_writes_wait_for_the_writers_batch() -> io::Result<()> {
        let (q, _client) = connected(limits(Overflow::Disconnect)).await?;
        assert!(q.send(Bytes::from_static(b"reply")).await);
        let mut batch = Vec::new();
        let taken = q.take(&mut batch).map(|t| t.bytes);
        let mut idle = IdleSockets::default();
        q.push(Bytes::from_static(b"msg"), Instant::now(), &mut idle);
        assert!(idle.0.is_empty(), "the writer holds the socket");
        assert!(q.take(&mut Vec::new()).is_none(), "one batch at a time");
        q.written(taken.unwrap_or_default());
        batch.clear();
        assert!(q.take(&mut batch).is_some());
        assert_eq!(batch, vec![Bytes::from_static(b"msg")]);
        Ok(())
    }
}
