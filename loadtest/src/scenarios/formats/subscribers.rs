//! One phase's subscribers: connected and subscribed in the phase's format
//! ([`connect`], [`subscribe`]), then read until told to stop, each frame
//! decoded and checked against the payload published ([`read`],
//! [`check`]). Its own module: the receiving and checking side, apart from
//! the phase that publishes and measures.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use tokio::sync::watch;

use super::{BUFFER_BYTES, Options, Seen};
use crate::Error;
use crate::clients::{CONNECT_TIMEOUT, client_failure, open_all, source_addr};
use crate::codec::{self, Body, Format, Frame, Protocol, Reassembler};
use crate::raw;

/// Connects and subscribes every client in `format`: (client, granted deltas).
pub(super) async fn connect(
    options: &Options,
    format: Format,
    topic: &Arc<str>,
) -> Result<Vec<(raw::Client, bool)>, Error> {
    let target = options.gateway.clone();
    let topic = topic.clone();
    open_all(options.clients, move |client| {
        let (target, topic) = (target.clone(), topic.clone());
        async move {
            let source = source_addr(target.addr.ip(), client);
            let fail = client_failure(client, source, target.addr);
            let opening = async {
                let headers = format.headers();
                let mut c = raw::Client::connect_with_headers(
                    source,
                    &target,
                    BUFFER_BYTES,
                    client as u64,
                    &headers,
                )
                .await
                .map_err(|e| format!("WebSocket handshake: {e}"))?;
                if format.deflate && !c.compressed() {
                    return Err("permessage-deflate offered, not negotiated \
                                (websocket.compression off?)"
                        .to_owned());
                }
                let protobuf = c.protocol() == Some(codec::PROTOBUF);
                if protobuf != (format.protocol == Protocol::Protobuf) {
                    return Err(format!(
                        "{:?} asked for, the server selected subprotocol {:?}",
                        format.protocol,
                        c.protocol()
                    ));
                }
                let delta = subscribe(&mut c, format, &topic).await?;
                if format.delta && !delta {
                    return Err("deltas asked for, not granted \
                                (is the namespace's `delta` on?)"
                        .to_owned());
                }
                Ok((c, delta))
            };
            tokio::time::timeout(CONNECT_TIMEOUT, opening)
                .await
                .map_err(|_| fail(format!("not subscribed within {CONNECT_TIMEOUT:?}")))?
                .map_err(fail)
        }
    })
    .await
}

/// Sends the `sub` of `topic` and reads up to its `ok`: whether deltas
/// were granted.
async fn subscribe(c: &mut raw::Client, format: Format, topic: &str) -> Result<bool, String> {
    let (opcode, sub) = codec::sub(format.protocol, 1, topic, format.delta);
    c.send(opcode, &sub)
        .await
        .map_err(|e| format!("sending sub: {e}"))?;
    loop {
        let frame = match c.next().await {
            Ok(Some(frame)) => frame,
            Ok(None) => return Err("closed before the sub was confirmed".to_owned()),
            Err(e) => return Err(format!("reading: {e}")),
        };
        match frame.opcode {
            raw::OP_PING => {
                let ping = frame.payload.to_vec();
                c.send(raw::OP_PONG, &ping)
                    .await
                    .map_err(|e| format!("pong: {e}"))?;
                continue;
            }
            raw::OP_CLOSE => return Err(format!("closed: {}", raw::describe_close(frame.payload))),
            _ => {}
        }
        match codec::decode(format.protocol, frame.opcode, frame.payload)? {
            Frame::Welcome => {}
            Frame::Ok { id: 1, delta, .. } => return Ok(delta),
            other => return Err(format!("sub refused: {other:?}")),
        }
    }
}

/// Reads one client's frames until `stop`: each `msg` of `topic` checked
/// (its seq the next, its payload, put together, the one published).
pub(super) async fn read(
    mut c: raw::Client,
    protocol: Protocol,
    topic: Arc<str>,
    series: Arc<[String]>,
    progress: Arc<AtomicU64>,
    mut stop: watch::Receiver<bool>,
) -> Seen {
    let mut seen = Seen::default();
    let mut reassembler = Reassembler::default();
    let mut last = 0u64;
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
        let frame = match next {
            Ok(Some(frame)) => frame,
            Ok(None) => {
                seen.error = Some("the gateway closed the connection".to_owned());
                break;
            }
            Err(e) => {
                seen.error = Some(format!("reading: {e}"));
                break;
            }
        };
        match frame.opcode {
            raw::OP_PING => {
                let ping = frame.payload.to_vec();
                if let Err(e) = c.send(raw::OP_PONG, &ping).await {
                    seen.error = Some(format!("pong: {e}"));
                    break;
                }
                continue;
            }
            raw::OP_CLOSE => {
                seen.error = Some(format!("closed: {}", raw::describe_close(frame.payload)));
                break;
            }
            _ => {}
        }
        let wire_bytes = frame.wire_bytes as u64;
        let checked = check(
            codec::decode(protocol, frame.opcode, frame.payload),
            &topic,
            last,
            &mut reassembler,
            &series,
        );
        match checked {
            Ok(delta) => {
                last += 1;
                seen.deliveries += 1;
                seen.deltas += u64::from(delta);
                seen.wire_bytes += wire_bytes;
                progress.fetch_add(1, Ordering::Relaxed);
            }
            Err(e) => {
                seen.error = Some(e);
                break;
            }
        }
    }
    seen
}

/// One decoded frame checked: a `msg` of `topic`, the seq after `last`,
/// its payload (a delta applied to the one before) the one published.
/// Whether it came as a delta.
fn check(
    frame: Result<Frame, String>,
    topic: &str,
    last: u64,
    reassembler: &mut Reassembler,
    series: &[String],
) -> Result<bool, String> {
    let msg = match frame? {
        Frame::Msg(msg) if msg.topic == topic => msg,
        other => return Err(format!("unexpected frame: {other:?}")),
    };
    if msg.seq != last + 1 {
        return Err(format!("seq {} after seq {last}", msg.seq));
    }
    let delta = matches!(msg.body, Body::Delta(_));
    let data = reassembler.payload(msg.seq, msg.body)?;
    let published = usize::try_from(msg.seq - 1)
        .ok()
        .and_then(|i| series.get(i))
        .ok_or_else(|| format!("seq {} was never published", msg.seq))?;
    if data != published.as_bytes() {
        return Err(format!(
            "seq {}{}: the payload differs from the one published",
            msg.seq,
            if delta { " (a delta)" } else { "" }
        ));
    }
    Ok(delta)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scenarios::formats::Kind;

    #[test]
    fn a_wrong_delta_a_gap_or_a_stray_frame_fails_the_client() {
        let series = Kind::State.series(3);
        let msg = |seq, body| {
            Ok(Frame::Msg(codec::Msg {
                topic: "t".to_owned(),
                seq,
                body,
            }))
        };
        // From `a` to `b` is the crate's `delta(b, a)`.
        let delta =
            |to: usize, from: usize| Body::Delta(fossil_delta::delta(&series[to], &series[from]));
        let full = |i: usize| Body::Full(series[i].clone().into_bytes());

        let mut r = Reassembler::default();
        assert_eq!(check(msg(1, full(0)), "t", 0, &mut r, &series), Ok(false));
        assert_eq!(
            check(msg(2, delta(1, 0)), "t", 1, &mut r, &series),
            Ok(true)
        );
        assert_eq!(
            check(msg(3, delta(2, 1)), "t", 2, &mut r, &series),
            Ok(true)
        );

        // A delta that applies, to the wrong payload (made against seq 3's
        // payload from seq 1's, sent as seq 2's).
        let mut r = Reassembler::default();
        check(msg(1, full(0)), "t", 0, &mut r, &series).expect("full");
        let wrong = check(msg(2, delta(2, 0)), "t", 1, &mut r, &series);
        assert!(
            wrong.is_err_and(|e| e.contains("differs")),
            "applied to the wrong payload"
        );
        // A full payload that is not the one published.
        let mut r = Reassembler::default();
        let e = check(msg(1, full(1)), "t", 0, &mut r, &series).expect_err("not seq 1's");
        assert!(e.contains("differs"), "{e}");
        // A gap, a duplicate, another topic, a frame that is no msg.
        let mut r = Reassembler::default();
        assert!(check(msg(2, full(1)), "t", 0, &mut r, &series).is_err());
        assert!(check(msg(1, full(0)), "t", 1, &mut r, &series).is_err());
        assert!(check(msg(1, full(0)), "u", 0, &mut r, &series).is_err());
        assert!(check(Ok(Frame::Welcome), "t", 0, &mut r, &series).is_err());
        assert!(
            check(msg(4, full(0)), "t", 3, &mut r, &series).is_err(),
            "never published"
        );
    }
}
