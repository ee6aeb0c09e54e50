//! The writer: writes what direct writes from the fan-out could not. It runs
//! in its connection's task, next to the reader.
//!
//! It wakes when its queue has something for it (a reply, a replay, the rest
//! of what a socket did not take at once, a ping or pong, a close), takes all
//! of it, and writes it with vectored writes, each batch under the write
//! timeout. When the pod drains, the `reconnect` advice and the 1012 close
//! come through its queue like any other frame
//! ([`crate::session::Registry::drain`]).

use std::io::IoSlice;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use tokio::io::{AsyncWrite, AsyncWriteExt};
use tokio::time::Instant;

use super::direct::{Deliveries, fill};
use super::queue::{MAX_IOV, Outbound};
use crate::config::Config;
use crate::disconnect::CloseReason;
use crate::metrics::Metrics;

/// What a writer needs of its pod, and no more: made once per pod.
pub struct Writing {
    pub write_timeout: Duration,
    pub close_timeout: Duration,
    pub metrics: Arc<Metrics>,
    /// The zero of ping timestamps.
    pub clock: Instant,
}

impl Writing {
    pub fn new(config: &Config, metrics: Arc<Metrics>, clock: Instant) -> Self {
        Self {
            write_timeout: config.websocket.write_timeout,
            close_timeout: config.websocket.close_timeout,
            metrics,
            clock,
        }
    }
}

/// Runs until the connection ends ([`Outbound::stop`], or a close written);
/// stops the connection when it returns.
///
/// A plain function that returns the writer's future, which holds what it
/// is given once (an `async fn` would keep its arguments as well:
/// rust-lang/rust#62958).
#[allow(clippy::manual_async_fn)]
pub fn run<W: AsyncWrite + Unpin>(
    mut io: W,
    out: Outbound,
    pod: Arc<Writing>,
) -> impl Future<Output = ()> {
    async move {
        // Made once: polled on every wake-up. The drain is not watched here
        // (a token of its own would cost every idle connection an
        // allocation and a waiter): the registry queues its advice
        // (`Registry::drain`).
        let stopped = out.stopped();
        tokio::pin!(stopped);
        'connection: loop {
            tokio::select! {
                biased;
                _ = &mut stopped => break,
                _ = out.ready() => {}
            }
            // Direct writes may add to the queue meanwhile without waking us.
            // The batch, and the write's future (with its timer), are made on
            // each wake-up and dropped before the next wait: an idle connection
            // holds neither.
            let mut batch: Vec<Bytes> = Vec::new();
            while let Some(taken) = out.take(&mut batch) {
                let result = Box::pin(write_timed(&mut io, &batch, pod.write_timeout)).await;
                batch.clear();
                if let Err(reason) = result {
                    // The batch is not given back: until `finish`, the socket
                    // stays ours, as a direct write would land after the bytes
                    // of a partly written frame.
                    out.note_reason(reason);
                    break 'connection;
                }
                out.written(taken.bytes);
                Deliveries::new(&pod.metrics).wrote(taken.frames, taken.oldest);
                if let Some(close) = taken.close {
                    if close.lingers() {
                        // The client answers our close with its own; the reader sees it.
                        let _ =
                            Box::pin(tokio::time::timeout(pod.close_timeout, out.stopped())).await;
                    }
                    break 'connection;
                }
            }
        }
        out.finish();
        let _ = io.shutdown().await;
        out.stop();
    }
}

/// Writes every frame, as few `writev` calls as the kernel allows, unless
/// the socket takes nothing for `stall`: the timer restarts with every byte
/// that goes out. A client that reads slowly is never cut by it (its queue's
/// bounds and, where history is kept, a catch-up handle its lag); one that
/// stopped reading, or whose network is gone, is, once its socket buffers
/// are full and `stall` has passed without a byte taken.
async fn write_timed<W: AsyncWrite + Unpin>(
    io: &mut W,
    frames: &[Bytes],
    stall: Duration,
) -> Result<(), CloseReason> {
    let timer = tokio::time::sleep(stall);
    tokio::pin!(timer);
    let mut index = 0;
    let mut offset = 0;
    while index < frames.len() {
        // The slice array lives only inside one poll, not in the task's
        // state: an idle connection should not carry 4 KiB of it.
        let write = std::future::poll_fn(|cx| {
            let mut slices = [IoSlice::new(&[]); MAX_IOV];
            let count = fill(&mut slices, &frames[index..]);
            // The front frame may be partly written already.
            if count > 0 {
                slices[0] = IoSlice::new(&frames[index][offset..]);
            }
            Pin::new(&mut *io).poll_write_vectored(cx, &slices[..count])
        });
        let mut written = tokio::select! {
            biased;
            written = write => match written {
                Ok(0) | Err(_) => return Err(CloseReason::ConnectionLost),
                Ok(written) => written,
            },
            _ = &mut timer => return Err(CloseReason::WriteTimeout),
        };
        timer.as_mut().reset(Instant::now() + stall);
        while written > 0 {
            let left = frames[index].len() - offset;
            if written >= left {
                written -= left;
                index += 1;
                offset = 0;
            } else {
                offset += written;
                written = 0;
            }
        }
    }
    tokio::select! {
        biased;
        flushed = io.flush() => flushed.map_err(|_| CloseReason::ConnectionLost),
        _ = &mut timer => Err(CloseReason::WriteTimeout),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::frame;
    use std::io;
    use tokio::io::AsyncReadExt;

    use crate::config::{Limits, Overflow};
    use crate::outbound::{IdleSockets, Pushed};

    fn pod() -> Arc<Writing> {
        Arc::new(Writing {
            write_timeout: Duration::from_secs(5),
            close_timeout: Duration::from_secs(2),
            metrics: Arc::new(Metrics::new()),
            clock: Instant::now(),
        })
    }

    fn queue() -> Outbound {
        Outbound::new(Limits {
            frames: 16,
            bytes: 1 << 20,
            overflow: Overflow::Disconnect,
        })
    }

    /// Paused time: the runtime jumps to the writer's next timer whenever
    /// everything waits, so the assertions are about the timers, exactly.
    #[tokio::test(start_paused = true)]
    async fn the_writer_sends_a_ping_at_once_and_gives_up_on_a_client_that_stops_reading() {
        let (server, mut client) = tokio::io::duplex(64);
        let out = queue();
        let start = Instant::now();
        let writer = tokio::spawn(run(server, out.clone(), pod()));
        // Virtual time: a hang fails at once, when this much of it has passed.
        let bound = Duration::from_secs(600);
        out.ping(frame::encode(frame::OP_PING, &[b"stamp"]));
        let mut ping = [0u8; 7];
        tokio::time::timeout(bound, client.read_exact(&mut ping))
            .await
            .expect("the ping in time")
            .expect("a frame");
        assert_eq!(ping[..2], [0x80 | frame::OP_PING, 5], "a ping");
        assert_eq!(start.elapsed(), Duration::ZERO, "written at once");
        // The client stops reading: a frame larger than the pipe sticks.
        assert!(out.send(Bytes::from(vec![b'x'; 4096])).await);
        let stuck = Instant::now();
        tokio::time::timeout(bound, writer)
            .await
            .expect("the writer gives up in time")
            .expect("the writer ends");
        assert_eq!(
            stuck.elapsed(),
            Duration::from_secs(5),
            "after write_timeout"
        );
        assert_eq!(out.reason(), Some(CloseReason::WriteTimeout));
        assert!(out.is_stopped(), "the reader is told");
    }

    #[tokio::test(start_paused = true)]
    async fn a_client_that_reads_slowly_is_never_cut_however_long_the_write() {
        let (server, mut client) = tokio::io::duplex(64);
        let out = queue();
        let writer = tokio::spawn(run(server, out.clone(), pod()));
        // 4 KiB through a 64-byte pipe, 64 bytes every 4 s: over four
        // minutes for the write, never 5 s (write_timeout) without a byte.
        let frame = Bytes::from(vec![b'y'; 4096]);
        assert!(out.send(frame.clone()).await);
        let mut got = Vec::new();
        while got.len() < frame.len() {
            tokio::time::sleep(Duration::from_secs(4)).await;
            let mut chunk = [0u8; 64];
            let read = tokio::time::timeout(Duration::from_secs(1), client.read(&mut chunk))
                .await
                .expect("bytes in time")
                .expect("read");
            got.extend_from_slice(&chunk[..read]);
        }
        assert_eq!(got, frame);
        assert_eq!(out.reason(), None, "not cut");
        out.stop();
        let _ = tokio::time::timeout(Duration::from_secs(600), writer).await;
    }

    /// What a fan-out on another core does when it finds the connection
    /// idle, run as a waker: the client reads what it can, so that the
    /// socket has room, and the queued frame is written directly.
    struct FanOutOnAnotherCore {
        out: Outbound,
        client: std::sync::Mutex<std::net::TcpStream>,
        read: std::sync::Mutex<Vec<u8>>,
    }

    impl std::task::Wake for FanOutOnAnotherCore {
        fn wake(self: Arc<Self>) {
            self.wake_by_ref();
        }

        fn wake_by_ref(self: &Arc<Self>) {
            use std::io::Read;
            let mut client = self.client.lock().unwrap_or_else(|e| e.into_inner());
            let mut read = self.read.lock().unwrap_or_else(|e| e.into_inner());
            let mut chunk = vec![0; 1 << 20];
            for _ in 0..2000 {
                {
                    let state = self.out.state();
                    if state.writing || state.closed || state.frames.is_empty() {
                        return;
                    }
                }
                while let Ok(n @ 1..) = client.read(&mut chunk) {
                    read.extend_from_slice(&chunk[..n]);
                }
                IdleSockets(vec![self.out.clone()]).write(&Metrics::new());
                std::thread::sleep(Duration::from_millis(1));
            }
        }
    }

    /// The writer's write times out with a frame partly written, while a
    /// fan-out has a frame queued for the connection: no direct write may
    /// follow the partial frame, as the client would read the fan-out's
    /// bytes as the rest of it.
    ///
    /// The window lies between two of the writer's own calls, with no await
    /// between them: a fan-out on another core would hit it only by chance.
    /// The test opens it for certain with a waker on the queue's `room`,
    /// which the writer wakes from inside the call that ends its batch (or
    /// from `finish`): the waker does there what that fan-out would do.
    #[tokio::test(start_paused = true)]
    async fn no_direct_write_follows_a_frame_the_writer_left_half_written() -> io::Result<()> {
        use std::io::Read;
        use std::task::{Context, Waker};
        use tokio::net::TcpListener;

        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let client = std::net::TcpStream::connect(listener.local_addr()?)?;
        let (server, _) = listener.accept().await?;
        let limits = Limits {
            frames: 16,
            bytes: 64 << 20,
            overflow: Overflow::Disconnect,
        };
        let (out, socket) = Outbound::with_socket(limits, server.into_split().1);
        // More than loopback buffers hold while the client does not read.
        let big = Bytes::from(vec![b'a'; 32 << 20]);
        assert!(out.send(big.clone()).await);
        let writer = tokio::spawn(run(socket, out.clone(), pod()));
        for _ in 0..100 {
            if out.state().writing {
                break;
            }
            tokio::task::yield_now().await;
        }
        assert!(out.state().writing, "the writer took its batch");
        let mut idle = IdleSockets::default();
        let pushed = out.push(Bytes::from_static(b"BBBB"), Instant::now(), &mut idle);
        assert_eq!(pushed, Pushed::Queued);
        assert!(idle.0.is_empty(), "the writer holds the socket");

        client.set_nonblocking(true)?;
        let fan_out = Arc::new(FanOutOnAnotherCore {
            out: out.clone(),
            client: std::sync::Mutex::new(client.try_clone()?),
            read: std::sync::Mutex::new(Vec::new()),
        });
        let room = out.shared.room.notified();
        tokio::pin!(room);
        let waker = Waker::from(fan_out.clone());
        assert!(
            room.as_mut()
                .poll(&mut Context::from_waker(&waker))
                .is_pending()
        );

        // Virtual time: the write times out as soon as everything waits.
        tokio::time::timeout(Duration::from_secs(600), writer)
            .await
            .expect("the writer gives up in time")
            .expect("the writer ends");
        assert_eq!(out.reason(), Some(CloseReason::WriteTimeout));

        let mut read = std::mem::take(&mut *fan_out.read.lock().unwrap_or_else(|e| e.into_inner()));
        let mut client = client;
        client.set_nonblocking(false)?;
        client.set_read_timeout(Some(Duration::from_secs(10)))?;
        client.read_to_end(&mut read)?;
        assert!(read.len() < big.len(), "the frame was cut short");
        if let Some(at) = read.iter().position(|&b| b != b'a') {
            panic!("a direct write after {at} bytes of the frame");
        }
        Ok(())
    }

    #[tokio::test]
    async fn a_write_survives_short_writes() -> io::Result<()> {
        // A 7-byte pipe forces many partial writes.
        let (mut a, mut b) = tokio::io::duplex(7);
        let frames: Vec<Bytes> = (0..300u16).map(|i| Bytes::from(i.to_string())).collect();
        let expected: Vec<u8> = frames.iter().flat_map(|f| f.to_vec()).collect();
        let reader = tokio::spawn(async move {
            let mut got = Vec::new();
            b.read_to_end(&mut got).await.map(|_| got)
        });
        let written = write_timed(&mut a, &frames, Duration::from_secs(60)).await;
        assert_eq!(written, Ok(()));
        drop(a);
        let got = reader.await.map_err(io::Error::other)??;
        assert_eq!(got, expected);
        Ok(())
    }
}
