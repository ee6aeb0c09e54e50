//! Coming back after a lost connection ([`Client::resume`]): a backoff (or
//! the server's advice), a pod picked at random, `resume`; a session that
//! is gone recorded and replaced by a fresh one that subscribes again. Its
//! own module: the reconnecting half of the client, apart from reading and
//! acking on a live connection.

use std::sync::atomic::Ordering;
use std::time::Duration;

use futures_util::SinkExt;
use tokio::sync::watch;
use tokio_tungstenite::tungstenite::Message;

use super::{Client, Clock, Event, Phase, handshake};
use crate::clients::Socket;
use crate::sessions::{ATTEMPT_TIMEOUT, Plan};

impl Client {
    /// Comes back after a lost connection: backs off, connects to a pod
    /// picked at random and resumes. A session that is gone is recorded and
    /// replaced: a fresh one subscribes again with `since` and `epoch`.
    pub(super) async fn resume(
        &mut self,
        plan: &Plan,
        phase: &mut watch::Receiver<Phase>,
        advised: Option<Duration>,
        clock: &Clock,
    ) -> Result<Socket, String> {
        plan.resuming.fetch_add(1, Ordering::SeqCst);
        let resumed = self.resume_attempts(plan, phase, advised, clock).await;
        plan.resuming.fetch_sub(1, Ordering::SeqCst);
        resumed
    }

    async fn resume_attempts(
        &mut self,
        plan: &Plan,
        phase: &mut watch::Receiver<Phase>,
        advised: Option<Duration>,
        clock: &Clock,
    ) -> Result<Socket, String> {
        let mut attempt = 0u32;
        loop {
            let wait = match (attempt, advised) {
                (0, Some(after)) => after,
                _ => plan.backoff.delay(attempt),
            };
            attempt += 1;
            self.record.attempts += 1;
            let gateway = plan.pick();
            let target = &plan.gateways[gateway];
            let (client, session) = (self.client, self.session.clone());
            let try_once = async {
                tokio::time::sleep(wait).await;
                tokio::time::timeout(
                    ATTEMPT_TIMEOUT,
                    handshake(client, target, Some(&session), None),
                )
                .await
                .map_err(|_| format!("no welcome within {ATTEMPT_TIMEOUT:?}"))?
                .map_err(|e| {
                    if e.refused {
                        plan.refused(gateway);
                    }
                    e.reason
                })
            };
            let outcome = tokio::select! {
                biased;
                changed = phase.changed() => {
                    if changed.is_err() || *phase.borrow_and_update() == Phase::Stop {
                        return Err(format!(
                            "not resumed by the end of the run after {attempt} attempts; last error: {}",
                            self.record.attempt_errors.last().map_or("none", String::as_str)
                        ));
                    }
                    continue;
                }
                outcome = try_once => outcome,
            };
            match outcome {
                Ok((mut ws, welcome)) => {
                    self.gateway = gateway;
                    self.note(Event::Welcome {
                        gateway,
                        resumed: welcome.resumed,
                        at: clock.ms32(),
                    });
                    if welcome.resumed && welcome.session == self.session {
                        self.record.resumes += 1;
                        return Ok(ws);
                    }
                    self.record.sessions_lost.push(format!(
                        "at {:.1} s: {}",
                        f64::from(clock.ms32()) / 1000.0,
                        welcome.reason.as_deref().unwrap_or("resumed: false")
                    ));
                    self.session = welcome.session;
                    if self.resubscribe(&mut ws).await.is_ok() {
                        return Ok(ws);
                    }
                }
                Err(e) => self.record.attempt_errors.push(e),
            }
        }
    }

    /// `sub` with `since` and `epoch` for every topic, on a fresh session;
    /// the `ok`s are read as any frame.
    async fn resubscribe(&mut self, ws: &mut Socket) -> Result<(), ()> {
        for (id, sub) in self.subs.iter().enumerate() {
            let frame = serde_json::json!({
                "op": "sub", "id": id, "topic": &*sub.name, "since": sub.last, "epoch": &*sub.epoch,
            });
            ws.send(Message::text(frame.to_string()))
                .await
                .map_err(|_| ())?;
        }
        Ok(())
    }
}
