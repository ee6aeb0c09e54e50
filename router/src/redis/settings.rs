//! What the engine is told about Redis: where it is (a URL, Sentinel's
//! master, a cluster's seed nodes), as whom, over TLS with which files, and
//! how patient to be; checked before anything connects ([`InvalidSetting`]
//! names the configuration key at fault).

use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use redis::{Client, ClientTlsConfig, ConnectionAddr, IntoConnectionInfo, TlsCertificates};
use rustls::pki_types::CertificateDer;
use rustls::pki_types::pem::PemObject;

use super::connection::Connector;
use super::scripts;

/// How to reach Redis and how patient to be with it.
#[derive(Clone)]
pub struct RedisSettings {
    /// `redis://[user[:password]@]host:port/db`, or `rediss://` for TLS. With
    /// Sentinel, the host and port are not used.
    pub url: String,
    /// Replaces the URL's password (so that it can come from a Secret).
    pub password: Option<String>,
    /// For `rediss://`: the CA, and a client certificate for mTLS.
    pub tls: TlsFiles,
    /// Where to ask for the master, if Redis runs under Sentinel.
    pub sentinel: Option<SentinelSettings>,
    /// Redis Cluster: some of its nodes (`redis://host:port` URLs; the
    /// rest are found from them). Empty: not a cluster. The user, password
    /// and TLS of `url` apply to every node.
    pub cluster: Vec<String>,
    /// Longest a command (or a connection attempt) may take before it fails.
    pub command_timeout: Duration,
    /// How long a pod stays subscribed to a topic after its last local
    /// subscriber left, so that a quick resubscribe costs nothing.
    pub linger: Duration,
    /// What every key and channel starts with ([`scripts::check_prefix`]):
    /// deployments sharing a Redis are isolated by theirs.
    pub prefix: String,
}

impl RedisSettings {
    /// Checks what can be checked before connecting: the URL, the
    /// certificate files, the sentinels' addresses.
    pub fn validate(&self) -> Result<(), InvalidSetting> {
        scripts::check_prefix(&self.prefix).map_err(|reason| InvalidSetting {
            key: "redis.prefix",
            reason,
        })?;
        if !self.cluster.is_empty() {
            if self.sentinel.is_some() {
                return Err(InvalidSetting {
                    key: "redis.cluster",
                    reason: "cannot be used with `redis.sentinel`: a cluster fails over by itself"
                        .into(),
                });
            }
            seeds(&self.cluster).map_err(|reason| InvalidSetting {
                key: "redis.cluster",
                reason,
            })?;
        }
        let connector = self.connector()?;
        if !self.cluster.is_empty() && !connector.first_database() {
            return Err(InvalidSetting {
                key: "redis.url",
                reason: "a Redis Cluster has only database 0".into(),
            });
        }
        Ok(())
    }

    pub(super) fn connector(&self) -> Result<Connector, InvalidSetting> {
        Connector::new(
            &self.url,
            self.password.as_deref(),
            &self.tls,
            self.sentinel.as_ref(),
            self.command_timeout,
        )
    }
}

impl std::fmt::Debug for RedisSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisSettings")
            .field("url", &redact_url(&self.url))
            .field("password", &self.password.as_ref().map(|_| "<redacted>"))
            .field("tls", &self.tls)
            .field("sentinel", &self.sentinel)
            .field("cluster", &redact_urls(&self.cluster))
            .field("command_timeout", &self.command_timeout)
            .field("linger", &self.linger)
            .field("prefix", &self.prefix)
            .finish()
    }
}

/// [`redact_url`] of each.
pub fn redact_urls(urls: &[String]) -> Vec<String> {
    urls.iter().map(|url| redact_url(url)).collect()
}

/// The URL without the password it may hold (`redis://user:<redacted>@host`).
pub fn redact_url(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    match rest.split_once('@') {
        Some((user_info, host)) if user_info.contains(':') => {
            let user = user_info.split_once(':').map_or("", |(user, _)| user);
            format!("{scheme}://{user}:<redacted>@{host}")
        }
        _ => url.to_owned(),
    }
}

/// PEM files for TLS (`rediss://`).
#[derive(Debug, Clone, Default)]
pub struct TlsFiles {
    /// CA certificates the server's certificate must chain to; `None`: the
    /// system's roots.
    pub ca: Option<PathBuf>,
    /// A client certificate (and below, its key), for a server that requires
    /// one (`tls-auth-clients yes`).
    pub cert: Option<PathBuf>,
    pub key: Option<PathBuf>,
}

/// Redis Sentinel: the master is whichever node the sentinels name, asked on
/// every connect.
#[derive(Clone)]
pub struct SentinelSettings {
    /// The name the sentinels monitor the master under.
    pub master_name: String,
    /// `host:port` of each sentinel.
    pub addresses: Vec<String>,
    /// The sentinels' own password (their `requirepass`), if they have one.
    pub password: Option<String>,
    /// Whether the sentinels speak TLS (with the CA and client certificate of
    /// [`TlsFiles`]).
    pub tls: bool,
}

impl fmt::Debug for SentinelSettings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SentinelSettings")
            .field("master_name", &self.master_name)
            .field("addresses", &self.addresses)
            .field("password", &self.password.as_ref().map(|_| "<redacted>"))
            .field("tls", &self.tls)
            .finish()
    }
}

/// A setting the engine cannot use; `key` names it as the configuration
/// file does (`redis.tls_ca`).
#[derive(Debug, Clone, thiserror::Error)]
#[error("{reason}")]
pub struct InvalidSetting {
    pub key: &'static str,
    pub reason: String,
}

pub(super) fn invalid(key: &'static str, reason: impl fmt::Display) -> InvalidSetting {
    InvalidSetting {
        key,
        reason: reason.to_string(),
    }
}

/// `host:port` of each cluster node URL (`redis://host:port`, `rediss://`
/// for TLS), or why one cannot be used (its password left out).
pub(super) fn seeds(urls: &[String]) -> Result<Vec<(String, u16)>, String> {
    urls.iter()
        .map(|url| {
            let shown = redact_url(url);
            let info = url
                .as_str()
                .into_connection_info()
                .map_err(|e| format!("`{shown}`: {e}"))?;
            match info.addr() {
                ConnectionAddr::Tcp(host, port) | ConnectionAddr::TcpTls { host, port, .. } => {
                    Ok((host.clone(), *port))
                }
                _ => Err(format!("`{shown}`: a cluster node is reached over TCP")),
            }
        })
        .collect()
}

/// The PEM files, read and checked now, so that a bad one stops the start
/// with its key named.
pub(super) fn certificates(files: &TlsFiles) -> Result<Option<TlsCertificates>, InvalidSetting> {
    let read = |key: &'static str, path: &Path| {
        std::fs::read(path).map_err(|e| invalid(key, format!("{}: {e}", path.display())))
    };
    // A file without a certificate would be read as an empty list, and the
    // failure put off to the first connect.
    let certificate = |key: &'static str, path: &Path| {
        let pem = read(key, path)?;
        let certificates = CertificateDer::pem_slice_iter(&pem)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| invalid(key, format!("{}: {e}", path.display())))?;
        if certificates.is_empty() {
            return Err(invalid(
                key,
                format!("{}: no PEM certificate in it", path.display()),
            ));
        }
        Ok(pem)
    };
    let root_cert = match &files.ca {
        Some(path) => Some(certificate("redis.tls_ca", path)?),
        None => None,
    };
    let client_tls = match (&files.cert, &files.key) {
        (Some(cert), Some(key)) => Some(ClientTlsConfig {
            client_cert: certificate("redis.tls_cert", cert)?,
            client_key: read("redis.tls_key", key)?,
        }),
        (None, None) => None,
        (Some(_), None) => return Err(invalid("redis.tls_key", "is needed with `redis.tls_cert`")),
        (None, Some(_)) => return Err(invalid("redis.tls_cert", "is needed with `redis.tls_key`")),
    };
    if root_cert.is_none() && client_tls.is_none() {
        return Ok(None);
    }
    let certificates = TlsCertificates {
        client_tls,
        root_cert,
    };
    // Parsed here as redis-rs will when it connects: a file that is no PEM
    // certificate (or key) is a configuration error, not a connect failure.
    // The key is what is left to check: redis-rs parses it here, as it will
    // when it connects.
    if let Err(e) = Client::build_with_tls("rediss://127.0.0.1", certificates.clone()) {
        return Err(invalid("redis.tls_key", e));
    }
    Ok(Some(certificates))
}
