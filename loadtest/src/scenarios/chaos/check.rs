//! The judgement after a `chaos` run, from what the publishers were
//! answered, what each client logged and what each fault left in Redis.
//! Pure: the run collects, this decides.
//!
//! Each client's stream of a topic is split at every `reset` (and at an
//! `ok` that did not recover) into segments, each in one epoch:
//! - within a segment, seqs processed under the protocol's rule (a `msg` not
//!   above the last one processed is dropped: a redelivery) must follow on
//!   one another: a skipped seq is **lost**;
//! - every `msg`'s data must be the publish the publisher was answered for
//!   that `(topic, epoch, seq)`, or, for a publish whose answer never came,
//!   the one every other client got there: otherwise **mismatched** (a seq
//!   issued twice in one epoch and delivered silently);
//! - a seq processed twice in one epoch, or one publish found at two
//!   places, is **duplicated**; two publishes answered with one `(topic,
//!   epoch, seq)` is an **ack conflict**;
//! - the last segment must be in the topic's final epoch and reach its
//!   newest answered seq: what it lacks is lost too;
//! - every break (a `reset`) must follow a fault that really lost writes
//!   (between the segment's start and the reset) where the topic was (on a
//!   cluster, on the master the fault hit), or be a gap longer than the
//!   history could bridge (same epoch); any other is **unexpected**.
//!
//! A fault lost writes when the Redis the pods came back to holds less of
//! the topic's epoch than was issued before: seqs above its position that a
//! publisher was answered, or a client delivered, before the pods could
//! reach it. Only the topics the fault could touch count ([`Fault::covers`]:
//! all of one Redis's, a cluster master's own).

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use super::client::{Event, Log};
use super::faults::Fault;
use super::publisher::Attempt;

/// Problems of each kind described in the result, at most.
const PROBLEMS_KEPT: u64 = 5;

/// `(topic, epoch)`.
type Series = (usize, Arc<str>);
/// `(topic, epoch, seq)`.
type Place = (usize, Arc<str>, u64);

/// What the check found.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Verdict {
    /// Publishes answered 200.
    pub acked: u64,
    /// `msg` frames checked (redeliveries included).
    pub checked: u64,
    /// Processed under the protocol's rule.
    pub processed: u64,
    /// Dropped by the rule (at-least-once replay after a resume).
    pub redelivered: u64,
    pub lost: u64,
    pub duplicated: u64,
    pub mismatched: u64,
    pub ack_conflicts: u64,
    /// Resets after a fault that lost writes.
    pub resets_expected: u64,
    /// Resets where the history could not bridge a gap.
    pub resets_history: u64,
    pub resets_unexpected: u64,
    /// Answered publishes a client did not get because a reset skipped them.
    pub skipped_at_resets: u64,
    /// Per topic, the final epoch and its newest answered seq.
    pub finals: Vec<Option<(String, u64)>>,
    pub problems: Vec<String>,
    /// How many problems of each kind were found.
    pub problem_counts: std::collections::BTreeMap<String, u64>,
    /// `(client, topic)` of the streams the problems were found in.
    pub problem_streams: Vec<(usize, usize)>,
}

impl Verdict {
    /// A problem of `kind`; the first few of each kind are described.
    fn problem(&mut self, kind: &str, what: impl FnOnce() -> String) -> bool {
        let count = self.problem_counts.entry(kind.to_owned()).or_default();
        *count += 1;
        if *count > PROBLEMS_KEPT {
            return false;
        }
        self.problems.push(format!("{kind}: {}", what()));
        true
    }

    /// A problem in the stream of `client` on `topic`.
    fn in_stream(
        &mut self,
        kind: &str,
        client: usize,
        topic: usize,
        what: impl FnOnce() -> String,
    ) {
        if self.problem(kind, what) && !self.problem_streams.contains(&(client, topic)) {
            self.problem_streams.push((client, topic));
        }
    }
}

/// Judges the run; fills in each fault's `lost_writes`, `lost_acked` and
/// `resets`. `streams` are `(client, log)`.
pub fn check(
    topics: usize,
    attempts: &[Attempt],
    faults: &mut [Fault],
    streams: &[(usize, &Log)],
    history_size: u64,
) -> Verdict {
    let mut v = Verdict::default();

    // What the publishers were answered.
    let mut acked: HashMap<Place, (u64, u32)> = HashMap::new();
    let mut published: HashMap<u64, usize> = HashMap::new();
    let mut finals: Vec<Option<(Arc<str>, u64, u32)>> = vec![None; topics];
    for a in attempts {
        published.insert(a.id, a.topic);
        let Ok(answer) = &a.answer else { continue };
        v.acked += 1;
        let place = (a.topic, answer.epoch.clone(), answer.seq);
        match acked.get(&place) {
            Some(&(id, _)) if id != a.id => {
                v.ack_conflicts += 1;
                v.problem("ack conflict", || {
                    format!(
                        "topic {} epoch {} seq {}: publishes {id:#x} and {:#x} both answered with it",
                        a.topic, answer.epoch, answer.seq, a.id
                    )
                });
            }
            _ => {
                acked.insert(place, (a.id, answer.at));
            }
        }
        if let Some(last) = finals.get_mut(a.topic) {
            let newer = last
                .as_ref()
                .is_none_or(|&(_, seq, at)| (answer.at, answer.seq) > (at, seq));
            if newer {
                *last = Some((answer.epoch.clone(), answer.seq, answer.at));
            }
        }
    }
    // The final epoch's newest seq (answers may come out of order).
    let finals: Vec<Option<(Arc<str>, u64)>> = finals
        .into_iter()
        .enumerate()
        .map(|(t, f)| {
            f.map(|(epoch, _, _)| {
                let top = acked
                    .keys()
                    .filter(|(topic, e, _)| *topic == t && *e == epoch)
                    .map(|&(_, _, s)| s)
                    .max()
                    .unwrap_or(0);
                (epoch, top)
            })
        })
        .collect();
    let mut acked_seqs: HashMap<Series, Vec<u64>> = HashMap::new();
    for (topic, epoch, seq) in acked.keys() {
        acked_seqs
            .entry((*topic, epoch.clone()))
            .or_default()
            .push(*seq);
    }
    for seqs in acked_seqs.values_mut() {
        seqs.sort_unstable();
    }
    let acked_above = |series: &Series, above: u64| -> u64 {
        acked_seqs.get(series).map_or(0, |seqs| {
            (seqs.len() - seqs.partition_point(|&s| s <= above)) as u64
        })
    };

    // What the clients were delivered: the first publish seen at each place.
    let mut observed: HashMap<Place, (Option<u64>, u32)> = HashMap::new();
    let mut placed: HashMap<u64, Place> = HashMap::new();
    for (client, log) in streams {
        let mut epoch: Option<Arc<str>> = None;
        for event in &log.events {
            match event {
                Event::Start {
                    epoch: e,
                    recovered,
                    ..
                } if !recovered || epoch.is_none() => epoch = Some(e.clone()),
                Event::Start { .. } | Event::Gone { .. } | Event::Welcome { .. } => {}
                Event::Reset { epoch: e, .. } => epoch = Some(e.clone()),
                Event::Msg { seq, id, at } => {
                    let Some(epoch) = &epoch else { continue };
                    let place = (log.topic, epoch.clone(), *seq);
                    if observed.contains_key(&place) {
                        continue;
                    }
                    observed.insert(place.clone(), (*id, *at));
                    let Some(id) = id else { continue };
                    match placed.get(id) {
                        Some(first) if *first != place => {
                            v.duplicated += 1;
                            let first = first.clone();
                            v.problem("publish at two places", || {
                                format!(
                                    "publish {id:#x} delivered at topic {} epoch {} seq {} and at epoch {} seq {} (client {client})",
                                    place.0, first.1, first.2, place.1, place.2
                                )
                            });
                        }
                        Some(_) => {}
                        None => {
                            placed.insert(*id, place);
                        }
                    }
                }
            }
        }
    }

    // What each fault lost.
    let mut lossy: Vec<(u32, usize)> = Vec::new();
    for (f, fault) in faults.iter_mut().enumerate() {
        let (Some(restored), Some(reopened)) = (&fault.restored, fault.reopened_ms) else {
            continue;
        };
        let reopened = u32::try_from(reopened).unwrap_or(u32::MAX);
        let covered: Vec<usize> = (0..topics).filter(|&t| fault.covers(t)).collect();
        for t in covered {
            // The topic's epoch before: that of its newest answer before.
            let before = acked
                .iter()
                .filter(|((topic, _, _), (_, at))| *topic == t && *at < reopened)
                .max_by_key(|((_, _, seq), (_, at))| (*at, *seq))
                .map(|((_, epoch, _), _)| epoch.clone());
            let Some(before) = before else { continue };
            let floor = match restored.get(t).and_then(Option::as_ref) {
                Some(p) if *p.epoch == *before => p.seq,
                _ => 0,
            };
            let mut issued: HashSet<u64> = HashSet::new();
            for ((topic, epoch, seq), (_, at)) in &acked {
                if *topic == t && *epoch == before && *seq > floor && *at < reopened {
                    issued.insert(*seq);
                    fault.lost_acked += 1;
                }
            }
            for ((topic, epoch, seq), (_, at)) in &observed {
                if *topic == t && *epoch == before && *seq > floor && *at < reopened {
                    issued.insert(*seq);
                }
            }
            fault.lost_writes += issued.len() as u64;
        }
        if fault.lossy() {
            lossy.push((reopened, f));
        }
    }
    lossy.sort_unstable();

    // Each stream.
    for (client, log) in streams {
        let topic = log.topic;
        let mut epoch: Option<Arc<str>> = None;
        let mut last = 0u64;
        let mut since = 0u32;
        let mut processed: HashMap<Arc<str>, HashSet<u64>> = HashMap::new();
        for event in &log.events {
            let (new_epoch, seq, at, recovered) = match event {
                Event::Start {
                    epoch,
                    seq,
                    recovered,
                    at,
                } => (epoch, *seq, *at, *recovered),
                Event::Reset { epoch, seq, at } => (epoch, *seq, *at, false),
                Event::Gone { .. } | Event::Welcome { .. } => continue,
                Event::Msg { seq, id, .. } => {
                    let Some(current) = &epoch else { continue };
                    v.checked += 1;
                    let place = (topic, current.clone(), *seq);
                    let expected = acked
                        .get(&place)
                        .map(|&(id, _)| Some(id))
                        .or_else(|| observed.get(&place).map(|&(id, _)| id));
                    let wrong_topic = id.and_then(|id| published.get(&id)) != Some(&topic);
                    if expected.flatten() != *id || id.is_none() || wrong_topic {
                        v.mismatched += 1;
                        v.in_stream("mismatch", *client, topic, || {
                            format!(
                                "client {client} topic {topic} epoch {current} seq {seq}: got publish {:?}, expected {:?}",
                                id.map(|i| format!("{i:#x}")),
                                expected.flatten().map(|i| format!("{i:#x}"))
                            )
                        });
                    }
                    if *seq <= last {
                        v.redelivered += 1;
                        continue;
                    }
                    if *seq > last + 1 {
                        v.lost += seq - last - 1;
                        v.in_stream("gap", *client, topic, || {
                            format!(
                                "client {client} topic {topic} epoch {current}: seqs {} to {} missing",
                                last + 1,
                                seq - 1
                            )
                        });
                    }
                    if !processed.entry(current.clone()).or_default().insert(*seq) {
                        v.duplicated += 1;
                        v.in_stream("processed twice", *client, topic, || {
                            format!("client {client} topic {topic} epoch {current} seq {seq}: processed twice")
                        });
                    }
                    v.processed += 1;
                    last = *seq;
                    continue;
                }
            };
            let Some(old) = epoch.clone() else {
                (epoch, last, since) = (Some(new_epoch.clone()), seq, at);
                continue;
            };
            if recovered && **new_epoch == *old {
                // A `sub` with `since` that the history bridged: no break.
                continue;
            }
            if !recovered && **new_epoch == *old && seq <= last {
                // Told again of the epoch it is in, at or below what it
                // processed (the reset it may not have read, sent again on
                // a resume): the client carries on, nothing skipped.
                continue;
            }
            // A break: is it explained?
            let fault = lossy.iter().rev().find(|&&(reopened, f)| {
                reopened > since && reopened <= at && faults[f].covers(topic)
            });
            if let Some(&(_, f)) = fault {
                v.resets_expected += 1;
                faults[f].resets += 1;
            } else if **new_epoch == *old && seq > last + history_size {
                v.resets_history += 1;
            } else {
                v.resets_unexpected += 1;
                v.in_stream("unexpected reset", *client, topic, || {
                    format!(
                        "client {client} topic {topic}: reset at {:.3} s from epoch {old} seq {last} to epoch {new_epoch} seq {seq}, after no fault that lost writes",
                        f64::from(at) / 1000.0
                    )
                });
            }
            v.skipped_at_resets += if **new_epoch == *old {
                acked_above(&(topic, old.clone()), last)
                    .saturating_sub(acked_above(&(topic, old.clone()), seq))
            } else {
                acked_above(&(topic, old.clone()), last)
            };
            (epoch, last, since) = (Some(new_epoch.clone()), seq, at);
        }
        // The end: the final epoch, up to its newest answered seq.
        let Some((final_epoch, top)) = finals.get(topic).cloned().flatten() else {
            continue;
        };
        match &epoch {
            Some(e) if *e == final_epoch => {
                let missing = acked_above(&(topic, final_epoch.clone()), last);
                if missing > 0 {
                    v.lost += missing;
                    v.in_stream("ended short", *client, topic, || {
                        format!(
                            "client {client} topic {topic} epoch {final_epoch}: ended at seq {last} of {top}"
                        )
                    });
                }
            }
            other => {
                v.lost += acked_above(&(topic, final_epoch.clone()), 0);
                v.in_stream("ended in another epoch", *client, topic, || {
                    format!(
                        "client {client} topic {topic}: ended in epoch {}, the topic's final epoch is {final_epoch}",
                        other.as_deref().unwrap_or("none")
                    )
                });
            }
        }
    }
    v.finals = finals
        .into_iter()
        .map(|f| f.map(|(e, s)| (e.to_string(), s)))
        .collect();
    v
}

#[cfg(test)]
mod tests {
    use super::super::faults::{Kind, Position};
    use super::super::publisher::Answer;
    use super::*;

    fn e(s: &str) -> Arc<str> {
        Arc::from(s)
    }

    /// Publish `id` on topic 0, answered `(epoch, seq)` at `at` ms.
    fn ack(id: u64, epoch: &str, seq: u64, at: u32) -> Attempt {
        Attempt {
            id,
            topic: 0,
            sent: at,
            answer: Ok(Answer {
                epoch: e(epoch),
                seq,
                at,
            }),
        }
    }

    fn start(epoch: &str, seq: u64) -> Event {
        Event::Start {
            epoch: e(epoch),
            seq,
            recovered: false,
            at: 0,
        }
    }

    fn msg(seq: u64, id: u64, at: u32) -> Event {
        Event::Msg {
            seq,
            id: Some(id),
            at,
        }
    }

    fn reset(epoch: &str, seq: u64, at: u32) -> Event {
        Event::Reset {
            epoch: e(epoch),
            seq,
            at,
        }
    }

    fn log(events: Vec<Event>) -> Log {
        Log { topic: 0, events }
    }

    /// A restore at `reopened` ms that left topic 0 at `(epoch, seq)`.
    fn restore(reopened: u64, epoch: &str, seq: u64) -> Fault {
        Fault {
            kind: Kind::Restore,
            at_s: 0.0,
            took_s: 0.0,
            hold_s: 0.0,
            detail: String::new(),
            reopened_ms: Some(reopened),
            restored: Some(vec![Some(Position {
                epoch: epoch.to_owned(),
                seq,
            })]),
            master: None,
            topics: None,
            lost_writes: 0,
            lost_acked: 0,
            resets: 0,
            error: None,
        }
    }

    fn run(attempts: &[Attempt], faults: &mut [Fault], logs: &[Log]) -> Verdict {
        let streams: Vec<(usize, &Log)> = logs.iter().enumerate().collect();
        check(1, attempts, faults, &streams, 100)
    }

    /// Publishes 1 to 3 in epoch A; the restore keeps 1; 2 and 3 are lost;
    /// epoch B goes on from 1 with publishes 4 and 5.
    fn lossy_history() -> Vec<Attempt> {
        vec![
            ack(1, "A", 1, 10),
            ack(2, "A", 2, 20),
            ack(3, "A", 3, 30),
            ack(4, "B", 2, 200),
            ack(5, "B", 3, 210),
        ]
    }

    #[test]
    fn a_complete_stream_passes() {
        let attempts = [ack(1, "A", 1, 10), ack(2, "A", 2, 20)];
        let logs = [log(vec![start("A", 0), msg(1, 1, 11), msg(2, 2, 21)])];
        let v = run(&attempts, &mut [], &logs);
        assert_eq!((v.checked, v.processed, v.lost), (2, 2, 0), "{v:?}");
        assert_eq!((v.mismatched, v.duplicated, v.resets_unexpected), (0, 0, 0));
        assert_eq!(v.finals, vec![Some(("A".to_owned(), 2))]);
    }

    #[test]
    fn a_reset_told_again_into_the_epoch_the_client_is_in_is_no_break() {
        let attempts: Vec<_> = (1..=3).map(|s| ack(s, "A", s, s as u32 * 10)).collect();
        let logs = [log(vec![
            start("A", 0),
            msg(1, 1, 11),
            msg(2, 2, 21),
            // A resume repeats a reset to A at 1 the client had read: it
            // carries on, and 2 comes again as a redelivery.
            reset("A", 1, 25),
            msg(2, 2, 26),
            msg(3, 3, 31),
        ])];
        let v = run(&attempts, &mut [], &logs);
        assert_eq!(
            (v.lost, v.duplicated, v.resets_unexpected),
            (0, 0, 0),
            "{v:?}"
        );
        assert_eq!((v.processed, v.redelivered), (3, 1));
    }

    #[test]
    fn redeliveries_are_dropped_and_gaps_and_a_short_end_are_lost() {
        let attempts: Vec<_> = (1..=5).map(|s| ack(s, "A", s, s as u32 * 10)).collect();
        let logs = [log(vec![
            start("A", 0),
            msg(1, 1, 11),
            msg(2, 2, 21),
            msg(2, 2, 22),
            msg(4, 4, 41),
        ])];
        let v = run(&attempts, &mut [], &logs);
        assert_eq!(v.redelivered, 1);
        // 3 skipped, 5 never came.
        assert_eq!(v.lost, 2, "{v:?}");
        assert_eq!(v.mismatched, 0);
    }

    #[test]
    fn a_seq_issued_twice_in_one_epoch_is_a_mismatch_and_an_ack_conflict() {
        // Redis went back in time and Herald did not notice: seq 2 of epoch
        // A issued again, to publish 3.
        let attempts = [ack(1, "A", 1, 10), ack(2, "A", 2, 20), ack(3, "A", 2, 300)];
        let logs = [
            log(vec![start("A", 0), msg(1, 1, 11), msg(2, 2, 21)]),
            log(vec![start("A", 1), msg(2, 3, 301)]),
        ];
        let v = run(&attempts, &mut [], &logs);
        assert_eq!(v.ack_conflicts, 1, "{v:?}");
        assert_eq!(v.mismatched, 1);
    }

    #[test]
    fn a_reset_after_a_fault_that_lost_writes_is_expected() {
        let attempts = lossy_history();
        let mut faults = [restore(100, "A", 1)];
        let logs = [log(vec![
            start("A", 0),
            msg(1, 1, 11),
            msg(2, 2, 21),
            reset("B", 1, 150),
            msg(2, 4, 201),
            msg(3, 5, 211),
        ])];
        let v = run(&attempts, &mut faults, &logs);
        assert_eq!((faults[0].lost_writes, faults[0].lost_acked), (2, 2));
        assert_eq!((v.resets_expected, v.resets_unexpected), (1, 0), "{v:?}");
        assert_eq!(faults[0].resets, 1);
        assert_eq!((v.lost, v.mismatched, v.duplicated), (0, 0, 0), "{v:?}");
        // Seq 3 of A was answered, never delivered: the reset told it.
        assert_eq!(v.skipped_at_resets, 1);
    }

    #[test]
    fn a_reset_after_no_lossy_fault_is_unexpected() {
        let attempts = lossy_history();
        // The fault left everything: it lost nothing.
        let mut faults = [restore(100, "A", 3)];
        let logs = [log(vec![
            start("A", 0),
            msg(1, 1, 11),
            reset("B", 1, 150),
            msg(2, 4, 201),
            msg(3, 5, 211),
        ])];
        let v = run(&attempts, &mut faults, &logs);
        assert!(!faults[0].lossy());
        assert_eq!(v.resets_unexpected, 1, "{v:?}");
        // A reset before the fault is not explained by it either.
        let mut faults = [restore(100, "A", 1)];
        let logs = [log(vec![
            start("A", 0),
            msg(1, 1, 11),
            reset("B", 1, 50),
            msg(2, 4, 201),
            msg(3, 5, 211),
        ])];
        assert_eq!(run(&attempts, &mut faults, &logs).resets_unexpected, 1);
    }

    #[test]
    fn on_a_cluster_only_a_fault_on_the_topics_master_explains_its_reset() {
        // Topic 0 lost 2 and 3 to a master's failover; topic 1, on another
        // master, lost nothing, yet a client of it got a reset.
        let mut attempts = lossy_history();
        attempts.extend([(11, "C", 1, 10), (12, "C", 2, 20), (13, "D", 1, 210)].map(
            |(id, epoch, seq, at)| Attempt {
                topic: 1,
                ..ack(id, epoch, seq, at)
            },
        ));
        let on_master = |topics: Vec<usize>| {
            let mut fault = restore(100, "A", 1);
            fault.kind = Kind::LaggingFailover;
            fault.master = Some(7001);
            fault.restored = Some(vec![
                Some(Position {
                    epoch: "A".to_owned(),
                    seq: 1,
                }),
                None,
            ]);
            fault.topics = Some(topics);
            fault
        };
        let logs = [
            log(vec![
                start("A", 0),
                msg(1, 1, 11),
                reset("B", 1, 150),
                msg(2, 4, 201),
                msg(3, 5, 211),
            ]),
            Log {
                topic: 1,
                events: vec![
                    start("C", 0),
                    msg(1, 11, 11),
                    msg(2, 12, 21),
                    reset("D", 0, 160),
                    msg(1, 13, 211),
                ],
            },
        ];
        let streams: Vec<(usize, &Log)> = logs.iter().enumerate().collect();
        let mut faults = [on_master(vec![0])];
        let v = check(2, &attempts, &mut faults, &streams, 100);
        // Only topic 0's writes count (topic 1's, not on that master, would
        // all have been "lost": the fault read no position of it).
        assert_eq!((faults[0].lost_writes, faults[0].resets), (2, 1), "{v:?}");
        assert_eq!((v.resets_expected, v.resets_unexpected), (1, 1), "{v:?}");
        assert!(
            v.problems.iter().any(|p| p.contains("client 1 topic 1")),
            "{v:?}"
        );
        // The same fault on both topics' master explains both.
        let mut faults = [on_master(vec![0, 1])];
        let v = check(2, &attempts, &mut faults, &streams, 100);
        assert_eq!((v.resets_expected, v.resets_unexpected), (2, 0), "{v:?}");
    }

    #[test]
    fn a_silent_epoch_change_is_caught() {
        // Epoch B began without a reset: the client takes B's seqs for A's.
        let attempts = lossy_history();
        let mut faults = [restore(100, "A", 1)];
        let logs = [log(vec![
            start("A", 0),
            msg(1, 1, 11),
            msg(2, 2, 21),
            msg(2, 4, 201),
            msg(3, 5, 211),
        ])];
        let v = run(&attempts, &mut faults, &logs);
        assert!(v.mismatched >= 1, "{v:?}");
        assert!(v.lost > 0, "never reached the final epoch: {v:?}");
    }

    #[test]
    fn a_gap_beyond_the_history_explains_a_reset_in_the_same_epoch() {
        let attempts: Vec<_> = (1..=150).map(|s| ack(s, "A", s, s as u32)).collect();
        let mut events = vec![start("A", 0), msg(1, 1, 1), reset("A", 140, 145)];
        events.extend((141..=150).map(|s| msg(s, s, s as u32)));
        let v = run(&attempts, &mut [], &[log(events)]);
        assert_eq!(
            (v.resets_history, v.resets_unexpected, v.lost),
            (1, 0, 0),
            "{v:?}"
        );
        assert_eq!(v.skipped_at_resets, 139);
    }

    #[test]
    fn one_publish_at_two_places_is_a_duplicate() {
        let attempts = [ack(1, "A", 1, 10), ack(2, "A", 2, 20)];
        let logs = [log(vec![start("A", 0), msg(1, 1, 11), msg(2, 1, 21)])];
        let v = run(&attempts, &mut [], &logs);
        assert!(v.duplicated >= 1 && v.mismatched >= 1, "{v:?}");
    }
}
