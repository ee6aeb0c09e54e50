//! The `idle` section: connections held with heartbeats, on one pod and
//! over four (one Redis, a Redis Cluster).

use super::markdown::{count, paragraphs, table, verdict};
use super::results::Results;

pub(super) fn section(results: &Results) -> String {
    let mut out = vec!["## idle: connections held with heartbeats running".to_owned()];
    let mut rows = Vec::new();
    for (name, label) in [
        ("idle", "19,000 on one gateway, 60 s, ping every 5 s"),
        ("idle-pods", "60,000 over 4 gateways with Redis, 60 s"),
        (
            "idle-pods-cluster",
            "60,000 over 4 gateways with a Redis Cluster (3 masters), 60 s",
        ),
    ] {
        let Some(res) = results.idle(name) else {
            // `herald-loadtest run` names the run's first pod's log after
            // it: there and no result means the run failed.
            let outcome = if results.has(&format!("{name}.log")) {
                format!("**failed**: no result (`{name}.log` in the results)")
            } else {
                "not run".to_owned()
            };
            rows.push(vec![
                label.to_owned(),
                outcome,
                String::new(),
                String::new(),
            ]);
            continue;
        };
        let per = res.rss_per_connection_bytes.unwrap_or(0.0);
        let pods: Vec<String> = res.pods.iter().map(|p| count(p.connections)).collect();
        rows.push(vec![
            label.to_owned(),
            format!(
                "{:.2} KiB per connection; {} unexpected closes; pings answered {}; per pod: {}",
                per / 1024.0,
                res.unexpected_closes,
                count(res.pings_answered),
                pods.join(", ")
            ),
            format!(
                "≤ 4 KiB, 0 closes: {}",
                verdict(per <= 4096.0 && res.unexpected_closes == 0)
            ),
            String::new(),
        ]);
    }
    out.push(table(&["run", "Herald", "target", "reference"], &rows));
    paragraphs(&out)
}
