//! Presence's keys and Lua scripts.
//!
//! Per topic, in the topic's hash slot (`{<topic>}`, as its history):
//! - `<prefix>:presence:{<topic>}`: `HASH instance -> <position>:<part>`
//!   ([`super::encoding`]), one field per pod instance with members there.
//! - `<prefix>:presence:{<topic>}:pos`: the presence position, `INCR`ed by
//!   every write that changes the hash.
//! - With join/leave events asked for ([`MEMBERS`]):
//!   `<prefix>:presence:{<topic>}:users`, `HASH user -> instances holding
//!   them`, and `<prefix>:presence:{<topic>}:of:<instance>`, `SET` of the
//!   users the instance holds.
//!
//! Per deployment and instance (each key its own slot):
//! - `<prefix>:presence:pods`: `ZSET instance -> expiry (Redis ms)`, the
//!   instances' liveness.
//! - `<prefix>:presence:pod:<instance>`: `SET` of the topics the instance
//!   has a field in (added before the field is written, removed after it is
//!   cleared), for the cleanup of a dead one.
//! - `<prefix>:presence:clean:<instance>`: the cleanup lock (`SET NX PX`).

use std::sync::{Arc, LazyLock};

use redis::Script;

use crate::Topic;

/// The names of presence's keys, under the deployment's prefix.
#[derive(Debug, Clone)]
pub struct PresenceKeys {
    prefix: Arc<str>,
}

impl PresenceKeys {
    pub fn new(prefix: &str) -> Self {
        Self {
            prefix: Arc::from(prefix),
        }
    }

    pub fn hash(&self, topic: &Topic) -> String {
        format!("{}:presence:{{{topic}}}", self.prefix)
    }

    pub fn position(&self, topic: &Topic) -> String {
        format!("{}:presence:{{{topic}}}:pos", self.prefix)
    }

    /// The topic's members: `HASH user -> instances holding them`.
    pub fn users(&self, topic: &Topic) -> String {
        format!("{}:presence:{{{topic}}}:users", self.prefix)
    }

    /// The users an instance holds in a topic: `SET`.
    pub fn users_of(&self, topic: &Topic, instance: &str) -> String {
        format!("{}:presence:{{{topic}}}:of:{instance}", self.prefix)
    }

    pub fn pods(&self) -> String {
        format!("{}:presence:pods", self.prefix)
    }

    pub fn topics_of(&self, instance: &str) -> String {
        format!("{}:presence:pod:{instance}", self.prefix)
    }

    pub fn cleaning(&self, instance: &str) -> String {
        format!("{}:presence:clean:{instance}", self.prefix)
    }
}

/// Writes an instance's part of a topic's presence whole, and announces the
/// change: nothing when it clears a field that is not there; else the next
/// position, the field set (or deleted, for an empty part) and a change
/// message on the topic's channel: the delta when the field held what the
/// writer last wrote (its position is `ARGV[2]`), the whole part otherwise
/// (a first write, or Redis lost or another pod cleared the field). Returns
/// the position (0: nothing done).
///
/// KEYS: hash, position. ARGV: instance, the position of the writer's last
/// write (`''`: none), the part (`''`: empty), the delta, the channel, the
/// command that announces (`PUBLISH`, `SPUBLISH`), how long an unused
/// position outlives the hash (ms).
pub static WRITE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r#"
local cur = redis.call('HGET', KEYS[1], ARGV[1])
if ARGV[3] == '' and not cur then
  return 0
end
local pos = redis.call('INCR', KEYS[2])
local kind, body = 'd', ARGV[4]
if (not cur) or string.match(cur, '^%d+') ~= ARGV[2] then
  kind, body = 'f', ARGV[3]
end
if ARGV[3] == '' then
  redis.call('HDEL', KEYS[1], ARGV[1])
  if redis.call('EXISTS', KEYS[1]) == 0 then
    redis.call('PEXPIRE', KEYS[2], ARGV[7])
  end
else
  redis.call('HSET', KEYS[1], ARGV[1], string.format('%d:', pos) .. ARGV[3])
  redis.call('PERSIST', KEYS[2])
end
redis.call(ARGV[6], ARGV[5], string.format('!p%d:%s:%s:', pos, kind, ARGV[1]) .. body)
return pos
"#,
    )
});

/// Sets the users an instance holds in a topic to `ARGV` (all of them),
/// counting per user the instances holding them: `[joins, leaves]`, the
/// users whose count went 0 -> 1 and 1 -> 0. Atomic, so each transition is
/// returned to one caller; running it again with the same users changes
/// nothing (a retry is safe). Kept only when join/leave events are asked
/// for (`PresenceSettings::members`).
///
/// KEYS: the topic's users hash, the instance's set. ARGV: its users.
pub static MEMBERS: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r#"
local now = {}
for i = 1, #ARGV do now[ARGV[i]] = true end
local joins, leaves = {}, {}
for _, u in ipairs(redis.call('SMEMBERS', KEYS[2])) do
  if now[u] then
    now[u] = false
  else
    redis.call('SREM', KEYS[2], u)
    if redis.call('HINCRBY', KEYS[1], u, -1) <= 0 then
      redis.call('HDEL', KEYS[1], u)
      leaves[#leaves + 1] = u
    end
  end
end
for i = 1, #ARGV do
  local u = ARGV[i]
  if now[u] then
    now[u] = false
    redis.call('SADD', KEYS[2], u)
    if redis.call('HINCRBY', KEYS[1], u, 1) == 1 then
      joins[#joins + 1] = u
    end
  end
end
return {joins, leaves}
"#,
    )
});

/// A topic's presence at one position: `[position, [field, value, ...]]`.
///
/// KEYS: hash, position.
pub static SNAPSHOT: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r#"
return {redis.call('GET', KEYS[2]) or '0', redis.call('HGETALL', KEYS[1])}
"#,
    )
});

/// An instance's liveness refreshed (unless `ARGV[1]` is `''`), and the
/// instances whose liveness expired (at most 16): `[added, [instance,
/// ...]]`, `added` 1 when the instance was not there (its first beat, or
/// Redis lost it, or it was taken for dead and cleaned).
///
/// KEYS: pods. ARGV: instance, ttl ms.
pub static BEAT: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r#"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local added = 0
if ARGV[1] ~= '' then
  added = redis.call('ZADD', KEYS[1], now + tonumber(ARGV[2]), ARGV[1])
end
return {added, redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'LIMIT', 0, 16)}
"#,
    )
});
