//! The `hooks` section: issue #24's targets for the backend hooks, the
//! connect proxy's handshakes beside tokens' in the same run, what the
//! publish proxy adds to a `pub`, and webhooks per second.

use super::markdown::{count, cpu_line, fine_ms, paragraphs, table, thousands, verdict};
use super::results::Results;
use crate::scenarios::hooks::outcome::{TARGET_ADDED_P99_US, TARGET_HANDSHAKES_PER_S};
use crate::scenarios::hooks::{Handshakes, Hooks};

pub(super) fn section(results: &Results) -> String {
    let mut out = vec![
        "## hooks: connect and publish proxies, webhooks".to_owned(),
        "`herald-loadtest hooks`: a pod with `[proxy.connect]` and `[proxy.publish]` at a backend \
         inside the load tool (HTTP/1.1 keep-alive on loopback, each answer after a fixed delay, \
         its own time measured), and HS256 tokens as well. Handshakes (TCP connect to `welcome`, \
         then close) without a token go to the connect proxy (user by cookie); the same number \
         with a token follow, on the same pod. Clients then alternate `pub`s to a namespace with \
         `publish_proxy` and to one without. Last, a second pod sends webhooks while clients \
         connect, subscribe to a topic of their own, publish and close (`connection.open`, \
         `topic.occupied`, `client.publish`, `connection.close`, `topic.vacated`)."
            .to_owned(),
    ];
    match results.hooks("hooks") {
        Some(res) => {
            out.push(table(&["figure", "Herald", "target"], &rows(res)));
            out.push(details(res));
        }
        None => out.push("Not run.".to_owned()),
    }
    paragraphs(&out)
}

fn rows(res: &Hooks) -> Vec<Vec<String>> {
    let mut rows = Vec::new();
    let proxy = res.batch("proxy");
    let token = res.batch("token");
    if let Some(p) = proxy {
        rows.push(vec![
            format!(
                "connect-proxy handshakes per second (backend {} ms)",
                res.backend_delay_ms
            ),
            format!("{}/s", thousands(p.per_s)),
            format!(
                "≥ 5,000/s: {}",
                verdict(p.failed == 0 && p.per_s >= TARGET_HANDSHAKES_PER_S)
            ),
        ]);
    }
    if let Some(t) = token {
        rows.push(vec![
            "token (HS256) handshakes per second, same pod".to_owned(),
            format!("{}/s", thousands(t.per_s)),
            String::new(),
        ]);
    }
    for h in [proxy, token].into_iter().flatten() {
        rows.push(vec![
            format!("{} handshake latency p50 / p99", h.auth),
            latency(h),
            String::new(),
        ]);
    }
    if let (Some(p), Some(t)) = (proxy, token) {
        rows.push(vec![
            "added by the connect proxy, p50 / p99".to_owned(),
            format!(
                "{} / {} (backend's own {} / {})",
                fine_ms(f64::from(p.latency.p50_us) - f64::from(t.latency.p50_us)),
                fine_ms(f64::from(p.latency.p99_us) - f64::from(t.latency.p99_us)),
                fine_ms(f64::from(p.backend.p50_us)),
                fine_ms(f64::from(p.backend.p99_us)),
            ),
            String::new(),
        ]);
    }
    if let Some(p) = &res.publish {
        rows.push(vec![
            "publish proxy: pub→ok p99 added over the backend's own time".to_owned(),
            format!(
                "{} ({} less the backend, {} without the proxy)",
                fine_ms(p.added_p99_us),
                fine_ms(f64::from(p.proxied_net.p99_us)),
                fine_ms(f64::from(p.plain.p99_us)),
            ),
            format!(
                "≤ 2 ms: {}",
                verdict(
                    p.errors == 0
                        && p.proxied_net.count > 0
                        && p.added_p99_us <= TARGET_ADDED_P99_US
                )
            ),
        ]);
    }
    if let Some(w) = &res.webhooks {
        rows.push(vec![
            "webhook events delivered per second".to_owned(),
            format!(
                "{}/s ({:.1} events per batch, {} at most)",
                thousands(w.per_s),
                w.batch_mean,
                w.batch_max
            ),
            String::new(),
        ]);
    }
    rows
}

fn latency(h: &Handshakes) -> String {
    format!(
        "{} / {}",
        fine_ms(f64::from(h.latency.p50_us)),
        fine_ms(f64::from(h.latency.p99_us))
    )
}

fn details(res: &Hooks) -> String {
    let mut lines = Vec::new();
    for h in &res.handshakes {
        lines.push(format!(
            "{}: {} in {:.2} s, {} at once, {} failed; the pod's CPU {} per handshake. {}",
            if h.auth == "proxy" {
                "Handshakes through the connect proxy (no token)"
            } else {
                "Handshakes with an HS256 token (no proxy)"
            },
            count(h.handshakes),
            h.wall_s,
            h.concurrency,
            h.failed,
            pod_cpu_per(&h.cpu, h.handshakes),
            cpu_line(&h.cpu)
        ));
    }
    if let Some(p) = &res.publish {
        lines.push(format!(
            "Publishes: {} clients, {} pub/s in all for {:.0} s, every other one through the \
             proxy; pub→ok p50/p99 without the proxy {} / {}, with it {} / {} ({} / {} less the \
             backend's own {} / {}). {}",
            p.clients,
            thousands(p.rate_per_s),
            p.duration_s,
            fine_ms(f64::from(p.plain.p50_us)),
            fine_ms(f64::from(p.plain.p99_us)),
            fine_ms(f64::from(p.proxied.p50_us)),
            fine_ms(f64::from(p.proxied.p99_us)),
            fine_ms(f64::from(p.proxied_net.p50_us)),
            fine_ms(f64::from(p.proxied_net.p99_us)),
            fine_ms(f64::from(p.backend.p50_us)),
            fine_ms(f64::from(p.backend.p99_us)),
            cpu_line(&p.cpu)
        ));
    }
    if let Some(w) = &res.webhooks {
        lines.push(format!(
            "Webhooks: {} clients × {} publishes; {} of {} events arrived ({} with retried \
             batches) in {} batches, the last {:.2} s after the clients were done ({:.2} s). {}",
            w.clients,
            w.publishes_per_client,
            count(w.distinct),
            count(w.expected),
            count(w.received),
            count(w.batches),
            w.lag_s,
            w.generated_s,
            cpu_line(&w.cpu)
        ));
    }
    lines.join(" ")
}

/// The watched pod's CPU per `n` of something, in µs.
fn pod_cpu_per(cpu: &crate::cpu::Usage, n: u64) -> String {
    let pod: Option<f64> = cpu.watched.iter().map(|w| w.cpu_s).sum();
    match pod {
        Some(s) if n > 0 => format!("{:.0} µs", s * 1e6 / n as f64),
        _ => "n/a".to_owned(),
    }
}
