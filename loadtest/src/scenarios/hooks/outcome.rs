//! What a `hooks` run found ([`Hooks`]), phase by phase, and its table.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::cpu::Usage;
use crate::latency::Summary;
use crate::report::Row;

/// Issue #24's target: connect-proxy handshakes a pod accepts per second.
pub const TARGET_HANDSHAKES_PER_S: f64 = 5_000.0;
/// Issue #24's target: what the publish proxy adds to a `pub`'s p99, over
/// the backend's own time, µs.
pub const TARGET_ADDED_P99_US: f64 = 2_000.0;

/// A batch of handshakes of one kind.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Handshakes {
    /// `proxy` (no token: the connect proxy) or `token` (HS256, no proxy).
    pub auth: String,
    /// Handshakes that got their `welcome`.
    pub handshakes: u64,
    pub failed: u64,
    pub first_failure: Option<String>,
    /// Clients handshaking at once.
    pub concurrency: usize,
    /// From the first connect to the last `welcome`.
    pub wall_s: f64,
    pub per_s: f64,
    /// Each handshake, TCP connect to `welcome`.
    pub latency: Summary,
    /// The connect proxy's own time per call (empty with tokens).
    pub backend: Summary,
    /// Connect calls that named their user by the forwarded `Cookie`.
    #[serde(default)]
    pub backend_cookies: u64,
    /// The pod watched.
    pub cpu: Usage,
}

/// `pub`s through the publish proxy beside `pub`s without it.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Publishes {
    pub clients: usize,
    pub rate_per_s: f64,
    pub duration_s: f64,
    /// `pub` to `ok`, the `plain` namespace (no proxy).
    pub plain: Summary,
    /// `pub` to `ok`, the `hooked` namespace (the publish proxy).
    pub proxied: Summary,
    /// The same, each less the backend's own time for it.
    pub proxied_net: Summary,
    /// The publish proxy's own time per call.
    pub backend: Summary,
    /// `proxied_net` less `plain`, at p50 and p99, µs (negative: less).
    pub added_p50_us: f64,
    pub added_p99_us: f64,
    /// Proxied publishes the backend kept no time for (left out).
    pub unmatched: u64,
    pub errors: u64,
    pub first_error: Option<String>,
    pub cpu: Usage,
}

/// Webhooks delivered while clients connect, publish and close.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Webhooks {
    pub clients: usize,
    pub publishes_per_client: u64,
    /// Events the clients caused (opens, publishes, closes, their topics'
    /// occupied and vacated), in all and by type.
    pub expected: u64,
    pub expected_by_type: BTreeMap<String, u64>,
    /// Events received, a retried batch's again included; and distinct ids.
    pub received: u64,
    pub distinct: u64,
    pub by_type: BTreeMap<String, u64>,
    pub batches: u64,
    pub batch_mean: f64,
    pub batch_max: u64,
    /// The clients' time: first connect to last close.
    pub generated_s: f64,
    /// From the first connect to the last event's arrival.
    pub delivered_s: f64,
    /// Distinct events per second over `delivered_s`.
    pub per_s: f64,
    /// From the last close to the last event's arrival.
    pub lag_s: f64,
    pub errors: u64,
    pub first_error: Option<String>,
    pub cpu: Usage,
}

/// The result.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Hooks {
    /// The backend's delay before each proxy answer, ms.
    pub backend_delay_ms: f64,
    /// The connect proxy's batch, then the tokens' (same run, same pod).
    pub handshakes: Vec<Handshakes>,
    pub publish: Option<Publishes>,
    pub webhooks: Option<Webhooks>,
    /// Requests the backend could not read, and the last one's reason.
    pub backend_bad_requests: u64,
    pub backend_last_bad: Option<String>,
    /// What stopped a phase early.
    pub problems: Vec<String>,
}

impl Hooks {
    /// The batch of `auth` (`proxy`, `token`).
    pub fn batch(&self, auth: &str) -> Option<&Handshakes> {
        self.handshakes.iter().find(|h| h.auth == auth)
    }
}

impl crate::report::Outcome for Hooks {
    const SCENARIO: &'static str = "hooks";

    fn rows(&self) -> Vec<Row> {
        rows(self)
    }

    fn failures(&self) -> Vec<String> {
        let mut failures = self.problems.clone();
        for h in &self.handshakes {
            if h.failed > 0 {
                failures.push(format!(
                    "{} {} handshakes failed; first: {}",
                    h.failed,
                    h.auth,
                    h.first_failure.as_deref().unwrap_or("?")
                ));
            }
        }
        if let Some(p) = &self.publish
            && p.errors > 0
        {
            failures.push(format!(
                "{} publishing clients failed; first: {}",
                p.errors,
                p.first_error.as_deref().unwrap_or("?")
            ));
        }
        if let Some(w) = &self.webhooks {
            if w.errors > 0 {
                failures.push(format!(
                    "{} webhook clients failed; first: {}",
                    w.errors,
                    w.first_error.as_deref().unwrap_or("?")
                ));
            }
            if w.distinct < w.expected {
                failures.push(format!(
                    "{} of {} webhook events never arrived",
                    w.expected - w.distinct,
                    w.expected
                ));
            }
        }
        if self.backend_bad_requests > 0 {
            failures.push(format!(
                "the backend could not read {} requests; last: {}",
                self.backend_bad_requests,
                self.backend_last_bad.as_deref().unwrap_or("?")
            ));
        }
        failures
    }
}

/// `met` or `MISSED`, for the table.
fn mark(met: bool) -> &'static str {
    if met { "met" } else { "MISSED" }
}

fn rows(r: &Hooks) -> Vec<Row> {
    let mut rows = vec![Row::new(
        "backend delay",
        format!("{} ms", r.backend_delay_ms),
    )];
    for h in &r.handshakes {
        let mut value = format!(
            "{:.0}/s ({} in {:.2} s, {} at once, {} failed); latency {}",
            h.per_s,
            h.handshakes,
            h.wall_s,
            h.concurrency,
            h.failed,
            h.latency.brief()
        );
        if h.auth == "proxy" {
            value.push_str(&format!(
                "; ≥ {TARGET_HANDSHAKES_PER_S:.0}/s: {}",
                mark(h.per_s >= TARGET_HANDSHAKES_PER_S)
            ));
        }
        rows.push(Row::new(format!("handshakes, {}", h.auth), value));
        if h.backend.count > 0 {
            rows.push(Row::new(
                format!("  backend's own time, {}", h.auth),
                format!(
                    "{} ({} users by cookie)",
                    h.backend.brief(),
                    h.backend_cookies
                ),
            ));
        }
        rows.push(Row::new(format!("  CPU, {}", h.auth), h.cpu.brief()));
    }
    if let Some(p) = &r.publish {
        rows.push(Row::new(
            "publish: plain pub→ok",
            format!(
                "{} ({} pubs, {} clients, {:.0}/s)",
                p.plain.brief(),
                p.plain.count,
                p.clients,
                p.rate_per_s
            ),
        ));
        rows.push(Row::new("publish: proxied pub→ok", p.proxied.brief()));
        rows.push(Row::new(
            "publish: proxied less backend",
            p.proxied_net.brief(),
        ));
        rows.push(Row::new("publish: backend's own time", p.backend.brief()));
        rows.push(Row::new(
            "publish: added p50 / p99",
            format!(
                "{:.3} / {:.3} ms; p99 ≤ {} ms: {}",
                p.added_p50_us / 1000.0,
                p.added_p99_us / 1000.0,
                TARGET_ADDED_P99_US / 1000.0,
                mark(p.proxied_net.count > 0 && p.added_p99_us <= TARGET_ADDED_P99_US)
            ),
        ));
        rows.push(Row::new("publish: CPU", p.cpu.brief()));
    }
    if let Some(w) = &r.webhooks {
        rows.push(Row::new(
            "webhooks: events",
            format!(
                "{} of {} arrived ({} with retries); by type {:?} of {:?}",
                w.distinct, w.expected, w.received, w.by_type, w.expected_by_type
            ),
        ));
        rows.push(Row::new(
            "webhooks: rate",
            format!(
                "{:.0} events/s ({:.2} s to the last; made in {:.2} s, last {:.2} s after)",
                w.per_s, w.delivered_s, w.generated_s, w.lag_s
            ),
        ));
        rows.push(Row::new(
            "webhooks: batches",
            format!(
                "{}, {:.1} events each on average, {} at most",
                w.batches, w.batch_mean, w.batch_max
            ),
        ));
        rows.push(Row::new("webhooks: CPU", w.cpu.brief()));
    }
    rows
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::Outcome;

    #[test]
    fn failed_handshakes_and_events_that_never_arrived_fail_the_run_and_targets_do_not() {
        let mut hooks = Hooks {
            handshakes: vec![Handshakes {
                auth: "proxy".to_owned(),
                handshakes: 10,
                per_s: 10.0,
                ..Handshakes::default()
            }],
            webhooks: Some(Webhooks {
                expected: 5,
                distinct: 5,
                ..Webhooks::default()
            }),
            ..Hooks::default()
        };
        // A missed target is the page's verdict, not a failure.
        assert!(hooks.failures().is_empty(), "{:?}", hooks.failures());
        assert!(
            rows(&hooks)
                .iter()
                .any(|r| r.value.contains("≥ 5000/s: MISSED")),
        );
        hooks.handshakes[0].failed = 2;
        hooks.handshakes[0].first_failure = Some("closed 4003".to_owned());
        if let Some(w) = hooks.webhooks.as_mut() {
            w.distinct = 3;
        }
        let failures = hooks.failures();
        assert_eq!(failures.len(), 2, "{failures:?}");
        assert!(failures[0].contains("2 proxy handshakes failed; first: closed 4003"));
        assert!(failures[1].contains("2 of 5 webhook events never arrived"));
    }
}
