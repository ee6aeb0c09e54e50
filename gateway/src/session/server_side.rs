//! Server-side subscriptions as a connection applies them: a backend's
//! subscribe or unsubscribe of the connection's user (handed over by the
//! [`Registry`](super::Registry), run by the connection's loop between the
//! client's own commands), and the token's `topics` at a fresh `hello`.
//!
//! They go through the same handshake as a client's `sub`
//! ([`Origin::Server`], [`Origin::Token`]) and the same limits; the
//! session keeps them as the server's, so that a resume restores them
//! without the token's grants.

use proto::{CommandError, ErrorCode, ServerMessage};
use router::{ServerSubscription, Since, Topic};

use super::Session;
use super::handshake::Origin;
use crate::auth::Claims;

impl Session {
    /// Runs the server-side commands waiting for the connection, in the
    /// order they came.
    pub(super) async fn server_commands(&mut self) {
        while let Some(command) = self.subscriptions.next_command() {
            if self.out.is_closing() {
                return;
            }
            let (name, outcome) = match command {
                ServerSubscription::Subscribe { topic, since } => (
                    "subscribe",
                    Box::pin(self.server_subscribe(Origin::Server, topic, since)).await,
                ),
                ServerSubscription::Unsubscribe { topic } => {
                    ("unsubscribe", self.server_unsubscribe(&topic).await)
                }
            };
            self.node
                .metrics
                .server_subscriptions_applied
                .with_label_values(&[name, outcome])
                .inc();
        }
    }

    /// Subscribes the connection as the server asks: nothing when it is
    /// subscribed already; an `err` without `id` (with the topic) when a
    /// limit refuses it or the handshake fails. Its outcome, as counted.
    async fn server_subscribe(
        &mut self,
        origin: Origin,
        topic: Topic,
        since: Option<Since>,
    ) -> &'static str {
        if self.subscriptions.contains(&topic) {
            return "unchanged";
        }
        let max = self.node.config.session.max_subscriptions;
        if self.subscriptions.count() >= max {
            let message = format!("at most {max} subscriptions per connection");
            let e = CommandError::new(None, ErrorCode::TooManySubscriptions, message);
            self.tell(e.about(topic.as_str())).await;
            return "refused";
        }
        if let Some(account) = self.account.as_mut()
            && let Err(limit) = account.subscribe(&topic)
        {
            let message = limit.message(&self.node.config.session);
            let e = CommandError::new(None, limit.code(), message);
            self.tell(e.about(topic.as_str())).await;
            return "refused";
        }
        let subscribed = self.subscribe(origin, topic.clone(), since).await;
        if !self.subscriptions.contains(&topic)
            && let Some(account) = self.account.as_mut()
        {
            account.unsubscribed(&topic);
        }
        match subscribed {
            Ok(()) => "done",
            Err(e) => {
                tracing::debug!(conn = self.conn, error = %e, "a server-side subscription failed");
                self.tell(e.to_command(origin, &topic)).await;
                "failed"
            }
        }
    }

    /// Unsubscribes the connection as the server asks, telling the client
    /// (`unsubscribed`); nothing when it is not subscribed.
    async fn server_unsubscribe(&mut self, topic: &Topic) -> &'static str {
        if !self.subscriptions.remove(topic) {
            return "unchanged";
        }
        if let Some(account) = self.account.as_mut() {
            account.unsubscribed(topic);
        }
        self.leave(topic).await;
        self.reply(ServerMessage::Unsubscribed {
            topic: topic.as_str(),
            reason: "server",
        })
        .await;
        "done"
    }

    /// Subscribes a fresh session to its token's `topics` (checked at
    /// `hello` by [`Self::token_topics`]), each answered `ok` with
    /// `reason: "token"`.
    pub(super) async fn subscribe_token_topics(&mut self, topics: Vec<Topic>) {
        for topic in topics {
            if self.out.is_closing() {
                return;
            }
            Box::pin(self.server_subscribe(Origin::Token, topic, None)).await;
        }
    }

    /// The token's `topics`, each a valid topic of a configured namespace,
    /// at most `session.max_subscriptions` of them; else why the token is
    /// refused, naming the topic.
    pub(super) fn token_topics(&self, claims: Option<&Claims>) -> Result<Vec<Topic>, String> {
        let Some(claims) = claims else {
            return Ok(Vec::new());
        };
        let max = self.node.config.session.max_subscriptions;
        if claims.topics.len() > max {
            return Err(format!(
                "token claims are invalid: `topics` holds more than {max} topics"
            ));
        }
        let mut topics: Vec<Topic> = Vec::with_capacity(claims.topics.len());
        for name in claims.topics.iter() {
            let topic = Topic::parse(name).map_err(|e| {
                format!("token claims are invalid: `topics`: `{name}` is not a topic: {e}")
            })?;
            if self.node.namespaces.get(&topic).is_none() {
                return Err(format!(
                    "token claims are invalid: `topics`: the namespace of `{name}` is not configured"
                ));
            }
            if !topics.contains(&topic) {
                topics.push(topic);
            }
        }
        Ok(topics)
    }
}
