//! A page of history: what one read of a topic's history returns, bounded
//! in messages and in bytes, so that a replay holds one page at a time
//! instead of everything a subscriber missed (issue #21, finding 6).

use crate::Publication;

/// At most how much one read of history returns ([`crate::Broker::recover`],
/// [`crate::Broker::history`]): `messages` publications, and `bytes` of
/// their data. A read stops after the publication that reaches `bytes`, so
/// that a publication larger than `bytes` still makes a page of its own and
/// every read moves on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PageSize {
    pub messages: usize,
    pub bytes: usize,
}

impl PageSize {
    /// No bound: everything in one read. For callers that want only the
    /// position (no `since`), and for tests; never for a replay to a client.
    pub const UNBOUNDED: Self = Self {
        messages: usize::MAX,
        bytes: usize::MAX,
    };

    /// Whether `page` (a read's answer) is as large as a read may return:
    /// there may be more after it.
    pub fn is_full(&self, page: &[Publication]) -> bool {
        let bytes: usize = page.iter().map(|p| p.data.len()).sum();
        page.len() >= self.messages || bytes >= self.bytes
    }

    /// The first publications of `from` (oldest first) that make a page:
    /// cloned (their data is shared, not copied).
    pub fn take<'a>(&self, from: impl IntoIterator<Item = &'a Publication>) -> Vec<Publication> {
        let mut page = Vec::new();
        let mut bytes = 0usize;
        for publication in from {
            if page.len() >= self.messages || bytes >= self.bytes {
                break;
            }
            bytes = bytes.saturating_add(publication.data.len());
            page.push(publication.clone());
        }
        page
    }
}

/// The answer to [`crate::Broker::history`].
#[derive(Debug, Clone)]
pub enum Page {
    /// The publications after the seq asked for, oldest first, continuing
    /// it without a gap: at most a page, none when the topic is no further.
    /// `seq` is the topic's seq when they were read.
    Read {
        publications: Vec<Publication>,
        seq: u64,
    },
    /// History no longer continues the seq asked for in its epoch: trimmed
    /// or expired meanwhile, or the topic moved to another epoch. Continuity
    /// is lost, as for a `since` out of the window.
    Lost,
}

/// Whether `page`, read after `after` from a topic at `seq`, continues
/// `after` without a gap: from `after + 1`, one after another, and up to
/// `seq` unless the page is full (the rest comes with the next read).
/// Nothing to read (`after == seq`) is an empty page; a topic behind
/// `after` went back in time.
pub fn continues(page: &[Publication], after: u64, seq: u64, size: PageSize) -> bool {
    if after > seq {
        return false;
    }
    let Some(first) = page.first() else {
        return after == seq;
    };
    let reaches = page.last().is_some_and(|last| last.seq == seq);
    first.seq == after.saturating_add(1)
        && page.windows(2).all(|w| w[1].seq == w[0].seq + 1)
        && (reaches || size.is_full(page))
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use bytes::Bytes;

    use super::*;
    use crate::Topic;

    fn publications(seqs: std::ops::RangeInclusive<u64>, len: usize) -> Vec<Publication> {
        let topic = Topic::parse("t").unwrap_or_else(|e| panic!("{e}"));
        seqs.map(|seq| Publication {
            topic: topic.clone(),
            epoch: Arc::from("e"),
            seq,
            data: Bytes::from(vec![b'x'; len]),
        })
        .collect()
    }

    #[test]
    fn a_page_is_bounded_in_messages_and_bytes_and_always_moves_on() {
        let all = publications(1..=10, 100);
        let seqs = |page: Vec<Publication>| page.iter().map(|p| p.seq).collect::<Vec<_>>();
        let by_count = PageSize {
            messages: 3,
            bytes: usize::MAX,
        };
        assert_eq!(seqs(by_count.take(&all)), vec![1, 2, 3]);
        let by_bytes = PageSize {
            messages: 100,
            bytes: 250,
        };
        // The third reaches 250 bytes: it ends the page.
        assert_eq!(seqs(by_bytes.take(&all)), vec![1, 2, 3]);
        let tiny = PageSize {
            messages: 100,
            bytes: 1,
        };
        assert_eq!(seqs(tiny.take(&all)), vec![1], "one larger than a page");
        assert!(tiny.is_full(&tiny.take(&all)));
    }

    #[test]
    fn a_page_continues_only_without_a_gap() {
        let size = PageSize {
            messages: 3,
            bytes: usize::MAX,
        };
        assert!(continues(&publications(4..=6, 1), 3, 10, size));
        assert!(continues(&publications(4..=5, 1), 3, 5, size));
        // Trimmed meanwhile: the read starts after what was asked for.
        assert!(!continues(&publications(5..=7, 1), 3, 10, size));
        // Short of the topic's seq without being full.
        assert!(!continues(&publications(4..=5, 1), 3, 10, size));
        assert!(continues(&[], 10, 10, size));
        assert!(!continues(&[], 3, 10, size), "nothing left of it");
        assert!(!continues(&[], 11, 10, size), "the topic went back");
    }
}
