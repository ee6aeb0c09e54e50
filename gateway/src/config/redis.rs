//! `[redis]`: where the Redis broker connects and how (TLS, Sentinel,
//! Cluster), and the settings the router takes from it. Its `Debug` leaves
//! the passwords out.

use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use router::{RedisSettings, SentinelSettings, TlsFiles};
use serde::Deserialize;

use super::defaults::{DEFAULT_REDIS_COMMAND_TIMEOUT, DEFAULT_REDIS_LINGER, DEFAULT_REDIS_URL};

#[derive(Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RedisConfig {
    /// `redis://[user[:password]@]host:port/db`; `rediss://` for TLS. With
    /// Sentinel, only its scheme, user, password and db are used.
    pub url: String,
    /// The password, if not in the URL (so that it can come from a Secret,
    /// as `HERALD_REDIS__PASSWORD`); it wins over the URL's. Empty: the URL's.
    pub password: String,
    /// PEM file of the CA that signs the server's certificate (`rediss://`);
    /// empty: the system's roots.
    pub tls_ca: String,
    /// PEM files of a client certificate and its key, for a server that
    /// requires one (mTLS); empty: none.
    pub tls_cert: String,
    pub tls_key: String,
    /// Longest a Redis command may take; a publish fails with 503 after it.
    #[serde(with = "humantime_serde")]
    pub command_timeout: Duration,
    /// How long a pod stays subscribed to a topic after its last local subscriber left.
    #[serde(with = "humantime_serde")]
    pub linger: Duration,
    /// Redis under Sentinel: the master is asked for on every (re)connect.
    pub sentinel: SentinelConfig,
    /// Redis Cluster: `redis://host:port` of some of its nodes (the others
    /// are found from them); empty: not a cluster. The user, password and
    /// TLS settings above apply to every node.
    pub cluster: Vec<String>,
    /// What every key and channel starts with: deployments sharing a Redis
    /// need one each (pub/sub ignores the database number). Letters,
    /// digits, `-`, `_`, `.`, `:`.
    pub prefix: String,
}

/// Off while `master_name` is empty.
#[derive(Clone, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SentinelConfig {
    /// The name the sentinels monitor the master under.
    pub master_name: String,
    /// `host:port` of each sentinel.
    pub addresses: Vec<String>,
    /// The sentinels' own password, if they have one; empty: none.
    pub password: String,
    /// Whether the sentinels speak TLS (with `redis.tls_ca` and the client
    /// certificate).
    pub tls: bool,
}

impl Default for RedisConfig {
    fn default() -> Self {
        Self {
            url: DEFAULT_REDIS_URL.to_owned(),
            password: String::new(),
            tls_ca: String::new(),
            tls_cert: String::new(),
            tls_key: String::new(),
            command_timeout: DEFAULT_REDIS_COMMAND_TIMEOUT,
            linger: DEFAULT_REDIS_LINGER,
            sentinel: SentinelConfig::default(),
            cluster: Vec::new(),
            prefix: router::redis::DEFAULT_PREFIX.to_owned(),
        }
    }
}

impl RedisConfig {
    pub fn settings(&self) -> RedisSettings {
        let path = |p: &str| Some(p).filter(|p| !p.is_empty()).map(PathBuf::from);
        let text = |t: &str| Some(t).filter(|t| !t.is_empty()).map(str::to_owned);
        let sentinel = &self.sentinel;
        let sentinel_on = !sentinel.master_name.is_empty() || !sentinel.addresses.is_empty();
        RedisSettings {
            url: self.url.clone(),
            password: text(&self.password),
            tls: TlsFiles {
                ca: path(&self.tls_ca),
                cert: path(&self.tls_cert),
                key: path(&self.tls_key),
            },
            sentinel: sentinel_on.then(|| SentinelSettings {
                master_name: sentinel.master_name.clone(),
                addresses: sentinel.addresses.clone(),
                password: text(&sentinel.password),
                tls: sentinel.tls,
            }),
            cluster: self.cluster.clone(),
            command_timeout: self.command_timeout,
            linger: self.linger,
            prefix: self.prefix.clone(),
            // The gateway sets its `[presence]` and pod name where it starts the broker.
            presence: router::PresenceSettings::default(),
        }
    }
}

/// Without the passwords (the URL's included).
impl fmt::Debug for RedisConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisConfig")
            .field("url", &router::redis::redact_url(&self.url))
            .field("password", &redacted(&self.password))
            .field("tls_ca", &self.tls_ca)
            .field("tls_cert", &self.tls_cert)
            .field("tls_key", &self.tls_key)
            .field("command_timeout", &self.command_timeout)
            .field("linger", &self.linger)
            .field("sentinel", &self.sentinel)
            .field("cluster", &router::redis::redact_urls(&self.cluster))
            .field("prefix", &self.prefix)
            .finish()
    }
}

impl fmt::Debug for SentinelConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SentinelConfig")
            .field("master_name", &self.master_name)
            .field("addresses", &self.addresses)
            .field("password", &redacted(&self.password))
            .field("tls", &self.tls)
            .finish()
    }
}

fn redacted(secret: &str) -> &'static str {
    if secret.is_empty() { "" } else { "<redacted>" }
}
