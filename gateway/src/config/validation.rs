//! The checks a loaded configuration passes before anything is started:
//! each refusal names its key.

use router::{Namespaces, Publish, Subscribe};

use super::defaults::MAX_DURATION;
use super::observability::check_log_level;
use super::{BrokerKind, Config, ConfigError};

impl Config {
    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        let invalid = |key, reason: &str| {
            Err(ConfigError::Invalid {
                key,
                reason: reason.to_owned(),
            })
        };
        let ws = &self.websocket;
        if ws.max_message_bytes == 0 {
            return invalid("websocket.max_message_bytes", "must be at least 1");
        }
        if let Err((key, reason)) = ws.compression.validate() {
            return invalid(key, &reason);
        }
        for (key, d) in [
            ("websocket.ping_interval", ws.ping_interval),
            ("websocket.pong_timeout", ws.pong_timeout),
            ("websocket.write_timeout", ws.write_timeout),
            ("websocket.handshake_timeout", ws.handshake_timeout),
            ("websocket.hello_timeout", ws.hello_timeout),
            ("websocket.message_timeout", ws.message_timeout),
            ("http.request_timeout", self.http.request_timeout),
            ("grpc.keepalive_interval", self.grpc.keepalive_interval),
            ("grpc.keepalive_timeout", self.grpc.keepalive_timeout),
        ] {
            if d.is_zero() {
                return invalid(key, "must be longer than 0s");
            }
        }
        // Every duration is added to the clock somewhere (a deadline, a
        // timer): one too long for it would panic there, in a connection's
        // task, instead of being refused here.
        for (key, d) in [
            ("websocket.ping_interval", ws.ping_interval),
            ("websocket.pong_timeout", ws.pong_timeout),
            ("websocket.write_timeout", ws.write_timeout),
            ("websocket.handshake_timeout", ws.handshake_timeout),
            ("websocket.close_timeout", ws.close_timeout),
            ("websocket.hello_timeout", ws.hello_timeout),
            ("websocket.message_timeout", ws.message_timeout),
            ("http.request_timeout", self.http.request_timeout),
            ("session.resume_window", self.session.resume_window),
            ("session.flush_interval", self.session.flush_interval),
            ("redis.command_timeout", self.redis.command_timeout),
            ("redis.linger", self.redis.linger),
            ("shutdown.drain_timeout", self.shutdown.drain_timeout),
            ("rebalance.interval", self.rebalance.interval),
            (
                "auth.jwks_refresh_interval",
                self.auth.jwks_refresh_interval,
            ),
            ("auth.jwks_min_refetch", self.auth.jwks_min_refetch),
            ("presence.diff_interval", self.presence.diff_interval),
            ("presence.pod_ttl", self.presence.pod_ttl),
        ] {
            if d > MAX_DURATION {
                return invalid(key, "must be at most 365 days");
            }
        }
        if ws.max_connections == 0 {
            return invalid("websocket.max_connections", "must be at least 1");
        }
        if ws.commands_per_second == 0 {
            return invalid("websocket.commands_per_second", "must be at least 1");
        }
        if ws.commands_burst == 0 {
            return invalid("websocket.commands_burst", "must be at least 1");
        }
        if ws.ipv4_prefix > 32 {
            return invalid("websocket.ipv4_prefix", "must be 0 to 32");
        }
        if ws.ipv6_prefix > 128 {
            return invalid("websocket.ipv6_prefix", "must be 0 to 128");
        }
        if self.http.max_concurrent_requests == 0 {
            return invalid("http.max_concurrent_requests", "must be at least 1");
        }
        if self.grpc.max_concurrent_streams == 0 {
            return invalid("grpc.max_concurrent_streams", "must be at least 1");
        }
        if self.grpc.max_connections == 0 {
            return invalid("grpc.max_connections", "must be at least 1");
        }
        if let Some(api) = self.http.api_listen
            && api.port() != 0
            && (api == self.listen || api == self.grpc.listen)
        {
            return invalid(
                "http.api_listen",
                "must differ from `listen` and `grpc.listen`",
            );
        }
        if let Err((key, reason)) = self.auth.validate() {
            return invalid(key, &reason);
        }
        if self.queue.frames < 2 {
            return invalid("queue.frames", "must be at least 2");
        }
        if self.queue.bytes < 2 * ws.max_message_bytes {
            return invalid(
                "queue.bytes",
                "must hold at least two of the largest messages (2 x websocket.max_message_bytes)",
            );
        }
        let replay = &self.replay;
        for (key, n) in [
            ("replay.max_concurrent", replay.max_concurrent),
            ("replay.page_messages", replay.page_messages),
            ("replay.page_bytes", replay.page_bytes),
            (
                "replay.catch_up_reads_per_second",
                replay.catch_up_reads_per_second as usize,
            ),
            ("history.max_limit", self.history.max_limit),
        ] {
            if n == 0 {
                return invalid(key, "must be at least 1");
            }
        }
        if replay.wait.is_zero() {
            return invalid("replay.wait", "must be longer than 0s");
        }
        if self.http.max_body_bytes == 0 {
            return invalid("http.max_body_bytes", "must be at least 1");
        }
        if self.http.api_keys.iter().any(|k| k.trim().is_empty()) {
            return invalid("http.api_keys", "keys must not be empty");
        }
        if let Err(reason) = self.http.keys() {
            return invalid("http.api_keys_file", &reason);
        }
        // Port 0 (any free port, as tests bind) may appear twice.
        if self.grpc.listen == self.listen && self.listen.port() != 0 {
            return invalid("grpc.listen", "must differ from `listen`");
        }
        if let Err(reason) = check_log_level(&self.log.level) {
            return invalid("log.level", &reason);
        }
        let telemetry = &self.telemetry;
        if !telemetry.otlp_endpoint.is_empty() {
            let endpoint = telemetry.otlp_endpoint.parse::<hyper::Uri>();
            let plain_http = endpoint
                .as_ref()
                .is_ok_and(|uri| uri.scheme_str() == Some("http") && uri.host().is_some());
            if !plain_http {
                return invalid(
                    "telemetry.otlp_endpoint",
                    "must be an OTLP/gRPC collector as http://host:port (no TLS), or empty",
                );
            }
        }
        if telemetry.service_name.trim().is_empty() {
            return invalid("telemetry.service_name", "must not be empty");
        }
        if !(0.0..=1.0).contains(&telemetry.sample_ratio) {
            return invalid("telemetry.sample_ratio", "must be in [0, 1]");
        }
        let rebalance = &self.rebalance;
        if rebalance.enabled {
            if self.broker == BrokerKind::Memory {
                return invalid(
                    "rebalance.enabled",
                    "needs broker = \"redis\": pods compare loads through it",
                );
            }
            if rebalance.interval.is_zero() {
                return invalid("rebalance.interval", "must be longer than 0s");
            }
            if !(rebalance.tolerance > 0.0 && rebalance.tolerance.is_finite()) {
                return invalid("rebalance.tolerance", "must be above 0 (0.2 is 20%)");
            }
            if !(rebalance.max_move_fraction > 0.0 && rebalance.max_move_fraction <= 1.0) {
                return invalid("rebalance.max_move_fraction", "must be in (0, 1]");
            }
        }
        if let Err((key, reason)) = self.presence.check() {
            return invalid(key, reason);
        }
        if let Err((key, reason)) = self.streams.check() {
            return invalid(key, reason);
        }
        // Webhooks (issue #24).
        if let Err((key, reason)) = self.webhooks.check() {
            return invalid(key, &reason);
        }
        if self.session.flush_interval.is_zero() {
            return invalid("session.flush_interval", "must be longer than 0s");
        }
        if self.broker == BrokerKind::Redis {
            if let Err(e) = self.redis.settings().validate() {
                return invalid(e.key, &e.reason);
            }
            if self.redis.command_timeout.is_zero() {
                return invalid("redis.command_timeout", "must be longer than 0s");
            }
        }
        // [proxy] (issue #24, the proxies' transport).
        if let Err((key, reason)) = self.proxy.check(&self.namespaces) {
            return invalid(key, &reason);
        }
        if let Err(e) = Namespaces::new(&self.namespaces) {
            return Err(ConfigError::Invalid {
                key: "namespaces",
                reason: e.to_string(),
            });
        }
        // A catch-up reads history: a namespace without any has none to read.
        for (name, ns) in &self.namespaces {
            if ns.on_lag == Some(router::OnLag::CatchUp) && ns.history_size == 0 {
                return Err(ConfigError::Invalid {
                    key: "namespaces",
                    reason: format!(
                        "namespace `{name}` has on_lag = \"catch_up\" but history_size = 0: a \
                         lagging subscriber is caught up from history (keep some, or choose \
                         \"disconnect\" or \"drop_newest\")"
                    ),
                });
            }
        }
        // Without a key nobody holds a token: nobody could ever be granted a
        // topic or own a personal one.
        if !self.auth.enabled() {
            for (name, ns) in &self.namespaces {
                let needs_tokens = ns.personal
                    || ns.subscribe == Subscribe::Granted
                    || ns.publish == Publish::Granted;
                if needs_tokens {
                    return Err(ConfigError::Invalid {
                        key: "namespaces",
                        reason: format!(
                            "namespace `{name}` grants by token (`granted` or `personal`), but no \
                             [auth] key is configured"
                        ),
                    });
                }
            }
        }
        Ok(())
    }
}
