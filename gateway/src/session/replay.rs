//! A replay: what a subscriber missed, streamed from history at the pace its
//! socket takes it (issue #21, finding 6).
//!
//! A `sub` with `since`, or a resumed subscription, first takes one of the
//! pod's replay turns ([`Replays`]: `replay.max_concurrent`, waited for at
//! most `replay.wait`, else `unavailable`). The broker's `recover` then
//! gives the topic's position and a first page of history; the rest is
//! read a page at a time ([`router::Broker::history`], on Redis connections
//! of their own), each page once the connection's queue has taken the one
//! before ([`Outbound::send`](crate::outbound::Outbound::send) waits for
//! room). A replaying connection holds its queue and one page, however much
//! it missed and however slowly it reads.
//!
//! Meanwhile the hub holds aside what arrives live, within the queue's
//! bounds; past them it drops it, and the replay reads on from history to
//! the topic's end before it goes live ([`crate::hub::Hub::go_live`]).
//! Where history no longer continues the replay (trimmed or expired while
//! it ran, or the topic moved to a new epoch), the client gets `reset` to
//! where the topic is now, as for a `since` out of the window: never a
//! silent gap.

use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use prometheus::IntGauge;
use proto::ServerMessage;
use router::{BrokerError, Causes, Page, PageSize, Position, Publication, Topic};
use tokio::sync::{Semaphore, SemaphorePermit};

use super::Session;
use super::handshake::Joining;
use super::rate::Bucket;
use crate::config::ReplayConfig;
use crate::disconnect::CloseReason;
use crate::frame;
use crate::metrics::Metrics;
use crate::outbound::{Mark, Outbound};

/// The pod's replay turns, and how large a page is.
pub struct Replays {
    turns: Semaphore,
    /// `replay.max_concurrent`, for the log.
    max: usize,
    wait: Duration,
    page: PageSize,
    metrics: Arc<Metrics>,
    /// Lagging subscribers' reads of history, the pod's whole
    /// (`replay.catch_up_reads_per_second`, a second's worth in a burst).
    catch_up_reads: Mutex<Bucket>,
    catch_up_rate: u32,
}

/// A replay's turn: its place among the replays running, until dropped.
pub(super) struct Turn<'a> {
    _permit: SemaphorePermit<'a>,
    running: &'a IntGauge,
}

impl Drop for Turn<'_> {
    fn drop(&mut self) {
        self.running.dec();
    }
}

/// Why a replay got no turn.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum NoTurn {
    /// `replay.max_concurrent` ran for all of `replay.wait`.
    Busy(Duration),
    /// The connection ended while it waited.
    Closed,
}

impl fmt::Display for NoTurn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Busy(wait) => write!(
                f,
                "too many replays on this server for {wait:?}; retry in a moment"
            ),
            Self::Closed => f.write_str("the connection ended"),
        }
    }
}

impl Replays {
    pub fn new(config: &ReplayConfig, metrics: Arc<Metrics>) -> Self {
        Self {
            turns: Semaphore::new(config.max_concurrent.min(Semaphore::MAX_PERMITS)),
            max: config.max_concurrent,
            wait: config.wait,
            page: PageSize {
                messages: config.page_messages,
                bytes: config.page_bytes,
            },
            metrics,
            catch_up_reads: Mutex::new(Bucket::new(
                config.catch_up_reads_per_second,
                config.catch_up_reads_per_second,
            )),
            catch_up_rate: config.catch_up_reads_per_second.max(1),
        }
    }

    /// A turn for a lagging subscriber's catch-up, however long it waits:
    /// the client is connected and served meanwhile (only that topic
    /// waits). `None` when the connection ends first.
    pub(super) async fn catch_up_turn(&self, out: &Outbound) -> Option<Turn<'_>> {
        let permit = tokio::select! {
            permit = self.turns.acquire() => permit.ok()?,
            () = out.stopped() => return None,
        };
        self.metrics.replays_running.inc();
        Some(Turn {
            _permit: permit,
            running: &self.metrics.replays_running,
        })
    }

    /// Waits for the pod's next catch-up read of history
    /// (`replay.catch_up_reads_per_second`); counted when it had to wait.
    pub(super) async fn catch_up_read(&self) {
        let mut waited = false;
        loop {
            let taken = self
                .catch_up_reads
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .take();
            if taken {
                self.metrics.lag.history_reads.inc();
                return;
            }
            if !waited {
                self.metrics.lag.throttled.inc();
                waited = true;
            }
            // A rate limit, not a synchronisation: a token comes back
            // within one period.
            tokio::time::sleep(Duration::from_secs_f64(1.0 / f64::from(self.catch_up_rate))).await;
        }
    }

    /// At most how much one read of history returns.
    pub fn page(&self) -> PageSize {
        self.page
    }

    /// A turn, in the order they were asked for, within `replay.wait`.
    pub(super) async fn turn(&self, out: &Outbound) -> Result<Turn<'_>, NoTurn> {
        let waiting = tokio::time::timeout(self.wait, self.turns.acquire());
        let permit = tokio::select! {
            permit = waiting => permit,
            () = out.stopped() => return Err(NoTurn::Closed),
        };
        match permit {
            Ok(Ok(permit)) => {
                self.metrics.replays_running.inc();
                Ok(Turn {
                    _permit: permit,
                    running: &self.metrics.replays_running,
                })
            }
            // The semaphore is never closed; its timeout is the refusal.
            Ok(Err(_)) | Err(_) => {
                self.metrics.replays_refused.inc();
                tracing::warn!(
                    max = self.max,
                    wait = ?self.wait,
                    "a replay waited for its turn in vain (replay.max_concurrent); refused with `unavailable`"
                );
                Err(NoTurn::Busy(self.wait))
            }
        }
    }
}

impl Session {
    /// Streams the replay of the topic `joining` after `start`: `first`
    /// (the page that `recover` read at `position`), then page after page
    /// up to `position` as the queue takes them, then live delivery, which
    /// consumes `joining`. Returns early when the connection closes, the
    /// subscription kept for the session's end to leave.
    pub(super) async fn replay(
        &mut self,
        mut joining: Joining,
        first: Vec<Publication>,
        start: u64,
        position: &Position,
    ) {
        let node = self.node.clone();
        let topic = &joining.topic().clone();
        let size = node.replays.page();
        let mut epoch = position.epoch.clone();
        let mut cursor = start;
        // Where history hands over to what the hub holds aside; `None` once
        // that was dropped: then the topic's seq at the next read.
        let mut target = Some(position.seq);
        let mut page = first;
        loop {
            for publication in page.drain(..) {
                let frame = frame::publication(self.out.format(), &publication, frame::Body::Data);
                let mark = Mark {
                    topic: topic.as_str(),
                    epoch: &publication.epoch,
                    seq: publication.seq,
                };
                if !self.out.send_marked(frame, Some(mark)).await {
                    joining.keep();
                    return;
                }
                cursor = publication.seq;
            }
            if target.is_some_and(|target| cursor >= target) {
                let at = Position {
                    epoch: epoch.clone(),
                    seq: cursor,
                };
                joining = match joining.go_live(&at) {
                    Ok(()) => return,
                    Err(joining) => joining,
                };
                node.metrics.replays_overrun.inc();
                tracing::debug!(
                    conn = self.conn,
                    %topic,
                    "live messages outgrew the queue during a replay; reading them from history"
                );
                target = None;
            }
            match node.broker.history(topic, &epoch, cursor, size).await {
                Ok(Page::Read { publications, seq }) => {
                    target.get_or_insert(seq);
                    page = publications;
                }
                Ok(Page::Lost) => {
                    let Some(now) = self.reset_replay(&joining).await else {
                        joining.keep();
                        return;
                    };
                    cursor = now.seq;
                    target = Some(now.seq);
                    epoch = now.epoch;
                }
                Err(e) => {
                    self.replay_failed(topic, &e);
                    joining.keep();
                    return;
                }
            }
        }
    }

    /// History no longer continues the replay: as for a `since` out of the
    /// window, a `reset` to where the topic is now, live from there. `None`
    /// when the broker could not say (the connection closes then).
    async fn reset_replay(&mut self, joining: &Joining) -> Option<Position> {
        let node = self.node.clone();
        let topic = joining.topic();
        // Before the position is read: what comes after it is kept aside.
        joining.hold_again();
        let position = match node.broker.recover(topic, None, PageSize::UNBOUNDED).await {
            Ok(recovery) => recovery.position,
            Err(e) => {
                self.replay_failed(topic, &e);
                return None;
            }
        };
        node.metrics.replays_lost.inc();
        tracing::info!(
            conn = self.conn,
            "history no longer continues a replay (trimmed or a new epoch); the client gets `reset`"
        );
        self.subscriptions
            .told(topic, &position.epoch, position.seq);
        self.reply(ServerMessage::Reset {
            topic: topic.as_str(),
            epoch: &position.epoch,
            seq: position.seq,
        })
        .await;
        Some(position)
    }

    /// Redis did not answer a replay's read. The client has had its `ok`
    /// (or `welcome`): it is closed with 4003 and comes back, its session
    /// saved as it was, so that the replay starts again from its acks.
    fn replay_failed(&self, topic: &Topic, e: &BrokerError) {
        tracing::warn!(conn = self.conn, error = %Causes(e), "a replay's read failed; the client is to come back");
        tracing::debug!(conn = self.conn, %topic, "the replay that failed");
        self.out.close(CloseReason::Unavailable, true);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn catch_up_reads_keep_to_the_pods_rate_and_waits_are_counted() {
        let metrics = Arc::new(Metrics::new());
        let config = ReplayConfig {
            catch_up_reads_per_second: 10,
            ..ReplayConfig::default()
        };
        let replays = Replays::new(&config, metrics.clone());
        let start = tokio::time::Instant::now();
        // A second's worth at once, then one a tenth of a second.
        for _ in 0..10 {
            replays.catch_up_read().await;
        }
        assert_eq!(start.elapsed(), Duration::ZERO);
        assert_eq!(metrics.lag.throttled.get(), 0);
        for _ in 0..5 {
            replays.catch_up_read().await;
        }
        assert!(
            start.elapsed() >= Duration::from_millis(450),
            "{:?}",
            start.elapsed()
        );
        assert_eq!(metrics.lag.throttled.get(), 5);
        assert_eq!(metrics.lag.history_reads.get(), 15);
    }
}
