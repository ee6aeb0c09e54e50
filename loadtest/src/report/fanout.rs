//! The `fanout` section: 10,000 clients on one topic against the floor, and
//! the build before's ratios when `BEFORE=` measured it.

use super::markdown::{cpu_line, ms, or_miss, paragraphs, table, verdict, x};
use super::results::Results;

pub(super) fn section(results: &Results) -> String {
    let mut out = vec![
        "## fanout: 10,000 clients, 1 topic, 1 KiB, 40 rounds 500 ms apart".to_owned(),
        "`herald-loadtest fanout --floor`: the floor (one thread writing the same frames to as \
         many plain loopback sockets, no WebSocket library) runs first in the same invocation."
            .to_owned(),
    ];
    let Some(res) = results.fanout("fanout") else {
        out.push("Not run.".to_owned());
        return paragraphs(&out);
    };
    let floor = res.floor.as_ref();
    let vs = res.vs_floor;
    let proc = res.processes.first();
    let rss = proc
        .and_then(|p| p.rss_bytes.iter().flatten().max().copied())
        .unwrap_or(0);
    let floor_p50 = floor.map(|f| f64::from(f.stats.last_client.p50_us));
    let floor_p99 = floor.map(|f| f64::from(f.stats.last_client.p99_us));
    let p50_x = vs.map(|v| v.last_client_p50_x);
    let p99_x = vs.map(|v| v.last_client_p99_x);
    let cpu_x = vs.and_then(|v| v.cpu_per_round_x);
    let rows = vec![
        vec![
            "last client, median".to_owned(),
            ms(Some(f64::from(res.stats.last_client.p50_us))),
            format!(
                "≤ 1.0× floor ({}): {}, {}",
                ms(floor_p50),
                x(p50_x),
                verdict(or_miss(p50_x) <= 1.0)
            ),
            "Go: sequential 90.9 ms, 10 sharded workers 30.8 ms, goroutine per client 31.4 ms \
             (10 vCPU)"
                .to_owned(),
        ],
        vec![
            "last client, p99".to_owned(),
            ms(Some(f64::from(res.stats.last_client.p99_us))),
            format!(
                "≤ 1.2× floor ({}): {}, {}",
                ms(floor_p99),
                x(p99_x),
                verdict(or_miss(p99_x) <= 1.2)
            ),
            "Go: 98.9 / 42.7 / 69.7 ms".to_owned(),
        ],
        vec![
            "all deliveries p50 / p99".to_owned(),
            format!(
                "{} / {}",
                ms(Some(f64::from(res.stats.latency.p50_us))),
                ms(Some(f64::from(res.stats.latency.p99_us)))
            ),
            String::new(),
            String::new(),
        ],
        vec![
            "gateway CPU per round".to_owned(),
            format!(
                "{:.1} ms",
                proc.and_then(|p| p.cpu_per_round_s).unwrap_or(0.0) * 1000.0
            ),
            format!(
                "≤ 1.15× the floor writer's ({:.1} ms): {}, {}",
                floor.map_or(0.0, |f| f.writer_cpu_per_round_s) * 1000.0,
                x(cpu_x),
                verdict(or_miss(cpu_x) <= 1.15)
            ),
            String::new(),
        ],
        vec![
            "gateway RSS".to_owned(),
            format!(
                "{:.1} MiB (max over rounds)",
                rss as f64 / f64::from(1 << 20)
            ),
            String::new(),
            "Go: ~240 to 292 MB (goroutine per client)".to_owned(),
        ],
        vec![
            "delivered / lost / duplicated".to_owned(),
            format!("{} / {} / {}", res.deliveries, res.lost, res.duplicated),
            "0 lost, 0 duplicated".to_owned(),
            String::new(),
        ],
    ];
    out.push(table(&["figure", "Herald", "target", "reference"], &rows));
    if let Some(split) = res.gateway_cpu {
        out.push(format!(
            "herald user-space cost per delivery: {:.0} ns; kernel {:.0} ns (gateway CPU per \
             round: user {:.1} ms, kernel {:.1} ms; from /proc, 10 ms ticks).",
            split.user_ns_per_delivery,
            split.system_ns_per_delivery,
            split.user_per_round_s * 1000.0,
            split.system_per_round_s * 1000.0
        ));
    }
    out.push(cpu_line(&res.cpu));
    if let Some(before) = results.fanout("fanout-before") {
        let bvs = before.vs_floor;
        let bsplit = before.gateway_cpu;
        out.push(format!(
            "The build before ({}), measured right after in the same run: gateway CPU per round \
             {} its floor writer's, last client median {} and p99 {} its floor; user-space cost \
             per delivery {:.0} ns, kernel {:.0} ns.",
            results.before_label("fanout"),
            x(bvs.and_then(|v| v.cpu_per_round_x)),
            x(bvs.map(|v| v.last_client_p50_x)),
            x(bvs.map(|v| v.last_client_p99_x)),
            bsplit.map_or(0.0, |s| s.user_ns_per_delivery),
            bsplit.map_or(0.0, |s| s.system_ns_per_delivery),
        ));
    }
    paragraphs(&out)
}

/// What the floor's writer spent per 1 KiB loopback `send`: the machine's
/// speed, for comparing runs across machines.
pub(super) fn floor_send_cost(results: &Results) -> String {
    let floor = results.fanout("fanout").and_then(|r| r.floor.as_ref());
    match floor {
        Some(f) if f.writer_cpu_per_round_s != 0.0 && f.clients != 0 => format!(
            "{:.1} µs",
            f.writer_cpu_per_round_s / f.clients as f64 * 1e6
        ),
        _ => "(not measured)".to_owned(),
    }
}
