//! Building the pod's hooks from `[proxy]`: one HTTP client for every HTTP
//! proxy, a gRPC channel for each gRPC one, and the bounds of each.

use std::sync::Arc;

use super::call::{Proxy, Transport};
use super::{Hooks, Kind, grpc, http};
use crate::config::{
    Config, DEFAULT_PRESENCE_MAX_INFO_BYTES, Endpoint, ProxyConfig, Scheme, UrlError,
};
use crate::metrics::Metrics;

/// Why the pod's hooks could not be built.
#[derive(Debug, thiserror::Error)]
pub enum HooksError {
    /// A proxy's URL (`Config::validate` refuses it first).
    #[error("invalid value for `{key}`: `{url}` {error}")]
    Url {
        key: &'static str,
        url: String,
        error: UrlError,
    },
    /// A `grpc://` proxy built outside a tokio runtime (a bug).
    #[error("gRPC proxies are built within the runtime")]
    NoRuntime,
    /// An `https://` proxy, and no root certificates to check it with.
    #[error("HTTPS proxies: no root certificates: {0}")]
    Roots(std::io::Error),
}

impl Hooks {
    /// The pod's hooks: a client for each configured proxy (none connects
    /// yet). Fails on a URL that `Config::validate` would have refused, or
    /// an `https://` proxy without root certificates.
    pub fn start(
        config: &Config,
        pod: Arc<str>,
        metrics: Arc<Metrics>,
    ) -> Result<Self, HooksError> {
        Self::build(&config.proxy, pod, config.presence.max_info_bytes, metrics)
    }

    /// [`Hooks::start`] for tests and tools without a pod: a proxy that
    /// cannot be built is logged, and fails every call (never taken for
    /// absent: a `hello` would be let in by the anonymous rule instead).
    pub fn new(config: &ProxyConfig, metrics: Arc<Metrics>) -> Self {
        let max_info = DEFAULT_PRESENCE_MAX_INFO_BYTES;
        match Self::build(config, Arc::from("herald"), max_info, metrics.clone()) {
            Ok(hooks) => hooks,
            Err(error) => {
                tracing::error!(%error, "the proxies cannot be called");
                let broken = |kind, endpoint: &Option<Endpoint>| {
                    endpoint.as_ref().map(|endpoint| {
                        let max_in_flight = config.max_in_flight;
                        Proxy::new(
                            kind,
                            Transport::Broken,
                            endpoint.timeout,
                            max_in_flight,
                            metrics.clone(),
                        )
                    })
                };
                Self {
                    config: config.clone(),
                    pod: Arc::from("herald"),
                    max_info_bytes: max_info,
                    connect: broken(Kind::Connect, &config.connect),
                    refresh: broken(Kind::Refresh, &config.refresh),
                    subscribe: broken(Kind::Subscribe, &config.subscribe),
                    publish: broken(Kind::Publish, &config.publish),
                    rpc: broken(Kind::Rpc, &config.rpc),
                }
            }
        }
    }

    pub(super) fn build(
        config: &ProxyConfig,
        pod: Arc<str>,
        max_info_bytes: usize,
        metrics: Arc<Metrics>,
    ) -> Result<Self, HooksError> {
        let mut config = config.clone();
        // The upgrade looks headers up by these names; HTTP's are
        // case-insensitive, and lower case is how they are forwarded.
        if let Some(connect) = &mut config.connect {
            for name in &mut connect.headers {
                *name = name.trim().to_ascii_lowercase();
            }
            connect.headers.sort_unstable();
            connect.headers.dedup();
        }
        let endpoints = [
            (Kind::Connect, "proxy.connect.url", &config.connect),
            (Kind::Refresh, "proxy.refresh.url", &config.refresh),
            (Kind::Subscribe, "proxy.subscribe.url", &config.subscribe),
            (Kind::Publish, "proxy.publish.url", &config.publish),
            (Kind::Rpc, "proxy.rpc.url", &config.rpc),
        ];
        let mut targets = Vec::new();
        for (kind, key, endpoint) in &endpoints {
            let Some(endpoint) = endpoint else { continue };
            let (scheme, uri) = endpoint.target().map_err(|error| HooksError::Url {
                key,
                url: endpoint.url.clone(),
                error,
            })?;
            targets.push((*kind, scheme, uri, endpoint.timeout));
        }
        let http = if targets
            .iter()
            .any(|(_, scheme, ..)| *scheme != Scheme::Grpc)
        {
            let https = targets
                .iter()
                .any(|(_, scheme, ..)| *scheme == Scheme::Https);
            Some(Arc::new(
                http::Client::new(https).map_err(HooksError::Roots)?,
            ))
        } else {
            None
        };
        let (mut connect, mut refresh, mut subscribe, mut publish, mut rpc) =
            (None, None, None, None, None);
        for (kind, scheme, uri, timeout) in targets {
            let transport = match (scheme, &http) {
                (Scheme::Grpc, _) => {
                    // The channel's worker is a task: it needs the runtime.
                    if tokio::runtime::Handle::try_current().is_err() {
                        return Err(HooksError::NoRuntime);
                    }
                    Transport::Grpc(grpc::Client::new(uri, timeout, config.max_response_bytes))
                }
                (_, Some(client)) => Transport::Http(client.clone(), uri),
                (_, None) => Transport::Broken,
            };
            let proxy = Some(Proxy::new(
                kind,
                transport,
                timeout,
                config.max_in_flight,
                metrics.clone(),
            ));
            match kind {
                Kind::Connect => connect = proxy,
                Kind::Refresh => refresh = proxy,
                Kind::Subscribe => subscribe = proxy,
                Kind::Publish => publish = proxy,
                Kind::Rpc => rpc = proxy,
            }
        }
        Ok(Self {
            config,
            pod,
            max_info_bytes,
            connect,
            refresh,
            subscribe,
            publish,
            rpc,
        })
    }
}
