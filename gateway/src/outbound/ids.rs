//! An SSE connection's event ids: its place in each of its topics, in the
//! request's topic order, `<epoch>:<seq>` joined by `.` (`:0` for a topic
//! not positioned yet). A browser sends the last one back as
//! `Last-Event-ID` when it reconnects, and the stream resumes from it on
//! any pod.
//!
//! The id is the connection's own, so an event is one buffer per
//! connection: its id line, then the `data:` part every subscriber shares
//! ([`crate::frame::Frames`]), copied. The allocation is paid for the id
//! anyway; the copy costs less than a second slice would (its queue slot,
//! and a `sendmsg` where one slice takes the cheaper `send`). Events are
//! made as they are queued, under the queue's lock, so that ids follow the
//! order events are written in.
//!
//! The fan-out moves a stream's id and copies it once per event and
//! connection, with ten or more topics in it, over thousands of
//! connections whose state is cold in the cache by the time their next
//! event comes: what it reads lies in one allocation, read front to back
//! (each separate allocation was a cache miss, and together they were most
//! of an event's cost), and a move rewrites its topic's digits in place.

use std::hash::BuildHasher;
use std::ops::Range;

use bytes::Bytes;
use foldhash::fast::FixedState;

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

/// `[count][hash; count][name end; count][part; count][names][line]`: the
/// topics' count, each topic's name [`hash`], where its name ends in
/// `names` and where its part of the line starts in the buffer (all `u32`,
/// little-endian), the names back to back in the request's order, then the
/// id line as it stands, `id: <id>\n`. A topic's part is `<epoch>:<seq>`
/// (not positioned: an empty epoch and seq 0), up to the `.` before the
/// next one or the line's end.
#[derive(Debug)]
pub(super) struct EventIds {
    buf: Box<[u8]>,
}

const WORD: usize = size_of::<u32>();
/// The header's columns, each `count` words after the count itself.
const HASHES: usize = 0;
const NAME_ENDS: usize = 1;
const PARTS: usize = 2;
const COLUMNS: usize = 3;

/// The index of topic `i`'s word in `column`, of `count` topics.
fn slot(column: usize, count: usize, i: usize) -> usize {
    1 + column * count + i
}

/// The bytes of the buffer's `n`th word.
fn word_at(n: usize) -> Range<usize> {
    n * WORD..(n + 1) * WORD
}

impl EventIds {
    pub(super) fn new(places: Vec<Place>) -> Self {
        let mut buf = Vec::new();
        buf.extend_from_slice(&word(places.len()));
        for place in &places {
            buf.extend_from_slice(&hash(&place.topic).to_le_bytes());
        }
        let mut name_end = 0;
        for place in &places {
            name_end += place.topic.len();
            buf.extend_from_slice(&word(name_end));
        }
        buf.resize(buf.len() + places.len() * WORD, 0);
        for place in &places {
            buf.extend_from_slice(place.topic.as_bytes());
        }
        buf.extend_from_slice(b"id: ");
        for (i, place) in places.iter().enumerate() {
            if i > 0 {
                buf.push(b'.');
            }
            let at = word(buf.len());
            buf[word_at(slot(PARTS, places.len(), i))].copy_from_slice(&at);
            let mut digits = [0u8; 20];
            let epoch = place.epoch.as_deref().unwrap_or_default();
            buf.extend(part(epoch, decimal(place.seq, &mut digits)));
        }
        buf.push(b'\n');
        Self { buf: buf.into() }
    }

    /// Moves `mark`'s topic (a topic not among them: nothing).
    pub(super) fn mark(&mut self, mark: Mark<'_>) {
        let Some(i) = self.find(mark.topic) else {
            return;
        };
        let part = self.part(i);
        let mut digits = [0u8; 20];
        let seq = decimal(mark.seq, &mut digits);
        let colon = self.buf[part.clone()].iter().position(|&b| b == b':');
        if let Some(colon) = colon.map(|at| part.start + at)
            && same(&self.buf[part.start..colon], mark.epoch.as_bytes())
            && part.end - colon - 1 == seq.len()
        {
            self.buf[colon + 1..part.end].copy_from_slice(seq);
            return;
        }
        let mut buf = Vec::with_capacity(self.buf.len() + mark.epoch.len() + seq.len());
        buf.extend_from_slice(&self.buf[..part.start]);
        buf.extend(self::part(mark.epoch, seq));
        buf.extend_from_slice(&self.buf[part.end..]);
        // The parts after it move by as much as it grew or shrank.
        let moved = |at: usize| at + buf.len() - self.buf.len();
        let later: Vec<usize> = (i + 1..self.count())
            .map(|j| moved(self.part_start(j)))
            .collect();
        self.buf = buf.into();
        let count = self.count();
        for (j, at) in (i + 1..).zip(later) {
            self.buf[word_at(slot(PARTS, count, j))].copy_from_slice(&word(at));
        }
    }

    /// The event of `data`, `data`'s bytes after the id line: one
    /// allocation of its exact size.
    pub(super) fn event(&self, data: &[u8]) -> Bytes {
        let line = &self.buf[self.line_start()..];
        let mut out = Vec::with_capacity(line.len() + data.len());
        out.extend_from_slice(line);
        out.extend_from_slice(data);
        Bytes::from(out)
    }

    fn count(&self) -> usize {
        self.word(0)
    }

    /// The `n`th `u32` of the buffer.
    fn word(&self, n: usize) -> usize {
        let mut bytes = [0; WORD];
        bytes.copy_from_slice(&self.buf[word_at(n)]);
        u32::from_le_bytes(bytes) as usize
    }

    /// Topic `i`'s word in `column`.
    fn column(&self, column: usize, i: usize) -> usize {
        self.word(slot(column, self.count(), i))
    }

    /// Where topic `i`'s name ends in the names.
    fn name_end(&self, i: usize) -> usize {
        self.column(NAME_ENDS, i)
    }

    /// Where topic `i`'s part of the line starts.
    fn part_start(&self, i: usize) -> usize {
        self.column(PARTS, i)
    }

    fn names_start(&self) -> usize {
        slot(COLUMNS, self.count(), 0) * WORD
    }

    fn line_start(&self) -> usize {
        let count = self.count();
        let names = if count == 0 {
            0
        } else {
            self.name_end(count - 1)
        };
        self.names_start() + names
    }

    /// The index of `topic`: its hash among the hashes, then its name.
    fn find(&self, topic: &str) -> Option<usize> {
        let hash = hash(topic) as usize;
        let names = self.names_start();
        (0..self.count()).find(|&i| {
            self.column(HASHES, i) == hash && {
                let start = if i == 0 { 0 } else { self.name_end(i - 1) };
                same(
                    &self.buf[names + start..names + self.name_end(i)],
                    topic.as_bytes(),
                )
            }
        })
    }

    /// Where topic `i`'s part of the line lies: up to the next one's `.`,
    /// or the line's `\n`.
    fn part(&self, i: usize) -> Range<usize> {
        let next = if i + 1 < self.count() {
            self.part_start(i + 1)
        } else {
            self.buf.len()
        };
        self.part_start(i)..next - 1
    }
}

/// Whether `a` and `b` are the same bytes, compared inline: names and
/// epochs are a few dozen bytes, and a call to `memcmp` for each cost more
/// than the compare (a fold, which the compiler does not turn back into
/// one).
fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0, |diff, (x, y)| diff | (x ^ y)) == 0
}

/// A count or offset as stored: ids are at most a request head long.
fn word(n: usize) -> [u8; WORD] {
    u32::try_from(n).unwrap_or(u32::MAX).to_le_bytes()
}

/// A topic name's hash (its low 32 bits), the same in every process:
/// nothing to learn from it, as a collision costs one more compare.
fn hash(topic: &str) -> u32 {
    FixedState::with_seed(0).hash_one(topic) as u32
}

/// `<epoch>:<seq>`.
fn part<'a>(epoch: &'a str, seq: &'a [u8]) -> impl Iterator<Item = u8> + 'a {
    epoch.bytes().chain([b':']).chain(seq.iter().copied())
}

impl State {
    /// Appends `frame`, as an event with its id on an SSE connection (moved
    /// by `mark` first).
    pub(super) fn append_event(&mut self, frame: Bytes, mark: Option<Mark<'_>>) {
        let frame = match &mut self.ids {
            Some(ids) => {
                if let Some(mark) = mark {
                    ids.mark(mark);
                }
                ids.event(&frame)
            }
            None => frame,
        };
        self.append(frame);
    }
}

impl Outbound {
    /// An SSE connection: every event it is sent from now on carries an
    /// id, starting from `places`.
    pub fn track_events(&self, places: Vec<Place>) {
        self.state().ids = Some(EventIds::new(places));
    }
}

/// `n` in decimal, in `buf`'s tail.
fn decimal(mut n: u64, buf: &mut [u8; 20]) -> &[u8] {
    let mut at = buf.len();
    loop {
        at -= 1;
        buf[at] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            return &buf[at..];
        }
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn place(topic: &str) -> Place {
        Place {
            topic: topic.into(),
            epoch: None,
            seq: 0,
        }
    }

    fn mark(ids: &mut EventIds, topic: &str, epoch: &str, seq: u64) {
        ids.mark(Mark { topic, epoch, seq });
    }

    #[test]
    fn an_id_holds_every_topic_in_order() {
        let mut ids = EventIds::new(vec![place("a"), place("b")]);
        assert_eq!(&ids.event(b"")[..], b"id: :0.:0\n");
        mark(&mut ids, "b", "ff", 9);
        mark(&mut ids, "zz", "1", 1);
        assert_eq!(&ids.event(b"")[..], b"id: :0.ff:9\n");
        mark(&mut ids, "a", "e", u64::MAX);
        assert_eq!(&ids.event(b"")[..], b"id: e:18446744073709551615.ff:9\n");
    }

    #[test]
    fn a_part_that_grows_or_shrinks_moves_the_ones_after_it() {
        let start = Place {
            topic: "chat/b".into(),
            epoch: Some("0a".into()),
            seq: 99,
        };
        let mut ids = EventIds::new(vec![place("chat/a"), start, place("chat/c")]);
        assert_eq!(&ids.event(b"")[..], b"id: :0.0a:99.:0\n");
        mark(&mut ids, "chat/b", "0a", 100);
        mark(&mut ids, "chat/c", "c0ffee", 7);
        assert_eq!(&ids.event(b"")[..], b"id: :0.0a:100.c0ffee:7\n");
        // Another epoch, fewer digits: the parts after it move back.
        mark(&mut ids, "chat/b", "1", 5);
        mark(&mut ids, "chat/c", "c0ffee", 8);
        assert_eq!(&ids.event(b"")[..], b"id: :0.1:5.c0ffee:8\n");
        mark(&mut ids, "chat/a", "abcdef0123456789", 12345);
        mark(&mut ids, "chat/c", "c0ffee", 10);
        assert_eq!(
            &ids.event(b"data: {}\n\n")[..],
            b"id: abcdef0123456789:12345.1:5.c0ffee:10\ndata: {}\n\n"
        );
    }

    #[test]
    fn a_name_that_ends_another_is_not_taken_for_it() {
        let mut ids = EventIds::new(vec![place("ab"), place("b"), place("abb")]);
        mark(&mut ids, "b", "e", 1);
        mark(&mut ids, "abb", "e", 2);
        mark(&mut ids, "a", "e", 3);
        assert_eq!(&ids.event(b"")[..], b"id: :0.e:1.e:2\n");
    }

    /// The rendering the buffer keeps, written the plain way: each topic's
    /// `<epoch>:<seq>` joined by `.`.
    fn model(places: &[(String, String, u64)]) -> Vec<u8> {
        let parts: Vec<String> = places.iter().map(|(_, e, s)| format!("{e}:{s}")).collect();
        format!("id: {}\n", parts.join(".")).into_bytes()
    }

    proptest! {
        /// Whatever moves come, in whatever order (another epoch, more or
        /// fewer digits, a topic not among them), the id is the one the
        /// plain rendering gives, and an event is that id and its data.
        #[test]
        fn the_id_is_always_the_plain_rendering_of_every_place(
            names in prop::collection::hash_set("[a-c/]{1,6}", 1..6),
            moves in prop::collection::vec(
                (0usize..8, "[0-9a-f]{0,16}", any::<u64>().prop_map(|s| s >> (s % 64))),
                0..40,
            ),
        ) {
            let names: Vec<String> = names.into_iter().collect();
            let mut plain: Vec<(String, String, u64)> =
                names.iter().map(|n| (n.clone(), String::new(), 0)).collect();
            let mut ids = EventIds::new(names.iter().map(|n| place(n)).collect());
            for (which, epoch, seq) in moves {
                // An empty epoch moves nothing as a `Mark` never has one;
                // an index past the names is a topic not among them.
                if epoch.is_empty() {
                    continue;
                }
                let topic = names.get(which).cloned().unwrap_or_else(|| "zz".to_owned());
                mark(&mut ids, &topic, &epoch, seq);
                if let Some(p) = plain.iter_mut().find(|(n, _, _)| *n == topic) {
                    (p.1, p.2) = (epoch, seq);
                }
                let mut want = model(&plain);
                want.extend_from_slice(b"data: x\n\n");
                prop_assert_eq!(&ids.event(b"data: x\n\n")[..], &want[..]);
            }
        }
    }
}
