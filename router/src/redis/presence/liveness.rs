//! Pod liveness, and the cleanup of a dead pod's presence.
//!
//! Every `pod_ttl / 5` each pod ([`beat`]) refreshes its instance's expiry
//! in `<prefix>:presence:pods` (Redis's clock: `now + pod_ttl`), writes
//! again what Redis may not hold of its parts, and removes the presence of
//! instances whose expiry passed: under a lock (`SET NX PX pod_ttl`), topic
//! by topic from the instance's topic set, each removal a change with the
//! instance's leaves ([`super::scripts::WRITE`] with an empty part), then
//! the instance itself, even if it beat again meanwhile (so that it finds
//! itself gone and writes its presence again). When occupancy is tracked,
//! the instance's subscriptions go too ([`Occupancy::clean`]), the cleaner
//! telling of the `vacated`s. Each step is idempotent: a cleaner killed midway
//! leaves the lock to expire, and the next pod to find the instance expired
//! finishes.
//!
//! # The bound
//! A pod killed without a goodbye last refreshed its expiry at most
//! `pod_ttl / 5` before it died; the expiry passes `pod_ttl` after that
//! refresh; a live pod's next beat finds it within `pod_ttl / 5` and removes
//! its members (a round trip per topic). So its members are listed at most
//! `pod_ttl + pod_ttl / 5` after its last refresh, plus the cleanup's round
//! trips: with the default `pod_ttl` of 10 s, within 12 s plus cleanup,
//! documented as 15 s. A cleaner killed midway adds up to `pod_ttl` (its
//! lock's life) to the topics it had not cleared.

use std::sync::Weak;
use std::time::Duration;

use redis::Value;

use super::encoding::decode_field;
use super::scripts::{BEAT, WRITE};
use super::{Context, Presence};
use crate::redis::call::{timed, unreadable};
use crate::redis::millis;
use crate::redis::occupancy::Occupancy;
use crate::{BrokerError, Causes, Topic};

/// How often a pod beats: a fifth of `pod_ttl`, at least every 10 ms.
pub fn period(pod_ttl: Duration) -> Duration {
    (pod_ttl / 5).max(Duration::from_millis(10))
}

/// Beats until the engine is dropped.
pub async fn run(presence: Weak<Presence>, period: Duration) {
    let mut tick = tokio::time::interval(period);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut beaten = false;
    loop {
        tick.tick().await;
        let Some(presence) = presence.upgrade() else {
            return;
        };
        if presence.stopped() {
            return;
        }
        match beat(&presence, beaten).await {
            Ok(()) => beaten = true,
            Err(e) => {
                tracing::warn!(error = %Causes(&e), "presence: this pod's liveness beat failed");
            }
        }
    }
}

/// One beat: refresh, write again, clean the dead.
async fn beat(presence: &Presence, beaten: bool) -> Result<(), BrokerError> {
    let context = &*presence.context;
    presence.replicas.expire_kept(context.settings.pod_ttl);
    let pods = context.keys.pods();
    let mut invocation = BEAT.prepare_invoke();
    invocation
        .key(&pods)
        .arg(&*context.instance)
        .arg(millis(context.settings.pod_ttl).max(1));
    let beating = context.shards.script::<Value>(&pods, &BEAT, &invocation);
    let reply = timed(&*context.observer, "presence_beat", beating).await?;
    let (added, expired) = parse_beat(reply).ok_or_else(|| unreadable("presence beat"))?;
    if added && beaten {
        tracing::warn!(
            instance = %context.instance,
            "presence: this pod's liveness was gone from redis (redis lost it, or this pod was taken for dead): writing its presence again"
        );
    }
    presence.writer.rewrite(added && beaten).await;
    if added
        && beaten
        && let Some(occupancy) = &presence.occupancy
    {
        occupancy.rewrite();
    }
    for dead in expired {
        if dead == *context.instance {
            continue;
        }
        if let Err(e) = clean(context, presence.occupancy.as_deref(), &dead).await {
            tracing::warn!(instance = %dead, error = %Causes(&e), "presence: removing a dead pod's members failed; another beat tries again");
        }
    }
    Ok(())
}

/// Sets this instance's liveness `ttl` ahead, once: a departing pod's last
/// beat ([`Presence::depart`]).
pub async fn extend(context: &Context, ttl: Duration) -> Result<(), BrokerError> {
    let pods = context.keys.pods();
    let mut invocation = BEAT.prepare_invoke();
    invocation
        .key(&pods)
        .arg(&*context.instance)
        .arg(millis(ttl).max(1));
    let beating = context.shards.script::<Value>(&pods, &BEAT, &invocation);
    timed(&*context.observer, "presence_beat", beating).await?;
    Ok(())
}

/// [`BEAT`]'s reply: whether the instance was added, and the expired ones.
fn parse_beat(value: Value) -> Option<(bool, Vec<String>)> {
    let Value::Array(items) = value else {
        return None;
    };
    let mut items = items.into_iter();
    let added = matches!(items.next()?, Value::Int(1));
    let Value::Array(expired) = items.next()? else {
        return None;
    };
    let expired = expired
        .into_iter()
        .filter_map(|v| match v {
            Value::BulkString(b) => String::from_utf8(b).ok(),
            _ => None,
        })
        .collect();
    Some((added, expired))
}

/// Removes a dead instance's presence, topic by topic, under the cleanup
/// lock, and its occupancy (each `vacated` it causes told by this pod);
/// nothing when another pod holds the lock.
async fn clean(
    context: &Context,
    occupancy: Option<&Occupancy>,
    dead: &str,
) -> Result<(), BrokerError> {
    let observer = &*context.observer;
    let lock = context.keys.cleaning(dead);
    let take = redis::cmd("SET")
        .arg(&lock)
        .arg(&*context.instance)
        .arg("NX")
        .arg("PX")
        .arg(millis(context.settings.pod_ttl).max(1))
        .clone();
    let taken = timed(
        observer,
        "presence_clean",
        context.shards.command::<Value>(&lock, &take),
    )
    .await?;
    if matches!(taken, Value::Nil) {
        return Ok(());
    }
    let listing = context.keys.topics_of(dead);
    let list = redis::cmd("SMEMBERS").arg(&listing).clone();
    let topics = match timed(
        observer,
        "presence_clean",
        context.shards.command::<Value>(&listing, &list),
    )
    .await?
    {
        Value::Array(topics) => topics,
        Value::Set(topics) => topics,
        _ => return Err(unreadable("presence topic set")),
    };
    let mut cleared = 0usize;
    for topic in topics {
        let Value::BulkString(name) = topic else {
            continue;
        };
        let text = String::from_utf8_lossy(&name).into_owned();
        if let Ok(topic) = Topic::parse(&text) {
            let members = clear(context, &topic, dead).await?;
            observer.presence_cleaned(members);
            cleared += 1;
        }
        let remove = redis::cmd("SREM").arg(&listing).arg(&name).clone();
        timed(
            observer,
            "presence_clean",
            context.shards.command::<Value>(&listing, &remove),
        )
        .await?;
    }
    if let Some(occupancy) = occupancy {
        let topics = occupancy.clean(dead).await?;
        tracing::info!(instance = %dead, topics, "occupancy: removed a dead pod's subscriptions");
    }
    // Forgotten even if it beat again meanwhile (it was only slow, or cut
    // off from Redis for longer than `pod_ttl`): its members were just
    // cleared, and only finding itself gone tells it to write them again
    // (its next beat adds it back, `added`). Kept because it came back, it
    // would hold members nobody lists, for good.
    let pods = context.keys.pods();
    let forget = redis::cmd("ZREM").arg(&pods).arg(dead).clone();
    timed(
        observer,
        "presence_clean",
        context.shards.command::<Value>(&pods, &forget),
    )
    .await?;
    let unlock = redis::cmd("DEL").arg(&lock).clone();
    timed(
        observer,
        "presence_clean",
        context.shards.command::<Value>(&lock, &unlock),
    )
    .await?;
    observer.presence_pod_cleaned();
    tracing::info!(instance = %dead, topics = cleared, "presence: removed a dead pod's members");
    Ok(())
}

/// Clears `dead`'s field of a topic (a change with its leaves); how many
/// users the field held.
async fn clear(context: &Context, topic: &Topic, dead: &str) -> Result<u64, BrokerError> {
    let observer = &*context.observer;
    let hash = context.keys.hash(topic);
    let get = redis::cmd("HGET").arg(&hash).arg(dead).clone();
    let members = match timed(
        observer,
        "presence_clean",
        context.shards.command::<Value>(&hash, &get),
    )
    .await?
    {
        Value::BulkString(field) => {
            decode_field(&field.into()).map_or(0, |(_, part)| part.len() as u64)
        }
        _ => 0,
    };
    let mut invocation = WRITE.prepare_invoke();
    invocation
        .key(&hash)
        .key(context.keys.position(topic))
        .arg(dead)
        .arg("")
        .arg("")
        .arg("")
        .arg(context.channels.channel(topic))
        .arg(context.publish)
        .arg(super::writer::IDLE_POSITION_MS);
    timed(
        observer,
        "presence_clean",
        context.shards.script::<Value>(&hash, &WRITE, &invocation),
    )
    .await?;
    // The dead instance's users: leaves where it was their last, told by
    // this pod.
    super::members::count(context, topic, dead, None).await?;
    Ok(members)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn beats_parse() {
        let reply = Value::Array(vec![
            Value::Int(1),
            Value::Array(vec![Value::BulkString(b"pod-a-01".to_vec())]),
        ]);
        assert_eq!(parse_beat(reply), Some((true, vec!["pod-a-01".to_owned()])));
        assert_eq!(parse_beat(Value::Int(0)), None);
        assert_eq!(period(Duration::from_secs(10)), Duration::from_secs(2));
    }
}
