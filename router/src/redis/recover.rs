//! Reading where a topic stands ([`scripts::RECOVER`]): its seq and epoch,
//! and with a `since` the history after it, for one topic or, after a
//! reconnect, for many in a pipeline per master.

use std::time::Duration;

use redis::Value;

use super::call::{failed, timed, timed_each, unreadable};
use super::lineage::{self, Lineage};
use super::pages::bound;
use super::replies::parse_recovered;
use super::scripts::{self, Keys};
use super::shards::{self, Shards};
use super::{META_TTL, millis, new_epoch, slots};
use crate::observe::Observer;
use crate::page::PageSize;
use crate::{BrokerError, Position, Publication, Recovery, Since, Topic};

/// What [`scripts::RECOVER`] answered.
pub(crate) struct Recovered {
    pub(super) position: Position,
    pub(super) now_ms: u64,
    /// The lineage clock when it was read: what was announced up to here
    /// is covered by `position`.
    pub(super) clock: u64,
    /// With each one's publish time (ms); `None` when the script did not
    /// read history.
    pub(super) entries: Option<Vec<(Publication, u64)>>,
    /// For a `since` of another epoch: the seq the current epoch began
    /// after, `entries` being its history from there.
    pub(super) base: Option<u64>,
}

impl Recovered {
    /// For a `since` of an epoch left behind: the stream starts again where
    /// the current epoch began, with all of it from history, if Redis still
    /// has it all; else at the topic's seq.
    pub(super) fn restart_at_epoch_start(self, ttl: Duration) -> Recovery {
        let position = self.position;
        match (self.base, self.entries) {
            (Some(base), Some(entries))
                if continuous(&entries, base, position.seq, self.now_ms, ttl) =>
            {
                Recovery {
                    position,
                    recovered: false,
                    publications: entries.into_iter().map(|(p, _)| p).collect(),
                    restart: base,
                }
            }
            _ => Recovery::lost(position),
        }
    }
}

/// How far [`scripts::RECOVER`] may trust a `since` (its `ARGV[7]`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Vouch {
    /// As [`Since::vouched`] says.
    AsGiven,
    /// The pod saw a seq at or below `since` issued again in its epoch.
    Reissued,
}

/// One topic's [`scripts::RECOVER`] call.
pub(super) fn recover_invocation(
    keys: &Keys,
    lineage: &Lineage,
    topic: &Topic,
    since: Option<&Since>,
    vouch: Vouch,
    history_ttl: Duration,
    page: PageSize,
) -> redis::ScriptInvocation<'static> {
    let vouched = match (vouch, since) {
        (Vouch::Reissued, _) => "2",
        (Vouch::AsGiven, Some(since)) if since.vouched => "1",
        _ => "0",
    };
    let slot = keys.slot(topic);
    let mut invocation = scripts::RECOVER.prepare_invoke();
    invocation
        .key(keys.meta(topic))
        .key(keys.history(topic))
        .key(keys.lineage(slot))
        .arg(new_epoch())
        .arg(since.map_or(-1, |s| i64::try_from(s.seq).unwrap_or(i64::MAX)))
        .arg(since.and_then(|s| s.epoch.as_deref()).unwrap_or(""))
        .arg(millis(history_ttl.min(META_TTL)).max(1))
        .arg(lineage.known(slot))
        .arg(lineage::fresh())
        .arg(vouched)
        .arg(bound(page.messages))
        .arg(bound(page.bytes));
    invocation
}

/// Runs [`scripts::RECOVER`]: the topic's position, and with `since` the
/// first page of the history after it.
#[allow(clippy::too_many_arguments)]
pub(super) async fn recover_raw(
    keys: &Keys,
    shards: &Shards,
    observer: &dyn Observer,
    lineage: &Lineage,
    topic: &Topic,
    since: Option<&Since>,
    history_ttl: Duration,
    page: PageSize,
) -> Result<Recovered, BrokerError> {
    let invocation = recover_invocation(
        keys,
        lineage,
        topic,
        since,
        Vouch::AsGiven,
        history_ttl,
        page,
    );
    let meta = keys.meta(topic);
    let reading = shards.script(&meta, &scripts::RECOVER, &invocation);
    let value: Value = timed(observer, "recover", reading).await?;
    recovered(keys, lineage, topic, value)
}

/// [`recover_raw`] for many topics at once, in a pipeline per master (the
/// pub/sub task's reads after a reconnect): `(topic, since, vouch, history
/// ttl)` each.
pub(super) async fn read_many(
    keys: &Keys,
    shards: &Shards,
    observer: &dyn Observer,
    lineage: &Lineage,
    reads: &[(Topic, Option<Since>, Vouch, Duration)],
) -> Result<Vec<Recovered>, BrokerError> {
    let calls: Vec<_> = reads
        .iter()
        .map(|(topic, since, vouch, ttl)| {
            // Whole: the pub/sub task delivers what it reads to every
            // subscriber at once, one copy for them all.
            let invocation = recover_invocation(
                keys,
                lineage,
                topic,
                since.as_ref(),
                *vouch,
                *ttl,
                PageSize::UNBOUNDED,
            );
            shards::Call {
                slot: slots::slot(keys.meta(topic).as_bytes()),
                script: &scripts::RECOVER,
                invocation,
            }
        })
        .collect();
    let values = timed_each(observer, "recover", shards.scripts(&calls))
        .await
        .into_iter()
        .map(|reply| match reply {
            Ok(Value::ServerError(e)) => Err(failed("recover", e.into())),
            Ok(value) => Ok(value),
            Err(e) => Err(failed("recover", e)),
        })
        .collect::<Result<Vec<Value>, BrokerError>>()?;
    reads
        .iter()
        .zip(values)
        .map(|((topic, ..), value)| recovered(keys, lineage, topic, value))
        .collect()
}

pub(super) fn recovered(
    keys: &Keys,
    lineage: &Lineage,
    topic: &Topic,
    value: Value,
) -> Result<Recovered, BrokerError> {
    let (recovered, line) = parse_recovered(topic, value).ok_or_else(|| unreadable("recover"))?;
    lineage.saw(keys.slot(topic), &line, recovered.clock);
    Ok(recovered)
}

/// Whether `entries` (read after `since`) continue it without a gap up to
/// `seq`, none older than `ttl`.
pub(super) fn continuous(
    entries: &[(Publication, u64)],
    since: u64,
    seq: u64,
    now_ms: u64,
    ttl: Duration,
) -> bool {
    let oldest_allowed = now_ms.saturating_sub(millis(ttl));
    entries.len() as u64 == seq - since
        && entries
            .first()
            .is_some_and(|(first, at)| first.seq == since + 1 && *at >= oldest_allowed)
        && entries.windows(2).all(|w| w[1].0.seq == w[0].0.seq + 1)
}
