//! The compact encoding of a pod instance's part of a topic's presence, as
//! its field of the topic's presence hash holds it and a change message
//! carries it, and the change message itself.
//!
//! A part: its anonymous connections, then per user its id, connections and
//! info, each length or number a LEB128 varint:
//! `anonymous (user_len user connections info_len+1 info)*`, `info_len+1`
//! being 0 for no info. A change of a part (a *delta*) is the same with 0
//! connections for a user who left. About 3 bytes besides the id and the
//! info per member: a 10,000-member room with 20-byte infos fits in ~0.35 MB.
//! The empty text is the empty part.
//!
//! The hash field is `<position>:<part>`, the position of the write that
//! set it. A change on the topic's channel is
//! `!p<position>:<f|d>:<instance>:<part or delta>` (`f`: the instance's
//! whole part; `d`: a delta on its part at the position before). The `!`
//! tells it from a publication's announcement, which starts with a digit or
//! `+`.

use std::sync::Arc;

use bytes::Bytes;

use crate::presence::{Member, PodMembers, PresenceUpdate};

/// What a change message starts with.
pub const MESSAGE_MARK: &[u8] = b"!p";

fn put_varint(out: &mut Vec<u8>, mut n: u64) {
    loop {
        let byte = (n & 0x7f) as u8;
        n >>= 7;
        if n == 0 {
            out.push(byte);
            return;
        }
        out.push(byte | 0x80);
    }
}

/// A varint at the start of `bytes`, and what follows it.
fn varint(bytes: &[u8]) -> Option<(u64, &[u8])> {
    let mut n: u64 = 0;
    for (i, byte) in bytes.iter().enumerate().take(10) {
        n |= u64::from(byte & 0x7f) << (7 * i);
        if byte & 0x80 == 0 {
            return Some((n, &bytes[i + 1..]));
        }
    }
    None
}

fn put_entry(out: &mut Vec<u8>, user: &str, connections: u32, info: Option<&[u8]>) {
    put_varint(out, user.len() as u64);
    out.extend_from_slice(user.as_bytes());
    put_varint(out, u64::from(connections));
    match info {
        Some(info) => {
            put_varint(out, info.len() as u64 + 1);
            out.extend_from_slice(info);
        }
        None => put_varint(out, 0),
    }
}

/// A part, encoded (empty for an empty part). Entries by user id, so that
/// one part always encodes alike.
pub fn encode_part(part: &PodMembers) -> Vec<u8> {
    if part.is_empty() {
        return Vec::new();
    }
    let mut entries: Vec<_> = part.iter().collect();
    entries.sort_unstable_by(|a, b| a.0.cmp(b.0));
    let mut out = Vec::with_capacity(8 + entries.len() * 32);
    put_varint(&mut out, u64::from(part.anonymous()));
    for (user, connections, info) in entries {
        put_entry(&mut out, user, connections, info.map(|b| &b[..]));
    }
    out
}

/// An update, encoded as a delta: removals as 0 connections.
pub fn encode_delta(update: &PresenceUpdate) -> Vec<u8> {
    let mut out = Vec::with_capacity(8 + (update.set.len() + update.removed.len()) * 32);
    put_varint(&mut out, u64::from(update.anonymous));
    for user in &update.removed {
        put_entry(&mut out, user, 0, None);
    }
    for (member, connections) in &update.set {
        put_entry(
            &mut out,
            &member.user,
            *connections,
            member.info.as_ref().map(|b| &b[..]),
        );
    }
    out
}

/// A user, their connections and info, as encoded.
type Entry = (Arc<str>, u32, Option<Bytes>);

/// The entries of an encoded part or delta: anonymous connections, and
/// (user, connections, info) in order; `None` when it is not one.
fn entries(bytes: &Bytes) -> Option<(u32, Vec<Entry>)> {
    if bytes.is_empty() {
        return Some((0, Vec::new()));
    }
    let (anonymous, mut rest) = varint(bytes)?;
    let mut entries = Vec::new();
    while !rest.is_empty() {
        let (len, after) = varint(rest)?;
        let user = after.get(..usize::try_from(len).ok()?)?;
        let user: Arc<str> = Arc::from(std::str::from_utf8(user).ok()?);
        let (connections, after) = varint(&after[user.len()..])?;
        let (info_len, after) = varint(after)?;
        let (info, after) = match info_len {
            0 => (None, after),
            n => {
                let n = usize::try_from(n - 1).ok()?;
                let info = after.get(..n)?;
                (Some(bytes.slice_ref(info)), &after[n..])
            }
        };
        entries.push((user, u32::try_from(connections).ok()?, info));
        rest = after;
    }
    Some((u32::try_from(anonymous).ok()?, entries))
}

/// A part, decoded; `None` when the bytes are not one (a user twice, 0
/// connections, or not the encoding at all).
pub fn decode_part(bytes: &Bytes) -> Option<PodMembers> {
    let (anonymous, entries) = entries(bytes)?;
    let mut part = PodMembers::default();
    part.set_anonymous(anonymous);
    for (user, connections, info) in entries {
        if connections == 0 || part.contains(&user) {
            return None;
        }
        part.insert(user, connections, info);
    }
    Some(part)
}

/// A delta, decoded as the update it was made from.
pub fn decode_delta(bytes: &Bytes) -> Option<PresenceUpdate> {
    let (anonymous, entries) = entries(bytes)?;
    let mut update = PresenceUpdate {
        anonymous,
        ..PresenceUpdate::default()
    };
    for (user, connections, info) in entries {
        if connections == 0 {
            update.removed.push(user);
        } else {
            update.set.push((Member { user, info }, connections));
        }
    }
    Some(update)
}

/// A hash field's value: the position of the write that set it, and the
/// part.
pub fn decode_field(value: &Bytes) -> Option<(u64, PodMembers)> {
    let colon = value.iter().position(|b| *b == b':')?;
    let position = std::str::from_utf8(&value[..colon]).ok()?.parse().ok()?;
    Some((position, decode_part(&value.slice(colon + 1..))?))
}

/// A change on a topic's channel, parsed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Message {
    pub position: u64,
    pub change: Change,
    pub instance: Arc<str>,
}

/// What a change message says of its instance's part.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    /// The instance's whole part now.
    Whole(PodMembers),
    /// Changes to the part it had at the position before.
    Delta(PresenceUpdate),
}

/// Whether a channel's payload is a presence change (not a publication).
pub fn is_message(payload: &[u8]) -> bool {
    payload.starts_with(MESSAGE_MARK)
}

/// The head of a change message, before its part or delta (as
/// [`super::scripts::WRITE`] writes it).
#[cfg(test)]
pub fn message_head(position: u64, whole: bool, instance: &str) -> Vec<u8> {
    let kind = if whole { 'f' } else { 'd' };
    format!("!p{position}:{kind}:{instance}:").into_bytes()
}

/// A change message, parsed; `None` when it is not one.
pub fn parse_message(payload: &Bytes) -> Option<Message> {
    let rest = payload.strip_prefix(MESSAGE_MARK)?;
    let mut parts = rest.splitn(4, |b| *b == b':');
    let position = std::str::from_utf8(parts.next()?).ok()?.parse().ok()?;
    let kind = parts.next()?;
    let instance = std::str::from_utf8(parts.next()?).ok()?;
    let body = payload.slice_ref(parts.next()?);
    let change = match kind {
        b"f" => Change::Whole(decode_part(&body)?),
        b"d" => Change::Delta(decode_delta(&body)?),
        _ => return None,
    };
    Some(Message {
        position,
        change,
        instance: Arc::from(instance),
    })
}

/// `bytes` with `head` in front, as one buffer.
#[cfg(test)]
pub fn joined(head: &[u8], bytes: &[u8]) -> Bytes {
    let mut out = bytes::BytesMut::with_capacity(head.len() + bytes.len());
    out.extend_from_slice(head);
    out.extend_from_slice(bytes);
    out.freeze()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn part(users: &[(&str, u32, Option<&'static str>)], anonymous: u32) -> PodMembers {
        let mut part = PodMembers::default();
        part.set_anonymous(anonymous);
        for (user, connections, info) in users {
            part.insert(
                Arc::from(*user),
                *connections,
                info.map(|i| Bytes::from_static(i.as_bytes())),
            );
        }
        part
    }

    #[test]
    fn parts_and_deltas_round_trip() {
        let original = part(
            &[
                ("alice", 2, Some("{\"name\":\"Alice\"}")),
                ("bob", 300, None),
                ("é:\n\t", 1, Some("{}")),
            ],
            70_000,
        );
        let encoded = Bytes::from(encode_part(&original));
        assert_eq!(decode_part(&encoded), Some(original.clone()));
        assert_eq!(decode_part(&Bytes::new()), Some(PodMembers::default()));
        let update = PresenceUpdate {
            set: vec![(
                Member {
                    user: Arc::from("carol"),
                    info: Some(Bytes::from_static(b"{\"a\":1}")),
                },
                3,
            )],
            removed: vec![Arc::from("bob")],
            anonymous: 4,
        };
        let delta = Bytes::from(encode_delta(&update));
        assert_eq!(decode_delta(&delta), Some(update));
        let field = joined(b"17:", &encoded);
        assert_eq!(decode_field(&field), Some((17, original)));
    }

    #[test]
    fn a_member_costs_a_few_bytes_besides_its_id_and_info() {
        let users: Vec<String> = (0..10_000).map(|i| format!("user-{i:05}")).collect();
        let mut big = PodMembers::default();
        for user in &users {
            big.insert(
                Arc::from(user.as_str()),
                1,
                Some(Bytes::from_static(b"{\"name\":\"Some Body\"}")),
            );
        }
        let len = encode_part(&big).len();
        // 10 bytes of id, 20 of info, 3 of lengths and count.
        assert!(len <= 10_000 * 33 + 8, "{len}");
    }

    #[test]
    fn malformed_parts_are_refused_not_panicked_on() {
        let good = Bytes::from(encode_part(&part(&[("alice", 1, Some("{}"))], 0)));
        // Cut anywhere after the anonymous count (alone, it is a part).
        for cut in 2..good.len() {
            assert_eq!(decode_part(&good.slice(..cut)), None, "cut at {cut}");
        }
        for bad in [
            &b"\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff"[..],
            b"\x00\x05ab",
            b"\x00\x02\xff\xfe\x01\x00",
            // 0 connections is no member.
            b"\x00\x01a\x00\x00",
            // Connections beyond u32.
            b"\x00\x01a\xff\xff\xff\xff\x7f\x00",
        ] {
            assert_eq!(decode_part(&Bytes::from_static(bad)), None, "{bad:?}");
        }
        let twice = [&good[..], &good[1..]].concat();
        assert_eq!(decode_part(&Bytes::from(twice)), None);
        assert_eq!(decode_field(&Bytes::from_static(b"x:")), None);
        assert_eq!(decode_field(&Bytes::from_static(b"12")), None);
    }

    #[test]
    fn messages_parse_and_are_told_from_announcements() {
        let p = part(&[("alice", 1, None)], 2);
        let head = message_head(42, true, "pod-a-00ff");
        let message = joined(&head, &encode_part(&p));
        assert!(is_message(&message));
        assert!(!is_message(b"42:9f3c:1700000000000:{}"));
        assert!(!is_message(b"+2:1:x"));
        assert_eq!(
            parse_message(&message),
            Some(Message {
                position: 42,
                change: Change::Whole(p),
                instance: Arc::from("pod-a-00ff"),
            })
        );
        let cleared = joined(&message_head(7, true, "i"), b"");
        assert_eq!(
            parse_message(&cleared).map(|m| m.change),
            Some(Change::Whole(PodMembers::default()))
        );
        let delta = joined(&message_head(8, false, "i"), &[0, 1, b'a', 0, 0]);
        assert_eq!(
            parse_message(&delta).map(|m| m.change),
            Some(Change::Delta(PresenceUpdate {
                removed: vec![Arc::from("a")],
                ..PresenceUpdate::default()
            }))
        );
        for bad in [&b"!px:f:i:"[..], b"!p1:z:i:", b"!p1:f:i", b"!p1:f:i:\x80"] {
            assert_eq!(parse_message(&Bytes::from_static(bad)), None, "{bad:?}");
        }
    }
}
