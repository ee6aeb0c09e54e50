//! Redis Cluster's hash slots: which of the 16384 slots a key is in, and a
//! hash tag for each slot, so that a key can be put in a chosen slot.

use std::sync::LazyLock;

/// Slots in a Redis Cluster.
pub const SLOTS: usize = 16384;

/// The slot of `key`: CRC16 (XMODEM) of its hash tag (the text between the
/// first `{` and the next `}`, if not empty) or of the whole key, mod 16384.
pub fn slot(key: &[u8]) -> u16 {
    let hashed = key
        .iter()
        .position(|&b| b == b'{')
        .and_then(|open| {
            let rest = &key[open + 1..];
            let close = rest.iter().position(|&b| b == b'}')?;
            (close > 0).then(|| &rest[..close])
        })
        .unwrap_or(key);
    crc16(hashed) % SLOTS as u16
}

fn crc16(bytes: &[u8]) -> u16 {
    bytes.iter().fold(0u16, |crc, &byte| {
        (0..8).fold(crc ^ (u16::from(byte) << 8), |crc, _| {
            if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            }
        })
    })
}

/// For each slot, a short text whose slot it is: `{<tag>}` in a key puts the
/// key in that slot.
static TAGS: LazyLock<Vec<Box<str>>> = LazyLock::new(|| {
    let mut tags: Vec<Option<Box<str>>> = vec![None; SLOTS];
    let mut missing = SLOTS;
    // About 180,000 numbers cover every slot: a few milliseconds, once.
    for n in 0u32.. {
        let text = n.to_string();
        let tag = &mut tags[usize::from(slot(text.as_bytes()))];
        if tag.is_none() {
            *tag = Some(text.into());
            missing -= 1;
            if missing == 0 {
                break;
            }
        }
    }
    tags.into_iter().map(Option::unwrap_or_default).collect()
});

/// A hash tag (without braces) that puts a key in `slot`.
pub fn tag(slot: u16) -> &'static str {
    TAGS.get(usize::from(slot)).map_or("", |tag| tag)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_are_redis_clusters() {
        // From the Redis Cluster specification and `CLUSTER KEYSLOT`.
        assert_eq!(crc16(b"123456789"), 0x31c3);
        assert_eq!(slot(b"foo"), 12182);
        assert_eq!(slot(b"{user1000}.following"), slot(b"{user1000}.followers"));
        assert_eq!(slot(b"foo{}{bar}"), slot(b"foo{}{bar}"));
        assert_ne!(slot(b"foo{}{bar}"), slot(b"bar"));
        assert_eq!(slot(b"foo{{bar}}zap"), slot(b"{bar"));
        assert_eq!(slot(b"herald:{news}:meta"), slot(b"news"));
    }

    #[test]
    fn every_slot_has_a_tag_that_puts_a_key_there() {
        for s in 0..SLOTS as u16 {
            let key = format!("herald:lineage:{{{}}}", tag(s));
            assert_eq!(slot(key.as_bytes()), s);
        }
    }
}
