//! The `streams` section (issue #25): server-sent events and HTTP-streaming
//! against the WebSocket. Deliveries per gateway CPU-second of the three
//! transports in two `throughput` shapes (`streams-ws`, `streams-sse`,
//! `streams-stream`: 10 topics per client; `streams-one-*`: one), in rounds
//! (`streams-ws-2`, …), the memory of idle SSE streams (`idle-sse`), and SSE
//! clients across a pod's death (`sse-failover`).

use super::markdown::{count, cpu_line, paragraphs, table, thousands, verdict, x};
use super::results::Results;
use crate::scenarios::throughput::Throughput;

/// The least share of the WebSocket's deliveries per CPU-second a stream
/// transport must reach.
const RATIO_TARGET: f64 = 0.8;
/// The most an idle SSE stream may cost the gateway, in bytes.
const IDLE_TARGET_BYTES: f64 = 6.0 * 1024.0;

/// A run that should be there but is not: failed (its pod's log is there),
/// or not run.
fn missing(results: &Results, name: &str) -> String {
    if results.has(&format!("{name}.log")) {
        format!("**failed**: no result (`{name}.log` in the results)")
    } else {
        "not run".to_owned()
    }
}

fn per_cpu(res: &Throughput) -> f64 {
    res.deliveries_per_gateway_cpu_s.unwrap_or(0.0)
}

/// Round `round`'s run of `transport` in a shape: `<prefix><transport>`,
/// then `<prefix><transport>-2`, `-3`, …
fn run_name(prefix: &str, transport: &str, round: usize) -> String {
    match round {
        1 => format!("{prefix}{transport}"),
        round => format!("{prefix}{transport}-{round}"),
    }
}

/// The middle one of `values` (the lower middle of an even count).
fn median(mut values: Vec<f64>) -> Option<f64> {
    values.sort_by(f64::total_cmp);
    values.get(values.len().saturating_sub(1) / 2).copied()
}

/// The transports' runs of one shape, each against the WebSocket's of the
/// same round. A round runs every transport once, one after the other,
/// because one run's figure moves by a fifth from run to run on a shared
/// machine: a round's runs are close in time, and the median round's ratio
/// is the figure.
fn transport_rows(results: &Results, prefix: &str, shape: &str, rows: &mut Vec<Vec<String>>) {
    let runs = |transport: &str| -> Vec<&Throughput> {
        (1..)
            .map_while(|round| results.throughput(&run_name(prefix, transport, round)))
            .collect()
    };
    let ws = runs("ws");
    for (transport, label) in [
        ("ws", "WebSocket (`/ws`)"),
        ("sse", "server-sent events (`GET /sse`)"),
        ("stream", "HTTP-streaming (`POST /stream`)"),
    ] {
        let label = format!("{label}, {shape}");
        let mine = runs(transport);
        if mine.is_empty() {
            let name = run_name(prefix, transport, 1);
            rows.push(vec![
                label,
                missing(results, &name),
                String::new(),
                String::new(),
            ]);
            continue;
        }
        let clean = mine
            .iter()
            .all(|res| res.lost == 0 && res.duplicated == 0 && res.disconnected == 0);
        let ratios: Vec<f64> = mine
            .iter()
            .zip(&ws)
            .filter(|(_, w)| per_cpu(w) > 0.0)
            .map(|(res, w)| per_cpu(res) / per_cpu(w))
            .collect();
        let ratio = median(ratios.clone());
        let target = match (transport, ratio) {
            ("ws", _) => "the yardstick".to_owned(),
            (_, Some(r)) => format!(
                "≥ {RATIO_TARGET}× the WebSocket's: {}",
                verdict(r >= RATIO_TARGET && clean)
            ),
            (_, None) => format!("≥ {RATIO_TARGET}× the WebSocket's: no WebSocket run"),
        };
        let per_round: Vec<String> = mine.iter().map(|res| thousands(per_cpu(res))).collect();
        let lost: u64 = mine.iter().map(|res| res.lost).sum();
        let duplicated: u64 = mine.iter().map(|res| res.duplicated).sum();
        let mut figures = format!(
            "{} deliveries per gateway CPU-second ({} per second)",
            per_round.join(" / "),
            mine.iter()
                .map(|res| thousands(res.deliveries_per_s))
                .collect::<Vec<_>>()
                .join(" / "),
        );
        if transport != "ws" && ratios.len() > 1 {
            let each: Vec<String> = ratios.iter().map(|r| format!("{r:.2}")).collect();
            figures.push_str(&format!("; by round {}×", each.join(" / ")));
        }
        figures.push_str(&format!("; lost / duplicated {lost} / {duplicated}"));
        let ratio_cell = match (transport, ratios.len()) {
            ("ws", _) | (_, 0 | 1) => x(ratio),
            (_, rounds) => format!("{} (median of {rounds})", x(ratio)),
        };
        rows.push(vec![label, figures, ratio_cell, target]);
    }
}

/// How a shape's runs were made, from its WebSocket run (or its SSE one).
fn shape_line(results: &Results, prefix: &str) -> Option<String> {
    let res = results
        .throughput(&format!("{prefix}ws"))
        .or(results.throughput(&format!("{prefix}sse")))?;
    Some(format!(
        "{} clients, each on {} of {} topics ({:.0} subscribers per topic)",
        count(res.clients as u64),
        res.subscriptions_per_client,
        res.topics,
        res.fanout
    ))
}

pub(super) fn section(results: &Results) -> String {
    let mut out =
        vec!["## streams: server-sent events and HTTP-streaming against the WebSocket".to_owned()];
    let mut rows = Vec::new();
    transport_rows(results, "streams-", "10 topics per client", &mut rows);
    transport_rows(results, "streams-one-", "1 topic per client", &mut rows);
    out.push(table(
        &["transport", "Herald", "of the WebSocket's", "target"],
        &rows,
    ));
    let shapes: Vec<String> = [("streams-", "10 topics"), ("streams-one-", "1 topic")]
        .iter()
        .filter_map(|(prefix, name)| Some(format!("{name}: {}", shape_line(results, prefix)?)))
        .collect();
    if let Some(res) = results
        .throughput("streams-ws")
        .or(results.throughput("streams-sse"))
    {
        out.push(format!(
            "Each run against a fresh pod, {} B payloads, {} publishing connections, {:.0} s; {}. \
             Where there are rounds, each ran the three transports one after the other, and a \
             ratio is the median of the rounds' (each against its round's WebSocket run). An SSE \
             event's id is the stream's position in each of its topics (about 19 bytes a topic), \
             so its bytes per delivery grow with the topics per stream. {}",
            res.size_bytes,
            res.concurrency,
            res.duration_s,
            shapes.join("; "),
            cpu_line(&res.cpu)
        ));
    }

    let mut rows = Vec::new();
    match results.idle("idle-sse") {
        None => rows.push(vec![
            "idle SSE streams".to_owned(),
            missing(results, "idle-sse"),
            String::new(),
        ]),
        Some(res) => {
            let per = res.rss_per_connection_bytes.unwrap_or(0.0);
            rows.push(vec![
                format!(
                    "{} idle SSE streams, {:.0} s, heartbeats read {}",
                    count(res.clients as u64),
                    res.duration_s,
                    count(res.pings_answered)
                ),
                format!(
                    "{:.2} KiB per stream; {} unexpected closes",
                    per / 1024.0,
                    res.unexpected_closes
                ),
                format!(
                    "≤ 6 KiB, 0 closes: {}",
                    verdict(per > 0.0 && per <= IDLE_TARGET_BYTES && res.unexpected_closes == 0)
                ),
            ]);
        }
    }
    match results.sse_failover("sse-failover") {
        None => rows.push(vec![
            "SSE failover".to_owned(),
            missing(results, "sse-failover"),
            String::new(),
        ]),
        Some(res) => {
            let met = res.lost == 0
                && res.duplicated == 0
                && res.resets == 0
                && res.publish_errors == 0
                && res.cut_clients > 0
                && res.reconnected == res.cut_clients;
            rows.push(vec![
                format!(
                    "{} SSE clients over {} pods, {}; back with `Last-Event-ID`",
                    count(res.clients as u64),
                    res.gateways.len(),
                    res.cut
                ),
                format!(
                    "lost / duplicated {} / {} ({} / {} clients), resets {}; {} of {} cut streams \
                     back, all within {}",
                    count(res.lost),
                    count(res.duplicated),
                    count(res.clients_with_loss),
                    count(res.clients_with_duplicates),
                    count(res.resets),
                    count(res.reconnected),
                    count(res.cut_clients),
                    res.all_reconnected_s
                        .map_or_else(|| "n/a".to_owned(), |s| format!("{s:.2} s"))
                ),
                format!("0 / 0 per client: {}", verdict(met)),
            ]);
        }
    }
    out.push(table(&["run", "Herald", "target"], &rows));
    paragraphs(&out)
}
