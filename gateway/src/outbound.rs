//! A connection's outgoing side: a queue bounded in frames and in bytes, and
//! who writes it to the socket.
//!
//! The fan-out [`push`](Outbound::push)es encoded frames and never waits;
//! when the queue is full, the connection's [`Overflow`] rule decides. The
//! session's own replies and replays [`send`](Outbound::send), which waits for
//! room instead. Pongs, pings and the close frame travel beside the queue, so
//! that a full queue never delays them.
//!
//! Two parties write, never at once. A fan-out collects the connections it
//! queued to while they were idle in an [`IdleSockets`], and once its topic's lock
//! is released writes straight to their sockets, a chunk of connections per
//! task, as far as each socket takes it without waiting: a frame then costs
//! one `writev` and no task wake-up. Everything else (what a socket did not
//! take, control frames, the close, a connection without a shareable socket)
//! is the writer task's: it [`take`](Outbound::take)s everything queued and
//! writes it under the write timeout. The queue's lock is held across a
//! direct write, and the writer marks the batch it writes, so the two never
//! interleave bytes.

use std::collections::VecDeque;
use std::io::{self, IoSlice};
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, ready};

use bytes::{Buf, Bytes};
use serde::Deserialize;
use socket2::SockRef;
use tokio::io::AsyncWrite;
use tokio::net::TcpStream;
use tokio::net::tcp::OwnedWriteHalf;
use tokio::sync::Notify;
use tokio::time::Instant;

use crate::disconnect::CloseReason;
use crate::frame;
use crate::metrics::Metrics;

/// Slices handed to one `writev` by the writer task (Linux allows 1024).
pub(crate) const MAX_IOV: usize = 256;

/// Slices handed to one direct `writev`: an idle connection's queue seldom
/// holds more, and the rest goes in the next call.
const DIRECT_IOV: usize = 16;

/// Connections one task writes to directly: small enough that a fan-out to
/// many spreads over every core, large enough that spawning costs little
/// next to the writes.
const CHUNK: usize = 128;

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
    shared: Arc<Shared>,
}

struct Shared {
    state: Mutex<State>,
    /// Wakes the writer.
    writer: Notify,
    /// Wakes a `send` waiting for room.
    room: Notify,
    limits: Limits,
    /// For direct writes; without it, the writer task writes everything.
    socket: Option<OwnedWriteHalf>,
}

#[derive(Default)]
struct State {
    frames: VecDeque<Bytes>,
    /// Bytes queued plus bytes the writer took and has not finished writing.
    bytes: usize,
    /// The front frame is partly written: its rest goes before anything else.
    partial: bool,
    /// The writer task is writing a batch: direct writes wait their turn.
    writing: bool,
    pong: Option<Bytes>,
    ping: Option<Bytes>,
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

    fn append(&mut self, frame: Bytes) {
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
    fn consume(&mut self, written: usize) -> u64 {
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
            self.partial = false;
            completed += 1;
        }
        completed
    }
}

/// What one direct write sent.
struct Direct {
    frames: u64,
    oldest: Option<Instant>,
}

impl Outbound {
    /// A queue written by its writer task alone.
    pub fn new(limits: Limits) -> Self {
        Self::build(limits, None)
    }

    /// A queue that fan-outs may also write straight to `socket`, and the
    /// writer task's handle on that socket.
    pub fn with_socket(limits: Limits, socket: OwnedWriteHalf) -> (Self, SocketWriter) {
        let out = Self::build(limits, Some(socket));
        (out.clone(), SocketWriter(out))
    }

    fn build(limits: Limits, socket: Option<OwnedWriteHalf>) -> Self {
        Self {
            shared: Arc::new(Shared {
                state: Mutex::new(State::default()),
                writer: Notify::new(),
                room: Notify::new(),
                limits,
                socket,
            }),
        }
    }

    fn state(&self) -> MutexGuard<'_, State> {
        // Nothing panics while holding this lock; recover rather than cascade.
        self.shared.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn wake_writer(&self) {
        self.shared.writer.notify_one();
    }

    /// Queues `frame`, handed over by the fan-out at `at`, without waiting.
    /// A connection nobody is writing to joins `idle`, which writes it.
    pub fn push(&self, frame: Bytes, at: Instant, idle: &mut IdleSockets) -> Pushed {
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
        let nobody_writing = state.frames.is_empty() && !state.writing;
        state.append(frame);
        drop(state);
        if nobody_writing {
            idle.0.push(self.clone());
        }
        Pushed::Queued
    }

    /// Appends `frame`, releases the lock, and wakes the writer if it may be
    /// waiting (the queue was empty).
    fn enqueue(&self, mut state: MutexGuard<'_, State>, frame: Bytes) {
        let was_empty = state.frames.is_empty();
        state.append(frame);
        drop(state);
        if was_empty {
            self.wake_writer();
        }
    }

    /// Applies the overflow rule to a frame that does not fit.
    pub fn overflow(&self) -> Pushed {
        match self.shared.limits.overflow {
            Overflow::DropNewest => Pushed::Dropped,
            Overflow::Disconnect => {
                let mut state = self.state();
                // Free the backlog now: the writer may be stuck in a write.
                state.drop_backlog();
                Self::request_close(&mut state, CloseReason::SlowConsumer, false);
                self.closing(state);
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
        Self::request_close(&mut state, reason, flush);
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
        Self::request_close(&mut state, reason, true);
        self.closing(state);
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
        self.closing(state);
    }

    /// Releases the lock after a close request: the writer writes the close,
    /// and a `send` waiting for room gives up.
    fn closing(&self, state: MutexGuard<'_, State>) {
        drop(state);
        self.wake_writer();
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
        let mut queued = state.frames.drain(..);
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

    /// Writes what is queued straight to the socket, as far as it takes it
    /// without waiting; whatever is left (or a control frame, or a close) is
    /// handed to the writer task. Nothing is done while the writer writes: it
    /// looks at the queue again when its batch is done.
    fn write_now(&self) -> Option<Direct> {
        let Some(socket) = &self.shared.socket else {
            self.wake_writer();
            return None;
        };
        let mut state = self.state();
        if state.writing || state.closed || state.frames.is_empty() {
            return None;
        }
        if state.close.is_some() || state.pong.is_some() || state.ping.is_some() {
            drop(state);
            self.wake_writer();
            return None;
        }
        // `send` on the socket itself: tokio's readiness needs no update, as
        // a writer task that takes over finds out for itself whether there
        // is room; and the kernel's socket call is cheaper than `writev`.
        let socket = SockRef::from(AsRef::<TcpStream>::as_ref(socket));
        let mut frames = 0;
        let done = loop {
            let mut slices = [IoSlice::new(&[]); DIRECT_IOV];
            let count = fill(&mut slices, &state.frames);
            let sent = match &slices[..count] {
                [one] => socket.send(one),
                many => socket.send_vectored(many),
            };
            match sent {
                Ok(0) => break false,
                Ok(n) => {
                    frames += state.consume(n);
                    if state.frames.is_empty() {
                        break true;
                    }
                }
                // WouldBlock: the writer waits for room. Any other error:
                // the writer meets it too, and ends the connection.
                Err(_) => break false,
            }
        };
        let oldest = if done { state.oldest.take() } else { None };
        drop(state);
        if !done {
            self.wake_writer();
        }
        if frames > 0 {
            self.shared.room.notify_waiters();
        }
        Some(Direct { frames, oldest })
    }
}

/// Points `slices` at the front of `frames`; returns how many it filled.
fn fill<'a>(slices: &mut [IoSlice<'a>], frames: impl IntoIterator<Item = &'a Bytes>) -> usize {
    let mut count = 0;
    for (slot, frame) in slices.iter_mut().zip(frames) {
        *slot = IoSlice::new(frame);
        count += 1;
    }
    count
}

/// The writer task's handle on a socket that direct writes share: writes
/// through a shared reference, waiting for room as any `AsyncWrite` does.
pub struct SocketWriter(Outbound);

impl SocketWriter {
    fn tcp(&self) -> io::Result<&TcpStream> {
        let socket = self.0.shared.socket.as_ref();
        socket
            .map(AsRef::as_ref)
            .ok_or_else(|| io::ErrorKind::NotConnected.into())
    }
}

impl AsyncWrite for SocketWriter {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.poll_write_vectored(cx, &[IoSlice::new(buf)])
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let tcp = self.tcp()?;
        loop {
            ready!(tcp.poll_write_ready(cx))?;
            match tcp.try_write_vectored(bufs) {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                result => return Poll::Ready(result),
            }
        }
    }

    fn is_write_vectored(&self) -> bool {
        true
    }

    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        let tcp = self.tcp()?;
        Poll::Ready(SockRef::from(tcp).shutdown(std::net::Shutdown::Write))
    }
}

/// Connections a fan-out queued frames to while nobody was writing to them.
/// [`spawn`](Self::spawn) writes to them directly once the fan-out released
/// its lock; dropped unwritten, an `IdleSockets` wakes their writer tasks instead.
#[derive(Default)]
pub struct IdleSockets(Vec<Outbound>);

impl IdleSockets {
    pub fn with_capacity(capacity: usize) -> Self {
        Self(Vec::with_capacity(capacity))
    }

    /// Writes to every connection, a chunk per task, so that a fan-out to
    /// many keeps every core writing. Outside a runtime, wakes the writers.
    pub fn spawn(mut self, metrics: &Arc<Metrics>) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        while !self.0.is_empty() {
            let chunk = if self.0.len() <= CHUNK {
                IdleSockets(std::mem::take(&mut self.0))
            } else {
                IdleSockets(self.0.split_off(self.0.len() - CHUNK))
            };
            let metrics = metrics.clone();
            runtime.spawn(async move {
                // Publications already arriving are queued first, so that
                // under load one `writev` carries several frames.
                tokio::task::yield_now().await;
                chunk.write(&metrics);
            });
        }
    }

    fn write(mut self, metrics: &Metrics) {
        let latency = metrics.fanout_latency.local();
        let batches = metrics.write_batch_frames.local();
        let mut delivered = 0;
        for out in self.0.drain(..) {
            let Some(direct) = out.write_now() else {
                continue;
            };
            if direct.frames > 0 {
                delivered += direct.frames;
                batches.observe(direct.frames as f64);
            }
            if let Some(oldest) = direct.oldest {
                latency.observe(oldest.elapsed().as_secs_f64());
            }
        }
        metrics.delivered.inc_by(delivered);
    }
}

impl Drop for IdleSockets {
    fn drop(&mut self) {
        for out in self.0.drain(..) {
            out.wake_writer();
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use tokio::io::AsyncReadExt;
    use tokio::net::{TcpListener, TcpStream};

    use super::*;

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
