//! The client's commands: each decoded, rate-limited, checked against the
//! client's grants and budgets, and answered (`ok` or `err`).

use bytes::Bytes;
use prost::Message;
use proto::binary::undecodable;
use proto::{Command, CommandError, ErrorCode, ServerMessage, v1};
use router::{BrokerError, Causes, Since, Topic};

use super::Session;
use super::access::Access;
use super::handshake::Origin;
use crate::budget::{Limit, Principal};
use crate::disconnect::CloseReason;
use crate::frame;
use crate::history;
use crate::hooks::{PublishReply, SubscribeReply};
use crate::outbound::Mark;
use crate::presence::PresenceError;

impl Session {
    /// A command from the client's socket, in the subprotocol the
    /// connection speaks.
    pub(super) async fn command(&mut self, message: Bytes) {
        if self.out.format().is_protobuf() {
            self.command_proto(message).await;
        } else {
            self.command_json(message).await;
        }
    }

    /// A JSON command: a text frame's, or one posted over HTTP (JSON
    /// whatever the connection speaks).
    pub(super) async fn command_json(&mut self, text: Bytes) {
        let Ok(json) = std::str::from_utf8(&text) else {
            // The reader only yields valid UTF-8.
            self.out.close(CloseReason::InvalidUtf8, false);
            return;
        };
        self.dispatch(Command::decode(json), &text).await;
    }

    /// A `herald.v1.protobuf` session's binary frame: one `ClientCommand`,
    /// from then on the same command as JSON's. Bytes that do not decode
    /// are `malformed`, counted as a JSON frame that does not parse.
    async fn command_proto(&mut self, frame: Bytes) {
        let decoded = v1::ClientCommand::decode(&*frame).map_err(|e| undecodable(&e));
        let command = match &decoded {
            Ok(decoded) => Command::from_proto(decoded),
            Err(e) => Err(e.clone()),
        };
        self.dispatch(command, &frame).await;
    }

    /// Rate-limits, runs and answers a decoded command; `frame` is what it
    /// was read from.
    async fn dispatch(&mut self, command: Result<Command<'_>, CommandError>, frame: &Bytes) {
        // Acks are cumulative, cost no broker work and get no reply: they are
        // not counted. A `ping` is cheap too, but it is answered: counted, so
        // that a flood of them is refused like any other.
        let counted = !matches!(command, Ok(Command::Ack { .. }));
        // Boxed, here and below: a connection's read loop is as large as the
        // largest future it awaits, for as long as it lives, and an idle
        // connection's task is mostly that (issue #16). Only an ack, the one
        // command that comes with the messages, is handled inline.
        if counted && !self.commands.take() {
            Box::pin(self.rate_limited(command.as_ref().ok())).await;
            return;
        }
        self.limited_in_a_row = 0;
        let result = match command {
            Err(e) => Err(e),
            Ok(Command::Ack { topic, seq, epoch }) if self.id.is_some() => {
                self.ack(&topic, seq, epoch.as_deref())
            }
            Ok(Command::Hello {
                token,
                resume,
                data,
            }) if self.id.is_none() => {
                Box::pin(self.hello(token.as_deref(), resume.as_deref(), data)).await;
                self.settle_account();
                Ok(())
            }
            Ok(Command::Hello { .. }) => Err(CommandError::new(
                None,
                ErrorCode::Malformed,
                "hello must be the first command",
            )),
            Ok(command) => {
                if self.id.is_none() {
                    // Implied: an anonymous `hello`.
                    Box::pin(self.hello(None, None, None)).await;
                    if self.id.is_none() {
                        return;
                    }
                    self.settle_account();
                }
                Box::pin(self.act(command, frame)).await
            }
        };
        match result {
            Ok(()) => self.bad_in_a_row = 0,
            Err(e) => Box::pin(self.reject(e)).await,
        }
    }

    /// Over the command rate: an `err`, and the close when it goes on.
    pub(super) async fn rate_limited(&mut self, command: Option<&Command<'_>>) {
        self.node.metrics.rate_limited.inc();
        let id = match command {
            Some(
                Command::Sub { id, .. }
                | Command::Unsub { id, .. }
                | Command::Pub { id, .. }
                | Command::Refresh { id, .. }
                | Command::Ping { id }
                | Command::History { id, .. }
                | Command::Presence { id, .. }
                | Command::Rpc { id, .. },
            ) => Some(*id),
            _ => None,
        };
        let ws = &self.node.config.websocket;
        self.reply(ServerMessage::Err {
            id,
            code: ErrorCode::RateLimited.as_str(),
            message: &format!(
                "at most {} commands per second (bursts of {})",
                ws.commands_per_second, ws.commands_burst
            ),
            topic: None,
        })
        .await;
        self.limited_in_a_row += 1;
        if self.limited_in_a_row >= ws.max_bad_commands {
            tracing::info!(conn = self.conn, "closed for commands over the rate limit");
            self.out.close(CloseReason::RateLimited, true);
        }
    }

    pub(super) async fn act(
        &mut self,
        command: Command<'_>,
        text: &Bytes,
    ) -> Result<(), CommandError> {
        match command {
            Command::Hello { .. } => Ok(()),
            Command::Ping { id } => {
                self.ok(id, None).await;
                Ok(())
            }
            Command::Refresh { id, token } => {
                let refreshed = Box::pin(self.refresh(id, &token)).await;
                // Topics the new token no longer grants were left.
                self.settle_account();
                refreshed
            }
            Command::Sub {
                id,
                topic,
                since,
                epoch,
                data,
                delta,
            } => {
                let topic = self.topic(Some(id), &topic)?;
                let proxied = self.asks_backend(&topic, Access::Subscribe);
                if proxied {
                    self.may_ask(id, &topic, Access::Subscribe)?;
                } else {
                    self.may(Some(id), &topic, Access::Subscribe)?;
                }
                if self.subscriptions.contains(&topic) {
                    return Err(CommandError::new(
                        Some(id),
                        ErrorCode::AlreadySubscribed,
                        format!("already subscribed to `{topic}`"),
                    )
                    .about(topic.as_str()));
                }
                if self.subscriptions.count() >= self.node.config.session.max_subscriptions {
                    return Err(CommandError::new(
                        Some(id),
                        ErrorCode::TooManySubscriptions,
                        format!(
                            "at most {} subscriptions per connection",
                            self.node.config.session.max_subscriptions
                        ),
                    )
                    .about(topic.as_str()));
                }
                self.draw(id, &topic, Access::Subscribe)?;
                let since = since.map(|seq| Since::claimed(seq, epoch.map(|e| e.into_owned())));
                // Charged before the backend is asked; given back below if
                // it does not approve.
                let approved = if proxied {
                    Box::pin(self.approve_subscribe(id, &topic, data)).await
                } else {
                    Ok(Some(SubscribeReply::default()))
                };
                let origin = Origin::Command(id);
                let subscribed = match approved {
                    Ok(Some(approved)) => self
                        .subscribe_approved(origin, topic.clone(), since, approved, delta)
                        .await
                        .map_err(|e| e.to_command(origin, &topic)),
                    // The backend did not answer: told so already.
                    Ok(None) => Ok(()),
                    Err(e) => Err(e),
                };
                if !self.subscriptions.contains(&topic)
                    && let Some(account) = self.account.as_mut()
                {
                    account.unsubscribed(&topic);
                }
                subscribed
            }
            Command::Unsub { id, topic } => {
                let topic = self.topic(Some(id), &topic)?;
                if !self.subscriptions.remove(&topic) {
                    return Err(not_subscribed(Some(id), &topic));
                }
                if let Some(account) = self.account.as_mut() {
                    account.unsubscribed(&topic);
                }
                self.leave(&topic).await;
                self.ok(id, Some(&topic)).await;
                Ok(())
            }
            Command::Pub { id, topic, data } => {
                let topic = self.topic(Some(id), &topic)?;
                let proxied = self.asks_backend(&topic, Access::Publish);
                if proxied {
                    self.may_ask(id, &topic, Access::Publish)?;
                } else {
                    self.may(Some(id), &topic, Access::Publish)?;
                }
                self.draw(id, &topic, Access::Publish)?;
                let mut payload = shared(text, data.get().as_bytes());
                if proxied {
                    match Box::pin(self.approve_publish(id, &topic, data)).await? {
                        Some(PublishReply::AsIs) => {}
                        Some(PublishReply::Replace(data)) => {
                            payload = Bytes::from(String::from(Box::<str>::from(data)));
                        }
                        Some(PublishReply::Skip) => {
                            // Accepted, not published: no position.
                            self.ok(id, Some(&topic)).await;
                            return Ok(());
                        }
                        // The backend did not answer: told so already.
                        None => return Ok(()),
                    }
                }
                let data = payload;
                let told = self.node.webhooks.keep_data(&data);
                let position = self
                    .node
                    .broker
                    .publish(&topic, data, None, None)
                    .await
                    .map_err(|e| broker_error(Some(id), &e).about(topic.as_str()))?;
                self.node.metrics.published.inc();
                let user = self.claims.as_ref().map(|c| &c.user);
                self.node.webhooks.published(&topic, user, &position, told);
                self.reply(ServerMessage::Ok {
                    id,
                    topic: Some(topic.as_str()),
                    seq: Some(position.seq),
                    epoch: Some(&position.epoch),
                    recovered: None,
                    expires: None,
                    data: None,
                    delta: None,
                })
                .await;
                Ok(())
            }
            Command::Ack { topic, seq, epoch } => self.ack(&topic, seq, epoch.as_deref()),
            Command::Rpc { id, method, data } => Box::pin(self.rpc(id, &method, data)).await,
            Command::History {
                id,
                topic,
                since,
                epoch,
                limit,
                reverse,
            } => {
                let query = history::Query {
                    since,
                    epoch: epoch.map(|e| e.into_owned()),
                    limit,
                    reverse,
                };
                self.history(id, &topic, query).await
            }

            Command::Presence {
                id,
                topic,
                cursor,
                limit,
            } => {
                let topic = self.topic(Some(id), &topic)?;
                // Whoever may subscribe may look; no subscription needed.
                self.may_read(id, &topic)?;
                let page = self
                    .node
                    .presence
                    .page(&topic, cursor.as_deref(), limit)
                    .await
                    .map_err(|e| presence_error(id, &topic, &e))?;
                let members = page.json_members();
                self.reply(ServerMessage::PresencePage {
                    id,
                    page: proto::json::PresencePage {
                        topic: topic.as_str(),
                        position: page.counts.position,
                        users: page.counts.users,
                        connections: page.counts.connections,
                        members: &members,
                        cursor: page.cursor.as_deref(),
                    },
                })
                .await;
                Ok(())
            }
        }
    }

    /// A page of a topic's history, where the client may subscribe to it.
    /// A `since` out of the window (`history_lost`) and a broker that
    /// cannot read are told, not held against the client as bad commands.
    async fn history(
        &mut self,
        id: u64,
        topic: &str,
        query: history::Query,
    ) -> Result<(), CommandError> {
        let node = self.node.clone();
        let checked = self
            .topic(Some(id), topic)
            .and_then(|topic| self.may_read(id, &topic).map(|_| topic))
            // A read touches the topic's keys (a topic not seen before gets
            // its position made), as a publish does: it counts against the
            // topics the client may touch in a minute.
            .and_then(|topic| self.draw(id, &topic, Access::Publish).map(|_| topic));
        let topic = checked.inspect_err(|_| history::refused(&node.metrics))?;
        let read = history::read(&*node.broker, &node.config, &node.metrics, &topic, query).await;
        let page = match read {
            Ok(page) => page,
            Err(e) => return self.history_refused(id, &topic, e).await,
        };
        let items = match page.items() {
            Ok(items) => items,
            Err(e) => return self.history_refused(id, &topic, e).await,
        };
        self.reply(ServerMessage::History {
            id,
            topic: topic.as_str(),
            epoch: &page.position.epoch,
            seq: page.position.seq,
            publications: &items,
        })
        .await;
        Ok(())
    }

    /// A history read not answered: a `limit` over the maximum is the
    /// client's bad command; the rest it is told of.
    async fn history_refused(
        &self,
        id: u64,
        topic: &Topic,
        e: history::HistoryError,
    ) -> Result<(), CommandError> {
        let refused = CommandError::new(Some(id), e.code(), e.to_string()).about(topic.as_str());
        if matches!(e, history::HistoryError::Limit(_)) {
            return Err(refused);
        }
        self.tell(refused).await;
        Ok(())
    }

    /// Opens the connection's account once `hello` said who the client is
    /// (its user, or else its address), and charges it with the
    /// subscriptions as a resume or a `refresh` left them. Nothing for a
    /// client `hello` refused: it spends nothing of the pod's.
    pub(super) fn settle_account(&mut self) {
        if self.id.is_none() {
            return;
        }
        let account = self.account.get_or_insert_with(|| {
            let principal = match &self.claims {
                Some(claims) => Principal::User(claims.user.clone()),
                None => Principal::Address(self.address),
            };
            Box::new(self.node.budgets.open(principal))
        });
        account.settle(&self.subscriptions.topics());
    }

    /// Draws a `sub` or a `pub` of `topic` on the budgets of the client's
    /// user or address.
    pub(super) fn draw(
        &mut self,
        id: u64,
        topic: &Topic,
        access: Access,
    ) -> Result<(), CommandError> {
        let Some(account) = self.account.as_mut() else {
            return Ok(());
        };
        let drawn = match access {
            Access::Subscribe => account.subscribe(topic),
            Access::Publish => account.publish(topic),
        };
        drawn.map_err(|limit: Limit| {
            let message = limit.message(&self.node.config.session);
            CommandError::new(Some(id), limit.code(), message).about(topic.as_str())
        })
    }

    /// Records how far the client acked `topic`.
    pub(super) fn ack(
        &self,
        topic: &str,
        seq: u64,
        epoch: Option<&str>,
    ) -> Result<(), CommandError> {
        let topic = self.topic(None, topic)?;
        if let Some(head) = self.never_sent(&topic, seq) {
            return Err(CommandError::new(
                None,
                ErrorCode::Malformed,
                format!("ack of seq {seq} of `{topic}`, which is newer than any sent ({head})"),
            )
            .about(topic.as_str()));
        }
        if !self.subscriptions.ack(&topic, seq, epoch) {
            return Err(not_subscribed(None, &topic));
        }
        Ok(())
    }

    /// Parses a topic and checks that its namespace exists.
    pub(super) fn topic(&self, id: Option<u64>, name: &str) -> Result<Topic, CommandError> {
        let topic = Topic::parse(name)
            .map_err(|e| CommandError::new(id, ErrorCode::BadTopic, e.to_string()).about(name))?;
        if self.node.namespaces.get(&topic).is_none() {
            return Err(CommandError::new(
                id,
                ErrorCode::UnknownNamespace,
                format!("namespace `{}` is not configured", topic.namespace()),
            )
            .about(topic.as_str()));
        }
        Ok(topic)
    }

    /// Whether this client may subscribe or publish to `topic`, as its
    /// namespace says.
    pub(super) fn may(
        &self,
        id: Option<u64>,
        topic: &Topic,
        access: Access,
    ) -> Result<(), CommandError> {
        let Some(ns) = self.node.namespaces.get(topic) else {
            return Err(CommandError::new(
                id,
                ErrorCode::UnknownNamespace,
                format!("namespace `{}` is not configured", topic.namespace()),
            )
            .about(topic.as_str()));
        };
        // Open mode: no key, and no connect proxy to say who anyone is.
        let open = self.node.verifier.is_none() && !self.node.hooks.connects();
        if access.allows(ns, topic, self.claims.as_deref(), open) {
            return Ok(());
        }
        self.node.metrics.auth_failed("forbidden");
        Err(CommandError::new(
            id,
            ErrorCode::Forbidden,
            format!("you may not {} `{topic}`", access.verb()),
        )
        .about(topic.as_str()))
    }

    /// An `ok` with the command's `id` (and `topic`), nothing else.
    async fn ok(&self, id: u64, topic: Option<&Topic>) {
        self.reply(ServerMessage::Ok {
            id,
            topic: topic.map(Topic::as_str),
            seq: None,
            epoch: None,
            recovered: None,
            expires: None,
            data: None,
            delta: None,
        })
        .await;
    }

    pub(super) async fn reply(&self, message: ServerMessage<'_>) {
        // A `reset` moves its topic (an SSE stream's event ids).
        let mark = match &message {
            ServerMessage::Reset { topic, epoch, seq } => Some(Mark {
                topic,
                epoch,
                seq: *seq,
            }),
            _ => None,
        };
        self.out
            .send_marked(frame::message(self.out.format(), &message), mark)
            .await;
    }

    /// An `err` the client's own command did not cause (a subscription it
    /// lost): not counted against it.
    pub(super) async fn tell(&self, e: CommandError) {
        self.reply(ServerMessage::Err {
            id: e.id,
            code: e.wire_code(),
            message: &e.message,
            topic: e.topic.as_deref(),
        })
        .await;
    }

    pub(super) async fn reject(&mut self, e: CommandError) {
        self.node.metrics.bad_commands.inc();
        tracing::debug!(conn = self.conn, code = %e.code, message = %e.message, "command rejected");
        self.tell(e).await;
        self.bad_in_a_row += 1;
        if self.bad_in_a_row >= self.node.config.websocket.max_bad_commands {
            self.out.close(CloseReason::BadCommands, true);
        }
    }
}

/// `data` as a publication's: without a copy where it points into `frame`
/// (a JSON command's); a copy where it does not (a protobuf command's,
/// decoded out of its frame).
fn shared(frame: &Bytes, data: &[u8]) -> Bytes {
    let within = frame.as_ptr_range();
    let ends = data.as_ptr_range();
    if within.start <= ends.start && ends.end <= within.end {
        frame.slice_ref(data)
    } else {
        Bytes::copy_from_slice(data)
    }
}

pub(super) fn not_subscribed(id: Option<u64>, topic: &Topic) -> CommandError {
    CommandError::new(
        id,
        ErrorCode::NotSubscribed,
        format!("not subscribed to `{topic}`"),
    )
    .about(topic.as_str())
}

/// The `err` a `presence` query gets.
fn presence_error(id: u64, topic: &Topic, e: &PresenceError) -> CommandError {
    let error = match e {
        PresenceError::Disabled(_) => {
            CommandError::new(Some(id), ErrorCode::Disabled, e.to_string())
        }
        PresenceError::Malformed(_) => {
            CommandError::new(Some(id), ErrorCode::Malformed, e.to_string())
        }
        PresenceError::Broker(e) => broker_error(Some(id), e),
    };
    error.about(topic.as_str())
}

pub(super) fn broker_error(id: Option<u64>, e: &BrokerError) -> CommandError {
    let code = match e {
        BrokerError::UnknownNamespace(_) => ErrorCode::UnknownNamespace,
        BrokerError::Unavailable(_) => ErrorCode::Unavailable,
    };
    // With its causes, as the message said when it was one string.
    CommandError::new(id, code, Causes(e).to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pubs_data_is_shared_with_its_frame_only_where_it_points_into_it() {
        let frame = Bytes::from_static(br#"{"op":"pub","id":1,"topic":"a","data":[1,2]}"#);
        let at = frame
            .windows(5)
            .position(|w| w == b"[1,2]")
            .unwrap_or_else(|| panic!("data in the frame"));
        let inside = &frame[at..at + 5];
        let shared_data = shared(&frame, inside);
        assert_eq!(
            (&shared_data[..], shared_data.as_ptr()),
            (&b"[1,2]"[..], inside.as_ptr())
        );
        // A protobuf command's data lives in the decoded message: copied.
        let decoded = b"[1,2]".to_vec();
        let copied = shared(&frame, &decoded);
        assert_eq!(&copied[..], b"[1,2]");
        assert_ne!(copied.as_ptr(), decoded.as_ptr());
    }
}
