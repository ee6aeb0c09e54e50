//! The Lua scripts that make each step one atomic server-side operation, and
//! the keys they work on.
//!
//! A topic's keys share the hash tag `{<topic>}`, so that in a Redis Cluster
//! its seq, history, idempotency keys and channel live on one shard.

use std::sync::{Arc, LazyLock};

use redis::Script;

use super::slots;
use crate::Topic;

/// The prefix of every key and channel unless `redis.prefix` says
/// otherwise.
pub const DEFAULT_PREFIX: &str = "herald";
/// The longest prefix accepted: it is repeated in every key.
const MAX_PREFIX_LEN: usize = 64;

/// The names of everything a pod keeps in Redis, all under one prefix, so
/// that two deployments sharing a Redis (pub/sub ignores the database
/// number) never see each other's topics, sessions or pods.
#[derive(Debug, Clone)]
pub struct Keys {
    prefix: Arc<str>,
    /// A cluster: a lineage per slot.
    cluster: bool,
}

/// Why a prefix cannot be used.
pub fn check_prefix(prefix: &str) -> Result<(), String> {
    if prefix.is_empty() || prefix.len() > MAX_PREFIX_LEN {
        return Err(format!("must be 1 to {MAX_PREFIX_LEN} characters"));
    }
    // No braces: a topic's keys are hash-tagged by `{<topic>}`, and a brace
    // in the prefix would make the prefix the tag (Redis Cluster).
    if let Some(c) = prefix
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | ':')))
    {
        return Err(format!(
            "`{c}` is not allowed: letters, digits, `-`, `_`, `.` and `:` only"
        ));
    }
    Ok(())
}

impl Default for Keys {
    fn default() -> Self {
        Self::new(DEFAULT_PREFIX, false)
    }
}

impl Keys {
    /// Keys under `prefix`, which [`check_prefix`] accepts; in a `cluster`,
    /// lineages per slot.
    pub fn new(prefix: &str, cluster: bool) -> Self {
        Self {
            prefix: Arc::from(prefix),
            cluster,
        }
    }

    /// The slot of the topic's keys in a cluster (0 otherwise): which
    /// lineage is the topic's.
    pub fn slot(&self, topic: &Topic) -> u16 {
        if self.cluster {
            slots::slot(topic.as_str().as_bytes())
        } else {
            0
        }
    }

    /// `HASH {seq, epoch}`: the topic's newest seq and its epoch.
    pub fn meta(&self, topic: &Topic) -> String {
        format!("{}:{{{topic}}}:meta", self.prefix)
    }

    /// `STREAM`: the history, entry id `<seq>-0`, fields `d` (data), `t` (ms).
    pub fn history(&self, topic: &Topic) -> String {
        format!("{}:{{{topic}}}:hist", self.prefix)
    }

    /// The pub/sub channel every publication of the topic is announced on.
    pub fn channel(&self, topic: &Topic) -> String {
        format!("{}:{{{topic}}}", self.prefix)
    }

    /// The topic of a channel name, if it is one of this prefix's.
    pub fn topic_of_channel(&self, channel: &str) -> Option<Topic> {
        let inner = channel
            .strip_prefix(&*self.prefix)?
            .strip_prefix(":{")?
            .strip_suffix('}')?;
        Topic::parse(inner).ok()
    }

    /// The remembered result of a publish with an idempotency key.
    pub fn idempotency(&self, topic: &Topic, key: &str) -> String {
        format!("{}:{{{topic}}}:idem:{key}", self.prefix)
    }

    /// `HASH pod -> "<connections>:<ms>"`: what each pod last reported.
    pub fn pods(&self) -> String {
        format!("{}:pods", self.prefix)
    }

    /// A session's snapshot, its first line naming its owner (`owner <token>`).
    pub fn session(&self, id: &str) -> String {
        format!("{}:session:{id}", self.prefix)
    }

    /// When a user's access was last revoked (Unix ms): their sessions
    /// started before it cannot be claimed. `user` is hex, as sessions store
    /// it.
    pub fn revoked(&self, user_hex: &str) -> String {
        format!("{}:revoked:{user_hex}", self.prefix)
    }

    /// The channel every pod listens on for what is not a topic's:
    /// `disconnect <user hex>`.
    pub fn control_channel(&self) -> String {
        format!("{}:control", self.prefix)
    }

    /// The dataset's lineage: `HASH {id, clock}`. Every publish advances
    /// `clock`; a pod passes the highest clock it has seen with each script,
    /// and a Redis whose clock is below it went back in time (restarted from
    /// an older snapshot, or failed over to a replica that lagged): the
    /// script then starts a new lineage, and every topic written before it
    /// gets a new epoch when it is next touched. See docs/protocol.md, "When
    /// Redis goes back in time".
    ///
    /// In a cluster, each slot has its own (`<prefix>:lineage:{<tag>}`, in
    /// the slot): a script's keys must share a slot, and the lineage moves
    /// with the slot's keys.
    pub fn lineage(&self, slot: u16) -> String {
        if self.cluster {
            format!("{}:lineage:{{{}}}", self.prefix, slots::tag(slot))
        } else {
            format!("{}:lineage", self.prefix)
        }
    }
}

/// Lua shared by the session scripts: `rank(owner)` is the rank of an owner
/// token, `<token>@<rank>` (a token without one ranks 0: a connection that
/// started its session and never claimed one). A claim ranks its owner at
/// Redis's time in ms, and above the owner it takes the session from: so a
/// claim made after Redis went back in time (an older snapshot, a lagging
/// replica) still ranks above every claim made before, and a stored owner
/// ranked below a saver is one whose claim Redis has since forgotten. The
/// saver wins then; an owner ranked equal or above claimed after it.
const RANK: &str = r#"
local function rank(owner)
  return tonumber(string.match(owner, '@(%d+)$') or '0')
end
local function stored_owner(value)
  return string.match(value, '^owner (%S+)\n')
end
"#;

/// Saves a session unless an owner that claimed it after `ARGV[1]` holds it;
/// returns 1 when saved.
///
/// KEYS: session. ARGV: owner, value (its owner line first), ttl ms.
pub static SAVE_SESSION: LazyLock<Script> = LazyLock::new(|| {
    Script::new(&format!(
        "{RANK}{}",
        r#"
local current = redis.call('GET', KEYS[1])
if current then
  local owner = stored_owner(current)
  if owner and owner ~= ARGV[1] and rank(owner) >= rank(ARGV[1]) then
    return 0
  end
end
redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
return 1
"#
    ))
});

/// Pushes back the expiry of a session its owner saved; returns 1 when
/// extended, 0 when another owner claimed it after `ARGV[1]`, -1 when it is
/// to be saved whole: there is none, or its owner ranks below `ARGV[1]`
/// (Redis forgot the claim). Only the owner's line is read.
///
/// KEYS: session. ARGV: owner, ttl ms.
pub static EXTEND_SESSION: LazyLock<Script> = LazyLock::new(|| {
    Script::new(&format!(
        "{RANK}{}",
        r#"
local head = redis.call('GETRANGE', KEYS[1], 0, #ARGV[1] + 6)
if head == '' then
  return -1
end
if head == 'owner ' .. ARGV[1] .. '\n' then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
local owner = stored_owner(redis.call('GETRANGE', KEYS[1], 0, 255))
if owner and rank(owner) < rank(ARGV[1]) then
  return -1
end
return 0
"#
    ))
});

/// Makes `ARGV[1]@<rank>` the session's owner, ranked at Redis's time and
/// above the owner it takes it from, keeping its expiry, and returns `{previous owner or "",
/// snapshot without the owner line, new owner, Redis's time in ms}`; nil when
/// there is none (or it was started before its user's access was revoked:
/// then it is deleted); 0, taking nothing, when it belongs to another user
/// than `ARGV[2]` (`user <hex> <since ms>` is the line after the owner's).
///
/// A claim that runs after `ARGV[3]` (Unix ms, Redis's clock) does nothing
/// and returns `{Redis's time in ms}`: its pod gave up waiting, and its
/// client resumed elsewhere, so running it late would take the session from
/// the connection that serves it now (Redis was frozen, or the network held
/// the claim back).
///
/// Given a snapshot (`ARGV[5]`, without an owner line), a session that is not
/// there is stored as that, for `ARGV[6]` ms, and claimed (from "").
///
/// The user's revocation is read from `KEYS[2]`, or (in a cluster, where it
/// is in another slot) given as `ARGV[4]`, read just before.
///
/// KEYS: session, \[the user's revocation\]. ARGV: owner token, user hex (''
/// for anonymous), not after, the revocation's time ('' for none or
/// `KEYS[2]`), \[snapshot, ttl ms\].
pub static CLAIM_SESSION: LazyLock<Script> = LazyLock::new(|| {
    Script::new(&format!(
        "{RANK}{}",
        r#"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
if now > tonumber(ARGV[3]) then
  return {now}
end
local current = redis.call('GET', KEYS[1])
local kept = false
if not current then
  if not ARGV[5] then
    return false
  end
  current = ARGV[5]
  kept = true
end
local from = stored_owner(current) or ''
local body = string.gsub(current, '^owner %S+\n', '', 1)
local user, since = string.match(body, '^user (%x+) (%d+)\n')
if (user or '') ~= ARGV[2] then
  return 0
end
local revoked = ARGV[4] ~= '' and ARGV[4] or nil
if KEYS[2] then
  revoked = redis.call('GET', KEYS[2])
end
if revoked and tonumber(since) <= tonumber(revoked) then
  redis.call('DEL', KEYS[1])
  return false
end
local owner = ARGV[1] .. '@' .. string.format('%d', math.max(rank(from) + 1, now))
local value = 'owner ' .. owner .. '\n' .. body
if kept then
  redis.call('SET', KEYS[1], value, 'PX', ARGV[6])
else
  redis.call('SET', KEYS[1], value, 'KEEPTTL')
end
return {from, body, owner, now}
"#
    ))
});

/// Lua shared by [`PUBLISH`] and [`RECOVER`]: `lineage(key, known, fresh)`
/// returns the lineage id and clock, starting a new lineage (at the known
/// clock) when Redis is behind what a pod saw; `position(meta, history,
/// lineage, fresh epoch, ttl of a new meta)` returns the topic's epoch, seq
/// and the seq its epoch began after (`b`; nil in a meta older than it),
/// creating them for a new topic and moving a topic written in an earlier
/// lineage to a new epoch (its seqs may be issued a second time).
pub(super) const PRELUDE: &str = r#"
local function lineage(key, known, fresh)
  local l = redis.call('HMGET', key, 'id', 'clock')
  local id, clock = l[1], tonumber(l[2] or '0')
  if not id or clock < known then
    -- Past anything any pod may have seen (up to 2^32 writes lost), so that
    -- no pod takes what comes next for old announcements.
    if clock < known then clock = known + 4294967296 end
    id = fresh
    redis.call('HSET', key, 'id', id, 'clock', clock)
  end
  return id, clock
end
local function position(meta, history, line, fresh, ttl)
  local m = redis.call('HMGET', meta, 'epoch', 'seq', 'l', 'b')
  local epoch, seq, base = m[1], tonumber(m[2] or '0'), tonumber(m[4])
  if not epoch then
    -- A new series: whatever history is left belongs to a lost one.
    epoch = fresh
    seq = 0
    base = 0
    redis.call('DEL', history)
    redis.call('HSET', meta, 'epoch', epoch, 'seq', 0, 'l', line, 'b', 0)
    if ttl then redis.call('PEXPIRE', meta, ttl) end
  elseif m[3] ~= line then
    -- Without a lineage: stored before lineages existed, adopted as it is.
    if m[3] then
      epoch = fresh
      base = seq
      redis.call('HSET', meta, 'b', base)
    end
    redis.call('HSET', meta, 'epoch', epoch, 'l', line)
  end
  return epoch, seq, base
end
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
"#;

/// Publishes a batch: for each item, assigns the topic's next seq, appends
/// to history (trimmed to the namespace's size and, every few publishes, to
/// its age; reads check the age too), announces on the channel, remembers an
/// idempotency key. Returns one reply per item, in order:
/// `"<seq>:<epoch>:<clock>:<lineage>"`, or an error for an item that failed
/// (alone: the items are independent).
///
/// One call for many items shares what every publish needs (the lineage,
/// Redis's time, the script's own start), which is most of a publish's cost
/// in Redis. The items of one call may be of any topics (of one hash slot,
/// in a cluster); items of one topic get their seqs in the batch's order.
///
/// The announcement is `<seq>:<epoch>:<stamp>:<data>`, the stamp being
/// `<ms>[;<traceparent>];c<clock>` (the traceparent for a traced publish
/// only). Several items of one topic in a call are one announcement,
/// `+<n>` followed by `:<length>:<announcement>` for each, in seq order.
///
/// KEYS: lineage, then per item: meta, history, \[idempotency\]. ARGV: the
/// pod's known clock, a fresh lineage id, meta ttl ms, idempotency ttl ms, a
/// fresh epoch (used by a topic that needs one), the command that announces
/// (`PUBLISH`; in a cluster `SPUBLISH`, to the shard's subscribers only),
/// then six per item: data, history size, history ttl ms, channel, `1` if it has an
/// idempotency key (else `0`), traceparent (`''`: none).
pub static PUBLISH: LazyLock<Script> = LazyLock::new(|| {
    Script::new(&format!(
        "{PRELUDE}{}",
        r#"
local line, clock = lineage(KEYS[1], tonumber(ARGV[1]), ARGV[2])
local now = now_ms()
local now_s = string.format('%d', now)
-- Each channel's announcements, in order, sent once every item is done.
local channels, announced = {}, {}
local function publish(meta, history, idem, data, size, ttl, channel, traceparent, clock)
  local epoch = position(meta, history, line, ARGV[5], nil)
  local seq = redis.call('HINCRBY', meta, 'seq', 1)
  if tonumber(size) > 0 then
    redis.call('XADD', history, 'MAXLEN', size, string.format('%d-0', seq), 'd', data, 't', now_s)
    redis.call('PEXPIRE', history, ttl)
    if seq % 16 == 0 then
      -- Every 16th publish drops up to 32 entries older than the history
      -- age: reading the stream's head on every publish would walk the
      -- entries its length trim left deleted there.
      local oldest = now - tonumber(ttl)
      local last
      for _, entry in ipairs(redis.call('XRANGE', history, '-', '+', 'COUNT', 32)) do
        if tonumber(entry[2][4]) >= oldest then break end
        last = entry[1]
      end
      if last then
        redis.call('XTRIM', history, 'MINID', string.format('%d-0', tonumber(string.match(last, '^%d+')) + 1))
      end
    end
  end
  redis.call('PEXPIRE', meta, ARGV[3])
  -- string.format('%d'): Lua prints a number with `..` through the C
  -- library's float formatting, a large part of a publish's cost.
  local stamp = now_s
  if traceparent ~= '' then stamp = stamp .. ';' .. traceparent end
  stamp = string.format('%s;c%d', stamp, clock)
  local records = announced[channel]
  if not records then
    records = {}
    announced[channel] = records
    channels[#channels + 1] = channel
  end
  records[#records + 1] = string.format('%d:%s:%s:', seq, epoch, stamp) .. data
  local result = string.format('%d:%s:%d:%s', seq, epoch, clock, line)
  if idem then redis.call('SET', idem, result, 'PX', ARGV[4]) end
  return result
end
local replies = {}
local k = 2
for a = 7, #ARGV, 6 do
  local meta, history, idem = KEYS[k], KEYS[k + 1], nil
  k = k + 2
  if ARGV[a + 4] == '1' then
    idem = KEYS[k]
    k = k + 1
  end
  local first = idem and redis.call('GET', idem)
  if first then
    replies[#replies + 1] = first
  else
    clock = clock + 1
    local ok, reply = pcall(publish, meta, history, idem, ARGV[a], ARGV[a + 1], ARGV[a + 2], ARGV[a + 3], ARGV[a + 5], clock)
    if ok then
      replies[#replies + 1] = reply
    else
      replies[#replies + 1] = redis.error_reply(type(reply) == 'table' and reply.err or tostring(reply))
    end
  end
end
redis.call('HSET', KEYS[1], 'clock', string.format('%d', clock))
for _, channel in ipairs(channels) do
  local records = announced[channel]
  if #records == 1 then
    redis.call(ARGV[6], channel, records[1])
  else
    -- Several of one topic: one announcement, `+<n>` and each record after
    -- its length, so that every pod receives and reads them at once.
    local parts = {'+' .. #records}
    for _, record in ipairs(records) do
      parts[#parts + 1] = string.format('%d', #record)
      parts[#parts + 1] = record
    end
    redis.call(ARGV[6], channel, table.concat(parts, ':'))
  end
end
return replies
"#
    ))
});

/// Whether `value` looks like a W3C `traceparent` (`00-<32 hex>-<16 hex>-<2
/// hex>`, 55 bytes): only such a value goes into an announcement, where a
/// `:` would break its framing.
pub fn is_traceparent(value: &str) -> bool {
    value.len() == 55
        && value.bytes().enumerate().all(|(i, b)| match i {
            2 | 35 | 52 => b == b'-',
            _ => b.is_ascii_hexdigit(),
        })
}

/// The topic's position (creating its epoch if it has none) and, given a
/// `since`, the first page of the history after it ([`PAGE_OF`]). Returns
/// `{seq, epoch, now_ms, clock, lineage, entries, base}`; `entries` only when
/// `since` is in the same epoch and before `seq`, or in another epoch: then
/// they are the current epoch's from its start, after `base` (when the
/// epoch's start is known and it has any), so that a reset can go back to
/// where the epoch began.
///
/// A `since` the pod vouches for (`ARGV[7]` = 1: a stored session's ack, or
/// what the pod delivered) above the topic's seq in the same epoch proves
/// that the topic went back in time; so does a seq the pod saw issued twice
/// (`ARGV[7]` = 2). Either moves the topic to a new epoch, once. A client's
/// own `since` (0) proves nothing: it may be made up.
///
/// A topic nobody published to yet keeps its meta only for `ARGV[4]` (the
/// namespace's history age): subscribing leaves nothing long-lived behind.
///
/// KEYS: meta, history, lineage. ARGV: a fresh epoch, since (-1 for none),
/// the since's epoch ('' for any), ttl ms of a new meta, the pod's known
/// clock, a fresh lineage id, vouched (0, 1, 2), the page's most entries
/// and bytes (0: no bound; absent, as an older pod sends it: none).
pub static RECOVER: LazyLock<Script> = LazyLock::new(|| {
    Script::new(&format!(
        "{PRELUDE}{PAGE_OF}{}",
        r#"
local line, clock = lineage(KEYS[3], tonumber(ARGV[5]), ARGV[6])
local epoch, seq, base = position(KEYS[1], KEYS[2], line, ARGV[1], ARGV[4])
local since = tonumber(ARGV[2])
local same = ARGV[3] == epoch
if same and ((ARGV[7] == '1' and since > seq) or ARGV[7] == '2') then
  epoch = ARGV[1]
  base = seq
  redis.call('HSET', KEYS[1], 'epoch', epoch, 'b', base)
end
local now = now_ms()
local other = ARGV[3] ~= '' and ARGV[3] ~= epoch
if since >= 0 and other and base and base < seq then
  -- A since of an epoch left behind: the history of this one, from its start.
  return {seq, epoch, now, clock, line, page_of(KEYS[2], base, ARGV[8], ARGV[9]), base}
end
if since < 0 or since >= seq or other then
  return {seq, epoch, now, clock, line}
end
return {seq, epoch, now, clock, line, page_of(KEYS[2], since, ARGV[8], ARGV[9])}
"#
    ))
});

/// Lua shared by [`RECOVER`] and [`PAGE`]: `page_of(history, after, count,
/// bytes)` returns the entries of `history` after seq `after`, at most
/// `count` (0 or nil: any) and up to the one whose data reaches `bytes` (0
/// or nil: any), so that a replay holds one page at a time, however long the
/// history. It reads the stream a few entries at a time, as many as the
/// bytes left hold at the size seen so far: a page of large messages does
/// not copy (in Redis, where every pod's commands wait) the many more that
/// `count` alone would allow.
pub(super) const PAGE_OF: &str = r#"
local function page_of(history, after, count, bytes)
  count = tonumber(count or '0')
  bytes = tonumber(bytes or '0')
  if count <= 0 and bytes <= 0 then
    return redis.call('XRANGE', history, string.format('%d-0', after + 1), '+')
  end
  if count <= 0 then count = 2147483647 end
  local kept, total, from, want = {}, 0, after + 1, 1
  while true do
    local read = redis.call('XRANGE', history, string.format('%d-0', from), '+', 'COUNT', want)
    for _, entry in ipairs(read) do
      kept[#kept + 1] = entry
      local fields = entry[2]
      for f = 1, #fields - 1, 2 do
        if fields[f] == 'd' then total = total + #fields[f + 1] end
      end
      if #kept >= count or (bytes > 0 and total >= bytes) then return kept end
    end
    if #read < want then return kept end
    from = tonumber(string.match(read[#read][1], '^%d+')) + 1
    want = count - #kept
    if bytes > 0 then
      want = math.min(want, math.floor((bytes - total) * #kept / math.max(total, 1)) + 1)
    end
  end
end
"#;

/// A replay's next page: the topic's history after a seq, in the epoch the
/// replay began in. Returns `{now_ms, seq, entries}` (`seq`: the topic's),
/// or `{now_ms}` when the topic is no longer in that epoch, or is to leave
/// it when next touched (its lineage is not the current one, or Redis's
/// clock is behind the pod's: Redis went back in time): then history no
/// longer continues the replay. It reads only; [`RECOVER`] or a publish
/// moves the topic.
///
/// KEYS: meta, history, lineage. ARGV: the epoch, the seq to read after,
/// the page's most entries and bytes (0: no bound), the pod's known clock.
pub static PAGE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(&format!(
        "{PRELUDE}{PAGE_OF}{}",
        r#"
local m = redis.call('HMGET', KEYS[1], 'epoch', 'seq', 'l')
local l = redis.call('HMGET', KEYS[3], 'id', 'clock')
local now = now_ms()
if m[1] ~= ARGV[1] or (m[3] and m[3] ~= l[1]) or tonumber(l[2] or '0') < tonumber(ARGV[5]) then
  return {now}
end
return {now, tonumber(m[2] or '0'), page_of(KEYS[2], tonumber(ARGV[2]), ARGV[3], ARGV[4])}
"#
    ))
});

/// Records a pod's connection count and returns the counts of the pods that
/// reported within the ttl (forgetting the others).
///
/// KEYS: pods. ARGV: pod, connections, ttl ms.
pub static POD_LOADS: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r#"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2] .. ':' .. now)
local all = redis.call('HGETALL', KEYS[1])
local loads = {}
for i = 1, #all, 2 do
  local count, at = string.match(all[i + 1], '^(%d+):(%d+)$')
  if at and now - tonumber(at) <= tonumber(ARGV[3]) then
    table.insert(loads, tonumber(count))
  else
    redis.call('HDEL', KEYS[1], all[i])
  end
end
return loads
"#,
    )
});

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn traceparents_are_checked_before_they_travel() {
        assert!(is_traceparent(
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
        ));
        assert!(!is_traceparent(
            "00:4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
        ));
        assert!(!is_traceparent("00-4bf92f35-01"));
    }

    #[test]
    fn channel_names_round_trip() {
        let topic = Topic::parse("chat:room-1/a").unwrap_or_else(|e| panic!("{e}"));
        let keys = Keys::default();
        assert_eq!(keys.channel(&topic), "herald:{chat:room-1/a}");
        assert_eq!(
            keys.topic_of_channel(&keys.channel(&topic)),
            Some(topic.clone())
        );
        assert_eq!(keys.topic_of_channel("other:{x}"), None);
        // Another release's channel is not ours, even where one prefix
        // starts the other.
        let staging = Keys::new("herald-staging", false);
        assert_eq!(keys.topic_of_channel(&staging.channel(&topic)), None);
        assert_eq!(staging.topic_of_channel(&keys.channel(&topic)), None);
    }

    #[test]
    fn prefixes_keep_the_hash_tag_the_topic() {
        assert!(check_prefix("herald").is_ok());
        assert!(check_prefix("team-a.prod:v2").is_ok());
        assert!(check_prefix("").is_err());
        assert!(check_prefix("a{b}").is_err());
        assert!(check_prefix("a b").is_err());
        assert!(check_prefix(&"x".repeat(65)).is_err());
    }
}
