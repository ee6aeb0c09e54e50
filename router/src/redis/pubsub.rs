//! The pod's one pub/sub connection, and the order of what it delivers.
//!
//! One task owns the connection and, per watched topic, the last seq
//! delivered: a publication arrives in seq order, a seq already delivered is
//! dropped, and a jump is filled from history before delivery (or, where
//! history cannot, the topic's subscribers get `reset`). When the connection
//! drops, for whatever reason (Redis restarted, `CLIENT KILL`, the output
//! buffer limit), the task reconnects with backoff and jitter, subscribes
//! every topic again in batches, and fills what was published meanwhile.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures_util::StreamExt;
use rand::Rng;
use redis::aio::{PubSubSink, PubSubStream};
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;

use super::connection::{Commands, Connector};
use super::{RedisSettings, parse_entries, recover_raw, scripts, timed};
use crate::observe::Observer;
use crate::{BrokerError, Deliver, Epoch, Namespaces, Position, Publication, Since, Topic};

/// Channels per SUBSCRIBE or UNSUBSCRIBE command.
const SUBSCRIBE_BATCH: usize = 500;
const MIN_BACKOFF: Duration = Duration::from_millis(100);
const MAX_BACKOFF: Duration = Duration::from_secs(5);

pub enum Command {
    Watch(Topic, oneshot::Sender<Result<(), BrokerError>>),
    Unwatch(Topic),
}

struct Watched {
    /// Watches not yet unwatched.
    count: usize,
    /// The epoch and seq last delivered.
    last: Option<(Epoch, u64)>,
    /// When `count` fell to 0: unsubscribed once the linger has passed.
    idle_since: Option<Instant>,
}

pub struct Pubsub {
    client: Connector,
    conn: Commands,
    sink: Arc<dyn Deliver>,
    observer: Arc<dyn Observer>,
    namespaces: Arc<Namespaces>,
    settings: RedisSettings,
    topics: HashMap<Topic, Watched>,
}

/// Why the connected loop ended.
enum Ended {
    /// The broker was dropped.
    Shutdown,
    /// The connection failed; reconnect.
    Lost,
}

impl Pubsub {
    pub fn new(
        client: Connector,
        conn: Commands,
        sink: Arc<dyn Deliver>,
        observer: Arc<dyn Observer>,
        namespaces: Arc<Namespaces>,
        settings: RedisSettings,
    ) -> Self {
        Self {
            client,
            conn,
            sink,
            observer,
            namespaces,
            settings,
            topics: HashMap::new(),
        }
    }
}

pub async fn run(mut ps: Pubsub, mut commands: mpsc::UnboundedReceiver<Command>) {
    let mut backoff = MIN_BACKOFF;
    loop {
        let connected = tokio::time::timeout(ps.settings.command_timeout, ps.client.pubsub()).await;
        let (mut subscriber, mut stream) = match connected {
            Ok(Ok(pubsub)) => pubsub.split(),
            failed => {
                let error = match failed {
                    Ok(Err(e)) => e.to_string(),
                    _ => "timed out".to_owned(),
                };
                tracing::warn!(%error, retry_in = ?backoff, "redis pub/sub connection failed");
                // Keep answering watches (they fail fast) while waiting.
                let wait = tokio::time::sleep(jitter(backoff));
                tokio::pin!(wait);
                loop {
                    tokio::select! {
                        _ = &mut wait => break,
                        command = commands.recv() => match command {
                            Some(command) => ps.refuse(command),
                            None => return,
                        },
                    }
                }
                backoff = (backoff * 2).min(MAX_BACKOFF);
                continue;
            }
        };
        match ps.serve(&mut subscriber, &mut stream, &mut commands).await {
            Ended::Shutdown => return,
            Ended::Lost => {
                ps.observer.pubsub_up(false);
                tracing::warn!(
                    topics = ps.topics.len(),
                    "redis pub/sub connection lost; reconnecting"
                );
                backoff = MIN_BACKOFF;
                tokio::time::sleep(jitter(backoff)).await;
            }
        }
    }
}

/// `d` plus up to 50% more, so that pods do not reconnect in lockstep.
fn jitter(d: Duration) -> Duration {
    d + d.mul_f64(rand::thread_rng().gen_range(0.0..0.5))
}

impl Pubsub {
    /// A watch while disconnected fails at once; an unwatch is recorded.
    fn refuse(&mut self, command: Command) {
        match command {
            Command::Watch(_, reply) => {
                let _ = reply.send(Err(BrokerError::Unavailable(
                    "redis pub/sub is reconnecting".into(),
                )));
            }
            Command::Unwatch(topic) => self.release(&topic, true),
        }
    }

    /// One watch fewer; `forget` drops an idle topic at once (there is no
    /// subscription to end).
    fn release(&mut self, topic: &Topic, forget: bool) {
        if let Some(watched) = self.topics.get_mut(topic) {
            watched.count = watched.count.saturating_sub(1);
            if watched.count == 0 {
                if forget {
                    self.topics.remove(topic);
                } else {
                    watched.idle_since = Some(Instant::now());
                }
            }
        }
    }

    async fn serve(
        &mut self,
        subscriber: &mut PubSubSink,
        stream: &mut PubSubStream,
        commands: &mut mpsc::UnboundedReceiver<Command>,
    ) -> Ended {
        // Everything watched before the connection dropped: subscribe again,
        // then fill what was published meanwhile.
        let channels: Vec<String> = std::iter::once(scripts::CONTROL_CHANNEL.to_owned())
            .chain(self.topics.keys().map(scripts::channel))
            .collect();
        if self.subscribe(subscriber, &channels).await.is_err() {
            return Ended::Lost;
        }
        self.observer.pubsub_up(true);
        let topics: Vec<Topic> = self.topics.keys().cloned().collect();
        for topic in topics {
            if self.resync(&topic).await.is_err() {
                return Ended::Lost;
            }
        }
        let mut linger =
            tokio::time::interval(self.settings.linger.max(Duration::from_millis(100)));
        linger.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                command = commands.recv() => {
                    let Some(command) = command else { return Ended::Shutdown };
                    let mut batch = vec![command];
                    while let Ok(more) = commands.try_recv() {
                        batch.push(more);
                    }
                    if self.command(subscriber, batch).await.is_err() {
                        return Ended::Lost;
                    }
                }
                message = stream.next() => {
                    let Some(message) = message else { return Ended::Lost };
                    if self.message(message.get_channel_name(), message.get_payload_bytes()).await.is_err() {
                        return Ended::Lost;
                    }
                }
                _ = linger.tick() => {
                    if self.unsubscribe_idle(subscriber).await.is_err() {
                        return Ended::Lost;
                    }
                }
            }
        }
    }

    async fn subscribe(
        &self,
        subscriber: &mut PubSubSink,
        channels: &[String],
    ) -> redis::RedisResult<()> {
        for chunk in channels.chunks(SUBSCRIBE_BATCH) {
            let start = std::time::Instant::now();
            let result =
                tokio::time::timeout(self.settings.command_timeout, subscriber.subscribe(chunk))
                    .await;
            let result = result.unwrap_or_else(|_| Err(timed_out()));
            self.observer
                .redis_call("subscribe", start.elapsed().as_secs_f64(), result.is_ok());
            result?;
        }
        Ok(())
    }

    /// Handles watches and unwatches that arrived together: new topics are
    /// subscribed in one command, then their positions read.
    async fn command(
        &mut self,
        subscriber: &mut PubSubSink,
        batch: Vec<Command>,
    ) -> Result<(), BrokerError> {
        let mut new = Vec::new();
        let mut replies = Vec::new();
        for command in batch {
            match command {
                Command::Unwatch(topic) => self.release(&topic, false),
                Command::Watch(topic, reply) => {
                    match self.topics.get_mut(&topic) {
                        Some(watched) => {
                            watched.count += 1;
                            watched.idle_since = None;
                        }
                        None => {
                            self.topics.insert(
                                topic.clone(),
                                Watched {
                                    count: 1,
                                    last: None,
                                    idle_since: None,
                                },
                            );
                            new.push(topic);
                        }
                    }
                    replies.push(reply);
                }
            }
        }
        let channels: Vec<String> = new.iter().map(scripts::channel).collect();
        let mut result = self
            .subscribe(subscriber, &channels)
            .await
            .map_err(super::unavailable);
        if result.is_ok() {
            // Subscribed first, position second: whatever is published from
            // here on arrives on the channel with a seq above this one.
            for topic in &new {
                let ttl = self.history_ttl(topic);
                match recover_raw(&self.conn, &*self.observer, topic, None, ttl).await {
                    Ok(recovered) => {
                        if let Some(watched) = self.topics.get_mut(topic) {
                            watched.last = Some((recovered.position.epoch, recovered.position.seq));
                        }
                    }
                    Err(e) => {
                        result = Err(e);
                        break;
                    }
                }
            }
        }
        if result.is_err() {
            for topic in &new {
                self.topics.remove(topic);
            }
        }
        for reply in replies {
            let _ = reply.send(result.clone());
        }
        result
    }

    fn history_ttl(&self, topic: &Topic) -> Duration {
        self.namespaces
            .get(topic)
            .map_or(Duration::ZERO, |ns| ns.history_ttl)
    }

    /// A message on the control channel: `disconnect <user hex>`.
    fn control(&self, payload: &[u8]) {
        let user = std::str::from_utf8(payload)
            .ok()
            .and_then(|text| text.strip_prefix("disconnect "))
            .and_then(super::sessions::unhex);
        match user {
            Some(user) => self.sink.disconnect(&user),
            None => tracing::warn!("unreadable message on the control channel"),
        }
    }

    /// A publication from the channel: `<seq>:<epoch>:<ms>[;<traceparent>]:<data>`.
    async fn message(&mut self, channel: &str, payload: &[u8]) -> Result<(), BrokerError> {
        if channel == scripts::CONTROL_CHANNEL {
            self.control(payload);
            return Ok(());
        }
        let Some(topic) = scripts::topic_of_channel(channel) else {
            return Ok(());
        };
        let Some(Announcement {
            seq,
            epoch,
            at_ms,
            traceparent,
            data,
        }) = parse_payload(payload)
        else {
            tracing::warn!(channel, "unreadable publication on a herald channel");
            return Ok(());
        };
        let lag_ms = now_ms().saturating_sub(at_ms);
        self.observer.pubsub_lag(lag_ms as f64 / 1000.0);
        let Some(watched) = self.topics.get(&topic) else {
            return Ok(());
        };
        let epoch: Epoch = match &watched.last {
            Some((last_epoch, _)) if **last_epoch == *epoch => last_epoch.clone(),
            _ => Arc::from(epoch),
        };
        let publication = Publication {
            topic: topic.clone(),
            epoch: epoch.clone(),
            seq,
            data: Bytes::copy_from_slice(data),
        };
        match watched.last.clone() {
            Some((last_epoch, last)) if last_epoch == epoch => {
                if seq <= last {
                    return Ok(());
                }
                if seq > last + 1 {
                    self.fill(&topic, &epoch, last, seq - 1).await?;
                }
            }
            // The topic's keys were lost and a new series began: no silent
            // continuation into it.
            Some(_) => self.reset(
                &topic,
                Position {
                    epoch: epoch.clone(),
                    seq: seq - 1,
                },
            ),
            None => {}
        }
        self.sink.deliver(&publication, traceparent);
        if let Some(watched) = self.topics.get_mut(&topic) {
            watched.last = Some((epoch, seq));
        }
        Ok(())
    }

    /// Delivers `after+1 ..= upto` from history, or resets the topic where
    /// history does not hold all of it.
    async fn fill(
        &mut self,
        topic: &Topic,
        epoch: &Epoch,
        after: u64,
        upto: u64,
    ) -> Result<(), BrokerError> {
        let mut conn = self.conn.clone();
        let reply: redis::Value = timed(
            &*self.observer,
            "fill",
            redis::cmd("XRANGE")
                .arg(scripts::history_key(topic))
                .arg(format!("{}-0", after + 1))
                .arg(format!("{upto}-0"))
                .query_async(&mut conn),
        )
        .await?;
        let entries = parse_entries(topic, epoch, reply).unwrap_or_default();
        let complete = entries.len() as u64 == upto - after
            && entries
                .iter()
                .zip(after + 1..)
                .all(|((p, _), seq)| p.seq == seq);
        if !complete {
            self.reset(
                topic,
                Position {
                    epoch: epoch.clone(),
                    seq: upto,
                },
            );
            return Ok(());
        }
        self.observer.gap_filled(entries.len() as u64);
        for (publication, _) in &entries {
            self.sink.deliver(publication, None);
        }
        Ok(())
    }

    /// After a reconnect: delivers what the topic got while we were away, or
    /// resets it where history cannot say.
    async fn resync(&mut self, topic: &Topic) -> Result<(), BrokerError> {
        let Some(watched) = self.topics.get(topic) else {
            return Ok(());
        };
        let since = watched.last.as_ref().map(|(epoch, seq)| Since {
            seq: *seq,
            epoch: Some(epoch.to_string()),
        });
        let ttl = self.history_ttl(topic);
        let recovered =
            recover_raw(&self.conn, &*self.observer, topic, since.as_ref(), ttl).await?;
        let position = recovered.position.clone();
        match (&watched.last, recovered.entries) {
            (Some((epoch, last)), _) if *epoch == position.epoch && *last == position.seq => {}
            (Some((epoch, last)), Some(entries))
                if *epoch == position.epoch
                    && super::continuous(&entries, *last, position.seq, recovered.now_ms, ttl) =>
            {
                self.observer.gap_filled(entries.len() as u64);
                for (publication, _) in &entries {
                    self.sink.deliver(publication, None);
                }
            }
            (Some(_), _) => self.reset(topic, position.clone()),
            (None, _) => {}
        }
        if let Some(watched) = self.topics.get_mut(topic) {
            watched.last = Some((position.epoch, position.seq));
        }
        Ok(())
    }

    fn reset(&mut self, topic: &Topic, position: Position) {
        tracing::warn!(%topic, epoch = %position.epoch, seq = position.seq, "topic lost continuity; subscribers reset");
        self.observer.topic_reset();
        self.sink.reset(topic, &position);
        if let Some(watched) = self.topics.get_mut(topic) {
            watched.last = Some((position.epoch, position.seq));
        }
    }

    async fn unsubscribe_idle(&mut self, subscriber: &mut PubSubSink) -> Result<(), BrokerError> {
        let linger = self.settings.linger;
        let now = Instant::now();
        let idle: Vec<Topic> = self
            .topics
            .iter()
            .filter(|(_, w)| {
                w.count == 0
                    && w.idle_since
                        .is_some_and(|t| now.duration_since(t) >= linger)
            })
            .map(|(topic, _)| topic.clone())
            .collect();
        for chunk in idle.chunks(SUBSCRIBE_BATCH) {
            let channels: Vec<String> = chunk.iter().map(scripts::channel).collect();
            let result = tokio::time::timeout(
                self.settings.command_timeout,
                subscriber.unsubscribe(&channels),
            )
            .await;
            result
                .unwrap_or_else(|_| Err(timed_out()))
                .map_err(super::unavailable)?;
            for topic in chunk {
                self.topics.remove(topic);
            }
        }
        Ok(())
    }
}

fn timed_out() -> redis::RedisError {
    redis::RedisError::from(std::io::Error::new(
        std::io::ErrorKind::TimedOut,
        "timed out",
    ))
}

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
    data: &'a [u8],
}

/// Splits `<seq>:<epoch>:<ms>[;<traceparent>]:<data>`.
fn parse_payload(payload: &[u8]) -> Option<Announcement<'_>> {
    let mut parts = payload.splitn(4, |b| *b == b':');
    let seq = std::str::from_utf8(parts.next()?).ok()?.parse().ok()?;
    let epoch = std::str::from_utf8(parts.next()?).ok()?;
    let stamp = std::str::from_utf8(parts.next()?).ok()?;
    let (at, traceparent) = match stamp.split_once(';') {
        Some((at, traceparent)) => (at, Some(traceparent)),
        None => (stamp, None),
    };
    Some(Announcement {
        seq,
        epoch,
        at_ms: at.parse().ok()?,
        traceparent,
        data: parts.next()?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn payloads_split_at_the_first_three_colons() {
        assert_eq!(
            parse_payload(b"42:9f3c:1700000000000:{\"a\":\"b:c\"}"),
            Some(Announcement {
                seq: 42,
                epoch: "9f3c",
                at_ms: 1_700_000_000_000,
                traceparent: None,
                data: &b"{\"a\":\"b:c\"}"[..],
            })
        );
        let tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        let traced = format!("7:9f3c:1700000000000;{tp}:[1]");
        assert_eq!(
            parse_payload(traced.as_bytes()),
            Some(Announcement {
                seq: 7,
                epoch: "9f3c",
                at_ms: 1_700_000_000_000,
                traceparent: Some(tp),
                data: &b"[1]"[..],
            })
        );
        assert_eq!(parse_payload(b"x:9f3c:1:{}"), None);
    }
}
