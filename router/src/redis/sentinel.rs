//! Redis Sentinel: which node is master, asked of every sentinel on each
//! connect, and checked with the node itself (`ROLE`).

use std::time::Duration;

use redis::aio::MultiplexedConnection;
use redis::{
    AsyncConnectionConfig, Client, ConnectionAddr, ConnectionInfo, ErrorKind, IntoConnectionInfo,
    RedisConnectionInfo, RedisError, RedisResult, ServerErrorKind, TlsCertificates, Value,
};

use super::connection::{address_of, at, client, tcp_settings};
use super::settings::{InvalidSetting, SentinelSettings, invalid};

/// The sentinels to ask, and how to reach the node they name.
pub(super) struct Sentinels {
    master_name: String,
    sentinels: Vec<(String, Client)>,
    /// The URL's scheme, user, password and database, for whichever address
    /// the sentinels name.
    node: ConnectionInfo,
    certificates: Option<TlsCertificates>,
}

impl Sentinels {
    pub(super) fn new(
        settings: &SentinelSettings,
        node: ConnectionInfo,
        certificates: Option<TlsCertificates>,
    ) -> Result<Self, InvalidSetting> {
        const KEY: &str = "redis.sentinel.addresses";
        if settings.master_name.trim().is_empty() {
            return Err(invalid("redis.sentinel.master_name", "must not be empty"));
        }
        if settings.addresses.is_empty() {
            return Err(invalid(KEY, "must list at least one sentinel (host:port)"));
        }
        let mut redis = RedisConnectionInfo::default().set_skip_set_lib_name();
        if let Some(password) = &settings.password {
            redis = redis.set_password(password);
        }
        let sentinels = settings
            .addresses
            .iter()
            .map(|address| {
                let (host, port) = host_port(address)
                    .ok_or_else(|| invalid(KEY, format!("`{address}` is not host:port")))?;
                let info = address_of(host, port, settings.tls)
                    .into_connection_info()
                    .map_err(|e| invalid(KEY, e))?
                    .set_redis_settings(redis.clone())
                    .set_tcp_settings(tcp_settings());
                let certificates = certificates.as_ref().filter(|_| settings.tls);
                let client = client(info, certificates).map_err(|e| invalid(KEY, e))?;
                Ok((address.clone(), client))
            })
            .collect::<Result<_, InvalidSetting>>()?;
        Ok(Self {
            master_name: settings.master_name.clone(),
            sentinels,
            node,
            certificates,
        })
    }

    /// The master's name and the sentinels, for messages.
    pub(super) fn describe(&self) -> String {
        let addresses: Vec<&str> = self.sentinels.iter().map(|(a, _)| a.as_str()).collect();
        format!(
            "master `{}` of the sentinels {}",
            self.master_name,
            addresses.join(", ")
        )
    }

    /// Asks every sentinel at once (each bounded by `timeout`) and takes the
    /// address most of those that answered name (on a tie, the first listed).
    pub(super) async fn master(&self, timeout: Duration) -> RedisResult<Client> {
        let answers = futures_util::future::join_all(
            self.sentinels
                .iter()
                .map(|(_, sentinel)| ask(sentinel, &self.master_name, timeout)),
        )
        .await;
        let mut named: Vec<((String, u16), usize)> = Vec::new();
        let mut errors = Vec::new();
        for ((address, _), answer) in self.sentinels.iter().zip(answers) {
            match answer {
                Ok(Some(master)) => match named.iter_mut().find(|(m, _)| *m == master) {
                    Some((_, votes)) => *votes += 1,
                    None => named.push((master, 1)),
                },
                Ok(None) => errors.push(format!("{address}: does not know the master")),
                Err(e) => errors.push(format!("{address}: {e}")),
            }
        }
        // `max_by_key` keeps the last of equals: look from the end.
        let Some(((host, port), _)) = named.into_iter().rev().max_by_key(|(_, votes)| *votes)
        else {
            return Err(RedisError::from((
                ErrorKind::Io,
                "no sentinel named a master",
                format!("`{}` ({})", self.master_name, errors.join("; ")),
            )));
        };
        let tls = matches!(self.node.addr(), ConnectionAddr::TcpTls { .. });
        let info = self.node.clone().set_addr(address_of(host, port, tls));
        client(info, self.certificates.as_ref())
    }
}

/// `SENTINEL GET-MASTER-ADDR-BY-NAME`: where `name`'s master is, as this
/// sentinel sees it.
async fn ask(
    sentinel: &Client,
    name: &str,
    timeout: Duration,
) -> RedisResult<Option<(String, u16)>> {
    let config = AsyncConnectionConfig::new()
        .set_connection_timeout(Some(timeout))
        .set_response_timeout(Some(timeout));
    let asking = async {
        let mut conn = sentinel
            .get_multiplexed_async_connection_with_config(&config)
            .await?;
        redis::cmd("SENTINEL")
            .arg("GET-MASTER-ADDR-BY-NAME")
            .arg(name)
            .query_async(&mut conn)
            .await
    };
    // Connecting and asking, each bounded, may not take twice the timeout.
    tokio::time::timeout(timeout, asking)
        .await
        .unwrap_or_else(|_| Err(timed_out()))
}

/// Fails unless the node says it is master (`ROLE`): the sentinels may
/// still name a master that was just demoted, or one that is down.
pub(super) async fn expect_master(
    conn: &mut MultiplexedConnection,
    client: &Client,
) -> RedisResult<()> {
    let role: Value = redis::cmd("ROLE")
        .query_async(conn)
        .await
        .map_err(|e| at(client, e))?;
    let is_master = match &role {
        Value::Array(items) => {
            matches!(items.first(), Some(Value::BulkString(r)) if r == b"master")
        }
        _ => false,
    };
    if is_master {
        Ok(())
    } else {
        Err(RedisError::from((
            ErrorKind::Server(ServerErrorKind::ReadOnly),
            "the node the sentinels named is not master",
            client.get_connection_info().addr().to_string(),
        )))
    }
}

/// `host:port`, `[v6]:port`.
fn host_port(address: &str) -> Option<(String, u16)> {
    let (host, port) = address.trim().rsplit_once(':')?;
    let host = host
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host);
    if host.is_empty() {
        return None;
    }
    Some((host.to_owned(), port.parse().ok()?))
}

fn timed_out() -> RedisError {
    RedisError::from(std::io::Error::new(
        std::io::ErrorKind::TimedOut,
        "timed out",
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sentinel_addresses_are_host_and_port() {
        assert_eq!(
            host_port("10.0.0.1:26379"),
            Some(("10.0.0.1".into(), 26379))
        );
        assert_eq!(host_port("[::1]:26379"), Some(("::1".into(), 26379)));
        assert_eq!(
            host_port("sentinel-0.sentinel:26379"),
            Some(("sentinel-0.sentinel".into(), 26379))
        );
        assert_eq!(host_port("10.0.0.1"), None);
        assert_eq!(host_port(":26379"), None);
        assert_eq!(host_port("h:99999"), None);
    }
}
