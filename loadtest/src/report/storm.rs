//! The `storm` section: 10,000 sessions cut at once, every one resuming.

use super::markdown::{count, cpu_line, ms, or_miss, paragraphs, table, verdict};
use super::results::Results;
use crate::scenarios::storm::Storm;

/// Whether every session resumed within 5 s, nothing lost or duplicated.
pub(super) fn met(res: &Storm) -> bool {
    or_miss(res.all_resumed_s) <= 5.0
        && res.lost == 0
        && res.app_duplicates == 0
        && res.resumed == res.cut_clients
}

/// When every session was back, and how many were: `1.83 s (10,000 of 10,000)`.
pub(super) fn resumed(res: &Storm) -> String {
    format!(
        "{} ({} of {})",
        res.all_resumed_s
            .map_or_else(|| "n/a".to_owned(), |s| format!("{s:.2} s")),
        count(res.resumed),
        count(res.cut_clients)
    )
}

pub(super) fn section(results: &Results) -> String {
    let mut out = vec!["## storm: 10,000 sessions cut at once, every one resumes".to_owned()];
    let Some(res) = results.storm("storm") else {
        out.push("Not run.".to_owned());
        return paragraphs(&out);
    };
    let rows = vec![
        vec![
            "all resumed after the cut".to_owned(),
            resumed(res),
            format!("≤ 5 s: {}", verdict(met(res))),
            String::new(),
        ],
        vec![
            "per-client resume p50 / p99".to_owned(),
            format!(
                "{} / {}",
                ms(Some(f64::from(res.resume_time.p50_us))),
                ms(Some(f64::from(res.resume_time.p99_us)))
            ),
            String::new(),
            String::new(),
        ],
        vec![
            "lost / duplicated (application)".to_owned(),
            format!("{} / {}", res.lost, res.app_duplicates),
            "0 / 0".to_owned(),
            String::new(),
        ],
        vec![
            "redelivered on the wire (dropped by the client rule)".to_owned(),
            count(res.wire_duplicates),
            String::new(),
            String::new(),
        ],
    ];
    out.push(table(&["figure", "Herald", "target", "reference"], &rows));
    out.push(format!(
        "Cut: {}; {} clients on {} topics, {:.0} msg/s, acks every {} ms. {}",
        res.cut,
        count(res.clients as u64),
        res.topics,
        res.rate_per_s,
        res.ack_interval_ms,
        cpu_line(&res.cpu)
    ));
    paragraphs(&out)
}
