//! Who the client is: `hello` (its token, and the session it starts or
//! resumes) and `refresh` (a new token for the same user).

use std::sync::Arc;
use std::time::UNIX_EPOCH;

use proto::{CommandError, ErrorCode, ServerMessage};
use router::{Causes, Claim, SessionUser};
use serde_json::value::RawValue;
use tokio::time::Instant;

use super::{Arrival, LiveSession, Session, Unregistered, random_id, tag};
use crate::auth::{Claims, Refused};
use crate::disconnect::CloseReason;
use crate::frame::Format;

impl Session {
    /// Who the client is: the claims of a valid token, or anonymous where
    /// that is allowed.
    async fn authenticate(&self, token: Option<&str>) -> Result<Option<Claims>, Denied> {
        let Some(verifier) = &self.node.verifier else {
            // Open mode: nothing to check a token against.
            return Ok(None);
        };
        let max_info = self.node.config.presence.max_info_bytes;
        match token {
            Some(token) => {
                let claims = verifier.verify(token).await?;
                claims.check_info(max_info)?;
                Ok(Some(claims))
            }
            None if self.node.config.auth.allow_anonymous => Ok(None),
            None => Err(Denied::Missing),
        }
    }

    /// A client `hello` let in as no one: counted, told why, and closed.
    async fn deny(&self, denied: Denied) {
        let (code, close) = denied.answer();
        let reason = denied.reason();
        self.node.metrics.auth_failed(reason);
        tracing::debug!(conn = self.conn, reason, "token refused");
        self.reply(ServerMessage::Err {
            id: None,
            code: code.as_str(),
            message: &denied.to_string(),
            topic: None,
        })
        .await;
        self.out.close(close, true);
    }

    /// A token whose `topics` claim cannot be subscribed: refused as a
    /// token with invalid claims is, with a message naming the topic.
    async fn deny_topics(&self, message: &str) {
        self.node.metrics.auth_failed("claims");
        tracing::debug!(conn = self.conn, message, "token refused");
        self.reply(ServerMessage::Err {
            id: None,
            code: ErrorCode::Unauthorized.as_str(),
            message,
            topic: None,
        })
        .await;
        self.out.close(CloseReason::Unauthorized, true);
    }

    /// A `refresh` refused: counted, and the `err` its command gets.
    fn deny_refresh(&self, id: u64, denied: Denied) -> CommandError {
        self.node.metrics.auth_failed(denied.reason());
        let (code, _) = denied.answer();
        CommandError::new(Some(id), code, denied.to_string())
    }

    /// Takes the token's claims for this connection. It lives until the
    /// token expires, with the same leeway the verifier allowed.
    pub(super) fn adopt(&mut self, claims: Option<Claims>) {
        let leeway = self.node.config.auth.leeway;
        self.due = claims
            .as_ref()
            .and_then(|c| c.deadline(leeway, std::time::SystemTime::now(), Instant::now()));
        self.claims = claims.map(Box::new);
        self.proxied = false;
    }

    /// Starts (or restores) the session and sends `welcome`. A resume that
    /// cannot be completed now (store or broker unavailable) closes with
    /// 4003, leaving the stored session as it was: the client comes back
    /// and resumes, rather than losing what it missed to a fresh session.
    ///
    /// Without a token, and with a connect proxy, the backend says who the
    /// client is (given `data`, `hello.data`); a token always wins.
    pub(super) async fn hello(
        &mut self,
        token: Option<&str>,
        resume: Option<&str>,
        data: Option<&RawValue>,
    ) {
        // Before the store is asked: a disconnect from now on reaches this
        // connection, whether or not the claim saw it.
        let arrived = self.node.live.arrival();
        let by_proxy = token.is_none() && self.node.hooks.connects();
        let claims = if by_proxy {
            match Box::pin(self.connect_by_proxy(data)).await {
                Ok(claims) => claims,
                Err(refused) => return self.deny_by_proxy(refused).await,
            }
        } else {
            // Used or not, the upgrade's headers go now.
            self.handshake = None;
            match self.authenticate(token).await {
                Ok(claims) => claims,
                Err(denied) => return self.deny(denied).await,
            }
        };
        self.begin(arrived, by_proxy, claims, resume).await;
    }

    /// [`hello`](Self::hello) once the client is known: `claims` verified
    /// (a stream's token is, before its response begins), or the connect
    /// proxy's (`by_proxy`). `arrived` was taken before anything was asked.
    pub(super) async fn begin(
        &mut self,
        arrived: Arrival,
        by_proxy: bool,
        claims: Option<Claims>,
        resume: Option<&str>,
    ) {
        let topics = match self.token_topics(claims.as_ref()) {
            Ok(topics) => topics,
            Err(message) => return self.deny_topics(&message).await,
        };
        let user = claims.as_ref().map(|c| c.user.clone());
        if by_proxy {
            self.adopt_proxied(claims);
        } else {
            self.adopt(claims);
        }
        let mut restored = None;
        let mut not_resumed = None;
        if let Some(id) = resume {
            match self.claim(id, user.as_deref()).await {
                Ok(Claim::Taken(claimed)) => {
                    // Saves go with the owner as the store ranked it.
                    self.owner = claimed.owner;
                    restored = Some((Arc::<str>::from(id), claimed.snapshot))
                }
                Ok(Claim::NotFound) => not_resumed = Some("not_found"),
                Ok(Claim::OtherUser) => {
                    tracing::info!(conn = self.conn, session = %tag(id), "resume of another user's session refused");
                    not_resumed = Some("other_user");
                }
                Err(e) => {
                    tracing::warn!(error = %Causes(&e), "session store unavailable; the client is to come back");
                    self.out.close(CloseReason::Unavailable, true);
                    return;
                }
            }
            let label = if restored.is_some() { "true" } else { "false" };
            self.node.metrics.resumes.with_label_values(&[label]).inc();
        }
        let (id, snapshot) = match restored {
            Some((id, snapshot)) => (id, Some(snapshot)),
            None => (random_id(), None),
        };
        self.resumed = snapshot.is_some();
        self.id = Some(id.clone());
        let session_user = match &snapshot {
            Some(snapshot) => snapshot.user.clone(),
            None => user.map(|id| SessionUser {
                id,
                since_ms: router::session::unix_ms(),
            }),
        };
        self.subscriptions.set_user(session_user);
        let ping_ms = self.node.config.websocket.ping_interval.as_millis() as u64;
        // An SSE stream has no session to speak of (it resumes by event
        // id): its first events are its topics' `ok`s.
        if self.out.format() != Format::Sse {
            self.reply(ServerMessage::Welcome {
                session: &id,
                ping_ms,
                resumed: self.resumed,
                expires: self.expires_unix(),
                reason: not_resumed,
            })
            .await;
        }
        let states = snapshot.map(|s| s.subscriptions).unwrap_or_default();
        // In place before the session is registered, whole: a flush while
        // they are restored one by one, then a resume elsewhere, must not
        // find only part of them.
        for state in &states {
            self.subscriptions.restore(state);
        }
        // Registered after `welcome` is queued, so that a `reconnect` from
        // the rebalancer never comes before it.
        let live = LiveSession {
            conn: self.conn,
            owner: self.owner.clone(),
            out: self.out.clone(),
            subscriptions: self.subscriptions.clone(),
        };
        if let Err(refused) = self.node.live.register(id.clone(), live, arrived) {
            let reason = match refused {
                Unregistered::Disconnected => CloseReason::Disconnected,
                Unregistered::Late => CloseReason::Unavailable,
            };
            tracing::info!(
                conn = self.conn,
                reason = reason.as_str(),
                "a connection was refused its session as it registered"
            );
            self.out.close(reason, true);
            return;
        }
        let user = self.claims.as_ref().map(|c| &c.user);
        self.node
            .webhooks
            .opened(self.conn, user, self.address.addr());
        self.restore(states).await;
        // A resumed session has them already, or the client unsubscribed.
        // An SSE stream carries the topics its request names, no others:
        // its event ids place it in those alone.
        if !self.resumed && self.out.format() != Format::Sse {
            self.subscribe_token_topics(topics).await;
        }

        // Its topics entered again: what its earlier connection left
        // lingering here goes, without a leave where this one holds them.
        if self.resumed {
            self.node.presence.resumed(&id);
        }
    }

    /// The token's expiry in Unix seconds, for `welcome` and `refresh`.
    pub(super) fn expires_unix(&self) -> Option<u64> {
        let expires = self.claims.as_ref()?.expires?;
        expires.duration_since(UNIX_EPOCH).ok().map(|d| d.as_secs())
    }

    /// A new token for the same user: the connection lives on to its
    /// expiry, with its grants. Topics it no longer grants are left.
    pub(super) async fn refresh(&mut self, id: u64, token: &str) -> Result<(), CommandError> {
        let Some(verifier) = self.node.verifier.clone() else {
            return Err(CommandError::new(
                Some(id),
                ErrorCode::Malformed,
                "this server does not check tokens",
            ));
        };
        let max_info = self.node.config.presence.max_info_bytes;
        let verified = verifier
            .verify(token)
            .await
            .and_then(|claims| claims.check_info(max_info).map(|()| claims));
        let claims = match verified {
            Ok(claims) => claims,
            Err(refused) => return Err(self.deny_refresh(id, refused.into())),
        };
        let same_user = self.claims.as_ref().map(|c| &c.user) == Some(&claims.user);
        if !same_user {
            return Err(self.deny_refresh(id, Denied::OtherUser));
        }
        let info = claims.info.clone();
        self.adopt(Some(claims));
        self.node.presence.refreshed(self.conn, info.as_ref());
        self.leave_ungranted().await;
        self.reply(ServerMessage::Ok {
            id,
            topic: None,
            seq: None,
            epoch: None,
            recovered: None,
            expires: self.expires_unix(),
            data: None,
            delta: None,
        })
        .await;
        Ok(())
    }
}

/// Why a client was not let in (`hello`) or on (`refresh`) as a user.
/// `Display` is the message the client is sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub(super) enum Denied {
    /// No token, where anonymous clients are not let in.
    #[error("a token is required")]
    Missing,
    /// The token was refused: expired, or not one of ours (see [`Refused`]).
    #[error(transparent)]
    Refused(#[from] Refused),
    /// A `refresh` with a valid token for another user than the
    /// connection's.
    #[error("a refresh must be for the connection's own user")]
    OtherUser,
}

impl Denied {
    /// Its label on `herald_auth_failures_total{reason}`.
    pub(super) fn reason(&self) -> &'static str {
        match self {
            Denied::Missing => "missing",
            Denied::Refused(refused) => refused.reason(),
            Denied::OtherUser => "other_user",
        }
    }

    /// How it is answered: the `err` code, and the close (`hello`'s; a
    /// refused `refresh` leaves the connection to its token's expiry). Only
    /// an expired token is one the client can fix by fetching a new one.
    pub(super) fn answer(&self) -> (ErrorCode, CloseReason) {
        match self {
            Denied::Refused(refused) if refused.is_expired() => {
                (ErrorCode::TokenExpired, CloseReason::TokenExpired)
            }
            _ => (ErrorCode::Unauthorized, CloseReason::Unauthorized),
        }
    }
}
