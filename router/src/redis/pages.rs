//! A replay's pages of history from Redis ([`scripts::PAGE`]; the first
//! comes with [`scripts::RECOVER`]): bounded reads, on the replay
//! connections, each checked to continue the one before.

use std::time::Duration;

use redis::Value;

use super::call::{timed, unreadable};
use super::lineage::Lineage;
use super::millis;
use super::replies::parse_page;
use super::scripts::{self, Keys};
use super::shards::Shards;
use crate::observe::Observer;
use crate::page::{self, Page, PageSize};
use crate::{BrokerError, Epoch, Publication, Topic};

/// What reads a replay's pages.
pub(super) struct Reader<'a> {
    pub keys: &'a Keys,
    /// The replay connections.
    pub shards: &'a Shards,
    pub observer: &'a dyn Observer,
    pub lineage: &'a Lineage,
}

impl Reader<'_> {
    /// The page of `topic` after `after` in `epoch`, of history kept for
    /// `ttl`: see [`crate::Broker::history`].
    pub async fn next(
        &self,
        topic: &Topic,
        epoch: &Epoch,
        after: u64,
        ttl: Duration,
        size: PageSize,
    ) -> Result<Page, BrokerError> {
        let slot = self.keys.slot(topic);
        let meta = self.keys.meta(topic);
        let mut invocation = scripts::PAGE.prepare_invoke();
        invocation
            .key(&meta)
            .key(self.keys.history(topic))
            .key(self.keys.lineage(slot))
            .arg(&**epoch)
            .arg(after)
            .arg(bound(size.messages))
            .arg(bound(size.bytes))
            .arg(self.lineage.known(slot));
        let reading = self.shards.script(&meta, &scripts::PAGE, &invocation);
        let value: Value = timed(self.observer, "replay", reading).await?;
        let (now_ms, read) = parse_page(topic, epoch, value).ok_or_else(|| unreadable("page"))?;
        let Some((seq, entries)) = read else {
            return Ok(Page::Lost);
        };
        Ok(match page_of(entries, after, seq, now_ms, ttl, size) {
            Some(publications) => Page::Read { publications, seq },
            None => Page::Lost,
        })
    }
}

/// A page's bound as the scripts take it: 0 for none.
pub(super) fn bound(n: usize) -> u64 {
    match u64::try_from(n) {
        Ok(n) if n < i64::MAX as u64 => n,
        _ => 0,
    }
}

/// `entries`, read after `after` from a topic at `seq`, as a page that
/// continues `after` ([`page::continues`]) and is not older than `ttl` (a
/// read checks the age too: history is trimmed by age only now and then);
/// `None` where history no longer continues it.
pub(super) fn page_of(
    entries: Vec<(Publication, u64)>,
    after: u64,
    seq: u64,
    now_ms: u64,
    ttl: Duration,
    size: PageSize,
) -> Option<Vec<Publication>> {
    let oldest_allowed = now_ms.saturating_sub(millis(ttl));
    if entries.first().is_some_and(|(_, at)| *at < oldest_allowed) {
        return None;
    }
    let publications: Vec<Publication> = entries.into_iter().map(|(p, _)| p).collect();
    page::continues(&publications, after, seq, size).then_some(publications)
}
