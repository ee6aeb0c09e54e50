//! `herald-loadtest report <dir>`: the figures BENCHMARKS.md shows, read
//! back from the JSON result files through the types that wrote them.
//!
//! Each file is read as an [`Envelope`] of its scenario's result type, and
//! each figure taken by field access, so a result field renamed or removed
//! fails to compile here rather than showing as "n/a" in BENCHMARKS.md; a
//! result file that no longer matches its type fails the report. The output
//! is one JSON object keyed by file name (without `.json`), each
//! `{scenario, finished_unix_s, machine, result}`, `result` holding the
//! figures under their names in the result file; `scripts/benchmarks.py`
//! renders it.

use std::path::Path;

use anyhow::{Context, bail};
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

use crate::cpu::Usage;
use crate::latency::Summary;
use crate::report::{Envelope, Outcome};
use crate::scenarios::chaos::Chaos;
use crate::scenarios::fanout::{Fanout, Stats};
use crate::scenarios::floor::Floor;
use crate::scenarios::idle::Idle;
use crate::scenarios::pods::Pods;
use crate::scenarios::publish::Publish;
use crate::scenarios::slow::Slow;
use crate::scenarios::stall::Stall;
use crate::scenarios::storm::Storm;
use crate::scenarios::throughput::Throughput;
use crate::scenarios::wire::Wire;

/// Every `*.json` result file in `dir`, as the figures object.
pub fn read_dir(dir: &Path) -> anyhow::Result<Value> {
    let mut paths: Vec<_> = std::fs::read_dir(dir)
        .with_context(|| format!("reading {}", dir.display()))?
        .map(|e| e.map(|e| e.path()))
        .collect::<Result<_, _>>()
        .with_context(|| format!("reading {}", dir.display()))?;
    paths.retain(|p| p.extension().is_some_and(|e| e == "json"));
    paths.sort();
    let mut figures = serde_json::Map::new();
    for path in paths {
        let name = path
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_default();
        let text = std::fs::read_to_string(&path)
            .with_context(|| format!("reading {}", path.display()))?;
        let file = of_file(&text).with_context(|| format!("reading {}", path.display()))?;
        figures.insert(name, file);
    }
    Ok(Value::Object(figures))
}

/// One result file's figures.
pub fn of_file(text: &str) -> anyhow::Result<Value> {
    /// Just the name, to pick the type.
    #[derive(serde::Deserialize)]
    struct Scenario {
        scenario: String,
    }
    let Scenario { scenario } = serde_json::from_str(text)?;
    match scenario.as_str() {
        Fanout::SCENARIO => typed(text, fanout),
        Pods::SCENARIO => typed(text, |p: &Pods| fanout(p)),
        Slow::SCENARIO => typed(text, slow),
        Floor::SCENARIO => typed(text, floor),
        Idle::SCENARIO => typed(text, idle),
        Storm::SCENARIO => typed(text, storm),
        Stall::SCENARIO => typed(text, stall),
        Publish::SCENARIO => typed(text, publish),
        Throughput::SCENARIO => typed(text, throughput),
        Wire::SCENARIO => typed(text, wire),
        Chaos::SCENARIO => typed(text, chaos),
        other => bail!("unknown scenario `{other}`"),
    }
}

/// The file read as an envelope of `T`, with `figures` of its result.
fn typed<T: DeserializeOwned>(text: &str, figures: impl Fn(&T) -> Value) -> anyhow::Result<Value> {
    let file: Envelope<T> = serde_json::from_str(text)?;
    Ok(json!({
        "scenario": file.scenario,
        "finished_unix_s": file.finished_unix_s,
        "machine": {
            "cores": file.machine.cores,
            "cpu": file.machine.cpu,
            "kernel": file.machine.kernel,
        },
        "result": figures(&file.result),
    }))
}

fn cpu(u: &Usage) -> Value {
    json!({
        "machine_busy_cores": u.machine_busy_cores,
        "cores": u.cores,
        "other_cpu_s": u.other_cpu_s,
    })
}

fn summary(s: &Summary) -> Value {
    json!({ "p50_us": s.p50_us, "p99_us": s.p99_us, "max_us": s.max_us })
}

fn stats(s: &Stats) -> Value {
    json!({ "latency": summary(&s.latency), "last_client": summary(&s.last_client) })
}

/// `fanout`'s, and `pods`'.
fn fanout(r: &Fanout) -> Value {
    json!({
        "latency": summary(&r.stats.latency),
        "last_client": summary(&r.stats.last_client),
        "floor": r.floor.as_ref().map(floor),
        "vs_floor": r.vs_floor.map(|v| json!({
            "last_client_p50_x": v.last_client_p50_x,
            "last_client_p99_x": v.last_client_p99_x,
            "cpu_per_round_x": v.cpu_per_round_x,
        })),
        "processes": r.processes.iter().map(|p| json!({
            "cpu_per_round_s": p.cpu_per_round_s,
            "rss_bytes": p.rss_bytes,
        })).collect::<Vec<_>>(),
        "gateway_cpu": r.gateway_cpu.map(|c| json!({
            "user_per_round_s": c.user_per_round_s,
            "system_per_round_s": c.system_per_round_s,
            "user_ns_per_delivery": c.user_ns_per_delivery,
            "system_ns_per_delivery": c.system_ns_per_delivery,
        })),
        "deliveries": r.deliveries,
        "lost": r.lost,
        "duplicated": r.duplicated,
        "cpu": cpu(&r.cpu),
    })
}

fn floor(r: &Floor) -> Value {
    json!({
        "clients": r.clients,
        "last_client": summary(&r.stats.last_client),
        "writer_cpu_per_round_s": r.writer_cpu_per_round_s,
        "lost": r.lost,
    })
}

fn slow(r: &Slow) -> Value {
    json!({
        "run": fanout(&r.run),
        "without": stats(&r.without),
        "with": stats(&r.with),
        "p99_with_over_without": r.p99_with_over_without,
        "slow_clients": r.slow_clients.iter().map(|c| json!({
            "closed": c.closed,
            "end": c.end,
            "reason": c.reason,
            "closed_after_s": c.closed_after_s,
            "blocked_for_s": c.blocked_for_s,
        })).collect::<Vec<_>>(),
        "rss": r.rss.iter().map(|g| json!({ "growth": g.growth })).collect::<Vec<_>>(),
    })
}

fn idle(r: &Idle) -> Value {
    json!({
        "rss_per_connection_bytes": r.rss_per_connection_bytes,
        "unexpected_closes": r.unexpected_closes,
        "pings_answered": r.pings_answered,
        "pods": r.pods.iter().map(|p| json!({ "connections": p.connections })).collect::<Vec<_>>(),
    })
}

fn stall(r: &Stall) -> Value {
    json!({
        "topics": r.topics,
        "connections": r.connections,
        "redis_delay_ms": r.redis_delay_ms,
        "canary_interval_ms": r.canary_interval_ms,
        "burst_topics": r.burst_topics,
        "burst_confirmed_s": r.burst_confirmed_s,
        "first_delivery_after_kill_s": r.first_delivery_after_kill_s,
        "phases": r.phases.iter().map(|p| json!({
            "name": p.name,
            "seconds": p.seconds,
            "sent": p.sent,
            "delivered": p.delivered,
            "undelivered": p.undelivered,
            "latency": summary(&p.latency),
            "longest_gap_ms": p.longest_gap_ms,
        })).collect::<Vec<_>>(),
        "lost": r.lost,
        "duplicated": r.duplicated,
        "out_of_order": r.out_of_order,
        "resets": r.resets,
        "publish_errors": r.publish_errors,
    })
}

fn storm(r: &Storm) -> Value {
    json!({
        "cut": r.cut,
        "clients": r.clients,
        "topics": r.topics,
        "rate_per_s": r.rate_per_s,
        "ack_interval_ms": r.ack_interval_ms,
        "cut_clients": r.cut_clients,
        "resumed": r.resumed,
        "all_resumed_s": r.all_resumed_s,
        "resume_time": summary(&r.resume_time),
        "lost": r.lost,
        "app_duplicates": r.app_duplicates,
        "wire_duplicates": r.wire_duplicates,
        "cpu": cpu(&r.cpu),
    })
}

fn chaos(r: &Chaos) -> Value {
    json!({
        "seed": r.seed,
        "redis": r.redis,
        "pods": r.pods,
        "clients": r.clients,
        "topics": r.topics,
        "subscriptions": r.subscriptions,
        "publishers": r.publishers,
        "rate_per_s": r.rate_per_s,
        "ran_s": r.ran_s,
        "faults_by_kind": r.faults_by_kind,
        "faults": r.faults.iter().map(|f| json!({
            "kind": f.kind.name(),
            "at_s": f.at_s,
            "took_s": f.took_s,
            "lost_writes": f.lost_writes,
            "lost_acked": f.lost_acked,
            "resets": f.resets,
            "master": f.master,
            "topics": f.topics,
            "detail": f.detail,
            "error": f.error,
        })).collect::<Vec<_>>(),
        "lost_writes": r.lost_writes,
        "lost_acked_writes": r.lost_acked_writes,
        "published": r.published,
        "acked": r.acked,
        "publish_errors": r.publish_errors,
        "publish_error_reasons": r.publish_error_reasons,
        "checked": r.checked,
        "processed": r.processed,
        "redelivered": r.redelivered,
        "lost": r.lost,
        "duplicated": r.duplicated,
        "mismatched": r.mismatched,
        "ack_conflicts": r.ack_conflicts,
        "resets_expected": r.resets_expected,
        "resets_history": r.resets_history,
        "resets_unexpected": r.resets_unexpected,
        "resumes": r.resumes,
        "sessions_lost": r.sessions_lost,
        "problem_counts": r.problem_counts,
        "cpu": cpu(&r.cpu),
    })
}

fn publish(r: &Publish) -> Value {
    json!({ "per_second": r.per_second, "latency": summary(&r.latency) })
}

fn throughput(r: &Throughput) -> Value {
    json!({
        "clients": r.clients,
        "topics": r.topics,
        "subscriptions_per_client": r.subscriptions_per_client,
        "fanout": r.fanout,
        "concurrency": r.concurrency,
        "publishes_per_s": r.publishes_per_s,
        "deliveries_per_s": r.deliveries_per_s,
        "deliveries_per_gateway_cpu_s": r.deliveries_per_gateway_cpu_s,
        "lost": r.lost,
        "duplicated": r.duplicated,
        "cpu": cpu(&r.cpu),
    })
}

fn wire(r: &Wire) -> Value {
    json!({
        "sizes": r.sizes.iter().map(|m| json!({
            "payload_bytes": m.payload_bytes,
            "herald_bytes": m.herald_bytes,
            "header_bytes": m.header_bytes,
            "envelope_bytes": m.envelope_bytes,
            "http_post_bytes": m.http_post_bytes,
            "error": m.error,
        })).collect::<Vec<_>>(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::write_json;
    use crate::scenarios::wire::Measured;

    #[test]
    fn a_result_file_reads_back_as_its_figures() {
        let wire = Wire {
            gateway: "ws://127.0.0.1:1/ws".to_owned(),
            topic: "abcdefgh".to_owned(),
            sizes: vec![Measured {
                payload_bytes: 10,
                herald_bytes: Some(62),
                header_bytes: Some(2),
                envelope_bytes: Some(50),
                http_post_bytes: Some(120),
                error: None,
            }],
        };
        let dir = std::env::temp_dir().join(format!("herald-figures-{}", std::process::id()));
        write_json(&dir.join("wire.json"), &wire).expect("written");
        std::fs::write(dir.join("notes.txt"), "not a result").expect("written");
        let figures = read_dir(&dir);
        let _ = std::fs::remove_dir_all(&dir);
        let figures = figures.expect("read");
        let file = &figures["wire"];
        assert_eq!(file["scenario"], "wire");
        assert!(file["machine"]["cores"].as_u64().is_some());
        assert_eq!(file["result"]["sizes"][0]["herald_bytes"], 62);
        assert_eq!(file["result"]["sizes"][0]["error"], Value::Null);
        assert_eq!(figures.as_object().map(|o| o.len()), Some(1));
    }

    #[test]
    fn a_file_that_no_longer_matches_its_type_fails() {
        let e = of_file(r#"{"scenario": "wire", "result": {"sizes": []}}"#)
            .expect_err("no machine")
            .to_string();
        assert!(e.contains("missing field"), "{e}");
        let e = of_file(r#"{"scenario": "warp"}"#)
            .expect_err("unknown")
            .to_string();
        assert!(e.contains("warp"), "{e}");
    }
}
