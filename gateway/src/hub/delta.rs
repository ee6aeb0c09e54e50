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
    pub(super) fn new(last: Option<&'a Last>, p: &'a Publication, metrics: &'a DeltaMetrics) -> Self {
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
