//! What the pod tells its operators: `[log]` (the level, checked as a
//! filter, and the format) and `[telemetry]` (OpenTelemetry traces).

use serde::Deserialize;

use super::defaults::{DEFAULT_TELEMETRY_SAMPLE_RATIO, DEFAULT_TELEMETRY_SERVICE_NAME};

#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LogConfig {
    /// A `tracing` filter: `info`, `herald=debug,hyper=warn`, ...
    pub level: String,
    pub format: LogFormat,
}

/// OpenTelemetry traces of the publish path (docs/tracing.md); off unless
/// `otlp_endpoint` is set.
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TelemetryConfig {
    /// An OTLP/gRPC collector, `http://host:4317`; empty exports nothing.
    pub otlp_endpoint: String,
    /// The `service.name` resource attribute.
    pub service_name: String,
    /// Parent-based: a publisher's sampled flag is followed; a publish
    /// without one is traced with this probability (0 to 1).
    pub sample_ratio: f64,
}

impl Default for TelemetryConfig {
    fn default() -> Self {
        Self {
            otlp_endpoint: String::new(),
            service_name: DEFAULT_TELEMETRY_SERVICE_NAME.to_owned(),
            sample_ratio: DEFAULT_TELEMETRY_SAMPLE_RATIO,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LogFormat {
    Text,
    Json,
}

impl Default for LogConfig {
    fn default() -> Self {
        Self {
            level: "info".to_owned(),
            format: LogFormat::Text,
        }
    }
}

/// The levels a `log.level` directive may be alone.
const LOG_LEVELS: [&str; 6] = ["off", "error", "warn", "info", "debug", "trace"];

/// Whether `level` is a filter as `log.level` takes it: comma-separated
/// directives, each a level or `target=level` (`target[span]=level` too).
/// `EnvFilter` alone would take any word for a target, so that a typo
/// (`debgu`) left the pod logging next to nothing.
pub(super) fn check_log_level(level: &str) -> Result<(), String> {
    let hint = "(try `info`, or `gateway=debug,info`)";
    if let Err(e) = tracing_subscriber::EnvFilter::builder().parse(level) {
        return Err(format!("not a tracing filter: {e} {hint}"));
    }
    for directive in level.split(',').map(str::trim).filter(|d| !d.is_empty()) {
        let bare = !directive.contains('=') && !directive.contains('[');
        if bare && !LOG_LEVELS.contains(&directive.to_ascii_lowercase().as_str()) {
            return Err(format!(
                "`{directive}` is neither a level ({}) nor target=level {hint}",
                LOG_LEVELS.join(", ")
            ));
        }
    }
    Ok(())
}
