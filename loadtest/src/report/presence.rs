//! The `presence` section: issue #23's targets for a 10,000-member room on
//! 4 pods sharing Redis, each beside the figure measured, and fan-out
//! latency with presence on and off.

use super::markdown::{count, cpu_line, fine_ms, ms, or_miss, paragraphs, table, verdict};
use super::results::Results;
use crate::scenarios::presence::Presence;

/// The targets.
const MEMORY_BYTES: f64 = 512.0 * 1024.0;
const FRAMES_PER_SUBSCRIBER: u64 = 50;
const ROOM_DELIVERIES: u64 = 500_000;
const GONE_S: f64 = 20.0;
const PAGE_P99_US: f64 = 5_000.0;
const STATS_P99_US: f64 = 1_000.0;
/// Fan-out with presence within this of without.
const FANOUT_SLOWER: f64 = 1.10;

pub(super) fn section(results: &Results) -> String {
    let mut out = vec![
        "## presence: a 10,000-member room on 4 pods sharing Redis".to_owned(),
        "`herald-loadtest presence`: each member a user with an HS256 token and a ~20-byte \
         `info` claim, spread over the pods; messages flow while 500 members leave and join \
         again; then a quiet window, timed queries, a rolling restart of every pod (members \
         resume at another pod) and kill -9 of the pod with the most members (they stay away)."
            .to_owned(),
    ];
    match results.presence("presence") {
        Some(res) => {
            out.push(table(
                &["figure", "Herald", "target", "reference"],
                &rows(res),
            ));
            out.push(details(res));
        }
        None => out.push("Not run.".to_owned()),
    }
    out.push(fanout(results));
    paragraphs(&out)
}

fn rows(res: &Presence) -> Vec<Vec<String>> {
    let mut rows = Vec::new();
    if let Some(q) = &res.quiet {
        let bytes = q.memory.room_bytes as f64;
        rows.push(vec![
            "Redis memory of the room's presence".to_owned(),
            format!(
                "{:.2} MB ({:.0} B per member)",
                bytes / 1e6,
                bytes / res.members as f64
            ),
            format!(
                "≤ 0.5 MB: {}",
                verdict(bytes > 0.0 && bytes <= MEMORY_BYTES)
            ),
            "~3.4 MB (~340 B per member)".to_owned(),
        ]);
        rows.push(vec![
            "Redis writes, steady state (no joins or leaves)".to_owned(),
            format!(
                "{:.4} per member over {:.0} s ({:.2}/s for {} pods)",
                q.writes_per_member, q.commands.window_s, q.writes_per_s, res.pods
            ),
            format!(
                "0 per member: {}",
                verdict(q.writes_per_s <= res.pods as f64)
            ),
            "~400/s".to_owned(),
        ]);
    }
    if let Some(r) = &res.restart {
        rows.push(vec![
            "rolling restart: presence frames per subscriber (max)".to_owned(),
            count(r.diffs.frames_max),
            format!(
                "≤ 50: {}",
                verdict(r.all_back && r.diffs.frames_max <= FRAMES_PER_SUBSCRIBER)
            ),
            String::new(),
        ]);
        rows.push(vec![
            "rolling restart: presence deliveries, whole room".to_owned(),
            count(r.diffs.frames_total),
            format!(
                "≤ 500,000: {}",
                verdict(r.all_back && r.diffs.frames_total <= ROOM_DELIVERIES)
            ),
            "100 million".to_owned(),
        ]);
    }
    if let Some(k) = &res.kill {
        let last = k.gone_s.zip(k.leaves_s).map(|(g, l)| g.max(l));
        rows.push(vec![
            format!(
                "kill -9: its {} members gone, leaves sent",
                count(k.members)
            ),
            format!("{} gone, {} every leave", secs(k.gone_s), secs(k.leaves_s)),
            format!("≤ 20 s: {}", verdict(or_miss(last) <= GONE_S)),
            "up to 60 s".to_owned(),
        ]);
    }
    if let Some(q) = &res.queries {
        let pod = |kind: &str| {
            q.server
                .iter()
                .find(|s| s.labels.contains(kind))
                .and_then(|s| s.p99_at_most_s)
                .map(|s| format!("; pod ≤ {}", fine_ms(s * 1e6)))
                .unwrap_or_default()
        };
        let page = f64::from(q.page.p99_us);
        rows.push(vec![
            format!("page of {} members, p99", count(q.page_members)),
            format!("{} at the client{}", fine_ms(page), pod("page")),
            format!("≤ 5 ms: {}", verdict(page <= PAGE_P99_US)),
            "~1.1 MB reply".to_owned(),
        ]);
        let stats = f64::from(q.stats.p99_us);
        rows.push(vec![
            "stats, p99".to_owned(),
            format!("{} at the client{}", fine_ms(stats), pod("stats")),
            format!("≤ 1 ms: {}", verdict(stats <= STATS_P99_US)),
            String::new(),
        ]);
    }
    rows
}

fn details(res: &Presence) -> String {
    let mut lines = vec![format!(
        "Join: {} members in {} (by pod {:?}), {} diffs at most per subscriber. \
         Flow: {:.0} msg/s, {} members churning, latency p50/p99 {} / {}, {} diffs at most per \
         subscriber.",
        count(res.members as u64),
        secs(res.join.all_in_s),
        res.join.members_by_pod,
        res.join.diffs.frames_max,
        res.rate_per_s,
        res.flow.churners,
        ms(Some(f64::from(res.flow.latency.p50_us))),
        ms(Some(f64::from(res.flow.latency.p99_us))),
        res.flow.diffs.frames_max,
    )];
    if let Some(q) = &res.quiet {
        let by: Vec<String> = q
            .commands
            .by_command
            .iter()
            .map(|(c, n)| format!("{c} {n}"))
            .collect();
        lines.push(format!(
            "Quiet window: commands {} (writes: {}); presence keys shared by rooms {} B.",
            by.join(", "),
            q.commands.writing.join(", "),
            count(q.memory.shared_bytes)
        ));
    }
    if let Some(r) = &res.restart {
        lines.push(format!(
            "Rolling restart: {:.0} s, {} resumes ({} fresh sessions), presence showed at least \
             {} users meanwhile; {} joins and {} leaves listed over all subscribers ({} users \
             listed as leaving).",
            r.took_s,
            count(r.resumed),
            r.fresh,
            r.min_users.map_or_else(|| "n/a".to_owned(), count),
            count(r.diffs.joins_total),
            count(r.diffs.leaves_total),
            count(r.left_users)
        ));
    }
    lines.push(cpu_line(&res.cpu));
    lines.join(" ")
}

/// Message latency with presence on and off: in `fanout` (its topic's
/// namespace with presence and join/leave, and without: the issue's
/// target, the room at rest), and in the room itself while members churn
/// (`presence` against `presence --presence-off`: what the diffs cost).
fn fanout(results: &Results) -> String {
    let mut rows = Vec::new();
    if let (Some(on), Some(off)) = (
        results.presence("presence"),
        results.presence("presence-off"),
    ) {
        // Not the target (that is `fanout`'s, below): here every
        // subscriber is sent the churn's joins and leaves, in the queue its
        // messages take, so this row says what join/leave costs them.
        let p50 = |r: &Presence| f64::from(r.flow.latency.p50_us);
        let p99 = |r: &Presence| f64::from(r.flow.latency.p99_us);
        rows.push(vec![
            format!(
                "the room's messages while members churn ({} members, {} pods), p50 / p99",
                count(on.members as u64),
                on.pods
            ),
            format!("{} / {}", ms(Some(p50(off))), ms(Some(p99(off)))),
            format!("{} / {}", ms(Some(p50(on))), ms(Some(p99(on)))),
            format!(
                "(the cost of the diffs: {:.2}× / {:.2}×)",
                p50(on) / p50(off).max(1.0),
                p99(on) / p99(off).max(1.0)
            ),
        ]);
    }
    if let (Some(off), Some(on)) = (
        results.fanout("fanout-presence-off"),
        results.fanout("fanout-presence-on"),
    ) {
        let p99 = |r: &crate::scenarios::fanout::Fanout| f64::from(r.stats.last_client.p99_us);
        rows.push(vec![
            format!(
                "fanout, {} anonymous clients, last client p99",
                count(on.clients as u64)
            ),
            ms(Some(p99(off))),
            ms(Some(p99(on))),
            within(p99(on), p99(off)),
        ]);
    }
    if rows.is_empty() {
        return "Latency with presence on and off: not run.".to_owned();
    }
    table(&["latency", "presence off", "presence on", "target"], &rows)
}

/// `on` against `off` as the 10% target reads it.
fn within(on: f64, off: f64) -> String {
    let ratio = on / off.max(1.0);
    format!(
        "within 10%: {ratio:.2}×, {}",
        verdict(ratio <= FANOUT_SLOWER)
    )
}

fn secs(s: Option<f64>) -> String {
    s.map_or_else(|| "n/a".to_owned(), |s| format!("{s:.1} s"))
}
