//! The `pods` section: what a subscriber on another pod pays, against one
//! on the publisher's pod and against the memory broker.

use super::markdown::{cpu_line, ms, paragraphs, table, verdict};
use super::results::Results;

pub(super) fn section(results: &Results) -> String {
    let mut out = vec!["## pods: the cross-pod cost (1,000 clients, 100 msg/s, 256 B)".to_owned()];
    let mut rows = Vec::new();
    for (name, label) in [
        ("pods-memory", "one pod, memory broker"),
        ("pods-one-pod", "Redis, subscribers on the publisher's pod"),
        ("pods-cross-pod", "Redis, subscribers on the other pod"),
    ] {
        let Some(res) = results.fanout(name) else {
            rows.push(vec![
                label.to_owned(),
                "not run".to_owned(),
                String::new(),
                String::new(),
                String::new(),
            ]);
            continue;
        };
        let latency = res.stats.latency;
        rows.push(vec![
            label.to_owned(),
            ms(Some(f64::from(latency.p50_us))),
            ms(Some(f64::from(latency.p99_us))),
            ms(Some(f64::from(latency.max_us))),
            format!("{} / {}", res.lost, res.duplicated),
        ]);
    }
    out.push(table(&["run", "p50", "p99", "max", "lost / dup"], &rows));
    if let (Some(one), Some(cross)) = (
        results.fanout("pods-one-pod"),
        results.fanout("pods-cross-pod"),
    ) {
        let delta =
            (f64::from(cross.stats.latency.p99_us) - f64::from(one.stats.latency.p99_us)) / 1000.0;
        out.push(format!(
            "Cross-pod p99 minus same-pod p99: {delta:+.1} ms (target ≤ 2 ms: {}). {}",
            verdict(delta <= 2.0),
            cpu_line(&cross.cpu)
        ));
    }
    out.push(
        "Publish throughput, through one Redis and through a cluster, is the `publish` section's."
            .to_owned(),
    );
    paragraphs(&out)
}
