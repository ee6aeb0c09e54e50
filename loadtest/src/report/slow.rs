//! The `slow` section: the fan-out with a client that never reads, the
//! large-frame run that shows the gateway closing it, and the `lag` run
//! (issue #25): 100 clients that stop reading for 10 s, caught up from
//! history.

use super::markdown::{cpu_line, ms, paragraphs, table, verdict, x};
use super::results::Results;
use crate::scenarios::slow::Slow;

pub(super) fn section(results: &Results) -> String {
    let mut out = vec!["## slow: the same, with one client that never reads".to_owned()];
    let Some(res) = results.slow("slow") else {
        out.push("Not run.".to_owned());
        out.extend(lag(results));
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
    out.extend(lag(results));
    paragraphs(&out)
}

/// The healthy clients' p99 over the pause's rounds, with the lagging
/// clients and without them: against `lag-baseline` (the same run without
/// them, the yardstick) where it ran, as the same rounds there see
/// the same history filling up; else against the rounds before the pause.
fn healthy_p99(res: &Slow, baseline: Option<&Slow>) -> Vec<String> {
    let with = f64::from(res.with.latency.p99_us);
    let (label, without) = match baseline {
        Some(b) => (
            "healthy clients' p99 over the pause's rounds, `lag-baseline` / this run",
            f64::from(b.with.latency.p99_us),
        ),
        None => (
            "healthy clients' p99 before / during the pause",
            f64::from(res.without.latency.p99_us),
        ),
    };
    let ratio = (without > 0.0).then(|| with / without);
    vec![
        label.to_owned(),
        format!("{} / {} ({})", ms(Some(without)), ms(Some(with)), x(ratio)),
        format!("within 10%: {}", verdict(ratio.is_some_and(|r| r <= 1.10))),
    ]
}

/// The `lag` run's table (issue #25's targets), when it ran.
fn lag(results: &Results) -> Vec<String> {
    let Some(res) = results.slow("lag") else {
        return Vec::new();
    };
    let Some(c) = &res.catch_up else {
        return vec!["### lag\n\nThe `lag` run holds no catch-up figures.".to_owned()];
    };
    let mib = |b: Option<u64>| {
        b.map_or("n/a".to_owned(), |b| {
            format!("{:.1} MiB", b as f64 / 1048576.0)
        })
    };
    let rss = c
        .rss
        .iter()
        .map(|r| {
            format!(
                "{} {} → {}",
                r.name,
                mib(r.before_bytes),
                mib(r.after_bytes)
            )
        })
        .collect::<Vec<_>>()
        .join("; ");
    let zero = |n: u64| format!("0: {}", verdict(n == 0));
    let rows = vec![
        vec![
            "lagging clients disconnected".to_owned(),
            format!("{} of {}", c.disconnected, c.clients),
            zero(c.disconnected as u64),
        ],
        vec!["rounds lost".to_owned(), c.lost.to_string(), zero(c.lost)],
        vec![
            "rounds duplicated".to_owned(),
            c.duplicated.to_string(),
            zero(c.duplicated),
        ],
        vec![
            "back on the live stream".to_owned(),
            format!("{} of {}", c.back_live, c.clients),
            format!("all: {}", verdict(c.back_live == c.clients)),
        ],
        vec![
            "all caught up after reading again".to_owned(),
            c.caught_up_s
                .map_or("not within the wait".to_owned(), |s| format!("{s:.2} s")),
            String::new(),
        ],
        healthy_p99(res, results.slow("lag-baseline")),
        vec![
            "pod RSS before the pause → after the catch-up".to_owned(),
            rss,
            "flat".to_owned(),
        ],
    ];
    vec![
        format!(
            "### lag: {} clients stop reading for rounds {:?}, then read again\n\n\
             `on_lag = \"catch_up\"` (docs/protocol.md#lagging-clients): the pod stops sending \
             them the topic, and serves it from history once they read again; {} rounds more \
             went out while they caught up.",
            c.clients,
            c.paused_rounds,
            c.after_rounds.len()
        ),
        table(&["figure", "Herald", "target"], &rows),
    ]
}
