//! Deltas for state topics (namespaces with `delta = true`, issue #26).
//!
//! A subscriber that asked for deltas holds a *base*: the data of the last
//! message it was sent of the topic, in full or rebuilt from a delta. The
//! hub sends it the next publication as a Fossil delta against that base
//! only when it can vouch for it: the last frame queued for it on the
//! topic was the live publication `seq - 1` of the same epoch ([`Delta`]),
//! and the hub still holds that publication's data ([`Last`]). Anything
//! else queued for it (a `reset`, a plain `msg`), anything it missed (a
//! dropped message, a lag), and going live after history (a subscribe, a
//! resume, a catch-up) leaves it *waiting*: its next message is full. So a
//! client is never sent a delta against a base it does not hold.
//!
//! The delta is computed once per publication, on the first subscriber
//! that can take it ([`Encoder`]), and shared by every format; each
//! format's frame is encoded once too (`Frames`, keyed by format and
//! [`Variant`]). The topic keeps its last publication (one `Bytes`
//! reference) only while a delta subscriber is on it.

use std::cell::OnceCell;
use std::sync::Arc;

use bytes::Bytes;
use router::{Epoch, Position, Publication};

use crate::frame::{Format, Variant};
use crate::metrics::DeltaMetrics;
use crate::payload::Payload;

/// Where a subscriber stands for deltas. One byte: it sits in the padding
/// of [`Subscriber`](super::Subscriber), which is per subscription.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Delta {
    /// Not asked for (or not granted): plain `msg`s only.
    Off,
    /// Asked for, with no base the hub vouches for: the next live message
    /// goes in full.
    Waiting,
    /// The last frame queued for it on the topic was the live publication
    /// at its cursor, in full or as a delta: the client holds its data.
    Based,
}

impl Delta {
    pub(super) fn new(wanted: bool) -> Self {
        if wanted { Delta::Waiting } else { Delta::Off }
    }

    pub(super) fn is_on(self) -> bool {
        self != Delta::Off
    }

    /// A frame of `variant` was queued for it: a full message or a delta
    /// is its base now; a plain `msg` (or anything else) makes the client
    /// drop its base.
    pub(super) fn queued(&mut self, variant: Variant) {
        if self.is_on() {
            *self = match variant {
                Variant::Full | Variant::Delta => Delta::Based,
                Variant::Data => Delta::Waiting,
            };
        }
    }

    /// It missed a message, or goes on from history: the next is full.
    pub(super) fn lost(&mut self) {
        if self.is_on() {
            *self = Delta::Waiting;
        }
    }

    /// What a subscriber standing at `cursor` is sent of the live
    /// publication at `epoch` and `seq` (whose data is binary or not), in
    /// `format`, where `delta` is the publication's delta against the one
    /// before (computed on first ask).
    pub(super) fn variant(
        self,
        cursor: &Position,
        format: Format,
        publication: (&Epoch, u64, bool),
        delta: &Encoder<'_>,
    ) -> Variant {
        let (epoch, seq, binary) = publication;
        match self {
            Delta::Off => Variant::Data,
            // A JSON client gets binary data as base64, never a delta: it
            // drops its base on one.
            _ if binary && !format.is_protobuf() => Variant::Data,
            Delta::Based
                if same_epoch(&cursor.epoch, epoch)
                    && cursor.seq.checked_add(1) == Some(seq)
                    && delta.get().is_some() =>
            {
                Variant::Delta
            }
            _ => Variant::Full,
        }
    }
}

fn same_epoch(a: &Epoch, b: &Epoch) -> bool {
    Arc::ptr_eq(a, b) || a == b
}

/// A topic's newest publication, kept while a delta subscriber is on it:
/// the base of the next publication's delta.
pub(super) struct Last {
    epoch: Epoch,
    seq: u64,
    /// As stored (see [`Payload`]): a reference, not a copy.
    data: Bytes,
}

impl Last {
    /// Keeps `p` in `last` unless `last` is newer in the same epoch (the
    /// broker handed over a straggler).
    pub(super) fn keep(last: &mut Option<Last>, p: &Publication) {
        let newer = match last {
            Some(last) => !same_epoch(&last.epoch, &p.epoch) || p.seq > last.seq,
            None => true,
        };
        if newer {
            *last = Some(Last {
                epoch: p.epoch.clone(),
                seq: p.seq,
                data: p.data.clone(),
            });
        }
    }
}

/// One publication's delta against the one before, computed at most once,
/// when first asked for.
pub(super) struct Encoder<'a> {
    /// The previous publication's data, where the hub holds it and it is
    /// of the same kind (JSON text or bytes) as this one's.
    base: Option<&'a [u8]>,
    target: &'a [u8],
    /// `Some(None)`: computed, and no shorter than the data.
    made: OnceCell<Option<Vec<u8>>>,
    metrics: &'a DeltaMetrics,
}

impl<'a> Encoder<'a> {
    /// For publication `p`, after `last` (the topic's, if held).
    pub(super) fn new(
        last: Option<&'a Last>,
        p: &'a Publication,
        metrics: &'a DeltaMetrics,
    ) -> Self {
        let payload = Payload::of(&p.data);
        let base = last
            .filter(|last| {
                same_epoch(&last.epoch, &p.epoch) && last.seq.checked_add(1) == Some(p.seq)
            })
            .map(|last| Payload::of(&last.data))
            .filter(|base| base.is_binary() == payload.is_binary())
            .map(Payload::bytes);
        Self {
            base,
            target: payload.bytes(),
            made: OnceCell::new(),
            metrics,
        }
    }

    /// For a frame that is no publication (a `reset`): never a delta.
    pub(super) fn none(metrics: &'a DeltaMetrics) -> Self {
        Self {
            base: None,
            target: &[],
            made: OnceCell::new(),
            metrics,
        }
    }

    /// The delta, where there is a base and it is shorter than the data.
    pub(super) fn get(&self) -> Option<&[u8]> {
        self.made
            .get_or_init(|| {
                let base = self.base?;
                self.metrics.encodes.inc();
                // `delta(target, source)`: what `apply(source, _)` turns
                // into `target`.
                let delta = fossil_delta::delta(self.target, base);
                (delta.len() < self.target.len()).then_some(delta)
            })
            .as_deref()
    }
}

#[cfg(test)]
mod tests {
    use super::super::*;
    use crate::config::Limits;
    use crate::deflate::Deflate;
    use proptest::prelude::*;
    use prost::Message;
    use serde_json::Value;

    /// What a client got.
    #[derive(Debug, Clone, PartialEq, Eq)]
    enum Got {
        Full(u64, Vec<u8>),
        Delta(u64, Vec<u8>),
        Data(u64),
        Reset(u64),
    }

    impl Got {
        fn form(&self) -> &'static str {
            match self {
                Got::Full(..) => "full",
                Got::Delta(..) => "delta",
                Got::Data(_) => "data",
                Got::Reset(_) => "reset",
            }
        }
    }

    /// The forms of `got`, in order.
    fn forms(got: &[Got]) -> Vec<&'static str> {
        got.iter().map(Got::form).collect()
    }

    /// The payload of an unmasked, uncompressed frame.
    fn payload(frame: &[u8]) -> &[u8] {
        match frame[1] & 0x7f {
            126 => &frame[4..],
            127 => &frame[10..],
            _ => &frame[2..],
        }
    }

    /// A JSON frame as a client reads it.
    fn json(frame: &[u8]) -> Got {
        let v: Value = serde_json::from_slice(payload(frame)).unwrap();
        let seq = v["seq"].as_u64().unwrap();
        match v["op"].as_str() {
            Some("reset") => Got::Reset(seq),
            _ if v.get("full").is_some() => {
                Got::Full(seq, v["full"].as_str().unwrap().as_bytes().to_vec())
            }
            _ if v.get("delta").is_some() => Got::Delta(
                seq,
                v["delta"]
                    .as_str()
                    .unwrap()
                    .chars()
                    .map(|c| u8::try_from(u32::from(c)).unwrap())
                    .collect(),
            ),
            _ => Got::Data(seq),
        }
    }

    /// A protobuf frame as a client reads it.
    fn protobuf(frame: &[u8]) -> Got {
        use proto::v1::server_message::Op;
        match proto::v1::ServerMessage::decode(payload(frame)).unwrap().op {
            Some(Op::Msg(msg)) if msg.delta => Got::Delta(msg.seq, msg.data),
            Some(Op::Msg(msg)) => Got::Full(msg.seq, msg.data),
            Some(Op::Reset(reset)) => Got::Reset(reset.seq),
            other => panic!("{other:?}"),
        }
    }

    /// Frames queued since the last look, read as `out`'s client would.
    fn drained(out: &Outbound) -> Vec<Got> {
        let mut batch = Vec::new();
        if let Some(taken) = out.take(&mut batch) {
            out.written(taken.bytes);
        }
        let read = if out.format().is_protobuf() {
            protobuf
        } else {
            json
        };
        batch.iter().map(|frame| read(frame)).collect()
    }

    /// A client applying what it got: the data of each message it could
    /// rebuild.
    #[derive(Default)]
    struct Client {
        base: Option<Vec<u8>>,
    }

    impl Client {
        fn apply(&mut self, got: &[Got]) -> Vec<(u64, Vec<u8>)> {
            let mut data = Vec::new();
            for got in got {
                match got {
                    Got::Full(seq, full) => {
                        self.base = Some(full.clone());
                        data.push((*seq, full.clone()));
                    }
                    Got::Delta(seq, delta) => {
                        let base = self.base.as_ref().expect("a delta after a base");
                        let target = fossil_delta::apply(base, delta).expect("applies");
                        self.base = Some(target.clone());
                        data.push((*seq, target));
                    }
                    Got::Data(_) | Got::Reset(_) => self.base = None,
                }
            }
            data
        }
    }

    struct Rig {
        hub: Hub,
        topic: Topic,
        epoch: Epoch,
    }

    struct Unsaved;
    impl Resets for Unsaved {
        fn reset(&self, _: &Topic, _: &Epoch, _: u64) {}
    }

    fn rig() -> Rig {
        Rig {
            hub: Hub::new(Arc::new(Metrics::new()), 8, 1 << 20),
            topic: Topic::parse("game:1").unwrap(),
            epoch: Arc::from("e"),
        }
    }

    /// A 1-2 KiB state of which `n` changes a field.
    fn state(n: u64) -> Bytes {
        let players: Vec<String> = (0..16)
            .map(|i| {
                format!(
                    r#"{{"id":{i},"name":"player-{i:02}","score":{}}}"#,
                    (n + 16 - i) / 16
                )
            })
            .collect();
        Bytes::from(format!(
            r#"{{"tick":{n},"players":[{}]}}"#,
            players.join(",")
        ))
    }

    impl Rig {
        /// A live subscriber `conn` in `format` whose queue holds `frames`.
        fn live(
            &self,
            conn: ConnId,
            format: Format,
            frames: usize,
            on_lag: OnLag,
            delta: bool,
        ) -> Outbound {
            let limits = Limits {
                frames,
                bytes: 1 << 20,
                overflow: Overflow::Disconnect,
            };
            let out = Outbound::formatted(limits, format);
            self.hub
                .join_as(&self.topic, conn, out.clone(), Unsaved, Some(on_lag), delta);
            assert!(self.hub.go_live(&self.topic, conn, &self.at(0)));
            out
        }

        fn at(&self, seq: u64) -> Position {
            Position {
                epoch: self.epoch.clone(),
                seq,
            }
        }

        fn publish(&self, seq: u64, data: Bytes) {
            self.hub.deliver(
                &Publication {
                    topic: self.topic.clone(),
                    epoch: self.epoch.clone(),
                    seq,
                    data,
                },
                None,
            );
        }

        fn encodes(&self) -> u64 {
            self.hub.metrics.delta.encodes.get()
        }
    }

    #[test]
    fn the_first_message_is_full_then_deltas_rebuild_each_publication() {
        let rig = rig();
        let out = rig.live(1, Format::WebSocket, 64, OnLag::CatchUp, true);
        let plain = rig.live(2, Format::WebSocket, 64, OnLag::CatchUp, false);
        for seq in 1..=5 {
            rig.publish(seq, state(seq));
        }
        let got = drained(&out);
        assert_eq!(forms(&got), ["full", "delta", "delta", "delta", "delta"]);
        let rebuilt = Client::default().apply(&got);
        let want: Vec<(u64, Vec<u8>)> = (1..=5).map(|seq| (seq, state(seq).to_vec())).collect();
        assert_eq!(rebuilt, want);
        // Much shorter than the data.
        let Got::Delta(_, delta) = &got[1] else {
            unreachable!()
        };
        assert!(delta.len() * 10 < state(2).len(), "{} bytes", delta.len());
        assert_eq!(
            forms(&drained(&plain)),
            ["data"; 5],
            "plain for a plain sub"
        );
        assert_eq!(rig.encodes(), 4);
        let metrics = &rig.hub.metrics.delta;
        assert_eq!((metrics.sent_full.get(), metrics.sent_delta.get()), (1, 4));
    }

    #[test]
    fn what_arrives_during_the_handshake_is_held_in_full_and_deltas_follow() {
        let rig = rig();
        let out = Outbound::new(Limits {
            frames: 64,
            bytes: 1 << 20,
            overflow: Overflow::Disconnect,
        });
        rig.hub
            .join_as(&rig.topic, 1, out.clone(), Unsaved, None, true);
        for seq in 1..=3 {
            rig.publish(seq, state(seq));
        }
        // History sent it 1: 2 and 3 are released, in full.
        assert!(rig.hub.go_live(&rig.topic, 1, &rig.at(1)));
        rig.publish(4, state(4));
        let got = drained(&out);
        assert_eq!(forms(&got), ["full", "full", "delta"]);
        assert_eq!(Client::default().apply(&got)[2], (4, state(4).to_vec()));
    }

    #[test]
    fn a_gap_makes_the_next_message_full() {
        let rig = rig();
        let out = rig.live(1, Format::WebSocket, 64, OnLag::CatchUp, true);
        rig.publish(1, state(1));
        rig.publish(2, state(2));
        // 3 never reached this pod's hub: 4 has no base the client holds.
        rig.publish(4, state(4));
        rig.publish(5, state(5));
        let got = drained(&out);
        assert_eq!(forms(&got), ["full", "delta", "full", "delta"]);
        assert_eq!(Client::default().apply(&got)[3], (5, state(5).to_vec()));
    }

    #[test]
    fn a_reset_makes_the_next_message_full() {
        let rig = rig();
        let out = rig.live(1, Format::WebSocket, 64, OnLag::CatchUp, true);
        rig.publish(1, state(1));
        rig.publish(2, state(2));
        // The topic goes on in the same epoch, after a gap it could not
        // bridge (a reset forward), then in a new one.
        rig.hub.reset(&rig.topic, &rig.at(6));
        rig.publish(7, state(7));
        rig.publish(8, state(8));
        let moved = Rig {
            epoch: Arc::from("f"),
            ..rig
        };
        moved.hub.reset(&moved.topic, &moved.at(0));
        moved.publish(1, state(9));
        moved.publish(2, state(10));
        let got = drained(&out);
        assert_eq!(
            forms(&got),
            [
                "full", "delta", "reset", "full", "delta", "reset", "full", "delta"
            ]
        );
        let rebuilt = Client::default().apply(&got);
        assert_eq!(rebuilt.last(), Some(&(2, state(10).to_vec())));
    }

    #[test]
    fn a_dropped_message_makes_the_next_full() {
        let rig = rig();
        let out = rig.live(1, Format::WebSocket, 2, OnLag::DropNewest, true);
        rig.publish(1, state(1));
        rig.publish(2, state(2));
        // No room: 3 is dropped for it.
        rig.publish(3, state(3));
        assert_eq!(forms(&drained(&out)), ["full", "delta"]);
        rig.publish(4, state(4));
        rig.publish(5, state(5));
        let got = drained(&out);
        assert_eq!(forms(&got), ["full", "delta"]);
        assert_eq!(Client::default().apply(&got)[1], (5, state(5).to_vec()));
    }

    #[test]
    fn a_lag_and_its_catch_up_make_the_next_full() {
        let rig = rig();
        let out = rig.live(1, Format::WebSocket, 2, OnLag::CatchUp, true);
        for seq in 1..=3 {
            rig.publish(seq, state(seq));
        }
        // 3 found no room: it lags from 2.
        assert_eq!(forms(&drained(&out)), ["full", "delta"]);
        // Its catch-up sent 3 from history (plain), holds aside, reads
        // once more, and goes live.
        assert_eq!(
            rig.hub.caught_up(&rig.topic, 1, &rig.at(3)),
            CaughtUp::Overrun
        );
        rig.publish(4, state(4));
        assert_eq!(rig.hub.caught_up(&rig.topic, 1, &rig.at(3)), CaughtUp::Live);
        rig.publish(5, state(5));
        let got = drained(&out);
        assert_eq!(forms(&got), ["full", "delta"]);
        assert_eq!(Client::default().apply(&got)[1], (5, state(5).to_vec()));
        // Live, caught up, then straight on: nothing more is full.
        rig.publish(6, state(6));
        assert_eq!(forms(&drained(&out)), ["delta"]);
    }

    #[test]
    fn a_delta_is_computed_once_for_a_hundred_subscribers_in_three_formats() {
        let rig = rig();
        let deflate = Format::WebSocketDeflate(Deflate {
            window_bits: 15,
            level: 1,
            // Nothing compressed: the frames stay readable here.
            min_bytes: u32::MAX,
        });
        let formats = [Format::WebSocket, deflate, Format::Protobuf(None)];
        let outs: Vec<Outbound> = (0..100)
            .map(|conn| rig.live(conn, formats[conn as usize % 3], 8, OnLag::CatchUp, true))
            .collect();
        rig.publish(1, state(1));
        rig.publish(2, state(2));
        assert_eq!(rig.encodes(), 1, "one delta for all");
        assert_eq!(rig.hub.metrics.delta.sent_delta.get(), 100);
        for out in &outs {
            let got = drained(out);
            assert_eq!(forms(&got), ["full", "delta"], "{:?}", out.format());
            assert_eq!(Client::default().apply(&got)[1], (2, state(2).to_vec()));
        }
    }

    #[test]
    fn binary_data_goes_plain_to_json_clients_and_as_deltas_to_protobuf_ones() {
        use crate::payload::Payload;
        let rig = rig();
        let json = rig.live(1, Format::WebSocket, 64, OnLag::CatchUp, true);
        let protobuf = rig.live(2, Format::Protobuf(None), 64, OnLag::CatchUp, true);
        let bytes = |n: u64| Payload::binary(&[&[0u8, 0xff, 0xfe][..], &state(n)].concat());
        rig.publish(1, bytes(1));
        rig.publish(2, bytes(2));
        // JSON again: no delta against binary data.
        rig.publish(3, state(3));
        rig.publish(4, state(4));
        assert_eq!(forms(&drained(&json)), ["data", "data", "full", "delta"]);
        let got = drained(&protobuf);
        assert_eq!(forms(&got), ["full", "delta", "full", "delta"]);
        let rebuilt = Client::default().apply(&got);
        assert_eq!(rebuilt[1], (2, Payload::of(&bytes(2)).bytes().to_vec()));
        assert_eq!(rebuilt[3], (4, state(4).to_vec()));
    }

    #[test]
    fn a_delta_no_shorter_than_the_data_is_not_sent() {
        let rig = rig();
        let out = rig.live(1, Format::WebSocket, 64, OnLag::CatchUp, true);
        rig.publish(1, Bytes::from_static(b"1"));
        rig.publish(2, Bytes::from_static(b"2"));
        assert_eq!(forms(&drained(&out)), ["full", "full"]);
        assert_eq!(rig.encodes(), 1, "tried, once");
    }

    #[test]
    fn the_topic_keeps_its_last_publication_only_while_a_delta_subscriber_is_on_it() {
        let rig = rig();
        let held = |rig: &Rig| {
            rig.hub
                .shard(&rig.topic)
                .get(&rig.topic)
                .is_some_and(|local| local.last.is_some())
        };
        let _plain = rig.live(1, Format::WebSocket, 64, OnLag::CatchUp, false);
        rig.publish(1, state(1));
        assert!(!held(&rig), "no delta subscriber: nothing kept");
        let _delta = rig.live(2, Format::WebSocket, 64, OnLag::CatchUp, true);
        rig.publish(2, state(2));
        assert!(held(&rig));
        assert!(!rig.hub.leave(&rig.topic, 2));
        assert!(!held(&rig), "let go with the last delta subscriber");
        // A rejoin over a delta subscriber counts it once.
        let _again = rig.live(3, Format::WebSocket, 64, OnLag::CatchUp, true);
        let _again = rig.live(3, Format::WebSocket, 64, OnLag::CatchUp, true);
        rig.publish(3, state(3));
        assert!(held(&rig));
        assert!(!rig.hub.leave(&rig.topic, 3), "the plain one is still on");
        assert!(!held(&rig));
    }

    #[test]
    fn sizes() {
        println!(
            "Subscriber {} (delta at {}), Held {}, LocalTopic {}",
            std::mem::size_of::<Subscriber>(),
            std::mem::offset_of!(Subscriber, delta),
            std::mem::size_of::<Held>(),
            std::mem::size_of::<LocalTopic>(),
        );
    }

    /// What happens to a topic and its subscribers, step by step.
    #[derive(Debug, Clone)]
    enum Step {
        /// The next publication, `change` of its fields changed.
        Publish(u8),
        /// A publication this pod's hub never saw (a gap).
        Skip,
        /// A reset to a new epoch.
        Reset,
        /// The clients read what is queued.
        Read,
    }

    fn steps() -> impl Strategy<Value = Vec<Step>> {
        proptest::collection::vec(
            prop_oneof![
                8 => any::<u8>().prop_map(Step::Publish),
                1 => Just(Step::Skip),
                1 => Just(Step::Reset),
                3 => Just(Step::Read),
            ],
            1..60,
        )
    }

    /// What a lagging subscriber's session is told.
    #[derive(Clone, Default)]
    struct Lags(Arc<std::sync::Mutex<Vec<Position>>>);
    impl Resets for Lags {
        fn reset(&self, _: &Topic, _: &Epoch, _: u64) {}
        fn lagged(&self, _: &Topic, cursor: &Position) {
            self.0.lock().unwrap().push(cursor.clone());
        }
    }

    /// The clients read what is queued, each checking what it rebuilt
    /// against what was published; a lagging one is then caught up
    /// (history: plain messages, which drop its base) and goes live.
    fn read(
        rig: &Rig,
        outs: &mut [(ConnId, Outbound, Client, Lags)],
        published: &[Bytes],
    ) -> Result<(), TestCaseError> {
        for (conn, out, client, lags) in outs.iter_mut() {
            for (seq, data) in client.apply(&drained(out)) {
                let want = &published[seq as usize - 1];
                prop_assert_eq!(&data[..], &want[..], "conn {} seq {}", conn, seq);
            }
            if std::mem::take(&mut *lags.0.lock().unwrap()).is_empty() {
                continue;
            }
            client.apply(&[Got::Data(0)]);
            let at = rig.at(published.len() as u64);
            loop {
                match rig.hub.caught_up(&rig.topic, *conn, &at) {
                    CaughtUp::Overrun => continue,
                    CaughtUp::Live => break,
                    other => prop_assert!(false, "caught up: {:?}", other),
                }
            }
        }
        Ok(())
    }

    proptest! {
        /// Whatever happens (gaps, resets, queues with no room, lags and
        /// catch-ups), a client applying what it is sent rebuilds each
        /// publication it gets exactly: never a delta against a base it
        /// does not hold.
        #[test]
        fn no_delta_is_sent_against_a_base_the_client_does_not_hold(steps in steps()) {
            let mut rig = rig();
            let limits = |frames| Limits { frames, bytes: 1 << 20, overflow: Overflow::Disconnect };
            let formats = [Format::WebSocket, Format::Protobuf(None)];
            let mut outs = Vec::new();
            for (conn, format) in formats.into_iter().enumerate() {
                let conn = conn as ConnId * 2;
                let dropping = Outbound::formatted(limits(3), format);
                let (dropped, lags) = (Lags::default(), Lags::default());
                rig.hub.join_as(&rig.topic, conn, dropping.clone(), dropped.clone(), Some(OnLag::DropNewest), true);
                let lagging = Outbound::formatted(limits(3), format);
                rig.hub.join_as(&rig.topic, conn + 1, lagging.clone(), lags.clone(), Some(OnLag::CatchUp), true);
                for conn in [conn, conn + 1] {
                    prop_assert!(rig.hub.go_live(&rig.topic, conn, &rig.at(0)));
                }
                outs.push((conn, dropping, Client::default(), dropped));
                outs.push((conn + 1, lagging, Client::default(), lags));
            }
            // What each seq of the current epoch was.
            let mut published: Vec<Bytes> = Vec::new();
            let mut fields = [0u8; 16];
            for step in steps {
                match step {
                    Step::Publish(change) => {
                        fields[usize::from(change % 16)] = change;
                        let data = Bytes::from(format!("{{\"fields\":{fields:?},\"pad\":\"{}\"}}", "x".repeat(64)));
                        published.push(data.clone());
                        rig.publish(published.len() as u64, data);
                    }
                    Step::Skip => published.push(Bytes::from_static(b"\"never seen\"")),
                    Step::Reset => {
                        // What the old epoch queued is read first.
                        read(&rig, &mut outs, &published)?;
                        rig = Rig { epoch: Arc::from(format!("{}x", rig.epoch)), ..rig };
                        rig.hub.reset(&rig.topic, &rig.at(0));
                        published.clear();
                    }
                    Step::Read => read(&rig, &mut outs, &published)?,
                }
            }
            read(&rig, &mut outs, &published)?;
        }

        /// Whatever two payloads are, the delta between them applies back
        /// to the second (and computing it does not panic).
        #[test]
        fn a_fossil_delta_rebuilds_any_bytes(
            base in proptest::collection::vec(any::<u8>(), 0..600),
            edits in proptest::collection::vec((any::<usize>(), any::<u8>()), 0..8),
            tail in proptest::collection::vec(any::<u8>(), 0..40),
        ) {
            let mut target = base.clone();
            for (at, byte) in edits {
                if !target.is_empty() {
                    let at = at % target.len();
                    target[at] = byte;
                }
            }
            target.extend(tail);
            let delta = fossil_delta::delta(&target, &base);
            prop_assert_eq!(fossil_delta::apply(&base, &delta).unwrap(), target);
        }
    }
}
