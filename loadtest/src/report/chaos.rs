//! The two `chaos` sections: the soak on one Redis (frozen, delayed, failed
//! over, restored from an old dump) and on a Redis Cluster (masters killed,
//! failed over, slots migrated), every stream checked.

use super::markdown::{count, cpu_line, paragraphs, table, verdict};
use super::results::Results;

pub(super) fn one_redis_section(results: &Results) -> String {
    section(
        results,
        "chaos",
        "## chaos: Redis frozen, delayed, failed over and restored from an old dump; every \
         stream checked",
        "A fault lost writes when the Redis the pods came back to held less of a topic's epoch \
         than had been acknowledged or delivered; Herald moves every topic to a new epoch then, \
         so each subscription gets a reset. ",
    )
}

pub(super) fn cluster_section(results: &Results) -> String {
    section(
        results,
        "chaos-cluster",
        "## chaos on a Redis Cluster: masters killed, failed over by hand and to a lagging \
         replica, slots migrated; every stream checked",
        "The pods use a Redis Cluster of three masters with a replica each (`--redis cluster`), \
         the topics two on each master at the start. `master-kill`: kill -9 of a master, its \
         replica promoted by the cluster after the node timeout (1 s), a fresh replica in the \
         dead master's place after the hold; `manual-failover`: `CLUSTER FAILOVER` (the master \
         waits for its replica, nothing lost); `lagging-failover`: the replica frozen (SIGSTOP) \
         and its link cut while the master takes writes for the hold, then the master killed \
         and the replica promoted (`CLUSTER FAILOVER FORCE`); `migrate`: a topic's slot moved \
         to the next master, mid-migration (`ASK`) for the hold; `pod-kill`: kill -9 of a pod. \
         A fault hits one master (the masters in turn): the writes it lost are counted on that \
         master's topics, read from the replica before it could be promoted, and only a reset \
         of one of those topics is explained by it; Herald keeps a lineage per hash slot, so \
         only the topics whose slot lost writes move to a new epoch. ",
    )
}

fn section(results: &Results, name: &str, title: &str, how: &str) -> String {
    let mut out = vec![title.to_owned()];
    let Some(res) = results.chaos(name) else {
        out.push("Not run.".to_owned());
        return paragraphs(&out);
    };
    let faults = &res.faults;
    let kinds: Vec<String> = res
        .faults_by_kind
        .iter()
        .map(|(k, n)| format!("{k} {n}"))
        .collect();
    let lossy = faults.iter().filter(|f| f.lost_writes > 0).count();
    let clean =
        res.lost == 0 && res.duplicated == 0 && res.mismatched == 0 && res.ack_conflicts == 0;
    let row = |figure: &str, value: String, target: String| {
        vec![figure.to_owned(), value, target, String::new()]
    };
    let rows = vec![
        row(
            "ran",
            format!(
                "{:.0} s: {} pods, {} clients with sessions ({} of {} topics each), {} \
                 publishers, {:.0} msg/s",
                res.ran_s,
                res.pods,
                res.clients,
                res.subscriptions,
                res.topics,
                res.publishers,
                res.rate_per_s
            ),
            String::new(),
        ),
        row(
            "faults injected",
            format!("{} ({})", faults.len(), kinds.join(", ")),
            String::new(),
        ),
        row(
            "writes Redis lost",
            format!(
                "{} ({} acknowledged) in {lossy} faults",
                count(res.lost_writes),
                count(res.lost_acked_writes)
            ),
            String::new(),
        ),
        row(
            "publishes acknowledged",
            format!("{} of {}", count(res.acked), count(res.published)),
            String::new(),
        ),
        row(
            "messages checked",
            format!(
                "{} ({} processed, {} redelivered after resumes and dropped by the seq rule)",
                count(res.checked),
                count(res.processed),
                count(res.redelivered)
            ),
            String::new(),
        ),
        row(
            "lost / duplicated / mismatched",
            format!("{} / {} / {}", res.lost, res.duplicated, res.mismatched),
            format!("0 / 0 / 0: {}", verdict(clean)),
        ),
        row(
            "resets after faults that lost writes / history gaps / elsewhere",
            format!(
                "{} / {} / {}",
                count(res.resets_expected),
                res.resets_history,
                res.resets_unexpected
            ),
            format!("none elsewhere: {}", verdict(res.resets_unexpected == 0)),
        ),
        row(
            "sessions resumed / lost",
            format!("{} / {}", count(res.resumes), res.sessions_lost),
            String::new(),
        ),
    ];
    out.push(table(&["figure", "Herald", "target", "reference"], &rows));
    let at = |at_s: f64| format!("{at_s:.1} s");
    if faults.iter().any(|f| f.master.is_some_and(|m| m != 0)) {
        let rows: Vec<Vec<String>> = faults
            .iter()
            .map(|f| {
                let master = match f.master.filter(|&m| m != 0) {
                    Some(m) => {
                        let topics: Vec<String> =
                            f.topics.iter().flatten().map(ToString::to_string).collect();
                        let topics = if topics.is_empty() {
                            "none".to_owned()
                        } else {
                            topics.join(", ")
                        };
                        format!("{m} ({topics})")
                    }
                    None => String::new(),
                };
                vec![
                    f.kind.name().to_owned(),
                    at(f.at_s),
                    master,
                    format!("{} ({})", f.lost_writes, f.lost_acked),
                    f.resets.to_string(),
                ]
            })
            .collect();
        out.push(table(
            &[
                "fault",
                "at",
                "master (its topics)",
                "writes lost (acknowledged)",
                "resets",
            ],
            &rows,
        ));
        // By kind, in the order the kinds first came.
        let mut by_kind: Vec<(&str, u64, u64, u64)> = Vec::new();
        for f in faults {
            let kind = f.kind.name();
            match by_kind.iter_mut().find(|(k, ..)| *k == kind) {
                Some((_, n, lost, resets)) => {
                    *n += 1;
                    *lost += f.lost_writes;
                    *resets += f.resets;
                }
                None => by_kind.push((kind, 1, f.lost_writes, f.resets)),
            }
        }
        let by_kind: Vec<String> = by_kind
            .iter()
            .map(|(k, n, lost, resets)| format!("{k} {lost} lost, {resets} resets in {n}"))
            .collect();
        let reasons = res.publish_error_reasons.join("; ");
        out.push(format!(
            "Masters are named by port. Writes lost and resets by kind: {}. Publishes that \
             failed, by reason: {}.",
            by_kind.join("; "),
            if reasons.is_empty() { "none" } else { &reasons }
        ));
    } else {
        let rows: Vec<Vec<String>> = faults
            .iter()
            .map(|f| {
                vec![
                    f.kind.name().to_owned(),
                    at(f.at_s),
                    format!("{} ({})", f.lost_writes, f.lost_acked),
                    f.resets.to_string(),
                ]
            })
            .collect();
        out.push(table(
            &["fault", "at", "writes lost (acknowledged)", "resets"],
            &rows,
        ));
    }
    if !res.problem_counts.is_empty() {
        let problems: Vec<String> = res
            .problem_counts
            .iter()
            .map(|(k, n)| format!("{k} {n}"))
            .collect();
        out.push(format!(
            "Streams that failed the check, by kind: {} (the run's `streams.txt` shows the first \
             few of each, with the session stored at the end).",
            problems.join(", ")
        ));
    }
    out.push(format!(
        "Seed {} (`--seed` replays the schedule). Each client checks its stream per topic: split \
         at every `reset`, seqs contiguous and never processed twice within an epoch, every \
         message the publish its publisher was acknowledged for at that `(topic, epoch, seq)`, \
         the last segment up to the topic's newest acknowledged seq. {how}{}",
        res.seed,
        cpu_line(&res.cpu)
    ));
    paragraphs(&out)
}
