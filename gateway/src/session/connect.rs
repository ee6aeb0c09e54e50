//! Who the client is by the application's backend: a `hello` without a
//! token asks the connect proxy (with the upgrade request's allow-listed
//! headers, kept from the upgrade until then), and a connection it let in
//! with an `expires` is refreshed through the refresh proxy shortly before
//! that, by the connection itself (its deadline timer).
//!
//! A token always wins: a `hello` with one is verified as before, and the
//! proxy is not asked (docs/hooks.md).

use std::net::IpAddr;
use std::time::{Duration, SystemTime};

use hyper::HeaderMap;
use proto::{ErrorCode, ServerMessage};
use serde_json::value::RawValue;
use tokio::time::Instant;

use super::Session;
use super::access::Access;
use crate::admission::ConnId;
use crate::auth::Claims;
use crate::disconnect::CloseReason;
use crate::hooks::{
    ConnectRequest, Forwarded, HookError, Hooks, MAX_FORWARDED_HEADER_BYTES, RefreshRequest,
};

/// What the connect proxy is told of the upgrade request: the client's
/// address and the allow-listed headers. Made only where a connect proxy
/// is configured, boxed, and dropped at `hello`: an idle connection holds
/// none of it.
#[derive(Debug)]
pub struct Handshake {
    remote_addr: IpAddr,
    headers: Forwarded,
}

impl Handshake {
    /// The allow-listed headers of an upgrade request from `remote_addr`
    /// (names lower-case; a header sent more than once joined with `, `, a
    /// cookie's with `; `), at most [`MAX_FORWARDED_HEADER_BYTES`] of them
    /// (a header that would pass it is left out, and logged); `None`
    /// without a connect proxy.
    pub fn capture(hooks: &Hooks, headers: &HeaderMap, remote_addr: IpAddr) -> Option<Box<Self>> {
        if !hooks.connects() {
            return None;
        }
        let mut kept = Vec::new();
        let mut bytes = 0;
        for name in hooks.forwarded_headers() {
            let name = name.to_ascii_lowercase();
            let separator = if name == "cookie" { "; " } else { ", " };
            let mut value = String::new();
            for part in headers.get_all(name.as_str()) {
                // Not text: a backend could not read it as a JSON string.
                let Ok(part) = std::str::from_utf8(part.as_bytes()) else {
                    continue;
                };
                if !value.is_empty() {
                    value.push_str(separator);
                }
                value.push_str(part);
            }
            if value.is_empty() {
                continue;
            }
            if bytes + name.len() + value.len() > MAX_FORWARDED_HEADER_BYTES {
                tracing::debug!(
                    header = %name,
                    "an upgrade's forwarded headers are over their bound: this one is left out"
                );
                continue;
            }
            bytes += name.len() + value.len();
            kept.push((name.into_boxed_str(), value.into_boxed_str()));
        }
        Some(Box::new(Self {
            remote_addr,
            headers: kept.into_boxed_slice(),
        }))
    }

    /// The connect proxy's request for this request's client, `client`
    /// naming it for the backend.
    pub fn connect_request(&self, client: ConnId) -> ConnectRequest<'_> {
        ConnectRequest {
            client,
            remote_addr: self.remote_addr,
            headers: &self.headers,
            data: None,
        }
    }
}

/// How long before a proxy-authenticated connection's expiry its refresh
/// is asked, at least: time for a slow backend, and for a retry.
const REFRESH_MARGIN: Duration = Duration::from_secs(3);

/// How soon a refresh the backend could not answer is asked again, until
/// the expiry.
const REFRESH_RETRY: Duration = Duration::from_secs(1);

impl Session {
    /// Who the client of a `hello` without a token is, by the connect
    /// proxy: its claims, or `None` (anonymous) when the backend named no
    /// user where anonymous clients are let in. The upgrade's headers are
    /// dropped here, used or not.
    pub(super) async fn connect_by_proxy(
        &mut self,
        data: Option<&RawValue>,
    ) -> Result<Option<Claims>, HookError> {
        let handshake = self.handshake.take();
        let (remote_addr, headers) = match &handshake {
            Some(handshake) => (handshake.remote_addr, &handshake.headers[..]),
            None => (self.address.addr(), &[][..]),
        };
        let request = ConnectRequest {
            client: self.conn,
            remote_addr,
            headers,
            data,
        };
        let claims = self.node.hooks.connect(&request).await?;
        if claims.user.is_empty() {
            if self.node.config.auth.allow_anonymous {
                return Ok(None);
            }
            return Err(HookError::Unauthorized(
                "the backend named no user, and anonymous clients are not let in".to_owned(),
            ));
        }
        // Held to a token's bounds, `info` to `presence.max_info_bytes`
        // included, by the hooks already (`Failure::Malformed` otherwise).
        Ok(Some(claims))
    }

    /// A `hello` the connect proxy did not let in: the client's `err`, and
    /// the close a refused token gets (4502), or, when the backend could
    /// not answer, `unavailable` and 4003: the client is to come back.
    pub(super) async fn deny_by_proxy(&self, refused: HookError) {
        let (code, close) = match &refused {
            HookError::Unauthorized(_) => (ErrorCode::Unauthorized, CloseReason::Unauthorized),
            HookError::Forbidden(_) | HookError::Refused { .. } => {
                (ErrorCode::Forbidden, CloseReason::Unauthorized)
            }
            HookError::Unavailable(_) => (ErrorCode::Unavailable, CloseReason::Unavailable),
        };
        tracing::debug!(conn = self.conn, code = %code, error = %refused, "the connect proxy did not let a client in");
        let message = match &refused {
            // The backend's own words, where it gave some.
            HookError::Unauthorized(m) | HookError::Forbidden(m) if !m.is_empty() => m.clone(),
            HookError::Refused { message, .. } if !message.is_empty() => message.clone(),
            HookError::Unavailable(_) => refused.to_string(),
            _ => format!("the application refused the connection ({code})"),
        };
        self.reply(ServerMessage::Err {
            id: None,
            code: code.as_str(),
            message: &message,
            topic: None,
        })
        .await;
        self.out.close(close, true);
    }

    /// Takes the connect (or refresh) proxy's claims for this connection.
    /// With `expires`, and a refresh proxy to ask, its deadline is the
    /// refresh's time ([`refresh_at`]); without a refresh proxy, the
    /// connection ends at `expires`, as a token's would.
    pub(super) fn adopt_proxied(&mut self, claims: Option<Claims>) {
        let refreshes = self.node.config.proxy.refresh.is_some();
        self.adopt(claims);
        if let Some(expiry) = self.due.filter(|_| refreshes) {
            self.due = Some(refresh_at(Instant::now(), expiry));
            self.proxied = true;
        }
    }

    /// When this connection's claims end, on the pod's clock: `expires`
    /// plus the leeway a token gets.
    fn expiry(&self) -> Option<Instant> {
        let leeway = self.node.config.auth.leeway;
        self.claims
            .as_ref()?
            .deadline(leeway, SystemTime::now(), Instant::now())
    }

    /// Asks the refresh proxy for this connection's claims again, as its
    /// deadline came: adopted (topics no longer granted are left, as a
    /// `refresh` with a token does), or, refused, the connection ends as an
    /// expired token's does (4004). A backend that cannot answer is asked
    /// again every [`REFRESH_RETRY`] until the expiry. `false`: the
    /// connection is closing.
    pub(super) async fn refresh_by_proxy(&mut self) -> bool {
        let now = Instant::now();
        let expiry = self.expiry().unwrap_or(now);
        let Some(user) = self.claims.as_ref().map(|c| c.user.clone()) else {
            // Anonymous clients have nothing to refresh.
            self.due = None;
            return true;
        };
        if now >= expiry {
            tracing::info!(
                conn = self.conn,
                "a proxy-authenticated connection was not refreshed before it expired"
            );
            self.out.close(CloseReason::TokenExpired, true);
            return false;
        }
        let request = RefreshRequest {
            client: self.conn,
            user: &user,
        };
        // The hooks hold the reply to the same user (another is
        // `Forbidden`) and to a token's bounds (`Malformed`).
        let refused = match self.node.hooks.refresh(&request).await {
            Ok(claims) => {
                let info = claims.info.clone();
                self.adopt_proxied(Some(claims));
                self.node.presence.refreshed(self.conn, info.as_ref());
                self.leave_ungranted().await;
                self.settle_account();
                return true;
            }
            Err(refused) => refused,
        };
        if let HookError::Unavailable(failure) = refused {
            tracing::debug!(conn = self.conn, %failure, "a refresh went unanswered: asked again");
            self.due = Some((Instant::now() + REFRESH_RETRY).min(expiry));
            return true;
        }
        tracing::info!(conn = self.conn, error = %refused, "the refresh proxy ended a connection");
        self.out.close(CloseReason::TokenExpired, true);
        false
    }

    /// Leaves, and tells the client of, the client's own subscriptions its
    /// new claims no longer grant.
    pub(super) async fn leave_ungranted(&mut self) {
        for topic in self.subscriptions.topics() {
            if self.subscriptions.is_server(&topic) {
                continue;
            }
            // A subscribe proxy's namespace: its approval stands.
            if self
                .node
                .namespaces
                .get(&topic)
                .is_some_and(|ns| ns.subscribe_proxy)
            {
                continue;
            }
            if let Err(mut e) = self.may(None, &topic, Access::Subscribe) {
                self.subscriptions.remove(&topic);
                self.leave(&topic).await;
                e.message = format!("`{topic}` is no longer granted; unsubscribed");
                self.tell(e).await;
            }
        }
    }
}

/// When to refresh claims that end at `expiry`: with 10% of the time left,
/// and at least [`REFRESH_MARGIN`] before (right away when less is left).
fn refresh_at(now: Instant, expiry: Instant) -> Instant {
    let left = expiry.saturating_duration_since(now);
    let margin = (left / 10).max(REFRESH_MARGIN).min(left);
    expiry - margin
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refresh_comes_before_the_expiry() {
        let now = Instant::now();
        let at = |secs| refresh_at(now, now + Duration::from_secs(secs)) - now;
        assert_eq!(at(100), Duration::from_secs(90));
        assert_eq!(at(10), Duration::from_secs(7));
        assert_eq!(at(2), Duration::ZERO);
        assert_eq!(at(0), Duration::ZERO);
    }
}
