//! The `presence_diff` coalescer: the changes the broker hands this pod for
//! a topic are gathered, and its local subscribers get them as one diff per
//! topic per interval, each user once (as it stands at the diff's `to`).
//!
//! The page rule: before a page at position `P` is answered, what is pending
//! up to `P` goes out ([`Diffs::take_upto`]), so that no diff spans a page's
//! position and a client applies exactly the diffs with `from >= P`.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use bytes::Bytes;
use router::Topic;

use router::{Member, PresenceChange};

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
        pending.changes.push(change);
    }

    /// Keeps only the topics `keep` says (those with subscribers here).
    pub fn retain(&mut self, keep: impl Fn(&Topic) -> bool) {
        self.topics.retain(|topic, _| keep(topic));
    }

    /// Every topic's pending diff, merged.
    pub fn take_all(&mut self) -> Vec<(Topic, Diff)> {
        let topics: Vec<Topic> = self
            .topics
            .iter()
            .filter(|(_, p)| !p.changes.is_empty())
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
        let taken = diffs.take_all();
        let [(_, diff)] = taken.as_slice() else {
            panic!("one diff: {taken:?}")
        };
        assert_eq!((diff.from, diff.to, diff.users), (4, 7, 2));
        assert_eq!(names(&diff.joins), ["bob", "carol"]);
        assert_eq!(diff.leaves, [Arc::from("alice")]);
        assert!(diffs.take_all().is_empty(), "nothing twice");
        // The next one starts where this one ended.
        diffs.push(&topic(), change(9, &[], &["bob"], 1));
        assert_eq!(diffs.take_all()[0].1.from, 7);
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
}
