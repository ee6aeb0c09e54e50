//! The `throughput` section: deliveries per second and per gateway
//! CPU-second with many topics and small messages; and the build before's.

use super::markdown::{cpu_line, paragraphs, table, thousands, verdict};
use super::results::Results;

pub(super) fn section(results: &Results) -> String {
    let mut out = vec![
        "## throughput: many topics, 64-byte messages, as fast as the gateway takes them"
            .to_owned(),
    ];
    let Some(res) = results.throughput("throughput") else {
        out.push("Not run.".to_owned());
        return paragraphs(&out);
    };
    let per_cpu = res.deliveries_per_gateway_cpu_s.unwrap_or(0.0);
    let rows = vec![
        vec![
            "deliveries per gateway CPU-second".to_owned(),
            thousands(per_cpu),
            format!("≥ 300,000: {}", verdict(per_cpu >= 300_000.0)),
        ],
        vec![
            "deliveries per second".to_owned(),
            thousands(res.deliveries_per_s),
            String::new(),
        ],
        vec![
            "publishes per second".to_owned(),
            thousands(res.publishes_per_s),
            String::new(),
        ],
        vec![
            "lost / duplicated".to_owned(),
            format!("{} / {}", res.lost, res.duplicated),
            "0 / 0".to_owned(),
        ],
    ];
    out.push(table(&["figure", "Herald", "target"], &rows));
    out.push(format!(
        "{} clients, each on {} of {} topics ({:.0} subscribers per topic), {} publishing \
         connections. {}",
        res.clients,
        res.subscriptions_per_client,
        res.topics,
        res.fanout,
        res.concurrency,
        cpu_line(&res.cpu)
    ));
    if let Some(before) = results.throughput("throughput-before") {
        out.push(format!(
            "The build before ({}), measured right after in the same run: {} deliveries per \
             gateway CPU-second, {} per second.",
            results.before_label("throughput"),
            thousands(before.deliveries_per_gateway_cpu_s.unwrap_or(0.0)),
            thousands(before.deliveries_per_s)
        ));
    }
    paragraphs(&out)
}
