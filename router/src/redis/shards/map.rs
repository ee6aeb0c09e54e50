//! The cluster's slot map, as `CLUSTER SLOTS` tells it.

use redis::Value;

use crate::redis::slots::SLOTS;

/// The cluster's slot map: the master of each slot.
pub struct Map {
    /// `host:port` of each master.
    pub masters: Vec<String>,
    /// For each slot, its master's index in `masters` (`u16::MAX`: none).
    owners: Vec<u16>,
    /// Counts the readings that changed the map.
    pub version: u64,
}

impl Map {
    pub(super) fn empty() -> Self {
        Self {
            masters: Vec::new(),
            owners: vec![u16::MAX; SLOTS],
            version: 0,
        }
    }

    /// `host:port` of the master of `slot`, if the map has one.
    pub fn master(&self, slot: u16) -> Option<&str> {
        let owner = *self.owners.get(usize::from(slot))?;
        self.masters.get(usize::from(owner)).map(String::as_str)
    }

    /// Reads a `CLUSTER SLOTS` reply: `[[start, end, [host, port, id, ..],
    /// replicas..], ..]`.
    pub(super) fn parse(reply: &Value, version: u64) -> Option<Self> {
        let Value::Array(ranges) = reply else {
            return None;
        };
        let mut map = Self::empty();
        map.version = version;
        for range in ranges {
            let Value::Array(parts) = range else {
                return None;
            };
            let (start, end) = (int(parts.first()?)?, int(parts.get(1)?)?);
            let Value::Array(master) = parts.get(2)? else {
                return None;
            };
            let host = match master.first()? {
                Value::BulkString(host) => String::from_utf8(host.clone()).ok()?,
                Value::SimpleString(host) => host.clone(),
                _ => return None,
            };
            let address = format!("{host}:{}", int(master.get(1)?)?);
            let index = match map.masters.iter().position(|m| *m == address) {
                Some(index) => index,
                None => {
                    map.masters.push(address);
                    map.masters.len() - 1
                }
            };
            let index = u16::try_from(index).ok()?;
            for slot in start..=end.min(SLOTS as i64 - 1) {
                *map.owners.get_mut(usize::try_from(slot).ok()?)? = index;
            }
        }
        Some(map)
    }

    pub(super) fn same_owners(&self, other: &Self) -> bool {
        self.owners
            .iter()
            .zip(&other.owners)
            .all(|(a, b)| self.masters.get(usize::from(*a)) == other.masters.get(usize::from(*b)))
    }
}

fn int(value: &Value) -> Option<i64> {
    match value {
        Value::Int(i) => Some(*i),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bulk(text: &str) -> Value {
        Value::BulkString(text.as_bytes().to_vec())
    }

    #[test]
    fn a_slot_map_is_read_from_cluster_slots() {
        let node = |port| Value::Array(vec![bulk("127.0.0.1"), Value::Int(port), bulk("id")]);
        let reply = Value::Array(vec![
            Value::Array(vec![
                Value::Int(0),
                Value::Int(5460),
                node(7000),
                node(7003),
            ]),
            Value::Array(vec![Value::Int(5461), Value::Int(10922), node(7001)]),
            Value::Array(vec![Value::Int(10923), Value::Int(16383), node(7002)]),
        ]);
        let map = Map::parse(&reply, 1).expect("a map");
        assert_eq!(map.master(0), Some("127.0.0.1:7000"));
        assert_eq!(map.master(5461), Some("127.0.0.1:7001"));
        assert_eq!(map.master(16383), Some("127.0.0.1:7002"));
        assert_eq!(map.masters.len(), 3);
        assert!(Map::parse(&Value::Int(1), 1).is_none());
    }
}
