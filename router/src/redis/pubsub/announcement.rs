//! Decoding what a channel carries: a publication's announcement (alone, or
//! in a batch of them), or a message on the control channel.

use std::sync::Arc;

use bytes::Bytes;

use super::Pubsub;
use super::flow::{Announced, Flow, MAX_HELD};
use crate::Topic;
use crate::redis::control::{self, Control};
use crate::redis::presence;

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// An announcement on a topic's channel, parsed.
#[derive(Debug, PartialEq, Eq)]
struct Announcement<'a> {
    seq: u64,
    epoch: &'a str,
    /// When Redis ran the publish, in ms since the epoch.
    at_ms: u64,
    /// The publish's W3C `traceparent`, when it was traced.
    traceparent: Option<&'a str>,
    /// The lineage clock of the publish.
    clock: Option<u64>,
    data: &'a [u8],
}

/// Splits a batch of announcements, `+<n>` and `:<length>:<announcement>`
/// for each, into the announcements.
fn split_batch(payload: &[u8]) -> Option<Vec<&[u8]>> {
    fn number(bytes: &[u8]) -> Option<(usize, &[u8])> {
        let end = bytes.iter().position(|b| *b == b':')?;
        let n = std::str::from_utf8(&bytes[..end]).ok()?.parse().ok()?;
        Some((n, &bytes[end + 1..]))
    }
    let (count, mut rest) = number(payload.strip_prefix(b"+")?)?;
    let mut records = Vec::with_capacity(count.min(MAX_HELD));
    for i in 0..count {
        let (len, after) = number(rest)?;
        records.push(after.get(..len)?);
        rest = &after[len..];
        if i + 1 < count {
            rest = rest.strip_prefix(b":")?;
        }
    }
    rest.is_empty().then_some(records)
}

/// Splits `<seq>:<epoch>:<ms>[;<traceparent>][;c<clock>]:<data>`.
fn parse_payload(payload: &[u8]) -> Option<Announcement<'_>> {
    let mut parts = payload.splitn(4, |b| *b == b':');
    let seq = std::str::from_utf8(parts.next()?).ok()?.parse().ok()?;
    let epoch = std::str::from_utf8(parts.next()?).ok()?;
    let mut stamp = std::str::from_utf8(parts.next()?).ok()?.split(';');
    let at_ms = stamp.next()?.parse().ok()?;
    let mut traceparent = None;
    let mut clock = None;
    for part in stamp {
        match part.strip_prefix('c') {
            Some(c) => clock = Some(c.parse().ok()?),
            None => traceparent = Some(part),
        }
    }
    Some(Announcement {
        seq,
        epoch,
        at_ms,
        traceparent,
        clock,
        data: parts.next()?,
    })
}

impl Pubsub {
    /// A message on the control channel ([`control`]).
    fn control(&self, payload: &[u8]) {
        match control::read(payload) {
            Some(Control::Disconnect(user)) => self.sink.disconnect(&user),
            Some(Control::Subscription(user, command)) => self.sink.subscription(&user, &command),
            Some(Control::Resumed(session)) => self.sink.resumed(&session),
            Some(Control::Forward(forward)) => self.sink.forward(&forward),
            None => tracing::warn!("unreadable message on the control channel"),
        }
    }

    /// A message from the channel: a publication's announcement, or a
    /// control message.
    pub(super) fn message(&mut self, channel: &str, payload: Bytes) {
        if channel == self.control_channel {
            self.control(&payload);
            return;
        }
        let Some(topic) = self.keys.topic_of_channel(channel) else {
            return;
        };
        if presence::encoding::is_message(&payload) {
            self.presence.message(&topic, &payload);
            return;
        }
        if payload.first() == Some(&b'+') {
            let Some(records) = split_batch(&payload) else {
                tracing::warn!(
                    channel,
                    "unreadable batch of publications on a herald channel"
                );
                return;
            };
            for record in records {
                self.announcement(channel, &topic, payload.slice_ref(record));
            }
        } else {
            self.announcement(channel, &topic, payload);
        }
    }

    /// One announcement of `topic`'s, parsed and run through the merge rule.
    fn announcement(&mut self, channel: &str, topic: &Topic, payload: Bytes) {
        let Some(announcement) = parse_payload(&payload) else {
            tracing::warn!(channel, "unreadable publication on a herald channel");
            return;
        };
        let lag_ms = now_ms().saturating_sub(announcement.at_ms);
        self.observer.pubsub_lag(lag_ms as f64 / 1000.0);
        if let Some(clock) = announcement.clock {
            self.lineage.saw_clock(self.keys.slot(topic), clock);
        }
        let Some(watched) = self.topics.get(topic) else {
            return;
        };
        // One epoch string per topic, not one per announcement.
        let epoch = match &watched.flow {
            Flow::Live(at) | Flow::Catching { at, .. } | Flow::Resubscribing { at, .. }
                if *at.epoch == *announcement.epoch =>
            {
                at.epoch.clone()
            }
            _ => Arc::from(announcement.epoch),
        };
        self.arrive(
            topic,
            Announced {
                epoch,
                seq: announcement.seq,
                clock: announcement.clock,
                traceparent: announcement.traceparent.map(Box::from),
                // A view into the payload the parser read: no copy.
                data: payload.slice_ref(announcement.data),
            },
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_batch_of_announcements_splits_by_length() {
        let records: [&[u8]; 2] = [b"1:e:5;c1:{\"a\":\"x:y\"}", b"2:e:5;c2:[]"];
        let batch = format!(
            "+2:{}:{}:{}:{}",
            records[0].len(),
            String::from_utf8_lossy(records[0]),
            records[1].len(),
            String::from_utf8_lossy(records[1])
        );
        assert_eq!(split_batch(batch.as_bytes()), Some(records.to_vec()));
        assert_eq!(split_batch(b"+2:3:abc"), None);
        assert_eq!(split_batch(b"+1:3:abcd"), None);
        assert_eq!(split_batch(b"+1:9:abc"), None);
    }

    #[test]
    fn payloads_split_at_the_first_three_colons() {
        assert_eq!(
            parse_payload(b"42:9f3c:1700000000000:{\"a\":\"b:c\"}"),
            Some(Announcement {
                seq: 42,
                epoch: "9f3c",
                at_ms: 1_700_000_000_000,
                traceparent: None,
                clock: None,
                data: &b"{\"a\":\"b:c\"}"[..],
            })
        );
        let tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        let traced = format!("7:9f3c:1700000000000;{tp};c12:[1]");
        assert_eq!(
            parse_payload(traced.as_bytes()),
            Some(Announcement {
                seq: 7,
                epoch: "9f3c",
                at_ms: 1_700_000_000_000,
                traceparent: Some(tp),
                clock: Some(12),
                data: &b"[1]"[..],
            })
        );
        assert_eq!(parse_payload(b"x:9f3c:1:{}"), None);
    }
}
