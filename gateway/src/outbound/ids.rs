//! An SSE connection's event ids: its place in each of its topics, in the
//! request's topic order, `<epoch>:<seq>` joined by `.` (`:0` for a topic
//! not positioned yet). A browser sends the last one back as
//! `Last-Event-ID` when it reconnects, and the stream resumes from it on
//! any pod.
//!
//! The id is the connection's own, the `data:` part of an event is shared
//! by every subscriber ([`crate::frame::Frames`]): the queue writes an id
//! line before each event, rendered as the event is queued, under the
//! queue's lock, so that ids follow the order events are written in.

use bytes::Bytes;

use super::queue::{Outbound, State};

/// Where a queued frame leaves its topic: a `msg`'s seq, a `reset`'s or an
/// `ok`'s epoch and seq. Other frames (presence, errors) move nothing.
#[derive(Debug, Clone, Copy)]
pub struct Mark<'a> {
    pub topic: &'a str,
    pub epoch: &'a str,
    pub seq: u64,
}

/// One topic's place.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Place {
    pub topic: Box<str>,
    /// `None`: not positioned yet (`:0`).
    pub epoch: Option<Box<str>>,
    pub seq: u64,
}

#[derive(Debug)]
pub(super) struct EventIds {
    places: Vec<Place>,
}

impl EventIds {
    pub(super) fn new(places: Vec<Place>) -> Self {
        Self { places }
    }

    /// Moves `mark`'s topic (a topic not among them: nothing).
    pub(super) fn mark(&mut self, mark: Mark<'_>) {
        let Some(place) = self.places.iter_mut().find(|p| &*p.topic == mark.topic) else {
            return;
        };
        if place.epoch.as_deref() != Some(mark.epoch) {
            place.epoch = Some(mark.epoch.into());
        }
        place.seq = mark.seq;
    }

    /// `id: <id>\n`.
    pub(super) fn render(&self) -> Bytes {
        let mut out = Vec::with_capacity(5 + self.places.len() * 24);
        out.extend_from_slice(b"id: ");
        for (i, place) in self.places.iter().enumerate() {
            if i > 0 {
                out.push(b'.');
            }
            match &place.epoch {
                Some(epoch) => {
                    out.extend_from_slice(epoch.as_bytes());
                    out.push(b':');
                    out.extend_from_slice(place.seq.to_string().as_bytes());
                }
                None => out.extend_from_slice(b":0"),
            }
        }
        out.push(b'\n');
        Bytes::from(out)
    }
}

impl State {
    /// Appends `frame`, after its id line on an SSE connection (moved by
    /// `mark` first).
    pub(super) fn append_event(&mut self, frame: Bytes, mark: Option<Mark<'_>>) {
        if let Some(ids) = &mut self.ids {
            if let Some(mark) = mark {
                ids.mark(mark);
            }
            let id = ids.render();
            self.append(id);
        }
        self.append(frame);
    }

    /// Whether the queue holds `max` frames (an event and its id line
    /// count as one).
    pub(super) fn is_full(&self, max: usize) -> bool {
        let per_event = if self.ids.is_some() { 2 } else { 1 };
        self.frames.len() >= max.saturating_mul(per_event)
    }
}

impl Outbound {
    /// An SSE connection: every event it is sent from now on carries an
    /// id, starting from `places`.
    pub fn track_events(&self, places: Vec<Place>) {
        self.state().ids = Some(Box::new(EventIds::new(places)));
    }
}

/// Whether a queued frame is an event's id line (counted with its event,
/// not as a frame of its own).
pub(super) fn is_id(frame: &[u8]) -> bool {
    frame.starts_with(b"id: ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_id_holds_every_topic_in_order() {
        let place = |topic: &str| Place {
            topic: topic.into(),
            epoch: None,
            seq: 0,
        };
        let mut ids = EventIds::new(vec![place("a"), place("b")]);
        assert_eq!(&ids.render()[..], b"id: :0.:0\n");
        ids.mark(Mark {
            topic: "b",
            epoch: "ff",
            seq: 9,
        });
        ids.mark(Mark {
            topic: "zz",
            epoch: "1",
            seq: 1,
        });
        assert_eq!(&ids.render()[..], b"id: :0.ff:9\n");
    }
}
