//! A lagging subscriber caught up from history (issue #25).
//!
//! The hub stops pushing a topic to a live subscriber whose queue has no
//! room for its next frame (its namespace's `on_lag` is `catch_up`), records
//! where the client stands in [`Subscriptions`] and pokes the connection.
//! The connection's loop then starts a catch-up per lagging topic
//! ([`Session::catch_up_lagging`]): a task of its own, so that the client's
//! commands, its pings and pongs, its replies and its other topics go on
//! meanwhile, and that an idle connection carries nothing for it (the task
//! and its state exist only while the client lags).
//!
//! A catch-up is a replay ([`super::replay`]) from where the client stands:
//! it reads the topic's history a page at a time, each page once the
//! client's queue holds no more than a page ([`Outbound::room`]: a client
//! that stalls holds no page, and one that reads holds about two), taking one of the pod's replay turns for the read
//! (`replay.max_concurrent`, waited for as long as it takes: the client is
//! connected and served meanwhile; given back before the page is queued, so
//! that a slow client does not keep replays and other catch-ups waiting)
//! within the pod's rate (`replay.catch_up_reads_per_second`), and goes
//! live with
//! [`Hub::caught_up`](crate::hub::Hub::caught_up), which dedups against its
//! cursor: each seq once, in order. What it holds is the queue and one page.
//! Where history no longer reaches back to the client's place, it sends
//! `reset` to where the topic is now, as a replay would, and goes live from
//! there.

use std::sync::Arc;

use proto::ServerMessage;
use router::{Causes, Page, PageSize, Position, Topic};

use super::{Pod, Session, Subscriptions};
use crate::admission::ConnId;
use crate::disconnect::CloseReason;
use crate::frame;
use crate::hub::CaughtUp;
use crate::metrics::CatchUpOutcome;
use crate::outbound::{Mark, Outbound};

impl Session {
    /// Starts a catch-up for each topic the hub marked lagging since the
    /// last look (the connection was poked).
    pub(super) fn catch_up_lagging(&self) {
        for (topic, from) in self.subscriptions.take_lagging() {
            if !self.subscriptions.contains(&topic) {
                continue;
            }
            let catch_up = CatchUp {
                node: self.node.clone(),
                out: self.out.clone(),
                subscriptions: self.subscriptions.clone(),
                conn: self.conn,
                topic: topic.clone(),
            };
            self.subscriptions
                .catching_up(topic, || tokio::spawn(catch_up.run(from)).abort_handle());
        }
    }
}

/// What a catch-up task holds: handles on the pod and on the connection.
struct CatchUp {
    node: Arc<Pod>,
    out: Outbound,
    subscriptions: Subscriptions,
    conn: ConnId,
    topic: Topic,
}

/// Counts a catch-up under way and how it ended, however it ends (a task
/// stopped when its topic is left or its connection ends is dropped where
/// it waits).
struct Running {
    node: Arc<Pod>,
    outcome: CatchUpOutcome,
}

impl Drop for Running {
    fn drop(&mut self) {
        let lag = &self.node.metrics.lag;
        lag.catching_up.dec();
        lag.caught_up(self.outcome);
    }
}

impl CatchUp {
    /// Catches the client up from `from` (where it stands) to live, unless
    /// the connection ends first.
    async fn run(self, from: Position) {
        self.node.metrics.lag.catching_up.inc();
        let mut running = Running {
            node: self.node.clone(),
            outcome: CatchUpOutcome::Ended,
        };
        running.outcome = tokio::select! {
            outcome = self.catch_up(from) => outcome,
            () = self.out.stopped() => CatchUpOutcome::Ended,
        };
        if let Some(id) = tokio::task::try_id() {
            self.subscriptions.caught_up(id);
        }
        tracing::debug!(
            conn = self.conn,
            topic = %self.topic,
            outcome = running.outcome.as_str(),
            "a lagging subscriber's catch-up from history is over"
        );
    }

    async fn catch_up(&self, from: Position) -> CatchUpOutcome {
        let node = &self.node;
        let size = node.replays.page();
        let mut outcome = CatchUpOutcome::Live;
        let mut at = from;
        loop {
            // Nothing read, no turn taken, while the client reads nothing.
            if !self.out.room(size.messages, size.bytes).await {
                return CatchUpOutcome::Ended;
            }
            let Some(turn) = node.replays.catch_up_turn(&self.out).await else {
                return CatchUpOutcome::Ended;
            };
            node.replays.catch_up_read().await;
            let read = node
                .broker
                .history(&self.topic, &at.epoch, at.seq, size)
                .await;
            drop(turn);
            match read {
                Ok(Page::Read { publications, seq }) => {
                    let last = publications.is_empty();
                    for publication in publications {
                        let frame =
                            frame::publication(self.out.format(), &publication, frame::Body::Data);
                        // An SSE stream's place moves with each message.
                        let mark = Mark {
                            topic: self.topic.as_str(),
                            epoch: &publication.epoch,
                            seq: publication.seq,
                        };
                        if !self.out.send_marked(frame, Some(mark)).await {
                            return CatchUpOutcome::Ended;
                        }
                        at.seq = publication.seq;
                    }
                    if !last && at.seq < seq {
                        continue;
                    }
                    match node.hub.caught_up(&self.topic, self.conn, &at) {
                        CaughtUp::Live => return outcome,
                        // Held aside from now: one more page to the end.
                        CaughtUp::Overrun => {}
                        CaughtUp::Lagged(now) => at = now,
                        CaughtUp::Gone => return CatchUpOutcome::Ended,
                    }
                }
                Ok(Page::Lost) => match self.reset().await {
                    Some(now) => {
                        at = now;
                        outcome = CatchUpOutcome::Reset;
                    }
                    None => return CatchUpOutcome::Ended,
                },
                Err(e) => {
                    // As for a replay: the client comes back and resumes
                    // from its acks.
                    tracing::warn!(conn = self.conn, error = %Causes(&e), "a catch-up's read of history failed; the client is to come back");
                    self.out.close(CloseReason::Unavailable, true);
                    return CatchUpOutcome::Ended;
                }
            }
        }
    }

    /// History no longer reaches back to where the client stands: a
    /// `reset` to where the topic is now (what comes after it held aside
    /// from before it is read), as a replay's. `None` when the broker could
    /// not say (the connection closes) or the connection ended.
    async fn reset(&self) -> Option<Position> {
        let node = &self.node;
        node.hub.hold_again(&self.topic, self.conn);
        let recovered = node
            .broker
            .recover(&self.topic, None, PageSize::UNBOUNDED)
            .await;
        let position = match recovered {
            Ok(recovery) => recovery.position,
            Err(e) => {
                tracing::warn!(conn = self.conn, error = %Causes(&e), "a catch-up could not read where its topic is; the client is to come back");
                self.out.close(CloseReason::Unavailable, true);
                return None;
            }
        };
        tracing::info!(
            conn = self.conn,
            "a lagging client fell behind its topic's history; it gets `reset`"
        );
        self.subscriptions
            .told(&self.topic, &position.epoch, position.seq);
        let reset = ServerMessage::Reset {
            topic: self.topic.as_str(),
            epoch: &position.epoch,
            seq: position.seq,
        };
        let mark = Mark {
            topic: self.topic.as_str(),
            epoch: &position.epoch,
            seq: position.seq,
        };
        let frame = frame::message(self.out.format(), &reset);
        if !self.out.send_marked(frame, Some(mark)).await {
            return None;
        }
        Some(position)
    }
}
