//! The `stall` section: a canary topic's latency on a pod watching 20,000
//! topics with Redis 200 ms away, through a burst and a pub/sub reconnect.

use super::markdown::{ms, paragraphs, table};
use super::results::Results;

pub(super) fn section(results: &Results) -> String {
    let mut out = vec![
        "## stall: one pod, 20,000 watched topics, Redis 200 ms away".to_owned(),
        "`herald-loadtest stall`: a canary topic published every 10 ms on a pod that watches \
         20,000 other topics, Redis behind `herald-loadtest proxy`. Phases: steady; a burst of \
         new topics; the pod's pub/sub connection killed (`CLIENT KILL TYPE pubsub`), so that it \
         resyncs every topic. A slow Redis must not stop fan-out for the topics that have \
         nothing to do with it."
            .to_owned(),
        "Before the pub/sub task stopped waiting for Redis itself (2f95892, the same command): \
         burst p99 640 ms, longest gap 463 ms; resync: no canary delivered for the whole 20 s \
         phase (2,004 of 2,004), the pod reading 20,033 topics one 200 ms round trip at a time, \
         over an hour."
            .to_owned(),
    ];
    let Some(res) = results.stall("stall") else {
        out.push("Not run.".to_owned());
        return paragraphs(&out);
    };
    let rows: Vec<Vec<String>> = res
        .phases
        .iter()
        .map(|p| {
            let delivered = |us: u32| {
                if p.delivered == 0 {
                    "none delivered".to_owned()
                } else {
                    ms(Some(f64::from(us)))
                }
            };
            vec![
                format!("{} ({:.0} s)", p.name, p.seconds),
                delivered(p.latency.p99_us),
                delivered(p.latency.max_us),
                format!("{:.0} ms", p.longest_gap_ms),
                format!("{} of {}", p.undelivered, p.sent),
            ]
        })
        .collect();
    out.push(table(
        &[
            "phase",
            "canary p99",
            "canary max",
            "longest gap",
            "not delivered",
        ],
        &rows,
    ));
    out.push(format!(
        "{} new topics confirmed: {}; first canary sent after the kill delivered after: {}. \
         Canary lost / duplicated / out of order / resets: {} / {} / {} / {}.",
        res.burst_topics,
        res.burst_confirmed_s.map_or_else(
            || "not within the phase".to_owned(),
            |s| format!("{s:.1} s")
        ),
        res.first_delivery_after_kill_s
            .map_or_else(|| "none".to_owned(), |s| format!("{s:.2} s")),
        res.lost,
        res.duplicated,
        res.out_of_order,
        res.resets
    ));
    paragraphs(&out)
}
