//! The `deflate` section (issue #26): permessage-deflate off and on in one
//! run, against the same build. The fan-out (`deflate-fanout-off`, `-on`:
//! `fanout` with the load tool's own clients, without and with the offer),
//! `throughput` (`deflate-throughput-off`, `-on`) and idle memory
//! (`deflate-idle-off`, `-on`).

use super::markdown::{count, cpu_line, paragraphs, table, thousands, verdict};
use super::results::Results;
use crate::scenarios::fanout::Fanout;

/// Gateway CPU per delivery with deflate on: at most this times off.
pub const FANOUT_CPU_TARGET: f64 = 1.1;
/// Deliveries per gateway CPU-second with deflate on: at least this times off.
pub const THROUGHPUT_TARGET: f64 = 0.9;
/// How much more the pod's RSS per idle connection with compression may be
/// than without and still count as no more: two processes' RSS differ by
/// some pages whatever they hold (the allocator's arenas, the runtime's
/// buffers); 1% of 4 KiB per connection is 40 B.
const IDLE_NOISE: f64 = 1.01;

/// Why a run has no result: failed (its pod's log is there), or not run.
fn missing(results: &Results, name: &str) -> String {
    if results.has(&format!("{name}.log")) {
        format!("**failed**: no result (`{name}.log` in the results)")
    } else {
        "not run".to_owned()
    }
}

/// The gateway's CPU per delivery, nanoseconds: (all, kernel).
fn per_delivery(res: &Fanout) -> Option<(f64, f64)> {
    let split = res.gateway_cpu?;
    Some((
        split.user_ns_per_delivery + split.system_ns_per_delivery,
        split.system_ns_per_delivery,
    ))
}

/// `2,345 ns (kernel 1,600: 68%); lost 0`, or why not.
fn fanout_cell(results: &Results, name: &str) -> String {
    let Some(res) = results.fanout(name) else {
        return missing(results, name);
    };
    let failures = res.failures();
    if !failures.is_empty() {
        return format!("**failed**: {}", failures.join("; "));
    }
    match per_delivery(res) {
        Some((all, kernel)) => format!(
            "{} ns (kernel {}: {:.0}%)",
            thousands(all),
            thousands(kernel),
            kernel * 100.0 / all.max(1.0)
        ),
        None => "n/a (no gateway pid)".to_owned(),
    }
}

fn idle_cell(results: &Results, name: &str) -> (String, Option<f64>) {
    let Some(res) = results.idle(name) else {
        return (missing(results, name), None);
    };
    let per = res.rss_per_connection_bytes;
    (
        format!(
            "{} per connection; {} unexpected closes",
            per.map_or("n/a".to_owned(), |b| format!("{:.2} KiB", b / 1024.0)),
            res.unexpected_closes
        ),
        per.filter(|_| res.unexpected_closes == 0),
    )
}

pub(super) fn section(results: &Results) -> String {
    let mut out =
        vec!["## deflate: permessage-deflate off and on, in one run (issue #26)".to_owned()];
    let (off, on) = (
        results.fanout("deflate-fanout-off"),
        results.fanout("deflate-fanout-on"),
    );
    if off.is_none()
        && on.is_none()
        && results.throughput("deflate-throughput-off").is_none()
        && results.idle("deflate-idle-off").is_none()
    {
        out.push("Not run.".to_owned());
        return paragraphs(&out);
    }
    let shape = off.or(on).map_or_else(String::new, |f| {
        format!(
            "{} clients on one topic, {} B payloads, {} rounds {:.0} ms apart",
            count(f.clients as u64),
            count(f.size_bytes as u64),
            f.rounds,
            f.interval_s * 1000.0
        )
    });
    out.push(format!(
        "`scripts/bench.sh deflate`: each shape twice against the same build, the clients \
         offering permessage-deflate as Chromium does or not. The fan-out's clients are the load \
         tool's own both times (tokio-tungstenite has no deflate): {shape}; its payload is the \
         send-time stamp padded with one repeated byte, compression's best case (the `formats` \
         section has realistic payloads). Gateway CPU per delivery over the measured rounds, the \
         kernel's part apart: the sends, which shrink with the frames."
    ));
    let mut rows = Vec::new();
    let ratio = match (off.and_then(per_delivery), on.and_then(per_delivery)) {
        (Some((a, _)), Some((b, _))) if a > 0.0 => Some(b / a),
        _ => None,
    };
    let clean = |f: Option<&Fanout>| f.is_some_and(|f| f.failures().is_empty());
    rows.push(vec![
        format!("fan-out ({shape}): gateway CPU per delivery"),
        fanout_cell(results, "deflate-fanout-off"),
        match ratio {
            Some(r) => format!("{} ({r:.2}×)", fanout_cell(results, "deflate-fanout-on")),
            None => fanout_cell(results, "deflate-fanout-on"),
        },
        format!(
            "≤ {FANOUT_CPU_TARGET}× off: {}",
            verdict(ratio.is_some_and(|r| r <= FANOUT_CPU_TARGET) && clean(off) && clean(on))
        ),
    ]);
    let wire = |f: Option<&Fanout>| {
        f.and_then(|f| f.wire_bytes_per_delivery)
            .map_or("n/a".to_owned(), |b| format!("{b:.1}"))
    };
    rows.push(vec![
        "fan-out: wire bytes per delivery".to_owned(),
        wire(off),
        format!(
            "{}{}",
            wire(on),
            on.map_or(String::new(), |f| format!(
                " (negotiated by {} of {} clients)",
                count(f.compressed_clients as u64),
                count(f.clients as u64)
            ))
        ),
        String::new(),
    ]);
    let per_cpu = |name: &str| {
        results
            .throughput(name)
            .filter(|t| t.lost == 0 && t.duplicated == 0 && t.disconnected == 0)
            .and_then(|t| t.deliveries_per_gateway_cpu_s)
    };
    let (t_off, t_on) = (
        per_cpu("deflate-throughput-off"),
        per_cpu("deflate-throughput-on"),
    );
    let t_ratio = match (t_off, t_on) {
        (Some(a), Some(b)) if a > 0.0 => Some(b / a),
        _ => None,
    };
    let t_cell = |name: &str, v: Option<f64>| v.map_or_else(|| missing(results, name), thousands);
    rows.push(vec![
        "throughput, 200 clients on 50 of 100 topics, 1 KiB: deliveries per gateway CPU-second"
            .to_owned(),
        t_cell("deflate-throughput-off", t_off),
        match t_ratio {
            Some(r) => format!("{} ({r:.2}×)", t_cell("deflate-throughput-on", t_on)),
            None => t_cell("deflate-throughput-on", t_on),
        },
        format!(
            "≥ {THROUGHPUT_TARGET}× off: {}",
            verdict(t_ratio.is_some_and(|r| r >= THROUGHPUT_TARGET))
        ),
    ]);
    let (idle_off, per_off) = idle_cell(results, "deflate-idle-off");
    let (idle_on, per_on) = idle_cell(results, "deflate-idle-on");
    let idle_clients = results
        .idle("deflate-idle-off")
        .or(results.idle("deflate-idle-on"))
        .map_or_else(|| "?".to_owned(), |i| count(i.clients as u64));
    rows.push(vec![
        format!("{idle_clients} idle connections, 60 s, pings every 5 s: gateway memory"),
        idle_off,
        idle_on,
        format!(
            "on ≤ off (within 1%, RSS's noise): {}",
            verdict(matches!((per_off, per_on), (Some(a), Some(b)) if b <= a * IDLE_NOISE))
        ),
    ]);
    out.push(table(&["run", "off", "on", "target"], &rows));
    if let Some(f) = on.or(off) {
        out.push(cpu_line(&f.cpu));
    }
    paragraphs(&out)
}
