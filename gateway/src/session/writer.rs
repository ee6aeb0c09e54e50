//! The writer task: writes what direct writes from the fan-out could not.
//!
//! It wakes when its queue has something for it (a reply, a replay, the rest
//! of what a socket did not take at once, a pong, a close), takes all of it,
//! and writes it with vectored writes, each batch under the write timeout. It
//! also sends the heartbeat pings and, when the pod drains, the `reconnect`
//! advice and the 1012 close.

use std::io::{self, IoSlice};
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use proto::ServerMessage;
use rand::Rng;
use tokio::io::{AsyncWrite, AsyncWriteExt};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::disconnect::CloseReason;
use crate::frame;
use crate::node::Node;
use crate::outbound::{MAX_IOV, Outbound};

/// Runs until the connection ends; cancels `stop` when it returns.
pub async fn run<W: AsyncWrite + Unpin>(
    mut io: W,
    out: Outbound,
    stop: CancellationToken,
    node: Arc<Node>,
) {
    let ws = &node.config.websocket;
    let mut ping = tokio::time::interval_at(Instant::now() + ws.ping_interval, ws.ping_interval);
    ping.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut batch: Vec<Bytes> = Vec::new();
    let mut draining = false;
    // Watched through a child token of this connection's own, and both
    // futures made once: polled on every wake-up, the pod-wide token's lock
    // and waiter list would be shared by every writer on every core.
    let drain = node.drain.child_token();
    let stopped = stop.cancelled();
    let drained = drain.cancelled();
    tokio::pin!(stopped, drained);
    'connection: loop {
        tokio::select! {
            biased;
            _ = &mut stopped => break,
            _ = out.ready() => {}
            _ = &mut drained, if !draining => {
                draining = true;
                advise_reconnect(&out, node.config.shutdown.drain_timeout);
            }
            _ = ping.tick() => {
                let stamp = node.clock.elapsed().as_micros() as u64;
                out.ping(frame::encode(frame::OP_PING, &[&stamp.to_be_bytes()]));
            }
        }
        // Direct writes may add to the queue meanwhile without waking us.
        while let Some(taken) = out.take(&mut batch) {
            let result = write_timed(&mut io, &batch, ws.write_timeout).await;
            batch.clear();
            out.written(taken.bytes);
            if let Err(reason) = result {
                out.note_reason(reason);
                break 'connection;
            }
            if taken.frames > 0 {
                node.metrics.delivered.inc_by(taken.frames);
                node.metrics.write_batch_frames.observe(taken.frames as f64);
            }
            if let Some(oldest) = taken.oldest {
                node.metrics
                    .fanout_latency
                    .observe(oldest.elapsed().as_secs_f64());
            }
            if let Some(close) = taken.close {
                if close.reason.lingers() {
                    // The client answers our close with its own; the reader sees it.
                    let _ = tokio::time::timeout(ws.close_timeout, stop.cancelled()).await;
                }
                break 'connection;
            }
        }
    }
    out.finish();
    let _ = io.shutdown().await;
    stop.cancel();
}

/// Queues `reconnect` with a random delay within the drain window, so that
/// the clients of a draining pod do not all come back at the same instant,
/// then the 1012 close.
fn advise_reconnect(out: &Outbound, window: Duration) {
    let window_ms = window.as_millis().max(1) as u64;
    let after_ms = rand::thread_rng().gen_range(0..window_ms);
    let advice = frame::message(&ServerMessage::Reconnect {
        after_ms,
        reason: "draining",
    });
    out.close_after(advice, CloseReason::Shutdown);
}

async fn write_timed<W: AsyncWrite + Unpin>(
    io: &mut W,
    frames: &[Bytes],
    timeout: Duration,
) -> Result<(), CloseReason> {
    match tokio::time::timeout(timeout, write_all(io, frames)).await {
        Ok(Ok(())) => Ok(()),
        Ok(Err(_)) => Err(CloseReason::ConnectionLost),
        Err(_) => Err(CloseReason::WriteTimeout),
    }
}

/// Writes every frame, as few `writev` calls as the kernel allows.
async fn write_all<W: AsyncWrite + Unpin>(io: &mut W, frames: &[Bytes]) -> io::Result<()> {
    let mut index = 0;
    let mut offset = 0;
    while index < frames.len() {
        // The slice array lives only inside one poll, not in the task's
        // state: an idle connection should not carry 4 KiB of it.
        let mut written = std::future::poll_fn(|cx| {
            let mut slices = [IoSlice::new(&[]); MAX_IOV];
            let mut count = 0;
            for (slot, frame) in slices.iter_mut().zip(&frames[index..]) {
                *slot = IoSlice::new(if count == 0 { &frame[offset..] } else { frame });
                count += 1;
            }
            Pin::new(&mut *io).poll_write_vectored(cx, &slices[..count])
        })
        .await?;
        if written == 0 {
            return Err(io::ErrorKind::WriteZero.into());
        }
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
    io.flush().await
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncReadExt;

    #[tokio::test]
    async fn write_all_survives_short_writes() -> io::Result<()> {
        // A 7-byte pipe forces many partial writes.
        let (mut a, mut b) = tokio::io::duplex(7);
        let frames: Vec<Bytes> = (0..300u16).map(|i| Bytes::from(i.to_string())).collect();
        let expected: Vec<u8> = frames.iter().flat_map(|f| f.to_vec()).collect();
        let reader = tokio::spawn(async move {
            let mut got = Vec::new();
            b.read_to_end(&mut got).await.map(|_| got)
        });
        write_all(&mut a, &frames).await?;
        drop(a);
        let got = reader.await.map_err(io::Error::other)??;
        assert_eq!(got, expected);
        Ok(())
    }
}
