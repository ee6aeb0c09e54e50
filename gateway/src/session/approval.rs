//! The subscribe and publish proxies: in a namespace with
//! `subscribe_proxy` (`publish_proxy`), the application's backend decides a
//! client's `sub` (`pub`) instead of the namespace's rule and the client's
//! grants. Only a personal topic's rule still holds (another user's is
//! refused before the backend is asked), and the topic's name, namespace and
//! the client's budgets are checked first: bad input costs no backend call.
//!
//! The command waits for the backend, bounded by the proxy's timeout; the
//! connection's other commands wait behind it, so replies stay in order.

use proto::{AppCode, CommandError, ErrorCode};
use router::Topic;
use serde_json::value::RawValue;

use super::Session;
use super::access::Access;
use crate::hooks::{HookError, PublishReply, PublishRequest, SubscribeReply, SubscribeRequest};

impl Session {
    /// Whether the backend decides this client's `access` to `topic`: its
    /// namespace has the proxy for it.
    pub(super) fn asks_backend(&self, topic: &Topic, access: Access) -> bool {
        self.node
            .namespaces
            .get(topic)
            .is_some_and(|ns| match access {
                Access::Subscribe => ns.subscribe_proxy,
                Access::Publish => ns.publish_proxy,
            })
    }

    /// What holds before a proxy is asked: a personal topic is its user's
    /// alone.
    pub(super) fn may_ask(
        &self,
        id: u64,
        topic: &Topic,
        access: Access,
    ) -> Result<(), CommandError> {
        let claims = self.claims.as_deref();
        if self
            .node
            .namespaces
            .get(topic)
            .is_some_and(|ns| Access::personal_allows(ns, topic, claims))
        {
            return Ok(());
        }
        self.node.metrics.auth_failed("forbidden");
        Err(CommandError::new(
            Some(id),
            ErrorCode::Forbidden,
            format!("you may not {} `{topic}`", access.verb()),
        )
        .about(topic.as_str()))
    }

    /// Whether the client may read `topic`'s history or presence: where it
    /// may subscribe by the namespace's rule, or, where a subscribe proxy
    /// decides, where the backend let it subscribe (it is subscribed now).
    pub(super) fn may_read(&self, id: u64, topic: &Topic) -> Result<(), CommandError> {
        if self.asks_backend(topic, Access::Subscribe) && self.subscriptions.contains(topic) {
            return Ok(());
        }
        self.may(Some(id), topic, Access::Subscribe)
    }

    /// The subscribe proxy's answer to a client's `sub`: `Ok(None)` when
    /// the backend could not answer (the client was told `unavailable`,
    /// not held against it as a bad command).
    pub(super) async fn approve_subscribe(
        &self,
        id: u64,
        topic: &Topic,
        data: Option<&RawValue>,
    ) -> Result<Option<SubscribeReply>, CommandError> {
        let request = SubscribeRequest {
            client: self.conn,
            user: self.claims.as_deref().map(|c| &*c.user),
            topic,
            data,
        };
        let answer = self.node.hooks.subscribe(&request).await;
        self.answered(id, topic, answer).await
    }

    /// The publish proxy's answer to a client's `pub`, as
    /// [`approve_subscribe`](Self::approve_subscribe).
    pub(super) async fn approve_publish(
        &self,
        id: u64,
        topic: &Topic,
        data: &RawValue,
    ) -> Result<Option<PublishReply>, CommandError> {
        let request = PublishRequest {
            client: self.conn,
            user: self.claims.as_deref().map(|c| &*c.user),
            topic,
            data,
        };
        let answer = self.node.hooks.publish(&request).await;
        self.answered(id, topic, answer).await
    }

    /// A proxy's answer about `topic`: a refusal is the command's `err`;
    /// a backend that could not answer is told, and `None`.
    async fn answered<T>(
        &self,
        id: u64,
        topic: &Topic,
        answer: Result<T, HookError>,
    ) -> Result<Option<T>, CommandError> {
        match answer {
            Ok(reply) => Ok(Some(reply)),
            Err(e @ HookError::Unavailable(_)) => {
                self.tell(hook_error(Some(id), &e).about(topic.as_str()))
                    .await;
                Ok(None)
            }
            Err(e) => Err(hook_error(Some(id), &e).about(topic.as_str())),
        }
    }
}

/// The `err` a client hears of a proxy's refusal: `unauthorized`,
/// `forbidden`, the backend's own code (when it is a valid one; else
/// `forbidden`), or `unavailable`.
pub(super) fn hook_error(id: Option<u64>, e: &HookError) -> CommandError {
    match e {
        HookError::Unauthorized(message) => {
            CommandError::new(id, ErrorCode::Unauthorized, or_default(message, e))
        }
        HookError::Forbidden(message) => {
            CommandError::new(id, ErrorCode::Forbidden, or_default(message, e))
        }
        HookError::Refused { code, message } => match AppCode::parse(code) {
            Some(code) => CommandError::app(id, code, or_default(message, e)),
            None => CommandError::new(id, ErrorCode::Forbidden, or_default(message, e)),
        },
        HookError::Unavailable(_) => CommandError::new(id, ErrorCode::Unavailable, e.to_string()),
    }
}

/// The backend's message, or a plain one where it gave none.
fn or_default(message: &str, e: &HookError) -> String {
    if message.is_empty() {
        match e {
            HookError::Unauthorized(_) => "the application refused: unauthorized".to_owned(),
            _ => "the application refused".to_owned(),
        }
    } else {
        message.to_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hooks::Failure;

    #[test]
    fn a_refusal_is_told_with_the_backends_code_where_it_is_one() {
        let told = |e: HookError| {
            let e = hook_error(Some(1), &e);
            (e.wire_code().to_owned(), e.message)
        };
        let refused = |code: &str| HookError::Refused {
            code: code.to_owned(),
            message: "full".to_owned(),
        };
        assert_eq!(
            told(refused("room_full")),
            ("room_full".into(), "full".into())
        );
        // Not a code a client could switch on: `forbidden`.
        assert_eq!(told(refused("Room Full!")).0, "forbidden");
        assert_eq!(
            told(HookError::Unauthorized(String::new())).0,
            "unauthorized"
        );
        assert_eq!(
            told(HookError::Forbidden("no".into())),
            ("forbidden".into(), "no".into())
        );
        let (code, message) = told(HookError::Unavailable(Failure::Timeout));
        assert_eq!(
            (code.as_str(), message.contains("timeout")),
            ("unavailable", true)
        );
    }
}
