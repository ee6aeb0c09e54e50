//! The history API's reads ([`crate::Broker::read_history`]): a page of a
//! topic's kept messages, oldest or newest first, and the rule that makes a
//! page whole or says the asked-for window is gone, the same for every
//! engine ([`window`]).
//!
//! A replay ([`crate::page`]) reads after a seq the subscriber holds; the
//! history API also reads from the oldest kept message, and backwards.

use crate::page::PageSize;
use crate::{Position, Publication};

/// What a history read asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HistoryQuery {
    /// Forward: the messages after it; reverse: those below it. `None`:
    /// from the oldest kept (forward) or the newest (reverse).
    pub since: Option<u64>,
    /// The epoch `since` is of; `None`: the topic's current one.
    pub epoch: Option<String>,
    /// Newest first.
    pub reverse: bool,
    /// At most this many messages and bytes; a page of 0 messages asks for
    /// the position only.
    pub size: PageSize,
}

/// The answer to [`crate::Broker::read_history`].
#[derive(Debug, Clone)]
pub enum HistoryPage {
    /// The publications asked for (oldest first, or newest first in
    /// reverse), whole: none missing between `since` and the last one, and
    /// the topic's position when they were read.
    Read {
        position: Position,
        publications: Vec<Publication>,
    },
    /// `since` is out of the window: of another epoch, beyond the topic's
    /// seq, or (forward) no longer followed by what history keeps. Never
    /// answered with part of what was asked.
    Lost { position: Position },
}

/// The page `query` gets from a topic at `position`, given `kept`: what
/// the engine read of its history that is not expired, in the query's
/// direction (forward: after `since`, or from the oldest kept; reverse:
/// below `since`, or from the newest), at least as many as `query.size`
/// allows when there are that many.
pub fn window(query: &HistoryQuery, position: Position, kept: Vec<Publication>) -> HistoryPage {
    let other_epoch = query
        .epoch
        .as_deref()
        .is_some_and(|epoch| epoch != &*position.epoch);
    let beyond = query.since.is_some_and(|since| {
        let top = if query.reverse {
            position.seq.saturating_add(1)
        } else {
            position.seq
        };
        since > top
    });
    if other_epoch || beyond {
        return HistoryPage::Lost { position };
    }
    if query.size.messages == 0 {
        return HistoryPage::Read {
            position,
            publications: Vec::new(),
        };
    }
    let publications = query.size.take(&kept);
    if !query.reverse {
        let after = query.since;
        // Forward from `since`: history must hold `since + 1`, unless the
        // topic is no further.
        let starts = match (after, publications.first()) {
            (Some(since), Some(first)) => first.seq == since + 1,
            (Some(since), None) => since == position.seq,
            (None, _) => true,
        };
        let unbroken = publications.windows(2).all(|w| w[1].seq == w[0].seq + 1);
        if !starts || !unbroken {
            return HistoryPage::Lost { position };
        }
    } else if !publications.windows(2).all(|w| w[1].seq + 1 == w[0].seq) {
        return HistoryPage::Lost { position };
    }
    HistoryPage::Read {
        position,
        publications,
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use bytes::Bytes;

    use super::*;
    use crate::Topic;

    fn kept(seqs: impl IntoIterator<Item = u64>) -> Vec<Publication> {
        let topic = Topic::parse("t").unwrap_or_else(|e| panic!("{e}"));
        seqs.into_iter()
            .map(|seq| Publication {
                topic: topic.clone(),
                epoch: Arc::from("e"),
                seq,
                data: Bytes::from_static(b"1"),
            })
            .collect()
    }

    fn query(since: Option<u64>, reverse: bool, limit: usize) -> HistoryQuery {
        HistoryQuery {
            since,
            epoch: None,
            reverse,
            size: PageSize {
                messages: limit,
                bytes: usize::MAX,
            },
        }
    }

    fn at(seq: u64) -> Position {
        Position {
            epoch: Arc::from("e"),
            seq,
        }
    }

    fn seqs(page: HistoryPage) -> Option<Vec<u64>> {
        match page {
            HistoryPage::Read { publications, .. } => {
                Some(publications.iter().map(|p| p.seq).collect())
            }
            HistoryPage::Lost { .. } => None,
        }
    }

    #[test]
    fn forward_pages_continue_since_or_say_it_is_lost() {
        assert_eq!(
            seqs(window(&query(Some(3), false, 2), at(10), kept(4..=10))),
            Some(vec![4, 5])
        );
        assert_eq!(
            seqs(window(&query(None, false, 3), at(10), kept(6..=10))),
            Some(vec![6, 7, 8])
        );
        // Trimmed away: 4 is no longer kept.
        assert_eq!(
            seqs(window(&query(Some(3), false, 2), at(10), kept(6..=10))),
            None
        );
        assert_eq!(
            seqs(window(&query(Some(10), false, 2), at(10), kept([]))),
            Some(vec![])
        );
        assert_eq!(
            seqs(window(&query(Some(11), false, 2), at(10), kept([]))),
            None
        );
    }

    #[test]
    fn reverse_pages_go_down_from_since() {
        assert_eq!(
            seqs(window(&query(Some(8), true, 3), at(10), kept([7, 6, 5, 4]))),
            Some(vec![7, 6, 5])
        );
        assert_eq!(
            seqs(window(&query(Some(11), true, 2), at(10), kept([10, 9]))),
            Some(vec![10, 9])
        );
        assert_eq!(
            seqs(window(&query(Some(12), true, 2), at(10), kept([]))),
            None
        );
    }

    #[test]
    fn another_epoch_is_lost_and_limit_zero_is_the_position_only() {
        let mut other = query(Some(3), false, 5);
        other.epoch = Some("f".to_owned());
        assert_eq!(seqs(window(&other, at(10), kept(4..=10))), None);
        assert_eq!(
            seqs(window(&query(Some(3), false, 0), at(10), kept([]))),
            Some(vec![])
        );
    }
}
