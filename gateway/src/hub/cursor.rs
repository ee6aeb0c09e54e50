//! Where a subscriber stands in a topic, and the one rule that moves it:
//! what makes `since` gapless and duplicate-free whatever order, and
//! however late, the broker hands the hub its frames.

use std::sync::Arc;

use router::{Epoch, Position};

/// What a fanned-out frame is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Publication,
    /// `reset`: continuity was lost; live delivery goes on after its seq.
    Reset,
}

/// Whether a subscriber at `cursor` is sent a frame of `kind` at `epoch`
/// and `seq`, moving the cursor when it is. A publication must be the
/// cursor's epoch and past it; a reset must move the cursor (to another
/// epoch, or forward): one at or behind it was covered already, by history
/// or by an earlier reset. A new epoch comes only after its reset, so a
/// publication of another epoch is a straggler of an epoch left behind.
pub fn admit(cursor: &mut Position, kind: Kind, epoch: &Epoch, seq: u64) -> bool {
    let same_epoch = Arc::ptr_eq(&cursor.epoch, epoch) || cursor.epoch == *epoch;
    match kind {
        Kind::Publication if same_epoch && seq > cursor.seq => {
            cursor.seq = seq;
            true
        }
        Kind::Publication => false,
        Kind::Reset if same_epoch && seq <= cursor.seq => false,
        Kind::Reset => {
            *cursor = Position {
                epoch: epoch.clone(),
                seq,
            };
            true
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// A frame as the broker may hand it to the hub: late, twice, or of an
    /// epoch a reset has left behind.
    #[derive(Debug, Clone)]
    enum Frame {
        Publication(usize, u64),
        Reset(usize, u64),
    }

    fn frames() -> impl Strategy<Value = Vec<Frame>> {
        proptest::collection::vec(
            prop_oneof![
                8 => (0usize..3, 0u64..30).prop_map(|(e, s)| Frame::Publication(e, s)),
                1 => (0usize..3, 0u64..30).prop_map(|(e, s)| Frame::Reset(e, s)),
            ],
            0..80,
        )
    }

    proptest! {
        /// What the hub lets through is what a client following the rule
        /// ("a reset moves you to its epoch and seq; take a message only
        /// above the last one of your epoch") takes in full: the server
        /// itself never sends a duplicate or a straggler.
        #[test]
        fn a_subscriber_is_sent_each_seq_of_its_epoch_once_in_order(
            start in 0u64..10,
            frames in frames(),
        ) {
            let epochs: [Epoch; 3] = [Arc::from("a"), Arc::from("b"), Arc::from("c")];
            let mut cursor = Position { epoch: epochs[0].clone(), seq: start };
            let mut client = (epochs[0].clone(), start);
            for frame in frames {
                let (kind, e, seq) = match frame {
                    Frame::Publication(e, s) => (Kind::Publication, e, s),
                    Frame::Reset(e, s) => (Kind::Reset, e, s),
                };
                let epoch = &epochs[e];
                if !admit(&mut cursor, kind, epoch, seq) {
                    continue;
                }
                match kind {
                    Kind::Reset => client = (epoch.clone(), seq),
                    Kind::Publication => {
                        prop_assert_eq!(&client.0, epoch, "a message of another epoch");
                        prop_assert!(seq > client.1, "seq {} after {}", seq, client.1);
                        client.1 = seq;
                    }
                }
                prop_assert_eq!((&cursor.epoch, cursor.seq), (&client.0, client.1));
            }
        }
    }

    #[test]
    fn the_next_seq_passes_and_a_reset_behind_the_cursor_does_not() {
        let (a, b): (Epoch, Epoch) = (Arc::from("a"), Arc::from("b"));
        let mut cursor = Position {
            epoch: a.clone(),
            seq: 5,
        };
        assert!(admit(&mut cursor, Kind::Publication, &a, 6));
        assert!(!admit(&mut cursor, Kind::Publication, &a, 6));
        assert!(!admit(&mut cursor, Kind::Reset, &a, 4));
        assert!(!admit(&mut cursor, Kind::Publication, &b, 7));
        assert!(admit(&mut cursor, Kind::Reset, &b, 0));
        assert!(admit(&mut cursor, Kind::Publication, &b, 1));
    }
}
