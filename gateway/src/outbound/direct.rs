//! Direct writes: a fan-out writes what it queued to connections it found
//! idle straight to their sockets, once its topic's lock is released, a
//! chunk of connections per task, as far as each socket takes it without
//! waiting: a frame then costs one `send` and no task wake-up. What a socket
//! does not take is left to the connection's writer.

use std::io::{self, IoSlice};
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll, ready};
use std::time::Duration;

use bytes::Bytes;
use prometheus::local::LocalHistogram;
use socket2::SockRef;
use tokio::io::AsyncWrite;
use tokio::net::TcpStream;
use tokio::net::tcp::OwnedWriteHalf;
use tokio::time::Instant;

use super::queue::Outbound;
use crate::config::Limits;
use crate::frame::Format;
use crate::metrics::Metrics;

/// Slices handed to one direct `writev`: an idle connection's queue seldom
/// holds more, and the rest goes in the next call.
const DIRECT_IOV: usize = 16;

/// Connections one task writes to directly: small enough that a fan-out to
/// many spreads over every core, large enough that spawning costs little
/// next to the writes.
const CHUNK: usize = 128;

/// What one direct write sent.
struct Direct {
    frames: u64,
    oldest: Option<Instant>,
}

impl Outbound {
    /// A queue whose socket is a counter that takes every byte at once:
    /// for benchmarks of the fan-out's own cost, without the kernel's.
    #[doc(hidden)]
    pub fn with_counting_sink(limits: Limits) -> (Self, SocketWriter) {
        let out = Self::build(
            limits,
            Some(Socket::Counting(AtomicU64::new(0))),
            Format::default(),
        );
        (out.clone(), SocketWriter(out))
    }

    /// Bytes a counting sink ([`with_counting_sink`](Self::with_counting_sink))
    /// was given; `None` for a real socket.
    #[doc(hidden)]
    pub fn sink_bytes(&self) -> Option<u64> {
        match &self.shared.socket {
            Some(Socket::Counting(count)) => Some(count.load(Ordering::Relaxed)),
            _ => None,
        }
    }

    /// Writes what is queued straight to the socket, as far as it takes it
    /// without waiting; whatever is left (or a control frame, or a close) is
    /// handed to the writer. Nothing is done while the writer writes: it
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
        let mut frames = 0;
        let done = loop {
            let mut slices = [IoSlice::new(&[]); DIRECT_IOV];
            let count = fill(&mut slices, &state.frames);
            match socket.send(&slices[..count]) {
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
        let room_waiters = state.room_waiters > 0;
        drop(state);
        if !done {
            self.wake_writer();
        }
        if frames > 0 && room_waiters {
            self.shared.room.notify_waiters();
        }
        Some(Direct { frames, oldest })
    }
}

/// Writes to clients as they are counted, by the fan-out's direct writes and
/// by writers alike: into local copies of the histograms (so that one
/// core's writes do not contend for another's cache lines), recorded when
/// dropped.
pub(super) struct Deliveries<'a> {
    metrics: &'a Metrics,
    batches: LocalHistogram,
    latency: LocalHistogram,
    delivered: u64,
}

impl<'a> Deliveries<'a> {
    pub(super) fn new(metrics: &'a Metrics) -> Self {
        Self {
            metrics,
            batches: metrics.write_batch_frames.local(),
            latency: metrics.fanout_latency.local(),
            delivered: 0,
        }
    }

    /// One write of `frames` queued frames, the oldest handed over by the
    /// fan-out at `oldest` (none: no fan-out frame was among them).
    pub(super) fn wrote(&mut self, frames: u64, oldest: Option<Instant>) {
        if frames > 0 {
            self.delivered += frames;
            self.batches.observe(frames as f64);
        }
        if let Some(oldest) = oldest {
            self.latency(oldest.elapsed());
        }
    }

    /// A fan-out frame written `after` it was handed over.
    pub(super) fn latency(&mut self, after: Duration) {
        self.latency.observe(after.as_secs_f64());
    }
}

impl Drop for Deliveries<'_> {
    fn drop(&mut self) {
        self.metrics.delivered.inc_by(self.delivered);
    }
}

/// Points `slices` at the front of `frames`; returns how many it filled.
pub(super) fn fill<'a>(
    slices: &mut [IoSlice<'a>],
    frames: impl IntoIterator<Item = &'a Bytes>,
) -> usize {
    let mut count = 0;
    for (slot, frame) in slices.iter_mut().zip(frames) {
        *slot = IoSlice::new(frame);
        count += 1;
    }
    count
}

/// The writer's handle on a socket that direct writes share: writes
/// through a shared reference, waiting for room as any `AsyncWrite` does.
pub struct SocketWriter(pub(super) Outbound);

impl SocketWriter {
    fn socket(&self) -> io::Result<&Socket> {
        let socket = self.0.shared.socket.as_ref();
        socket.ok_or_else(|| io::ErrorKind::NotConnected.into())
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
        let tcp: &TcpStream = match self.socket()? {
            Socket::Tcp(tcp) => tcp.as_ref(),
            Socket::Counting(count) => return Poll::Ready(Ok(counted(count, bufs))),
        };
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
        match self.socket()? {
            Socket::Tcp(tcp) => Poll::Ready(
                SockRef::from(AsRef::<TcpStream>::as_ref(tcp)).shutdown(std::net::Shutdown::Write),
            ),
            Socket::Counting(_) => Poll::Ready(Ok(())),
        }
    }
}

/// Connections a fan-out queued frames to while nobody was writing to them.
/// [`spawn`](Self::spawn) writes to them directly once the fan-out released
/// its lock; dropped unwritten, an `IdleSockets` wakes their writers instead.
#[derive(Default)]
pub struct IdleSockets(pub(super) Vec<Outbound>);

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

    pub(super) fn write(mut self, metrics: &Metrics) {
        let mut deliveries = Deliveries::new(metrics);
        // The clock is read once per chunk, after its writes, not once per
        // connection: a latency then runs to the chunk's last write, at
        // most a chunk of sends later than its own.
        let mut oldest = Vec::with_capacity(self.0.len());
        for out in self.0.drain(..) {
            if let Some(direct) = out.write_now() {
                deliveries.wrote(direct.frames, None);
                oldest.extend(direct.oldest);
            }
        }
        if !oldest.is_empty() {
            let now = Instant::now();
            for at in oldest {
                deliveries.latency(now.saturating_duration_since(at));
            }
        }
    }
}

impl Drop for IdleSockets {
    fn drop(&mut self) {
        for out in self.0.drain(..) {
            out.wake_writer();
        }
    }
}
/// Where a queue's frames go.
pub(super) enum Socket {
    Tcp(OwnedWriteHalf),
    /// Counts the bytes it is given and takes them all: the fan-out's own
    /// cost without the kernel's, for the benchmarks.
    Counting(AtomicU64),
}

impl Socket {
    /// One non-blocking send of `slices`, as far as the socket takes them.
    pub(super) fn send(&self, slices: &[IoSlice<'_>]) -> io::Result<usize> {
        match self {
            // `send` on the socket itself: tokio's readiness needs no update,
            // as a writer that takes over finds out for itself whether
            // there is room; and the kernel's socket call is cheaper than
            // `writev`.
            Socket::Tcp(tcp) => {
                let socket = SockRef::from(AsRef::<TcpStream>::as_ref(tcp));
                match slices {
                    [one] => socket.send(one),
                    many => socket.send_vectored(many),
                }
            }
            Socket::Counting(count) => Ok(counted(count, slices)),
        }
    }
}

/// Adds the length of `slices` to `count`; returns it.
pub(super) fn counted(count: &AtomicU64, slices: &[IoSlice<'_>]) -> usize {
    let len: usize = slices.iter().map(|s| s.len()).sum();
    count.fetch_add(len as u64, Ordering::Relaxed);
    len
}
