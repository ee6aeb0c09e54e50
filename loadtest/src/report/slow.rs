//! The `slow` section: the fan-out with a client that never reads, and the
//! large-frame run that shows the gateway closing it.

use super::markdown::{cpu_line, ms, paragraphs, table, verdict, x};
use super::results::Results;

pub(super) fn section(results: &Results) -> String {
    let mut out = vec!["## slow: the same, with one client that never reads".to_owned()];
    let Some(res) = results.slow("slow") else {
        out.push("Not run.".to_owned());
        return paragraphs(&out);
    };
    let ratio = res.p99_with_over_without;
    let slow = res.slow_clients.first();
    let growth = res
        .rss
        .iter()
        .filter_map(|g| g.growth)
        .max_by(f64::total_cmp);
    let closed = match slow {
        Some(s) if s.closed => format!(
            "after {:.2} s ({})",
            s.closed_after_s.unwrap_or(0.0),
            s.reason.as_deref().unwrap_or("None")
        ),
        Some(s) => s.end.clone(),
        None => "None".to_owned(),
    };
    let rows = vec![
        vec![
            "healthy clients' p99 without / with it".to_owned(),
            format!(
                "{} / {} ({})",
                ms(Some(f64::from(res.without.latency.p99_us))),
                ms(Some(f64::from(res.with.latency.p99_us))),
                x(Some(ratio))
            ),
            format!("within 10%: {}", verdict(ratio <= 1.10)),
            "Go, sequential loop: every client waited 1.1 s".to_owned(),
        ],
        vec![
            "last client, median without / with".to_owned(),
            format!(
                "{} / {}",
                ms(Some(f64::from(res.without.last_client.p50_us))),
                ms(Some(f64::from(res.with.last_client.p50_us)))
            ),
            String::new(),
            String::new(),
        ],
        vec![
            "slow client closed".to_owned(),
            closed,
            "within write timeout + 1 s".to_owned(),
            String::new(),
        ],
        vec![
            "gateway RSS growth from round 5".to_owned(),
            growth.map_or_else(|| "n/a".to_owned(), |g| format!("{:.1}%", g * 100.0)),
            format!("within 10%: {}", verdict(growth.is_some_and(|g| g <= 0.10))),
            String::new(),
        ],
    ];
    out.push(table(&["figure", "Herald", "target", "reference"], &rows));
    out.push(cpu_line(&res.run.cpu));
    if let Some(big) = results.slow("slow-close") {
        let s = big.slow_clients.first();
        let what = match s {
            Some(s) if s.closed => format!(
                "closed {:.2} s into the slow phase, reason `{}`, its write stuck at most {:.2} s \
                 (write timeout 5 s)",
                s.closed_after_s.unwrap_or(0.0),
                s.reason.as_deref().unwrap_or("None"),
                s.blocked_for_s.unwrap_or(0.0)
            ),
            Some(s) => format!("not closed ({})", s.end),
            None => "not closed (None)".to_owned(),
        };
        out.push(format!(
            "At 1 KiB × 40 rounds the kernel buffers everything the slow client is sent (a \
             loopback socket takes a few MB), so the gateway's writes never block and there is \
             nothing to close. With 60 KB frames (20 clients, 80 rounds 50 ms apart) the slow \
             client was {what}; healthy p99 {} without it, {} with it.",
            ms(Some(f64::from(big.without.latency.p99_us))),
            ms(Some(f64::from(big.with.latency.p99_us)))
        ));
    }
    paragraphs(&out)
}
