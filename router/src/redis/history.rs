//! The history API's reads from Redis ([`HISTORY`]): a page of a topic's
//! stream, forward or reverse, on the replay connections, made whole or
//! lost by the same rule as the embedded engine's ([`history::window`]).

use std::sync::LazyLock;
use std::time::Duration;

use redis::{Script, Value};

use super::call::timed;
use super::lineage::{self, Lineage};
use super::pages::bound;
use super::recover::recovered;
use super::scripts::{Keys, PAGE_OF, PRELUDE};
use super::shards::Shards;
use super::{META_TTL, millis, new_epoch};
use crate::history::{self, HistoryPage, HistoryQuery};
use crate::observe::Observer;
use crate::{BrokerError, Publication, Topic};

/// A page of a topic's history for the history API. Returns `{seq, epoch,
/// now_ms, clock, lineage, entries}` as [`super::scripts::RECOVER`] does
/// (creating the topic's position as it does), without `entries` when the
/// `since` is of another epoch or the page is of no message.
///
/// Forward: the entries after `since` (from the oldest not older than the
/// history's age when none is given), at most a page ([`PAGE_OF`]); one
/// more than the page's count, so that the caller sees where it ends.
/// Reverse: the entries below `since` (from the newest), newest first.
///
/// KEYS: meta, history, lineage. ARGV: a fresh epoch, ttl ms of a new meta,
/// the pod's known clock, a fresh lineage id, since (-1 for none), the
/// since's epoch ('' for any), `1` for reverse, the most entries (0: the
/// position only) and bytes (0: no bound), the history's age in ms.
pub static HISTORY: LazyLock<Script> = LazyLock::new(|| {
    Script::new(&format!(
        "{PRELUDE}{PAGE_OF}{}",
        r#"
local line, clock = lineage(KEYS[3], tonumber(ARGV[3]), ARGV[4])
local epoch, seq = position(KEYS[1], KEYS[2], line, ARGV[1], ARGV[2])
local now = now_ms()
local since = tonumber(ARGV[5])
local count = tonumber(ARGV[8])
if (ARGV[6] ~= '' and ARGV[6] ~= epoch) or count == 0 then
  return {seq, epoch, now, clock, line}
end
if ARGV[7] == '1' then
  local top = '+'
  if since >= 0 then
    if since <= 1 then return {seq, epoch, now, clock, line, {}} end
    top = string.format('%d-0', since - 1)
  end
  return {seq, epoch, now, clock, line, redis.call('XREVRANGE', KEYS[2], top, '-', 'COUNT', count + 1)}
end
local after = since
if after < 0 then
  -- From the oldest kept that is not too old: the publish trims by age
  -- only now and then.
  after = 0
  local oldest = now - tonumber(ARGV[10])
  local from = '-'
  while true do
    local read = redis.call('XRANGE', KEYS[2], from, '+', 'COUNT', 32)
    local found = false
    for _, entry in ipairs(read) do
      if tonumber(entry[2][4]) >= oldest then
        found = true
        break
      end
      after = tonumber(string.match(entry[1], '^%d+'))
    end
    if found or #read < 32 then break end
    from = string.format('%d-0', after + 1)
  end
end
return {seq, epoch, now, clock, line, page_of(KEYS[2], after, count + 1, ARGV[9])}
"#
    ))
});

/// The largest integer a Lua number holds exactly.
const LUA_EXACT: u64 = 1 << 53;

/// What reads the history API's pages.
pub(super) struct Reader<'a> {
    pub keys: &'a Keys,
    /// The replay connections.
    pub shards: &'a Shards,
    pub observer: &'a dyn Observer,
    pub lineage: &'a Lineage,
}

impl Reader<'_> {
    /// See [`crate::Broker::read_history`]; `ttl`: the namespace's history
    /// age.
    pub async fn read(
        &self,
        topic: &Topic,
        query: &HistoryQuery,
        ttl: Duration,
    ) -> Result<HistoryPage, BrokerError> {
        let slot = self.keys.slot(topic);
        let meta = self.keys.meta(topic);
        // Lua's numbers are doubles: a `since` past 2^53 (beyond any seq a
        // topic reaches) is read as 2^53, which is beyond the topic all the
        // same; the window's rule judges the `since` asked for.
        let since = query.since.map_or(-1, |s| s.min(LUA_EXACT) as i64);
        let count = bound(query.size.messages).min(u64::from(u32::MAX));
        let mut invocation = HISTORY.prepare_invoke();
        invocation
            .key(&meta)
            .key(self.keys.history(topic))
            .key(self.keys.lineage(slot))
            .arg(new_epoch())
            .arg(millis(ttl.min(META_TTL)).max(1))
            .arg(self.lineage.known(slot))
            .arg(lineage::fresh())
            .arg(since)
            .arg(query.epoch.as_deref().unwrap_or(""))
            .arg(if query.reverse { "1" } else { "0" })
            .arg(count)
            .arg(bound(query.size.bytes))
            .arg(millis(ttl).max(1));
        let reading = self.shards.script(&meta, &HISTORY, &invocation);
        let value: Value = timed(self.observer, "history", reading).await?;
        let read = recovered(self.keys, self.lineage, topic, value)?;
        let oldest_allowed = read.now_ms.saturating_sub(millis(ttl));
        let entries = read.entries.unwrap_or_default();
        let fresh = |(_, at): &(Publication, u64)| *at >= oldest_allowed;
        let kept: Vec<Publication> = if query.reverse {
            // Newest first: the first too old ends what is kept.
            entries
                .into_iter()
                .take_while(fresh)
                .map(|(p, _)| p)
                .collect()
        } else {
            // Forward, too old at the head: left out. After a `since`, the
            // window's rule then finds `since + 1` missing: lost.
            entries
                .into_iter()
                .skip_while(|e| !fresh(e))
                .map(|(p, _)| p)
                .collect()
        };
        Ok(history::window(query, read.position, kept))
    }
}
