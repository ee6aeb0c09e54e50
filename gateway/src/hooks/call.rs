//! One proxy: its transport, and what every call to it goes through
//! ([`Proxy::call`]): a slot among `proxy.max_in_flight` (none free: refused
//! at once, as a backend that is slow already gains nothing from more
//! callers queueing on it), the proxy's `timeout` over the whole call (the
//! answer's body included), its metrics, and a log line for a call without
//! a usable answer (at most one a second per proxy: a backend that is down
//! fails every call).

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use prometheus::IntGauge;
use tokio::sync::Semaphore;
use tokio::time::Instant;

use super::{Failure, HookError, Kind, grpc, http};
use crate::metrics::Metrics;

/// How a proxy's backend is reached.
pub(super) enum Transport {
    /// POST of JSON to `uri` through the pod's pooled HTTP client.
    Http(Arc<http::Client>, hyper::Uri),
    /// The `ProxyBackend` service over one lazily connected channel.
    Grpc(grpc::Client),
    /// A proxy whose client could not be built (logged when it was): every
    /// call fails, rather than the proxy being taken for absent.
    Broken,
}

/// A call that did not approve: the backend's refusal, or no usable answer
/// and what the log says of it.
#[derive(Debug)]
pub(super) enum Denied {
    Refusal(HookError),
    Failed(Failure, String),
}

impl Denied {
    pub(super) fn failed(failure: Failure, detail: impl std::fmt::Display) -> Self {
        Denied::Failed(failure, detail.to_string())
    }
}

impl From<HookError> for Denied {
    fn from(refusal: HookError) -> Self {
        match refusal {
            HookError::Unavailable(failure) => Denied::Failed(failure, String::new()),
            refusal => Denied::Refusal(refusal),
        }
    }
}

/// Least time between two warnings of one proxy, in milliseconds.
const WARN_EVERY_MS: u64 = 1000;

/// One configured proxy.
pub(super) struct Proxy {
    pub(super) kind: Kind,
    pub(super) transport: Transport,
    pub(super) timeout: Duration,
    slots: Semaphore,
    metrics: Arc<Metrics>,
    /// When this proxy last warned, in ms after `born` (0: never).
    warned: AtomicU64,
    born: Instant,
}

impl Proxy {
    pub(super) fn new(
        kind: Kind,
        transport: Transport,
        timeout: Duration,
        max_in_flight: usize,
        metrics: Arc<Metrics>,
    ) -> Self {
        Self {
            kind,
            transport,
            timeout,
            slots: Semaphore::new(max_in_flight.min(Semaphore::MAX_PERMITS)),
            metrics,
            warned: AtomicU64::new(0),
            born: Instant::now(),
        }
    }

    /// Runs `work` (one call to the backend) within this proxy's bounds,
    /// and counts how it went.
    pub(super) async fn call<T>(
        &self,
        work: impl Future<Output = Result<T, Denied>>,
    ) -> Result<T, HookError> {
        let Ok(_slot) = self.slots.try_acquire() else {
            return Err(self.count(Denied::failed(
                Failure::Saturated,
                "proxy.max_in_flight calls are waiting already",
            )));
        };
        let proxy = self.kind.as_str();
        let _in_flight = InFlight::new(self.metrics.proxy.in_flight.with_label_values(&[proxy]));
        let started = Instant::now();
        let result = match tokio::time::timeout(self.timeout, work).await {
            Ok(result) => result,
            Err(_) => Err(Denied::failed(
                Failure::Timeout,
                format_args!("no answer within {:?}", self.timeout),
            )),
        };
        self.metrics
            .proxy
            .duration
            .with_label_values(&[proxy])
            .observe(started.elapsed().as_secs_f64());
        match result {
            Ok(value) => {
                self.metrics
                    .proxy
                    .calls
                    .with_label_values(&[proxy, "ok"])
                    .inc();
                Ok(value)
            }
            Err(denied) => Err(self.count(denied)),
        }
    }

    /// Counts a call that did not approve (and warns of a failure): the
    /// session's error.
    fn count(&self, denied: Denied) -> HookError {
        let proxy = self.kind.as_str();
        let (result, error) = match denied {
            Denied::Refusal(refusal) => {
                let result = match &refusal {
                    HookError::Unauthorized(_) => "unauthorized",
                    HookError::Forbidden(_) => "forbidden",
                    HookError::Refused { .. } => "refused",
                    HookError::Unavailable(_) => "unavailable",
                };
                (result, refusal)
            }
            Denied::Failed(failure, detail) => {
                self.metrics
                    .proxy
                    .failures
                    .with_label_values(&[proxy, failure.as_str()])
                    .inc();
                self.warn(failure, &detail);
                ("unavailable", HookError::Unavailable(failure))
            }
        };
        self.metrics
            .proxy
            .calls
            .with_label_values(&[proxy, result])
            .inc();
        error
    }

    /// A `warn!` for a call without a usable answer, unless this proxy
    /// warned less than a second ago (then `debug!`).
    fn warn(&self, failure: Failure, detail: &str) {
        let proxy = self.kind.as_str();
        let now = u64::try_from(self.born.elapsed().as_millis())
            .unwrap_or(u64::MAX)
            .max(1);
        let last = self.warned.load(Ordering::Relaxed);
        let due = last == 0 || now.saturating_sub(last) >= WARN_EVERY_MS;
        if due
            && self
                .warned
                .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            tracing::warn!(
                proxy,
                reason = failure.as_str(),
                detail,
                "the backend gave no usable answer: the client is told `unavailable` (one warning a second per proxy at most)"
            );
        } else {
            tracing::debug!(
                proxy,
                reason = failure.as_str(),
                detail,
                "the backend gave no usable answer"
            );
        }
    }
}

/// A call in flight, counted in `herald_proxy_in_flight` until it ends,
/// however it ends (the session may drop it midway: its client left).
struct InFlight(IntGauge);

impl InFlight {
    fn new(gauge: IntGauge) -> Self {
        gauge.inc();
        Self(gauge)
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.dec();
    }
}
