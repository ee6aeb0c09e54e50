//! A subscriber's reading ([`Subscriber::read`]): every stamped message's
//! latency noted under its index, duplicates and strays counted, until the
//! scenario stops it or the gateway closes it; for either client
//! ([`Reading`]). Its own module: what a client does once subscribed, apart
//! from connecting and subscribing it.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use futures_util::StreamExt;
use tokio::sync::watch;
use tokio_tungstenite::tungstenite::Message;

use super::{End, Link, MISSING, Received, ServerFrame, Socket, Subscriber};
use crate::latency::now_micros;
use crate::raw;

impl Subscriber {
    /// Reads until `stop` turns true (or its sender goes), noting for each
    /// stamped message its latency under its index (`messages` of them);
    /// `progress` counts first deliveries, so the scenario knows when all are in.
    pub async fn read(
        self,
        messages: usize,
        progress: Arc<AtomicU64>,
        stop: watch::Receiver<bool>,
    ) -> Received {
        self.read_from(0, messages, progress, stop).await
    }

    /// [`read`](Self::read), `progress` counting only the messages from
    /// index `from` on (a client that joined at round `from` may still get
    /// a straggler of a round before).
    pub async fn read_from(
        self,
        from: usize,
        messages: usize,
        progress: Arc<AtomicU64>,
        mut stop: watch::Receiver<bool>,
    ) -> Received {
        let mut received = Received {
            client: self.client,
            gateway: self.gateway,
            latency_us: vec![MISSING; messages],
            duplicates: 0,
            unexpected: 0,
            wire_bytes: 0,
            compressed: matches!(&self.link, Link::Raw(c) if c.compressed()),
            end: End::Stopped,
        };
        if *stop.borrow_and_update() {
            return received;
        }
        let mut reading = Reading {
            received: &mut received,
            from,
            progress: &progress,
        };
        match self.link {
            Link::Library(ws) => reading.library(*ws, &mut stop).await,
            Link::Raw(c) => reading.raw(c, &mut stop).await,
        }
        received
    }
}

/// A client's reading in progress: its record, and the shared count.
struct Reading<'a> {
    received: &'a mut Received,
    /// Messages from this index on count in `progress`.
    from: usize,
    progress: &'a AtomicU64,
}

impl Reading<'_> {
    /// Notes one text frame received now: a stamped `msg`'s latency, a
    /// duplicate, or an unexpected frame; whether it was a `msg` of the run.
    fn text(&mut self, text: &[u8]) -> bool {
        let now = now_micros();
        let messages = self.received.latency_us.len();
        match serde_json::from_slice::<ServerFrame<'_>>(text) {
            Ok(ServerFrame {
                op,
                data: Some(stamp),
            }) if op == "msg" && (stamp.i as usize) < messages => {
                let slot = &mut self.received.latency_us[stamp.i as usize];
                if *slot == MISSING {
                    *slot = stamp.latency_to(now).min(MISSING - 1);
                    if stamp.i as usize >= self.from {
                        self.progress.fetch_add(1, Ordering::Relaxed);
                    }
                } else {
                    self.received.duplicates += 1;
                }
                true
            }
            // A topic whose namespace has join/leave diffs
            // (`fanout` with presence on, bench.sh's
            // fanout-presence): the fan-out's figures leave them out.
            Ok(ServerFrame { op, .. }) if op == "presence_diff" => false,
            _ => {
                self.received.unexpected += 1;
                false
            }
        }
    }

    /// Reads tungstenite's messages until `stop`.
    async fn library(&mut self, mut ws: Socket, stop: &mut watch::Receiver<bool>) {
        loop {
            // Both futures are cancel-safe: a frame half read stays in the stream.
            let next = tokio::select! {
                biased;
                changed = stop.changed() => {
                    if changed.is_err() || *stop.borrow() {
                        break;
                    }
                    continue;
                }
                next = ws.next() => next,
            };
            match next {
                Some(Ok(Message::Text(text))) => {
                    self.text(text.as_bytes());
                }
                Some(Ok(Message::Close(frame))) => {
                    self.received.end = End::Closed(frame.map(|f| u16::from(f.code)));
                    break;
                }
                // Pings are answered by the library.
                Some(Ok(_)) => {}
                Some(Err(e)) => {
                    self.received.end = End::Failed(e.to_string());
                    break;
                }
                None => {
                    self.received.end = End::Closed(None);
                    break;
                }
            }
        }
    }

    /// Reads the raw client's frames until `stop`, answering pings, each
    /// `msg` frame's wire bytes counted.
    async fn raw(&mut self, mut c: raw::Client, stop: &mut watch::Receiver<bool>) {
        loop {
            // Both futures are cancel-safe: a frame half read stays buffered.
            let next = tokio::select! {
                biased;
                changed = stop.changed() => {
                    if changed.is_err() || *stop.borrow() {
                        break;
                    }
                    continue;
                }
                next = c.next() => next,
            };
            let ping = match next {
                Ok(Some(frame)) => match frame.opcode {
                    raw::OP_TEXT => {
                        if self.text(frame.payload) {
                            self.received.wire_bytes += frame.wire_bytes as u64;
                        }
                        continue;
                    }
                    raw::OP_PING => frame.payload.to_vec(),
                    raw::OP_CLOSE => {
                        let code = (frame.payload.len() >= 2)
                            .then(|| u16::from_be_bytes([frame.payload[0], frame.payload[1]]));
                        self.received.end = End::Closed(code);
                        break;
                    }
                    _ => {
                        self.received.unexpected += 1;
                        continue;
                    }
                },
                Ok(None) => {
                    self.received.end = End::Closed(None);
                    break;
                }
                Err(e) => {
                    self.received.end = End::Failed(e.to_string());
                    break;
                }
            };
            if let Err(e) = c.send(raw::OP_PONG, &ping).await {
                self.received.end = End::Failed(format!("sending a pong: {e}"));
                break;
            }
        }
    }
}
