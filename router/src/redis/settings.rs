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
use crate::PresenceSettings;

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
    /// This pod's presence: its liveness ttl and name.
    pub presence: PresenceSettings,
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
            .field("presence", &self.presence)
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

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(url: &str) -> RedisSettings {
        RedisSettings {
            url: url.to_owned(),
            password: None,
            tls: TlsFiles::default(),
            sentinel: None,
            cluster: Vec::new(),
            command_timeout: Duration::from_secs(1),
            linger: Duration::from_secs(1),
            prefix: scripts::DEFAULT_PREFIX.to_owned(),
            presence: PresenceSettings::default(),
        }
    }

    fn sentinel(master_name: &str, addresses: &[&str]) -> SentinelSettings {
        SentinelSettings {
            master_name: master_name.to_owned(),
            addresses: addresses.iter().map(|a| a.to_string()).collect(),
            password: Some("sentinel-s3cret".into()),
            tls: false,
        }
    }

    /// The key `validate` names, and its reason.
    fn refused(settings: &RedisSettings) -> (&'static str, String) {
        match settings.validate() {
            Ok(()) => panic!("{settings:?} validated"),
            Err(e) => (e.key, e.reason),
        }
    }

    #[test]
    fn a_plain_url_with_the_defaults_is_valid_and_reaches_its_address() {
        let plain = settings("redis://127.0.0.1:6379");
        assert!(plain.validate().is_ok());
        let connector = plain.connector().expect("a connector");
        assert_eq!(connector.describe(), "127.0.0.1:6379");
        assert!(connector.first_database());
        let tls = settings("rediss://user:pw@redis.example:6380/2");
        assert!(tls.validate().is_ok());
        let connector = tls.connector().expect("a connector");
        assert_eq!(connector.describe(), "redis.example:6380");
        assert!(!connector.first_database());
    }

    #[test]
    fn a_url_that_is_not_redis_s_is_refused_as_redis_url() {
        for url in [
            "http://127.0.0.1:6379",
            "127.0.0.1:6379",
            "redis://127.0.0.1:port",
        ] {
            assert_eq!(refused(&settings(url)).0, "redis.url", "{url}");
        }
    }

    #[test]
    fn a_prefix_outside_its_alphabet_or_length_is_refused() {
        for prefix in ["", "{tag}", "a b", &"x".repeat(65)] {
            let mut with = settings("redis://127.0.0.1");
            with.prefix = prefix.to_owned();
            assert_eq!(refused(&with).0, "redis.prefix", "{prefix:?}");
        }
        let mut staging = settings("redis://127.0.0.1");
        staging.prefix = "herald-staging:v2".into();
        assert!(staging.validate().is_ok());
    }

    #[test]
    fn a_cluster_is_its_nodes_over_tcp_in_database_0_without_sentinel() {
        let mut cluster = settings("redis://:pw@ignored:1");
        cluster.cluster = vec![
            "redis://10.0.0.1:7000".into(),
            "rediss://node-b:7001".into(),
        ];
        assert!(cluster.validate().is_ok());
        assert_eq!(
            seeds(&cluster.cluster),
            Ok(vec![("10.0.0.1".into(), 7000), ("node-b".into(), 7001)])
        );

        let mut with_sentinel = cluster.clone();
        with_sentinel.sentinel = Some(sentinel("mymaster", &["10.0.0.9:26379"]));
        let (key, reason) = refused(&with_sentinel);
        assert_eq!(key, "redis.cluster");
        assert!(reason.contains("redis.sentinel"), "{reason}");

        let mut other_db = cluster.clone();
        other_db.url = "redis://ignored:1/3".into();
        let (key, reason) = refused(&other_db);
        assert_eq!(
            (key, reason.as_str()),
            ("redis.url", "a Redis Cluster has only database 0")
        );

        let mut socket = cluster.clone();
        socket.cluster = vec!["redis+unix:///tmp/redis.sock".into()];
        let (key, reason) = refused(&socket);
        assert_eq!(key, "redis.cluster");
        assert!(reason.contains("over TCP"), "{reason}");
    }

    #[test]
    fn a_cluster_node_that_is_no_url_is_refused_without_its_password() {
        let urls = vec!["redis://:s3cret@10.0.0.1:notaport".to_owned()];
        let reason = seeds(&urls).expect_err("no port");
        assert!(reason.contains("10.0.0.1"), "{reason}");
        assert!(!reason.contains("s3cret"), "{reason}");
        assert!(seeds(&["nowhere".to_owned()]).is_err());
    }

    #[test]
    fn sentinel_settings_need_a_master_name_and_host_port_addresses() {
        let with = |s: SentinelSettings| {
            let mut settings = settings("redis://127.0.0.1");
            settings.sentinel = Some(s);
            settings
        };
        let good = with(sentinel("mymaster", &["10.0.0.1:26379", "[::1]:26380"]));
        assert!(good.validate().is_ok());
        assert_eq!(
            good.connector().expect("a connector").describe(),
            "master `mymaster` of the sentinels 10.0.0.1:26379, [::1]:26380"
        );
        assert_eq!(
            refused(&with(sentinel(" ", &["10.0.0.1:26379"]))).0,
            "redis.sentinel.master_name"
        );
        assert_eq!(
            refused(&with(sentinel("mymaster", &[]))).0,
            "redis.sentinel.addresses"
        );
        let (key, reason) = refused(&with(sentinel("mymaster", &["10.0.0.1"])));
        assert_eq!(key, "redis.sentinel.addresses");
        assert!(reason.contains("`10.0.0.1` is not host:port"), "{reason}");
    }

    #[test]
    fn tls_files_need_a_rediss_url_and_each_other() {
        let pki = testkit::pki::Pki::new();
        let (cert, key) = pki.client();
        let with = |url: &str, ca: Option<PathBuf>, cert: Option<PathBuf>, key: Option<PathBuf>| {
            let mut settings = settings(url);
            settings.tls = TlsFiles { ca, cert, key };
            settings
        };
        let mtls = with(
            "rediss://127.0.0.1:6380",
            Some(pki.ca()),
            Some(cert.clone()),
            Some(key.clone()),
        );
        assert!(mtls.validate().is_ok());
        assert!(
            with("rediss://127.0.0.1", Some(pki.ca()), None, None)
                .validate()
                .is_ok()
        );

        let (key_name, reason) = refused(&with("redis://127.0.0.1", Some(pki.ca()), None, None));
        assert_eq!(key_name, "redis.tls_ca");
        assert!(reason.contains("rediss://"), "{reason}");
        let plain_mtls = with(
            "redis://127.0.0.1",
            None,
            Some(cert.clone()),
            Some(key.clone()),
        );
        assert_eq!(refused(&plain_mtls).0, "redis.tls_cert");
        let no_key = with("rediss://127.0.0.1", None, Some(cert.clone()), None);
        assert_eq!(
            refused(&no_key),
            ("redis.tls_key", "is needed with `redis.tls_cert`".into())
        );
        let no_cert = with("rediss://127.0.0.1", None, None, Some(key.clone()));
        assert_eq!(
            refused(&no_cert),
            ("redis.tls_cert", "is needed with `redis.tls_key`".into())
        );
    }

    #[test]
    fn a_tls_file_that_is_missing_or_not_pem_is_refused_naming_its_key() {
        let pki = testkit::pki::Pki::new();
        let (cert, key) = pki.client();
        let not_pem = pki.dir().join("not.pem");
        std::fs::write(&not_pem, "not a certificate").expect("write a file");
        let missing = pki.dir().join("missing.pem");
        let with = |ca: Option<PathBuf>, cert: Option<PathBuf>, key: Option<PathBuf>| {
            let mut settings = settings("rediss://127.0.0.1");
            settings.tls = TlsFiles { ca, cert, key };
            settings
        };
        let (name, reason) = refused(&with(Some(missing.clone()), None, None));
        assert_eq!(name, "redis.tls_ca");
        assert!(reason.contains("missing.pem"), "{reason}");
        let (name, reason) = refused(&with(Some(not_pem.clone()), None, None));
        assert_eq!(name, "redis.tls_ca");
        assert!(reason.contains("no PEM certificate"), "{reason}");
        let (name, _) = refused(&with(None, Some(not_pem.clone()), Some(key.clone())));
        assert_eq!(name, "redis.tls_cert");
        // A certificate where the key should be.
        let (name, _) = refused(&with(None, Some(cert.clone()), Some(cert.clone())));
        assert_eq!(name, "redis.tls_key");
        let (name, _) = refused(&with(None, Some(cert), Some(missing)));
        assert_eq!(name, "redis.tls_key");
    }

    #[test]
    fn urls_are_shown_without_their_password() {
        assert_eq!(
            redact_url("redis://herald:s3cret@10.0.0.1:6379/0"),
            "redis://herald:<redacted>@10.0.0.1:6379/0"
        );
        assert_eq!(
            redact_url("rediss://:s3cret@h:6380"),
            "rediss://:<redacted>@h:6380"
        );
        for shown in ["redis://10.0.0.1:6379", "redis://herald@h", "not a url"] {
            assert_eq!(redact_url(shown), shown);
        }
        assert_eq!(
            redact_urls(&["redis://a:b@h:1".into(), "redis://h:2".into()]),
            ["redis://a:<redacted>@h:1", "redis://h:2"]
        );
        let mut settings = settings("redis://herald:url-s3cret@h:6379");
        settings.password = Some("secret-s3cret".into());
        settings.sentinel = Some(sentinel("mymaster", &["h:26379"]));
        settings.cluster = vec!["redis://:node-s3cret@h:7000".into()];
        let shown = format!("{settings:?}");
        assert!(!shown.contains("s3cret"), "{shown}");
        assert!(shown.contains("<redacted>"), "{shown}");
    }
}
