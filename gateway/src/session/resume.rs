//! What a resume needs: the session claimed from whoever held it last, and
//! saved to the store as the connection goes on and as it ends.

use proto::ErrorCode;
use router::{BrokerError, Causes, Claim, Since, SubscriptionState};

use super::access::Access;
use super::handshake::Origin;
use super::{Session, TakeOver, tag};
use crate::disconnect::CloseReason;
use crate::hooks::SubscribeReply;

impl Session {
    /// The session `id` to resume, claimed for this connection, so that a
    /// connection that served it before can no longer save over it. It
    /// comes from this pod's connection serving it if that one held it last
    /// (its acks are the newest), or else as stored. Only `user`'s session
    /// is taken (an anonymous one when `None`); another user's is left alone.
    pub(super) async fn claim(&self, id: &str, user: Option<&str>) -> Result<Claim, BrokerError> {
        let (owner, live) = match self.node.live.take_over(id, user).await {
            TakeOver::OtherUser => return Ok(Claim::OtherUser),
            TakeOver::None => return self.node.sessions.claim(id, &self.owner, user).await,
            TakeOver::Taken(owner, live) => (owner, live),
        };
        // Adopted, not just claimed: the store may have no copy yet (none
        // flushed, or a pod-local store), and the connection taken over may
        // not have ended (a stuck write outlasts the takeover's wait); it
        // must find this connection the owner when it saves at last.
        let window = self.node.config.session.resume_window;
        let claimed = self
            .node
            .sessions
            .adopt(id, &self.owner, user, &live, window)
            .await?;
        Ok(match claimed {
            Claim::Taken(stored) => {
                let held_it_last = stored.from.as_deref() == Some(&*owner);
                Claim::Taken(router::Claimed {
                    snapshot: if held_it_last { live } else { stored.snapshot },
                    from: None,
                    owner: stored.owner,
                })
            }
            other => other,
        })
    }

    /// Subscribes again to a resumed session's topics, in place already
    /// (restored before the session was registered), each from its acks.
    pub(super) async fn restore(&mut self, states: Vec<SubscriptionState>) {
        for state in states {
            // The token may grant less than the one the session began with;
            // what the server subscribed it to is the server's call.
            let checked = match state.server {
                true => Ok(()),
                false => self.may(None, &state.topic, Access::Subscribe),
            };
            if let Err(e) = checked {
                self.subscriptions.remove(&state.topic);
                self.tell(e).await;
                continue;
            }
            // Acks were checked against what was sent: the pod vouches.
            let since = Since {
                seq: state.acked,
                epoch: Some(state.epoch.to_string()),
                vouched: true,
            };
            // Deltas as the client's `sub` was granted them.
            let subscribed = self
                .subscribe_approved(
                    Origin::Restored,
                    state.topic.clone(),
                    Some(since),
                    SubscribeReply::default(),
                    state.delta,
                )
                .await
                .map_err(|e| e.to_command(Origin::Restored, &state.topic));
            match subscribed {
                Ok(()) => {}
                // Redis did not answer: this subscription and those not
                // restored yet stay as stored, so that the session saved
                // when this connection ends still has them; the client
                // comes back and resumes again.
                Err(e) if e.code == ErrorCode::Unavailable => {
                    tracing::warn!(message = %e.message, "a resumed subscription could not be restored");
                    // As stored, `told` included: a reset the client may
                    // not have read is sent again at the next resume.
                    self.subscriptions.restore(&state);
                    self.out.close(CloseReason::Unavailable, true);
                    return;
                }
                // For good (its namespace is no longer configured): the
                // client is told, and the session goes on without it.
                Err(e) => {
                    self.subscriptions.remove(&state.topic);
                    self.tell(e).await;
                }
            }
        }
    }

    /// Saves the session for the resume window, unless a newer connection
    /// owns it now.
    pub(super) async fn save(&self, id: &str) {
        match self.save_now(id).await {
            Ok(true) => {}
            Ok(false) => {
                tracing::debug!(session = %tag(id), "session resumed by another connection; not saved");
            }
            Err(e) => {
                tracing::warn!(error = %Causes(&e), session = %tag(id), "session not saved; it cannot be resumed");
            }
        }
    }

    /// Saves the session as it is now ([`super::Subscriptions::save`]). Whether it
    /// was kept.
    pub(super) async fn save_now(&self, id: &str) -> Result<bool, BrokerError> {
        let window = self.node.config.session.resume_window;
        self.subscriptions
            .save(&*self.node.sessions, id, &self.owner, window)
            .await
    }
}
