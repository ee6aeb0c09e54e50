//! The Redis [`SessionStore`]: claims run as a script with a deadline in
//! Redis's time, saves and extends queued for the batching writer
//! ([`super::sessions`]), revocations stored and announced.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use redis::Value;
use tokio::sync::oneshot;

use super::broker::RedisBroker;
use super::broker::ended;
use super::call::{failed, timed, timed_raw};
use super::replies::{ClaimReply, parse_claim};
use super::{connection, control, millis, scripts, sessions};
use crate::session::unix_ms;
use crate::{
    BrokerError, Claim, Claimed, Forward, SessionSave, SessionSnapshot, SessionStore, Stored,
    Unavailable, Whose,
};

#[async_trait]
impl SessionStore for RedisBroker {
    async fn save(
        &self,
        id: &str,
        owner: &str,
        snapshot: SessionSnapshot,
        ttl: Duration,
    ) -> Result<bool, BrokerError> {
        let saved = self.queue_save(id, owner, Some(&snapshot), ttl).await?;
        let saved = saved.await.unwrap_or_else(|_| Err(writer_ended()))?;
        Ok(saved == Stored::Kept)
    }

    async fn extend(&self, id: &str, owner: &str, ttl: Duration) -> Result<Stored, BrokerError> {
        let extended = self.queue_save(id, owner, None, ttl).await?;
        extended.await.unwrap_or_else(|_| Err(writer_ended()))
    }

    async fn save_many(
        &self,
        batch: Vec<SessionSave>,
        ttl: Duration,
    ) -> Vec<Result<Stored, BrokerError>> {
        // Queued together, the writer sends them in one pipeline.
        let mut queued = Vec::with_capacity(batch.len());
        for save in &batch {
            let snapshot = save.snapshot.as_ref();
            queued.push(self.queue_save(&save.id, &save.owner, snapshot, ttl).await);
        }
        let mut answers = Vec::with_capacity(queued.len());
        for saved in queued {
            answers.push(match saved {
                Ok(saved) => saved.await.unwrap_or_else(|_| Err(writer_ended())),
                Err(e) => Err(e),
            });
        }
        answers
    }

    async fn claim(&self, id: &str, owner: &str, user: Option<&str>) -> Result<Claim, BrokerError> {
        self.claim_or_keep(id, owner, user, None).await
    }

    async fn adopt(
        &self,
        id: &str,
        owner: &str,
        user: Option<&str>,
        snapshot: &SessionSnapshot,
        ttl: Duration,
    ) -> Result<Claim, BrokerError> {
        self.claim_or_keep(id, owner, user, Some((snapshot, ttl)))
            .await
    }

    async fn revoke(&self, user: &str, ttl: Duration) -> Result<(), BrokerError> {
        self.inner.reach.check()?;
        let user_hex = sessions::hex(user);
        // Twice the window: a pod that missed the announcement may still
        // save a session of the user's for a while.
        let keep = millis(ttl).max(1).saturating_mul(2);
        let key = self.inner.keys.revoked(&user_hex);
        let mut set = redis::cmd("SET");
        set.arg(&key).arg(unix_ms()).arg("PX").arg(keep);
        // Stored first, then told: a claim reads it from then on, and every
        // pod drops the user's connections (in a cluster, a `PUBLISH`
        // reaches every node's subscribers).
        let channel = self.inner.keys.control_channel();
        let mut publish = redis::cmd("PUBLISH");
        publish.arg(&channel).arg(control::disconnect(user));
        let shards = &self.inner.shards;
        let revoking = async {
            shards.command::<()>(&key, &set).await?;
            shards.command::<()>(&channel, &publish).await
        };
        timed(&*self.inner.observer, "revoke", revoking).await
    }

    async fn whose(&self, id: &str) -> Result<Whose, BrokerError> {
        self.inner.reach.check()?;
        let shards = &self.inner.shards;
        let key = self.inner.keys.session(id);
        let mut get = redis::cmd("GET");
        get.arg(&key);
        let reading = shards.command::<Option<Vec<u8>>>(&key, &get);
        let Some(value) = timed(&*self.inner.observer, "session_user", reading).await? else {
            return Ok(Whose::Nobody);
        };
        let Some(user) = sessions::decode(&value).user else {
            return Ok(Whose::Anonymous);
        };
        // A revocation is in its own key (another slot, in a cluster): a
        // session it ended is gone for a claim, and so for this.
        let revocation = self.inner.keys.revoked(&sessions::hex(&user.id));
        let mut get = redis::cmd("GET");
        get.arg(&revocation);
        let reading = shards.command::<Option<u64>>(&revocation, &get);
        let revoked = timed(&*self.inner.observer, "session_user", reading).await?;
        if revoked.is_some_and(|at| user.since_ms <= at) {
            return Ok(Whose::Nobody);
        }
        Ok(Whose::User(user.id))
    }
}

impl RedisBroker {
    /// Publishes `forward` on the control channel, which every pod reads
    /// ([`crate::Broker::forward`]).
    pub(super) async fn forward_commands(&self, forward: &Forward) -> Result<(), BrokerError> {
        self.inner.reach.check()?;
        let channel = self.inner.keys.control_channel();
        let mut publish = redis::cmd("PUBLISH");
        publish.arg(&channel).arg(control::forward(forward));
        let sending = self.inner.shards.command::<()>(&channel, &publish);
        timed(&*self.inner.observer, "forward", sending).await
    }
}

impl RedisBroker {
    /// Runs [`scripts::CLAIM_SESSION`]; with `keep`, a session that is not
    /// there is stored as that snapshot, for that long, and claimed.
    ///
    /// The claim must run within half the command timeout (Redis's clock, as
    /// far as this pod knows it): one that runs later, when this pod may have
    /// given up and its client resumed elsewhere, takes nothing. A claim
    /// answered in time that ran too late by that reckoning (the clocks
    /// differ more than learnt so far) is tried again once.
    ///
    /// A claim whose connection broke under it (the first command after Redis
    /// restarted, or after `CLIENT KILL`, meets the pod's stale socket) is
    /// also tried again once, on the new connection, with a deadline of its
    /// own: the client should not pay a reconnect for the pod's socket. That
    /// is safe whether or not the first attempt ran: a claim by the same
    /// owner only ranks it higher, and the stored snapshot is the same. What
    /// a first attempt that ran would have said of the previous owner is
    /// lost, though: `from` is then `None`, and an adopting connection takes
    /// the stored copy, whose subscriptions are all there (a `sub`'s `ok`
    /// waits for the store) and whose acks may be a little older (a replay
    /// the client drops).
    async fn claim_or_keep(
        &self,
        id: &str,
        owner: &str,
        user: Option<&str>,
        keep: Option<(&SessionSnapshot, Duration)>,
    ) -> Result<Claim, BrokerError> {
        self.inner.reach.check()?;
        let user_hex = user.map(sessions::hex).unwrap_or_default();
        let within = self.inner.command_timeout / 2;
        let key = self.inner.keys.session(id);
        let shards = &self.inner.shards;
        // In a cluster the user's revocation is in another slot than the
        // session: read just before the claim, instead of by it.
        let revoked: Option<String> = match user {
            Some(_) if shards.is_cluster() => {
                let revocation = self.inner.keys.revoked(&user_hex);
                let mut get = redis::cmd("GET");
                get.arg(&revocation);
                let reading = shards.command(&revocation, &get);
                timed(&*self.inner.observer, "session_load", reading).await?
            }
            _ => None,
        };
        let mut retried = false;
        for attempt in 0..2 {
            let mut invocation = scripts::CLAIM_SESSION.prepare_invoke();
            invocation.key(&key);
            if user.is_some() && !shards.is_cluster() {
                invocation.key(self.inner.keys.revoked(&user_hex));
            }
            let sent_ms = unix_ms();
            invocation
                .arg(owner)
                .arg(&user_hex)
                .arg(self.inner.redis_clock.deadline(sent_ms, within))
                .arg(revoked.as_deref().unwrap_or(""));
            if let Some((snapshot, ttl)) = keep {
                invocation
                    .arg(sessions::encode_body(snapshot))
                    .arg(millis(ttl).max(1));
            }
            let claiming = shards.script(&key, &scripts::CLAIM_SESSION, &invocation);
            let value: Value = match timed_raw(&*self.inner.observer, "session_load", claiming)
                .await
            {
                Ok(value) => value,
                Err(e) if attempt == 0 && connection::broke_under(&e) => {
                    tracing::info!(error = %e, "a claim met a broken Redis connection; trying it on a new one");
                    retried = true;
                    continue;
                }
                Err(e) => return Err(failed("session_load", e)),
            };
            let claimed = match parse_claim(value)? {
                ClaimReply::NotFound => return Ok(Claim::NotFound),
                ClaimReply::OtherUser => return Ok(Claim::OtherUser),
                ClaimReply::Ran(ran) => ran,
            };
            self.inner
                .redis_clock
                .learn(sent_ms, unix_ms(), claimed.redis_ms);
            if let Some(taken) = claimed.taken {
                // Taken from this connection's own first attempt, which ran
                // before its connection broke: who held it before is lost.
                let own = retried && sessions::is_owned_by(&taken.from, owner);
                return Ok(Claim::Taken(Claimed {
                    snapshot: sessions::decode(&taken.body),
                    from: Some(taken.from).filter(|f| !f.is_empty() && !own),
                    owner: Arc::from(taken.owner),
                }));
            }
            // (No session id in the log: it is what resumes the session.)
            tracing::debug!("a claim ran after its deadline: trying again");
        }
        Err(BrokerError::Unavailable(Unavailable::ClaimsLate(within)))
    }

    /// Hands a save (`None`: an extend) to the session writer; the receiver
    /// says how it went.
    async fn queue_save(
        &self,
        id: &str,
        owner: &str,
        snapshot: Option<&SessionSnapshot>,
        ttl: Duration,
    ) -> Result<oneshot::Receiver<Result<Stored, BrokerError>>, BrokerError> {
        self.inner.reach.check()?;
        let (done, saved) = oneshot::channel();
        let save = sessions::Save {
            key: self.inner.keys.session(id),
            owner: owner.to_owned(),
            value: snapshot.map(|snapshot| sessions::encode(owner, snapshot)),
            ttl_ms: millis(ttl).max(1),
            done,
        };
        self.inner
            .saves
            .send(save)
            .await
            .map_err(|_| writer_ended())?;
        Ok(saved)
    }
}

fn writer_ended() -> BrokerError {
    ended("session writer")
}
