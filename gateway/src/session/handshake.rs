//! The subscribe handshake: hub join, broker watch and recover, replay, live.

use proto::{CommandError, ErrorCode, ServerMessage};
use router::{Since, Topic};

use super::Session;
use super::commands::broker_error;

impl Session {
    /// Subscribes: live delivery first (buffered), then the topic's position
    /// and history, then the buffered messages the history did not cover.
    /// With `since`, the replay waits for its turn first ([`Replays`](super::Replays)), and
    /// streams at the pace the client reads ([`replay`](super::replay)).
    /// Without `id` this restores a resumed subscription: no `ok`, and a
    /// `reset` when history cannot bridge the gap.
    pub(super) async fn subscribe(
        &mut self,
        id: Option<u64>,
        topic: Topic,
        since: Option<Since>,
    ) -> Result<(), CommandError> {
        let node = self.node.clone();
        // Before anything is held aside or read for it.
        let _turn = match since {
            Some(_) => Some(node.replays.turn(&self.out).await.map_err(|refused| {
                CommandError::new(id, ErrorCode::Unavailable, refused.to_string())
                    .about(topic.as_str())
            })?),
            None => None,
        };
        let joined = node.hub.join(
            &topic,
            self.conn,
            self.out.clone(),
            self.subscriptions.clone(),
        );
        let watched = joined
            .watched
            .get_or_try_init(|| node.broker.watch(&topic))
            .await;
        let page = node.replays.page();
        let recovery = match watched {
            Ok(()) => node.broker.recover(&topic, since.clone(), page).await,
            Err(e) => Err(e),
        };
        let recovery = match recovery {
            Ok(recovery) => recovery,
            Err(e) => {
                self.leave(&topic).await;
                return Err(broker_error(id, e).about(topic.as_str()));
            }
        };
        let position = recovery.position.clone();
        if since.is_some() {
            let label = if recovery.recovered { "true" } else { "false" };
            node.metrics.replays.with_label_values(&[label]).inc();
        }
        let start = match &since {
            Some(since) if recovery.recovered => since.seq,
            // A restored subscription not recovered starts at its `reset`,
            // which may be where the topic's new epoch began, all of that
            // epoch following; a client's own `sub` at the topic's seq, as
            // its `ok` says.
            _ if id.is_none() => recovery.restart,
            _ => position.seq,
        };
        let first = if recovery.recovered || id.is_none() {
            recovery.publications
        } else {
            Vec::new()
        };
        // A restored subscription is sent `reset` where continuity was
        // lost, and again where it was told of one before and never acked
        // in its epoch (it may not have read it): a client that had it
        // carries on (a reset at or below what it processed in its epoch).
        let tell = id.is_none() && (!recovery.recovered || self.subscriptions.is_told(&topic));
        // Before going live: a reset among the held frames moves it on.
        if tell {
            self.subscriptions.told(&topic, &position.epoch, start);
        } else {
            self.subscriptions
                .insert(topic.clone(), position.epoch.clone(), start);
        }
        match id {
            Some(id) => {
                if let Err(e) = self.store_subscriptions(id).await {
                    self.subscriptions.remove(&topic);
                    self.leave(&topic).await;
                    return Err(e.about(topic.as_str()));
                }
                self.reply(ServerMessage::Ok {
                    id,
                    topic: Some(topic.as_str()),
                    seq: Some(position.seq),
                    epoch: Some(&position.epoch),
                    recovered: since.as_ref().map(|_| recovery.recovered),
                    expires: None,
                })
                .await;
            }
            None if tell => {
                self.reply(ServerMessage::Reset {
                    topic: topic.as_str(),
                    epoch: &position.epoch,
                    seq: start,
                })
                .await;
            }
            None => {}
        }
        self.replay(&topic, first, start, &position).await;
        Ok(())
    }

    /// Removes this connection from a topic; the last local subscriber
    /// releases the broker's watch.
    pub(super) async fn leave(&self, topic: &Topic) {
        if self.node.hub.leave(topic, self.conn) {
            self.node.broker.unwatch(topic).await;
        }
    }
}
