//! The `presence_diff` coalescer: the changes the broker hands this pod for
//! a topic are gathered, and its local subscribers get them as one diff per
//! topic per interval, each user once (as it stands at the diff's `to`).
//!
//! The page rule: before a page at position `P` is answered, what is pending
//! up to `P` goes out ([`Diffs::take_upto`]), so that no diff spans a page's
//! position and a client applies exactly the diffs with `from >= P`.
//!
//! A diff goes out at the interval when users joined or left. Changes of
//! the connection count alone (clients moving between pods, a rolling
//! restart's resumes) wait, still pending so that positions stay
//! contiguous, for the next join or leave or [`COUNTS_EVERY`]: a restart
//! that moves every client costs each subscriber a handful of diffs, not one
//! per interval.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use router::Topic;
use tokio::time::Instant;

use router::{Member, PresenceChange};

/// How long changes of the connection count alone may wait for a join or
/// a leave to go out with.
pub const COUNTS_EVERY: Duration = Duration::from_secs(5);

/// Changes that may wait for company at most: past it, they go out.
const MAX_WAITING: usize = 1024;

#[derive(Default)]
pub struct Diffs {
    topics: HashMap<Topic, Pending>,
}

#[derive(Default)]
struct Pending {
    /// The position of the last change sent on (or skipped): the next
    /// diff's `from`.
    sent: Option<u64>,
    /// In position order.
    changes: Vec<PresenceChange>,
    /// When the oldest of `changes` came.
    since: Option<Instant>,
}

impl Pending {
    /// Whether its diff goes out at this interval: someone joined or left,
    /// or the counts waited long enough.
    fn due(&self, now: Instant) -> bool {
        self.changes
            .iter()
            .any(|c| !c.joins.is_empty() || !c.leaves.is_empty())
            || self.changes.len() >= MAX_WAITING
            || self.since.is_some_and(|since| now >= since + COUNTS_EVERY)
    }
}

/// One `presence_diff`, merged.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Diff {
    pub from: u64,
    pub to: u64,
    /// Users present at `to` who joined since `from`, with their `info`
    /// (JSON text).
    pub joins: Vec<(Arc<str>, Option<Bytes>)>,
    pub leaves: Vec<Arc<str>>,
    pub users: u64,
    pub connections: u64,
}

impl Diffs {
    /// A change the broker handed for `topic`, to go out with the next diff.
    pub fn push(&mut self, topic: &Topic, change: PresenceChange) {
        let pending = self.topics.entry(topic.clone()).or_default();
        if pending.sent.is_some_and(|sent| change.position <= sent) {
            // Already sent on (a page went out after it).
            return;
        }
        pending.since.get_or_insert_with(Instant::now);
        pending.changes.push(change);
    }

    /// Keeps only the topics `keep` says (those with subscribers here).
    pub fn retain(&mut self, keep: impl Fn(&Topic) -> bool) {
        self.topics.retain(|topic, _| keep(topic));
    }

    /// Every topic's pending diff that is due at `now`, merged.
    pub fn take_all(&mut self, now: Instant) -> Vec<(Topic, Diff)> {
        let topics: Vec<Topic> = self
            .topics
            .iter()
            .filter(|(_, p)| !p.changes.is_empty() && p.due(now))
            .map(|(t, _)| t.clone())
            .collect();
        topics
            .into_iter()
            .filter_map(|topic| {
                let diff = self.take_upto(&topic, u64::MAX)?;
                Some((topic, diff))
            })
            .collect()
    }

    /// `topic`'s pending changes up to `position`, merged; `None` when
    /// there are none. Later ones stay pending.
    pub fn take_upto(&mut self, topic: &Topic, position: u64) -> Option<Diff> {
        let pending = self.topics.get_mut(topic)?;
        let upto = pending
            .changes
            .iter()
            .take_while(|c| c.position <= position)
            .count();
        if upto == 0 {
            // Nothing of it pending: a diff later starts at the page.
            pending.sent = Some(pending.sent.unwrap_or(0).max(position.min(u64::MAX - 1)));
            return None;
        }
        let changes: Vec<PresenceChange> = pending.changes.drain(..upto).collect();
        pending.since = (!pending.changes.is_empty()).then(Instant::now);
        let first = changes.first()?.position;
        let last = changes.last()?;
        let from = pending.sent.unwrap_or_else(|| first.saturating_sub(1));
        let (to, users, connections) = (last.position, last.users, last.connections);
        pending.sent = Some(to);
        // Each user as it stands at `to`: in (with its newest info) or out.
        let mut state: BTreeMap<Arc<str>, Option<Option<Bytes>>> = BTreeMap::new();
        for change in changes {
            for Member { user, info } in change.joins {
                state.insert(user, Some(info));
            }
            for user in change.leaves {
                state.insert(user, None);
            }
        }
        let mut diff = Diff {
            from,
            to,
            joins: Vec::new(),
            leaves: Vec::new(),
            users,
            connections,
        };
        for (user, present) in state {
            match present {
                Some(info) => diff.joins.push((user, info)),
                None => diff.leaves.push(user),
            }
        }
        Some(diff)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn topic() -> Topic {
        Topic::parse("room:1").unwrap_or_else(|e| panic!("{e}"))
    }

    fn change(position: u64, joins: &[&str], leaves: &[&str], users: u64) -> PresenceChange {
        PresenceChange {
            position,
            joins: joins
                .iter()
                .map(|u| Member {
                    user: Arc::from(*u),
                    info: None,
                })
                .collect(),
            leaves: leaves.iter().map(|u| Arc::from(*u)).collect(),
            users,
            connections: users,
        }
    }

    fn names(users: &[(Arc<str>, Option<Bytes>)]) -> Vec<&str> {
        users.iter().map(|(u, _)| &**u).collect()
    }

    #[test]
    fn many_changes_in_an_interval_are_one_diff_each_user_once() {
        let mut diffs = Diffs::default();
        diffs.push(&topic(), change(5, &["alice", "bob"], &[], 2));
        diffs.push(&topic(), change(6, &["carol"], &["bob"], 2));
        diffs.push(&topic(), change(7, &["bob"], &["alice"], 2));
        let taken = diffs.take_all(Instant::now());
        let [(_, diff)] = taken.as_slice() else {
            panic!("one diff: {taken:?}")
        };
        assert_eq!((diff.from, diff.to, diff.users), (4, 7, 2));
        assert_eq!(names(&diff.joins), ["bob", "carol"]);
        assert_eq!(diff.leaves, [Arc::from("alice")]);
        assert!(diffs.take_all(Instant::now()).is_empty(), "nothing twice");
        // The next one starts where this one ended.
        diffs.push(&topic(), change(9, &[], &["bob"], 1));
        assert_eq!(diffs.take_all(Instant::now())[0].1.from, 7);
    }

    #[test]
    fn a_page_sends_what_is_pending_up_to_it_and_no_diff_spans_it() {
        let mut diffs = Diffs::default();
        diffs.push(&topic(), change(3, &["alice"], &[], 1));
        diffs.push(&topic(), change(4, &["bob"], &[], 2));
        let early = diffs.take_upto(&topic(), 3).expect("up to the page");
        assert_eq!((early.from, early.to), (2, 3));
        let rest = diffs.take_upto(&topic(), u64::MAX).expect("the rest");
        assert_eq!((rest.from, rest.to), (3, 4));
        // A page past everything pending: the next diff starts at it, and a
        // change the page already held is not sent again.
        assert_eq!(diffs.take_upto(&topic(), 8), None);
        diffs.push(&topic(), change(8, &["carol"], &[], 3));
        diffs.push(&topic(), change(9, &["dave"], &[], 4));
        let next = diffs.take_upto(&topic(), u64::MAX).expect("after the page");
        assert_eq!((next.from, next.to), (8, 9));
        assert_eq!(names(&next.joins), ["dave"]);
    }

    #[tokio::test(start_paused = true)]
    async fn connection_counts_alone_wait_for_a_join_or_their_time() {
        let mut diffs = Diffs::default();
        let counts = |position, connections| PresenceChange {
            connections,
            ..change(position, &[], &[], 1)
        };
        diffs.push(&topic(), counts(5, 2));
        diffs.push(&topic(), counts(6, 3));
        assert!(diffs.take_all(Instant::now()).is_empty(), "counts wait");
        // A join takes them along, positions contiguous.
        diffs.push(&topic(), change(7, &["bob"], &[], 2));
        let taken = diffs.take_all(Instant::now());
        let [(_, diff)] = taken.as_slice() else {
            panic!("one diff: {taken:?}")
        };
        assert_eq!((diff.from, diff.to, diff.connections), (4, 7, 2));
        // Counts alone go out once they waited COUNTS_EVERY.
        diffs.push(&topic(), counts(8, 4));
        tokio::time::advance(COUNTS_EVERY - Duration::from_millis(1)).await;
        assert!(diffs.take_all(Instant::now()).is_empty());
        tokio::time::advance(Duration::from_millis(1)).await;
        let taken = diffs.take_all(Instant::now());
        assert_eq!(taken.len(), 1);
        assert_eq!(
            (taken[0].1.from, taken[0].1.to, taken[0].1.connections),
            (7, 8, 4)
        );
    }
}
