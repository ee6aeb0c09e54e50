//! Herald's dashboards and alerting rules, proven against a real Prometheus.
//!
//! A real `redis-server` and the real `herald` binary (Redis broker) run under
//! light load: subscribers that answer pings and ack, an HTTP and a gRPC
//! publisher, clients that come and go, resume, replay with `since`, send bad
//! commands or stop answering, a presence room's comings and goings and
//! queries, a refused upgrade, a Redis freeze and a killed
//! pub/sub connection. Debian's `prometheus` scrapes the gateway every second
//! with `k8s/alerts/herald-rules.yaml` loaded; then every panel query and
//! template variable of every dashboard in `k8s/dashboards/`, and the signal
//! of every alert (the convention is in the rule file's header), go through
//! the Prometheus HTTP API, and each must be valid and return series.
//! `promtool check rules` must accept the rule file, `promtool test rules`
//! must make every alert fire in one case and stay quiet in another
//! (`k8s/alerts/herald-rules.test.yaml`), every `runbook_url` must name a
//! section of `docs/runbook.md`, and `docs/metrics.md` must name every
//! metric the gateway exports.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use proto::v1::publisher_client::PublisherClient;
use serde_json::{Value, json};
use testkit::Herald;
use testkit::Redis;
use testkit::eventually::eventually_every;
use tokio::task::JoinHandle;
use tokio::time::{Instant, sleep, timeout};
use tokio_tungstenite::tungstenite::Message;
use tonic::transport::Endpoint;

use crate::pod::HERALD;

/// Prometheus scrapes and evaluates rules this often.
const SCRAPE_INTERVAL: &str = "1s";
/// What the test puts for Grafana's `$__rate_interval`: several scrapes, so
/// that every `rate` has samples to work on.
const RATE_INTERVAL: &str = "10s";
/// Scrapes to wait for before evaluating anything (more than
/// `RATE_INTERVAL` holds, and the trouble the test causes).
const SCRAPES: f64 = 15.0;
/// Longest Prometheus may take to start, to scrape `SCRAPES` times, or to
/// evaluate every rule once.
const PROMETHEUS_WAIT: Duration = Duration::from_secs(60);
/// Between two looks at Prometheus.
const POLL: Duration = Duration::from_millis(250);
/// Ports tried for Prometheus before giving up.
const ATTEMPTS: usize = 5;
/// The gateway's heartbeat in this test: pings every second, so that ping
/// round trips are observed, and a client silent for two seconds is a dead
/// peer.
const PING_INTERVAL: &str = "1s";
const PONG_TIMEOUT: &str = "1s";
/// Long enough for a Redis freeze to time Redis calls out.
const REDIS_COMMAND_TIMEOUT: &str = "200ms";
const FREEZE: Duration = Duration::from_millis(1500);
/// Severities an alert may carry.
const SEVERITIES: [&str; 3] = ["critical", "warning", "info"];
/// Annotations every alert must carry.
const ANNOTATIONS: [&str; 3] = ["summary", "description", "runbook_url"];
/// Where every `runbook_url` points: a section of this file.
const RUNBOOK: &str = "docs/runbook.md";
/// kube-state-metrics' names: an alert or panel that joins them cannot
/// return series here (no Kubernetes); its query must still be valid.
const KUBE_STATE: &str = "kube_";

/// What the load and the trouble must have produced, as Prometheus saw it.
const SEEN: [(&str, &str); 17] = [
    (
        "publishes",
        "sum(increase(herald_messages_published_total[1m]))",
    ),
    (
        "deliveries",
        "sum(increase(herald_messages_delivered_total[1m]))",
    ),
    (
        "fan-out latencies",
        "sum(increase(herald_fanout_latency_seconds_count[1m]))",
    ),
    (
        "ping round trips",
        "sum(increase(herald_ping_rtt_seconds_count[1m]))",
    ),
    (
        "client closes",
        r#"sum(increase(herald_connections_closed_total{reason="client_closed"}[1m]))"#,
    ),
    (
        "dead peers",
        r#"sum(increase(herald_connections_closed_total{reason="dead_peer"}[1m]))"#,
    ),
    (
        "bad commands",
        "sum(increase(herald_bad_commands_total[1m]))",
    ),
    (
        "recovered replays",
        r#"sum(herald_replays_total{recovered="true"})"#,
    ),
    (
        "unrecovered replays",
        r#"sum(herald_replays_total{recovered="false"})"#,
    ),
    ("resumes", r#"sum(herald_resumes_total{resumed="true"})"#),
    (
        "resumes of unknown sessions",
        r#"sum(herald_resumes_total{resumed="false"})"#,
    ),
    (
        "gRPC publishes",
        r#"sum(herald_grpc_requests_total{method="Publish", code="OK"})"#,
    ),
    (
        "HTTP 503s while Redis was frozen",
        r#"sum(herald_publish_requests_total{status="503"})"#,
    ),
    ("Redis errors", "sum(herald_redis_errors_total)"),
    (
        "presence diffs",
        "sum(increase(herald_presence_diffs_total[1m]))",
    ),
    (
        "presence queries",
        "sum(increase(herald_presence_query_seconds_count[1m]))",
    ),
    (
        "a pub/sub reconnect",
        "sum(increase(herald_redis_pubsub_reconnects_total[1m]))",
    ),
];

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the workspace root")
        .to_owned()
}

fn rules_path() -> PathBuf {
    repo().join("k8s/alerts/herald-rules.yaml")
}

/// The rules' unit tests, for `promtool test rules`.
fn rule_tests_path() -> PathBuf {
    repo().join("k8s/alerts/herald-rules.test.yaml")
}

/// Fails, pointing at the script that installs it, when `tool` is missing.
fn require(tool: &str) {
    let hint = "install Debian's `prometheus` package, which brings `prometheus` and `promtool` \
                (scripts/test.sh does: apt-get install -y --no-install-recommends prometheus)";
    match Command::new(tool).arg("--version").output() {
        Ok(output) if output.status.success() => {}
        Ok(output) => panic!(
            "`{tool} --version` failed ({}): {hint}\n{}",
            output.status,
            String::from_utf8_lossy(&output.stderr)
        ),
        Err(e) => panic!("`{tool}` cannot be run ({e}): {hint}"),
    }
}

/// Runs `promtool <command> rules <file>`, which must succeed and say so.
fn promtool_rules(command: &str, file: impl AsRef<std::ffi::OsStr>) {
    require("promtool");
    let output = Command::new("promtool")
        .arg(command)
        .arg("rules")
        .arg(file)
        .output()
        .expect("run promtool");
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(output.status.success(), "promtool {command} rules:\n{said}");
    assert!(
        said.contains("SUCCESS"),
        "promtool {command} rules:\n{said}"
    );
}

#[test]
fn promtool_accepts_the_alerting_rules() {
    promtool_rules("check", rules_path());
}

/// Every alert fires in one case and stays quiet in another, as
/// Prometheus' own rule engine evaluates them (`for` included) over the
/// series of herald-rules.test.yaml; and no alert lacks either case.
#[test]
fn every_alert_fires_in_one_case_and_stays_quiet_in_another() {
    promtool_rules("test", rule_tests_path());

    let rules = std::fs::read_to_string(rules_path()).expect("the rule file");
    let alerts: BTreeSet<&str> = rules
        .lines()
        .filter_map(|l| l.trim().strip_prefix("- alert: "))
        .map(str::trim)
        .collect();
    assert!(alerts.len() > 10, "alerts found: {alerts:?}");
    let tests = std::fs::read_to_string(rule_tests_path()).expect("the rule tests");
    let (fires, quiet) = cases(&tests);
    let mut missing = Vec::new();
    for alert in &alerts {
        if !fires.contains(*alert) {
            missing.push(format!("{alert}: no case where it fires"));
        }
        if !quiet.contains(*alert) {
            missing.push(format!("{alert}: no case where it stays quiet"));
        }
    }
    for name in fires.union(&quiet) {
        if !alerts.contains(name.as_str()) {
            missing.push(format!("{name}: tested, but no such alert"));
        }
    }
    assert!(missing.is_empty(), "{}", missing.join("\n"));
}

/// The alerts a promtool test file makes fire (an expected ALERTS series,
/// `alertstate="firing"`, with samples) and those it expects quiet
/// (`alert_rule_test` with `exp_alerts: []`), in the form the file's header
/// describes.
fn cases(tests: &str) -> (BTreeSet<String>, BTreeSet<String>) {
    let lines: Vec<&str> = tests.lines().map(str::trim).collect();
    let mut fires = BTreeSet::new();
    let mut quiet = BTreeSet::new();
    for (i, line) in lines.iter().enumerate() {
        let next = |n: usize| lines.get(i + n).copied().unwrap_or_default();
        if let Some(name) = line.strip_prefix("alertname: ")
            && next(1) == "exp_alerts: []"
        {
            quiet.insert(name.to_owned());
        }
        if let Some(rest) = line.strip_prefix("- expr: 'ALERTS{alertname=\"")
            && let Some((name, "alertstate=\"firing\"}'")) = rest.split_once("\", ")
            && next(2) == "exp_samples:"
            && next(3).starts_with("- labels: 'ALERTS{")
        {
            fires.insert(name.to_owned());
        }
    }
    (fires, quiet)
}

/// The process collector's metrics, which the fd and memory alerts and the
/// dashboard's fleet-health panels read, are on `/metrics` with sane values.
#[cfg(target_os = "linux")]
#[tokio::test]
async fn metrics_include_the_process_fds_memory_and_cpu() {
    let herald = Herald::start(HERALD, &[], &[]).await;
    let (status, exposition) = testkit::http(herald.addr, "GET", "/metrics", &[], b"").await;
    assert_eq!(status, 200, "GET /metrics");
    let value = |name: &str| -> f64 {
        exposition
            .lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
            .unwrap_or_else(|| panic!("no {name} in /metrics:\n{exposition}"))
            .trim()
            .parse()
            .unwrap_or_else(|e| panic!("{name}: {e}"))
    };
    let open = value("process_open_fds");
    let max = value("process_max_fds");
    // Listeners and the runtime hold a few; the limit is well above them.
    assert!(open >= 3.0 && open < max, "open fds {open}, limit {max}");
    assert!(
        value("process_resident_memory_bytes") > 1e6,
        "resident memory"
    );
    assert!(value("process_cpu_seconds_total") >= 0.0, "cpu seconds");
    assert!(value("process_start_time_seconds") > 1.5e9, "start time");
    assert!(value("process_threads") >= 1.0, "threads");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_panel_query_and_alert_returns_series_from_a_real_prometheus() {
    require("prometheus");
    let redis = Redis::start().await;
    let herald = Herald::pod(
        HERALD,
        &redis.url(),
        &[
            ("HERALD_REDIS__COMMAND_TIMEOUT", REDIS_COMMAND_TIMEOUT),
            ("HERALD_WEBSOCKET__PING_INTERVAL", PING_INTERVAL),
            ("HERALD_WEBSOCKET__PONG_TIMEOUT", PONG_TIMEOUT),
            ("HERALD_LOG__LEVEL", "info"),
            ("HERALD_NAMESPACES__ROOM__SUBSCRIBE", "anyone"),
            ("HERALD_NAMESPACES__ROOM__PRESENCE", "true"),
            ("HERALD_NAMESPACES__ROOM__JOIN_LEAVE", "true"),
        ],
    )
    .await;
    let load = Load::start(&herald).await;
    let prometheus = Prometheus::start(herald.addr, &rules_path()).await;

    // Trouble, once Prometheus watches (it applies its targets a few seconds
    // after it starts): Redis freezes (calls time out, publishes get 503),
    // then the pod's pub/sub connection is killed (it reconnects and fills
    // the gap from history).
    prometheus.wait_for_scrapes(2.0).await;
    redis.freeze();
    sleep(FREEZE).await;
    redis.thaw();
    sleep(Duration::from_secs(1)).await;
    let killed = redis.cli(&["CLIENT", "KILL", "TYPE", "pubsub"]);
    assert_eq!(killed.trim(), "1", "one pub/sub connection killed");

    prometheus.wait_for_scrapes(SCRAPES).await;
    let mut failures = Vec::new();
    // The load did what it is said to do, as Prometheus saw it: the queries
    // below show live data, not only series at zero.
    for (what, expr) in SEEN {
        match prometheus.value(expr).await {
            Some(v) if v > 0.0 => {}
            other => failures.push(format!("the load did not show {what}: {expr} = {other:?}")),
        }
    }
    let rules = prometheus.wait_for_rules().await;
    let names = prometheus.metric_names().await;
    let mut exprs = Vec::new();

    // Every query of every dashboard.
    let mut dashboards = 0;
    let mut panel_queries = 0;
    let mut variable_queries = 0;
    let mut annotation_queries = 0;
    for (path, dashboard) in dashboards_in(&repo().join("k8s/dashboards")) {
        dashboards += 1;
        let file = path.file_name().unwrap_or_default().to_string_lossy();
        let values = variables(&dashboard, &file, &mut failures);
        check_panels(&dashboard, &file, &mut failures);
        for variable in dashboard["templating"]["list"]
            .as_array()
            .into_iter()
            .flatten()
        {
            if variable["type"] != "query" {
                continue;
            }
            let query = variable["query"]["query"]
                .as_str()
                .or_else(|| variable["query"].as_str())
                .unwrap_or_default();
            let what = format!("{file}: variable ${}", variable["name"]);
            let Some(selector) = query
                .strip_prefix("label_values(")
                .and_then(|rest| rest.rsplit_once(','))
                .map(|(selector, _label)| substitute(selector, &values))
            else {
                failures.push(format!(
                    "{what}: not label_values(selector, label): {query}"
                ));
                continue;
            };
            variable_queries += 1;
            exprs.push(selector.clone());
            if let Err(e) = prometheus.series(&selector).await {
                failures.push(format!("{what}: {selector}: {e}"));
            }
        }
        for (title, expr) in targets(&dashboard) {
            panel_queries += 1;
            let expr = substitute(&expr, &values);
            if expr.contains('$') {
                failures.push(format!(
                    "{file}: {title}: a variable the test cannot fill: {expr}"
                ));
                continue;
            }
            exprs.push(expr.clone());
            match prometheus.query(&expr).await {
                // kube-state-metrics' panels: valid, but nothing to show here.
                Ok(0) if expr.contains(KUBE_STATE) => {}
                Ok(0) => failures.push(format!("{file}: {title}: no series: {expr}")),
                Ok(_) => {}
                Err(e) => failures.push(format!("{file}: {title}: {e}: {expr}")),
            }
        }
        // Annotation queries (deploys from herald_build_info): a version
        // that Prometheus first saw within the query's window is one the test
        // has just deployed, so each returns series.
        for annotation in dashboard["annotations"]["list"]
            .as_array()
            .into_iter()
            .flatten()
        {
            let Some(expr) = annotation["expr"].as_str() else {
                continue;
            };
            annotation_queries += 1;
            let what = format!("{file}: annotation {}", annotation["name"]);
            if annotation["datasource"]["uid"] != "${datasource}" {
                failures.push(format!("{what}: datasource is not ${{datasource}}"));
            }
            let expr = substitute(expr, &values);
            exprs.push(expr.clone());
            match prometheus.query(&expr).await {
                Ok(0) => failures.push(format!("{what}: no series: {expr}")),
                Ok(_) => {}
                Err(e) => failures.push(format!("{what}: {e}: {expr}")),
            }
        }
    }
    assert!(dashboards > 0, "no dashboard in k8s/dashboards");

    // The signal of every alert.
    let runbook = std::fs::read_to_string(repo().join(RUNBOOK)).expect(RUNBOOK);
    let runbook_anchors = anchors(&runbook);
    let mut alerts = 0;
    for rule in &rules {
        let name = rule["name"].as_str().unwrap_or("?");
        if rule["type"] != "alerting" {
            continue;
        }
        alerts += 1;
        failures.extend(
            alert_shape(rule, &runbook_anchors)
                .into_iter()
                .map(|e| format!("alert {name}: {e}")),
        );
        let query = rule["query"].as_str().unwrap_or_default();
        let signal = match signal(query) {
            Ok(signal) => signal,
            Err(e) => {
                failures.push(format!("alert {name}: {e}: {query}"));
                continue;
            }
        };
        exprs.push(signal.clone());
        match prometheus.query(&signal).await {
            Ok(0) if signal.contains(KUBE_STATE) => {}
            Ok(0) => failures.push(format!("alert {name}: its signal has no series: {signal}")),
            Ok(_) => {}
            Err(e) => failures.push(format!("alert {name}: {e}: {signal}")),
        }
    }
    assert!(alerts > 0, "no alerting rule loaded");

    // A query that returns series may still name a metric that does not
    // exist (`... or vector(0)`): every herald_* and process_* name must be a
    // real one.
    for expr in &exprs {
        for name in metric_names_in(expr) {
            if !names.contains(&name) {
                failures.push(format!("{name} is not a metric Prometheus has: {expr}"));
            }
        }
    }

    // The catalogue names every metric the gateway exports.
    let catalogue =
        std::fs::read_to_string(repo().join("docs/metrics.md")).expect("docs/metrics.md");
    let (_, exposition) = testkit::http(herald.addr, "GET", "/metrics", &[], b"").await;
    let mut exported = 0;
    for name in exposition
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.split_whitespace().next())
    {
        exported += 1;
        if !catalogue.contains(&format!("`{name}`")) {
            failures.push(format!("docs/metrics.md does not name `{name}`"));
        }
    }

    drop(load);
    // On failure, Prometheus' and herald's logs follow (their guards print them).
    assert!(
        failures.is_empty(),
        "{} problems:\n{}",
        failures.len(),
        failures.join("\n")
    );
    println!(
        "evaluated {panel_queries} panel queries, {variable_queries} variable queries and \
         {annotation_queries} annotation queries of {dashboards} dashboard(s), and the signals of \
         {alerts} alerts; {exported} exported metrics are in docs/metrics.md"
    );
}

/// Each `*.json` of `dir`, parsed.
fn dashboards_in(dir: &Path) -> Vec<(PathBuf, Value)> {
    let mut paths: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|entry| entry.expect("a directory entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "json"))
        .collect();
    paths.sort();
    paths
        .into_iter()
        .map(|path| {
            let text = std::fs::read_to_string(&path).expect("read a dashboard");
            let value = serde_json::from_str(&text)
                .unwrap_or_else(|e| panic!("{}: not JSON: {e}", path.display()));
            (path, value)
        })
        .collect()
}

/// What the test puts for each variable: the "All" value of a variable that
/// has one (`.*`, which also matches series without the label, as outside
/// Kubernetes), else its current value; and fixed values for Grafana's own.
fn variables(dashboard: &Value, file: &str, failures: &mut Vec<String>) -> Vec<(String, String)> {
    let mut values = vec![
        ("__rate_interval".to_owned(), RATE_INTERVAL.to_owned()),
        ("__interval".to_owned(), SCRAPE_INTERVAL.to_owned()),
        ("__range".to_owned(), "1m".to_owned()),
    ];
    let mut has_datasource = false;
    for variable in dashboard["templating"]["list"]
        .as_array()
        .into_iter()
        .flatten()
    {
        let name = variable["name"].as_str().unwrap_or_default().to_owned();
        if variable["type"] == "datasource" {
            has_datasource = variable["query"] == "prometheus";
            continue;
        }
        let current = &variable["current"]["value"];
        let current = current
            .as_str()
            .or_else(|| current.get(0).and_then(Value::as_str));
        // "All" without a custom value is, in Grafana, the regex of every
        // option: `.*` is that here, where every series is the test's.
        let all = variable["allValue"].as_str().unwrap_or(".*");
        let value = match (all, current) {
            (all, Some("$__all") | None) if variable["includeAll"] == true => all,
            (_, Some(value)) if value != "$__all" => value,
            _ => {
                failures.push(format!("{file}: variable ${name} has no default value"));
                continue;
            }
        };
        values.push((name, value.to_owned()));
    }
    if !has_datasource {
        failures.push(format!("{file}: no Prometheus `datasource` variable"));
    }
    // Longest first, so that `$pod` does not eat the start of `$pods`.
    values.sort_by_key(|(name, _)| std::cmp::Reverse(name.len()));
    values
}

fn substitute(expr: &str, values: &[(String, String)]) -> String {
    let mut expr = expr.to_owned();
    for (name, value) in values {
        expr = expr
            .replace(&format!("${{{name}}}"), value)
            .replace(&format!("${name}"), value);
    }
    expr
}

/// Every panel, rows' panels included.
fn panels(dashboard: &Value) -> Vec<&Value> {
    let mut all = Vec::new();
    for panel in dashboard["panels"].as_array().into_iter().flatten() {
        all.push(panel);
        all.extend(panel["panels"].as_array().into_iter().flatten());
    }
    all
}

/// (panel title, expr) of every query target.
fn targets(dashboard: &Value) -> Vec<(String, String)> {
    panels(dashboard)
        .into_iter()
        .flat_map(|panel| {
            let title = panel["title"].as_str().unwrap_or("?").to_owned();
            panel["targets"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(move |t| Some((title.clone(), t["expr"].as_str()?.to_owned())))
        })
        .collect()
}

/// Every panel queries through the `${datasource}` variable, ids are
/// unique, and a heatmap reads a histogram's buckets.
fn check_panels(dashboard: &Value, file: &str, failures: &mut Vec<String>) {
    let mut ids = BTreeSet::new();
    let mut heatmap = false;
    for panel in panels(dashboard) {
        let title = panel["title"].as_str().unwrap_or("?");
        if !ids.insert(panel["id"].as_u64()) {
            failures.push(format!("{file}: {title}: id {} twice", panel["id"]));
        }
        if panel["type"] == "row" {
            continue;
        }
        let uses_variable = |ds: &Value| ds["uid"] == "${datasource}";
        if !uses_variable(&panel["datasource"]) {
            failures.push(format!(
                "{file}: {title}: datasource is not ${{datasource}}"
            ));
        }
        let targets = panel["targets"]
            .as_array()
            .map(Vec::as_slice)
            .unwrap_or_default();
        if targets.is_empty() {
            failures.push(format!("{file}: {title}: no query"));
        }
        for target in targets {
            if !target["datasource"].is_null() && !uses_variable(&target["datasource"]) {
                failures.push(format!(
                    "{file}: {title}: a target's datasource is not ${{datasource}}"
                ));
            }
        }
        heatmap |= panel["type"] == "heatmap"
            && targets.iter().any(|t| {
                t["format"] == "heatmap"
                    && t["expr"].as_str().is_some_and(|e| e.contains("_bucket"))
            });
    }
    if !heatmap {
        failures.push(format!("{file}: no heatmap over a histogram's buckets"));
    }
}

/// What the rule file's header promises of every alert.
fn alert_shape(rule: &Value, runbook_anchors: &BTreeSet<String>) -> Vec<String> {
    let mut problems = Vec::new();
    if rule["duration"].as_f64().unwrap_or(0.0) <= 0.0 {
        problems.push("no `for`".to_owned());
    }
    let severity = rule["labels"]["severity"].as_str().unwrap_or_default();
    if !SEVERITIES.contains(&severity) {
        problems.push(format!("severity {severity:?} not one of {SEVERITIES:?}"));
    }
    for annotation in ANNOTATIONS {
        if rule["annotations"][annotation]
            .as_str()
            .is_none_or(|a| a.trim().is_empty())
        {
            problems.push(format!("no `{annotation}` annotation"));
        }
    }
    let url = rule["annotations"]["runbook_url"]
        .as_str()
        .unwrap_or_default();
    match url.strip_prefix(RUNBOOK).and_then(|u| u.strip_prefix('#')) {
        Some(anchor) if runbook_anchors.contains(anchor) => {}
        _ => problems.push(format!(
            "runbook_url {url:?} is not {RUNBOOK}#<a section of {RUNBOOK}>"
        )),
    }
    problems
}

/// The anchors of `markdown`'s headings, as GitHub makes them: lower case,
/// spaces to `-`, punctuation other than `-` and `_` dropped.
fn anchors(markdown: &str) -> BTreeSet<String> {
    markdown
        .lines()
        .filter(|l| l.starts_with('#'))
        .map(|l| {
            l.trim_start_matches('#')
                .trim()
                .to_lowercase()
                .chars()
                .filter_map(|c| match c {
                    ' ' => Some('-'),
                    c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
                    _ => None,
                })
                .collect()
        })
        .collect()
}

/// The part of an alert's expression that returns series whether or not the
/// alert fires: `<signal>` of `<signal> <comparison> <number>`, or of
/// `absent(<signal>)`. `query` is the expression as Prometheus prints it.
fn signal(query: &str) -> Result<String, String> {
    let query = query.trim();
    if let Some(inner) = query
        .strip_prefix("absent(")
        .and_then(|q| q.strip_suffix(')'))
    {
        top_level(inner)?;
        return Ok(inner.to_owned());
    }
    let (at, op) = top_level(query)?
        .last()
        .copied()
        .ok_or("not `<signal> <comparison> <number>`")?;
    let threshold = query[at + op.len()..].trim();
    threshold
        .parse::<f64>()
        .map_err(|_| format!("compared with {threshold:?}, not a number"))?;
    Ok(query[..at].trim().to_owned())
}

/// The byte offsets and operators of the comparisons at the top level of
/// `expr` (outside parentheses, brackets, braces and strings); an error for a
/// top-level `and`, `or` or `unless`, which would bind looser than the
/// comparison.
fn top_level(expr: &str) -> Result<Vec<(usize, &'static str)>, String> {
    let bytes = expr.as_bytes();
    let mut depth = 0i32;
    let mut quote = None;
    let mut found = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        let c = bytes[i];
        if let Some(q) = quote {
            if c == b'\\' {
                i += 2;
                continue;
            }
            if c == q {
                quote = None;
            }
            i += 1;
            continue;
        }
        match c {
            b'"' | b'\'' | b'`' => quote = Some(c),
            b'(' | b'[' | b'{' => depth += 1,
            b')' | b']' | b'}' => {
                depth -= 1;
                if depth < 0 {
                    return Err("unbalanced brackets".to_owned());
                }
            }
            _ if depth == 0 => {
                for op in ["==", "!=", ">=", "<=", ">", "<"] {
                    if expr[i..].starts_with(op) {
                        found.push((i, op));
                        i += op.len() - 1;
                        break;
                    }
                }
                for word in [" and ", " or ", " unless "] {
                    if expr[i..].starts_with(word) {
                        return Err(format!("a top-level `{}`", word.trim()));
                    }
                }
            }
            _ => {}
        }
        i += 1;
    }
    if depth != 0 || quote.is_some() {
        return Err("unbalanced brackets or quotes".to_owned());
    }
    Ok(found)
}

/// The `herald_*` and `process_*` metric names `expr` mentions (the
/// gateway's own).
fn metric_names_in(expr: &str) -> BTreeSet<String> {
    let mut names = metric_names_with(expr, "herald_");
    names.extend(metric_names_with(expr, "process_"));
    names
}

fn metric_names_with(expr: &str, prefix: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let mut rest = expr;
    while let Some(at) = rest.find(prefix) {
        let preceded = rest[..at]
            .chars()
            .next_back()
            .is_some_and(|c| c.is_ascii_alphanumeric() || c == '_');
        let tail = &rest[at..];
        let len = tail
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(tail.len());
        if !preceded {
            names.insert(tail[..len].to_owned());
        }
        rest = &tail[len..];
    }
    names
}

/// Percent-encodes a query parameter.
fn encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// Debian's `prometheus`, scraping one gateway, in a directory of its own;
/// killed (and the directory removed) when dropped.
struct Prometheus {
    addr: SocketAddr,
    child: Option<Child>,
    dir: PathBuf,
}

impl Prometheus {
    async fn start(target: SocketAddr, rules: &Path) -> Self {
        let mut last_log = String::new();
        for attempt in 0..ATTEMPTS {
            let addr = SocketAddr::from(([127, 0, 0, 1], testkit::herald::free_port()));
            let dir = std::env::temp_dir().join(format!(
                "herald-prometheus-{}-{attempt}",
                std::process::id()
            ));
            let _ = std::fs::remove_dir_all(&dir);
            std::fs::create_dir_all(&dir).expect("create Prometheus' directory");
            let config = format!(
                "global:\n  scrape_interval: {SCRAPE_INTERVAL}\n  scrape_timeout: {SCRAPE_INTERVAL}\n  \
                 evaluation_interval: {SCRAPE_INTERVAL}\nrule_files:\n  - {rules}\n\
                 scrape_configs:\n  - job_name: herald\n    static_configs:\n      - targets: ['{target}']\n",
                rules = rules.display()
            );
            std::fs::write(dir.join("prometheus.yml"), config).expect("write prometheus.yml");
            let log = std::fs::File::create(dir.join("prometheus.log")).expect("create the log");
            // Killed with the test process too, were it killed first.
            let mut command = testkit::process::command("prometheus");
            command
                .arg(format!(
                    "--config.file={}",
                    dir.join("prometheus.yml").display()
                ))
                .arg(format!(
                    "--storage.tsdb.path={}",
                    dir.join("data").display()
                ))
                .arg(format!("--web.listen-address={addr}"))
                .stdin(Stdio::null())
                .stdout(log.try_clone().expect("clone the log"))
                .stderr(log);
            let child = testkit::process::spawn(command).expect("spawn prometheus");
            let mut prometheus = Self {
                addr,
                child: Some(child),
                dir,
            };
            if prometheus.wait_ready().await {
                return prometheus;
            }
            last_log = prometheus.log();
            assert!(
                last_log.contains("address already in use"),
                "prometheus exited before it was ready:\n{last_log}"
            );
        }
        panic!("prometheus found no free port in {ATTEMPTS} attempts:\n{last_log}");
    }

    /// Whether `/-/ready` answered 200 (false: the process exited).
    async fn wait_ready(&mut self) -> bool {
        let deadline = Instant::now() + PROMETHEUS_WAIT;
        loop {
            if let Some(child) = self.child.as_mut()
                && child.try_wait().expect("try_wait").is_some()
            {
                return false;
            }
            if let Ok((200, _)) = testkit::http::get(self.addr, "/-/ready").await {
                return true;
            }
            assert!(
                Instant::now() < deadline,
                "prometheus not ready within {PROMETHEUS_WAIT:?}:\n{}",
                self.log()
            );
            sleep(POLL).await;
        }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("prometheus.log")).unwrap_or_default()
    }

    /// `data` of a successful API answer, or the error Prometheus gave.
    async fn api(&self, path: &str) -> Result<Value, String> {
        let (status, body) = testkit::http(self.addr, "GET", path, &[], b"").await;
        let answer: Value = serde_json::from_str(&body)
            .map_err(|e| format!("HTTP {status}, not JSON ({e}): {body}"))?;
        if answer["status"] != "success" {
            return Err(format!(
                "HTTP {status}, {}: {}",
                answer["errorType"], answer["error"]
            ));
        }
        Ok(answer["data"].clone())
    }

    /// Evaluates `expr` now; how many series (or scalars) it returned.
    async fn query(&self, expr: &str) -> Result<usize, String> {
        let data = self
            .api(&format!("/api/v1/query?query={}", encode(expr)))
            .await?;
        Ok(match data["result"].as_array() {
            Some(series) if data["resultType"] != "scalar" => series.len(),
            _ => 1,
        })
    }

    /// The value of the single series `expr` returns, if it returns one.
    async fn value(&self, expr: &str) -> Option<f64> {
        let data = self
            .api(&format!("/api/v1/query?query={}", encode(expr)))
            .await
            .ok()?;
        data["result"][0]["value"][1].as_str()?.parse().ok()
    }

    /// Fails unless some series match `selector`.
    async fn series(&self, selector: &str) -> Result<(), String> {
        let data = self
            .api(&format!("/api/v1/series?match[]={}", encode(selector)))
            .await?;
        match data.as_array() {
            Some(series) if !series.is_empty() => Ok(()),
            _ => Err("no series".to_owned()),
        }
    }

    /// Waits until the gateway has been scraped `scrapes` times, the last
    /// one successfully.
    async fn wait_for_scrapes(&self, wanted: f64) {
        eventually_every(POLL, PROMETHEUS_WAIT, || async {
            let up = self.value(r#"up{job="herald"}"#).await;
            let scrapes = self
                .value(r#"count_over_time(up{job="herald"}[1m])"#)
                .await
                .unwrap_or(0.0);
            if up == Some(1.0) && scrapes >= wanted {
                Ok(())
            } else {
                Err(format!("{scrapes} scrapes (up = {up:?}):\n{}", self.log()))
            }
        })
        .await;
    }

    /// Every rule, once each has been evaluated without error.
    async fn wait_for_rules(&self) -> Vec<Value> {
        eventually_every(POLL, PROMETHEUS_WAIT, || async {
            let data = self.api("/api/v1/rules").await.expect("the rules");
            let rules: Vec<Value> = data["groups"]
                .as_array()
                .into_iter()
                .flatten()
                .flat_map(|g| g["rules"].as_array().cloned().unwrap_or_default())
                .collect();
            assert!(
                !rules.is_empty(),
                "prometheus loaded no rules:\n{}",
                self.log()
            );
            let broken: Vec<String> = rules
                .iter()
                .filter(|r| r["health"] == "err")
                .map(|r| format!("{}: {}", r["name"], r["lastError"]))
                .collect();
            assert!(
                broken.is_empty(),
                "rules that failed to evaluate:\n{}",
                broken.join("\n")
            );
            if rules.iter().all(|r| r["health"] == "ok") {
                Ok(rules)
            } else {
                Err("rules not all evaluated")
            }
        })
        .await
    }

    /// Every metric name Prometheus has a series of.
    async fn metric_names(&self) -> BTreeSet<String> {
        let data = self
            .api("/api/v1/label/__name__/values")
            .await
            .expect("names");
        data.as_array()
            .into_iter()
            .flatten()
            .filter_map(|n| n.as_str().map(str::to_owned))
            .collect()
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        if std::thread::panicking() {
            eprintln!("--- prometheus output ---\n{}", self.log());
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The background load; stopped when dropped.
struct Load(Vec<JoinHandle<()>>);

impl Load {
    async fn start(herald: &Herald) -> Self {
        // A request on /ws that is no upgrade: refused before the handshake.
        let (status, _) = testkit::http(herald.addr, "GET", "/ws", &[], b"").await;
        assert_eq!(status, 400, "a plain GET on /ws");
        let url = herald.ws_url();
        let mut tasks = Vec::new();
        for topic in ["news", "news", "ticks", "room:1"] {
            tasks.push(tokio::spawn(subscriber(url.clone(), topic)));
        }
        tasks.push(tokio::spawn(http_publisher(herald.addr)));
        tasks.push(tokio::spawn(grpc_publisher(herald.grpc_addr)));
        tasks.push(tokio::spawn(churn(url.clone())));
        tasks.push(tokio::spawn(presence(url.clone(), herald.addr)));
        tasks.push(tokio::spawn(dead_peer(url)));
        Self(tasks)
    }
}

impl Drop for Load {
    fn drop(&mut self) {
        for task in &self.0 {
            task.abort();
        }
    }
}

type Socket =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

async fn connect(url: &str) -> Option<Socket> {
    match timeout(testkit::WAIT, tokio_tungstenite::connect_async(url)).await {
        Ok(Ok((ws, _))) => Some(ws),
        _ => None,
    }
}

async fn send(ws: &mut Socket, value: Value) -> bool {
    ws.send(Message::text(value.to_string())).await.is_ok()
}

/// The next JSON frame within `wait` (pings are answered as frames are read).
async fn next_json(ws: &mut Socket, wait: Duration) -> Option<Value> {
    let deadline = Instant::now() + wait;
    loop {
        match timeout(
            deadline.saturating_duration_since(Instant::now()),
            ws.next(),
        )
        .await
        {
            Ok(Some(Ok(Message::Text(text)))) => return serde_json::from_str(&text).ok(),
            Ok(Some(Ok(_))) => {}
            _ => return None,
        }
    }
}

/// Subscribes to `topic`, reads and acks everything, answers pings; comes
/// back whenever the connection ends.
async fn subscriber(url: String, topic: &'static str) {
    loop {
        if let Some(mut ws) = connect(&url).await {
            if send(&mut ws, json!({"op": "hello"})).await {
                send(&mut ws, json!({"op": "sub", "id": 1, "topic": topic})).await;
            }
            while let Some(Ok(message)) = ws.next().await {
                let Message::Text(text) = message else {
                    continue;
                };
                let frame: Value = serde_json::from_str(&text).unwrap_or_default();
                if frame["op"] == "msg" {
                    let ack = json!({"op": "ack", "topic": topic, "seq": frame["seq"]});
                    if !send(&mut ws, ack).await {
                        break;
                    }
                }
            }
        }
        sleep(Duration::from_millis(100)).await;
    }
}

/// Comes and goes on `room:1` (a presence namespace) every 300 ms, asking
/// for its presence each time, and its counts over HTTP: the subscriber
/// that stays gets a diff for each change.
async fn presence(url: String, addr: SocketAddr) {
    loop {
        if let Some(mut ws) = connect(&url).await {
            let _ = send(&mut ws, json!({"op": "sub", "id": 1, "topic": "room:1"})).await;
            let _ = send(
                &mut ws,
                json!({"op": "presence", "id": 2, "topic": "room:1"}),
            )
            .await;
            let _ = next_json(&mut ws, Duration::from_millis(300)).await;
            let _ = ws.close(None).await;
        }
        let path = "/v1/presence/stats?topic=room:1";
        let _ = testkit::http(addr, "GET", path, &[], b"").await;
        sleep(Duration::from_millis(300)).await;
    }
}

/// Publishes to `news` over HTTP every 50 ms; one in 20 to a bad topic (400).
async fn http_publisher(addr: SocketAddr) {
    for i in 0u64.. {
        let topic = if i % 20 == 19 { "not a topic!" } else { "news" };
        let body = json!({"topic": topic, "data": {"i": i}}).to_string();
        let _ = testkit::http(addr, "POST", "/v1/publish", &[], body.as_bytes()).await;
        sleep(Duration::from_millis(50)).await;
    }
}

/// Publishes to `ticks` over gRPC every 200 ms, asking `TopicInfo` now and then.
async fn grpc_publisher(addr: SocketAddr) {
    let endpoint = Endpoint::from_shared(format!("http://{addr}"))
        .expect("an endpoint")
        .connect_timeout(testkit::WAIT)
        .timeout(testkit::WAIT);
    let Ok(channel) = endpoint.connect().await else {
        return;
    };
    let mut client = PublisherClient::new(channel);
    for i in 0u64.. {
        let request = proto::v1::PublishRequest {
            topic: "ticks".into(),
            data: json!({"tick": i}).to_string().into_bytes(),
            idempotency_key: None,
            binary: false,
        };
        let _ = client.publish(request).await;
        if i % 5 == 0 {
            let info = proto::v1::TopicInfoRequest {
                topic: "ticks".into(),
            };
            let _ = client.topic_info(info).await;
        }
        sleep(Duration::from_millis(200)).await;
    }
}

/// Clients that come and go: each resumes the previous one's session or
/// starts afresh (now and then naming a session that does not exist),
/// subscribes with `since` (from a position it knows, or from another
/// epoch), sends a bad command, reads a little and closes.
async fn churn(url: String) {
    let mut session: Option<String> = None;
    let mut position: Option<(u64, String)> = None;
    for i in 0u64.. {
        let Some(mut ws) = connect(&url).await else {
            sleep(Duration::from_millis(200)).await;
            continue;
        };
        let hello = match (i % 4, &session) {
            (1, Some(s)) => json!({"op": "hello", "resume": s}),
            (3, _) => json!({"op": "hello", "resume": "no-such-session"}),
            _ => json!({"op": "hello"}),
        };
        let _ = send(&mut ws, hello).await;
        let welcome = next_json(&mut ws, testkit::WAIT).await.unwrap_or_default();
        session = welcome["session"].as_str().map(str::to_owned);
        if welcome["resumed"] != true {
            let mut sub = json!({"op": "sub", "id": 1, "topic": "news"});
            if let Some((seq, epoch)) = &position {
                sub["since"] = json!(seq.saturating_sub(3));
                sub["epoch"] = if i % 3 == 0 {
                    json!("0000000000000000")
                } else {
                    json!(epoch)
                };
            }
            let _ = send(&mut ws, sub).await;
        }
        let _ = send(&mut ws, json!({"op": "no-such-op"})).await;
        let until = Instant::now() + Duration::from_millis(400);
        while let Some(frame) =
            next_json(&mut ws, until.saturating_duration_since(Instant::now())).await
        {
            if frame["op"] == "ok"
                && let (Some(seq), Some(epoch)) = (frame["seq"].as_u64(), frame["epoch"].as_str())
            {
                position = Some((seq, epoch.to_owned()));
            }
            if frame["op"] == "msg" {
                let _ = send(
                    &mut ws,
                    json!({"op": "ack", "topic": "news", "seq": frame["seq"]}),
                )
                .await;
            }
        }
        let _ = ws.close(None).await;
        let _ = timeout(Duration::from_secs(1), async {
            while ws.next().await.is_some() {}
        })
        .await;
        sleep(Duration::from_millis(300)).await;
    }
}

/// A client that says hello and then never reads again, so never answers a
/// ping: closed as a dead peer. Then another, and so on.
async fn dead_peer(url: String) {
    loop {
        if let Some(mut ws) = connect(&url).await {
            let _ = send(&mut ws, json!({"op": "hello"})).await;
            sleep(Duration::from_secs(4)).await;
        }
    }
}
