//! How the engine reaches Redis: the address in the URL, or whichever node a
//! group of Sentinels names master; over TCP or TLS; as an ACL user.
//!
//! - [`Connector`] knows where to go. With Sentinel it asks the sentinels
//!   ([`super::sentinel`]) on every connect, so that a connection that dropped comes back to the
//!   node that is master now. (redis-rs's `ConnectionManager` and `PubSub`
//!   come back to the address they first had, and nothing in redis-rs asks
//!   the sentinels again.)
//! - [`Commands`] is the engine's command connection: one multiplexed
//!   connection shared by every clone, replaced when it fails (a dropped
//!   socket, a timeout, `READONLY` from a master that was demoted), with the
//!   bounded retries and backoff `ConnectionManager` had. It is a
//!   `ConnectionLike`, so scripts and pipelines run on it unchanged.
//! - [`Connector::pubsub_link`] opens a fresh pub/sub connection on the
//!   master (or a cluster's node, [`Connector::node`]).

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use backoff::Backoff;
use futures_util::FutureExt;
use futures_util::future::{BoxFuture, Shared};
use redis::aio::{ConnectionLike, MultiplexedConnection};
use redis::io::tcp::TcpSettings;
use redis::io::tcp::socket2::TcpKeepalive;
use redis::{
    AsyncConnectionConfig, Client, Cmd, ConnectionAddr, ConnectionInfo, ErrorKind,
    IntoConnectionInfo, Pipeline, RedisError, RedisFuture, RedisResult, ServerErrorKind,
    TlsCertificates, Value,
};

use super::sentinel::{Sentinels, expect_master};
use super::settings::{InvalidSetting, SentinelSettings, TlsFiles, certificates, invalid};

/// Connection attempts after a first one failed, before a command fails
/// (each later command starts a fresh series).
const RETRIES: u32 = 2;
/// The waits between those attempts: up to 200 ms, then up to 400 ms, at
/// random (full jitter), so that pods do not reconnect in lockstep.
const RETRY_BACKOFF: Backoff = Backoff::new(Duration::from_millis(200), Duration::from_secs(1));
/// Idle time before TCP keepalive probes start, the time between them, and
/// how many go unanswered before the socket fails: a node that vanished (a
/// partition, a host powered off) is noticed in about 25 s even on an idle
/// connection, instead of never.
const KEEPALIVE_IDLE: Duration = Duration::from_secs(10);
const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(5);
const KEEPALIVE_RETRIES: u32 = 3;

/// Where Redis is, and how to open connections to it.
#[derive(Clone)]
pub struct Connector {
    inner: Arc<Target>,
}

struct Target {
    place: Place,
    /// Bounds each connection attempt, each sentinel's answer and (on the
    /// connections made) each command.
    timeout: Duration,
    db: i64,
    /// The URL's scheme, user, password and database, and the TLS
    /// certificates: how any node is reached (a cluster's, from its address).
    node: ConnectionInfo,
    certificates: Option<TlsCertificates>,
}

enum Place {
    /// The URL's address.
    Direct(Client),
    Sentinel(Sentinels),
}

impl Connector {
    /// Reads the URL and the certificate files; connects to nothing.
    pub fn new(
        url: &str,
        password: Option<&str>,
        tls: &TlsFiles,
        sentinel: Option<&SentinelSettings>,
        timeout: Duration,
    ) -> Result<Self, InvalidSetting> {
        let mut node = url
            .into_connection_info()
            .map_err(|e| invalid("redis.url", e))?;
        let over_tls = matches!(node.addr(), ConnectionAddr::TcpTls { .. });
        let certificates = certificates(tls)?;
        if certificates.is_some() && !over_tls {
            let key = if tls.ca.is_some() {
                "redis.tls_ca"
            } else {
                "redis.tls_cert"
            };
            return Err(invalid(key, "needs a `rediss://` URL in `redis.url`"));
        }
        if over_tls || sentinel.is_some_and(|s| s.tls) {
            install_crypto_provider();
        }
        // No `CLIENT SETINFO` (redis-rs names itself by default): an ACL user
        // without the right would leave a refusal in the ACL log on every
        // connect, and Redis before 7.2 does not know the command.
        let mut redis = node.redis_settings().clone().set_skip_set_lib_name();
        if let Some(password) = password {
            redis = redis.set_password(password);
        }
        node = node.set_redis_settings(redis);
        node = node.set_tcp_settings(tcp_settings());
        let db = node.redis_settings().db();
        let place = match sentinel {
            None => Place::Direct(
                client(node.clone(), certificates.as_ref()).map_err(|e| invalid("redis.url", e))?,
            ),
            Some(sentinel) => Place::Sentinel(Sentinels::new(
                sentinel,
                node.clone(),
                certificates.clone(),
            )?),
        };
        Ok(Self {
            inner: Arc::new(Target {
                place,
                timeout,
                db,
                node,
                certificates,
            }),
        })
    }

    /// A connector to one node (of a cluster) at `host:port`, reached as
    /// this one reaches its own.
    pub fn node(&self, host: &str, port: u16) -> RedisResult<Self> {
        let target = &self.inner;
        let tls = matches!(target.node.addr(), ConnectionAddr::TcpTls { .. });
        let info = target
            .node
            .clone()
            .set_addr(address_of(host.to_owned(), port, tls));
        Ok(Self {
            inner: Arc::new(Target {
                place: Place::Direct(client(info.clone(), target.certificates.as_ref())?),
                timeout: target.timeout,
                db: target.db,
                node: info,
                certificates: target.certificates.clone(),
            }),
        })
    }

    /// Whether the URL's database is the first: a cluster has no other.
    pub fn first_database(&self) -> bool {
        self.inner.db == 0
    }

    /// Where this connects, for messages: `127.0.0.1:6379`, or the master's
    /// name and the sentinels.
    pub fn describe(&self) -> String {
        match &self.inner.place {
            Place::Direct(client) => client.get_connection_info().addr().to_string(),
            Place::Sentinel(sentinels) => sentinels.describe(),
        }
    }

    /// A fresh pub/sub connection to the master: RESP3, every push (the
    /// messages of its subscriptions, a `sunsubscribe` Redis sends by itself,
    /// the connection's end) handed to `pushes`. Its commands (`SUBSCRIBE`,
    /// `SSUBSCRIBE`, ...) are answered by their confirmations.
    pub async fn pubsub_link(
        &self,
        pushes: impl redis::aio::AsyncPushSender,
    ) -> RedisResult<MultiplexedConnection> {
        let client = self.master().await?;
        let mut conn = {
            let info = client.get_connection_info().clone().set_redis_settings(
                client
                    .get_connection_info()
                    .redis_settings()
                    .clone()
                    .set_protocol(redis::ProtocolVersion::RESP3),
            );
            let resp3 = self::client(info, self.inner.certificates.as_ref())?;
            let config = AsyncConnectionConfig::new()
                .set_connection_timeout(Some(self.inner.timeout))
                .set_response_timeout(Some(self.inner.timeout))
                .set_push_sender(pushes);
            resp3
                .get_multiplexed_async_connection_with_config(&config)
                .await
                .map_err(|e| self.at(&client, e))?
        };
        if matches!(self.inner.place, Place::Sentinel(_)) {
            // Pub/sub on a replica would hear the master's publishes, but not
            // on a demoted master that sentinels have not reconfigured yet.
            expect_master(&mut conn, &client).await?;
        }
        Ok(conn)
    }

    /// A client for the master: the URL's, or the one the sentinels name now.
    async fn master(&self) -> RedisResult<Client> {
        match &self.inner.place {
            Place::Direct(client) => Ok(client.clone()),
            Place::Sentinel(sentinels) => sentinels.master(self.inner.timeout).await,
        }
    }

    async fn open(&self, client: &Client) -> RedisResult<MultiplexedConnection> {
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(self.inner.timeout))
            .set_response_timeout(Some(self.inner.timeout));
        client
            .get_multiplexed_async_connection_with_config(&config)
            .await
            .map_err(|e| self.at(client, e))
    }

    /// [`at`] where the address is not the one the message names already.
    fn at(&self, client: &Client, e: RedisError) -> RedisError {
        match self.inner.place {
            Place::Direct(_) => e,
            Place::Sentinel(_) => at(client, e),
        }
    }

    /// One attempt at a command connection to the master.
    async fn command_connection(&self) -> RedisResult<MultiplexedConnection> {
        let client = self.master().await?;
        let mut conn = self.open(&client).await?;
        if matches!(self.inner.place, Place::Sentinel(_)) {
            expect_master(&mut conn, &client).await?;
        }
        Ok(conn)
    }
}

/// The engine's command connection; see the module's docs.
#[derive(Clone)]
pub struct Commands {
    shared: Arc<Slot>,
}

struct Slot {
    connector: Connector,
    current: Mutex<Current>,
}

/// The connection in use (or being made), and its generation: a failure
/// replaces the connection only if it is still the one that failed, so that
/// the commands that were in flight on it together cause one reconnect.
struct Current {
    generation: u64,
    connection: Connecting,
}

/// Shared by every command waiting for it: one series of attempts at a time.
type Connecting = Shared<BoxFuture<'static, RedisResult<MultiplexedConnection>>>;

impl Commands {
    /// Tries once to connect, bounded by the timeout; what failed is
    /// returned beside a `Commands` that connects when a command first needs
    /// it, so that a pod can start while Redis is away.
    pub async fn start(connector: Connector) -> (Self, Option<RedisError>) {
        let first = connector.command_connection().await;
        let (connection, failed) = match first {
            Ok(conn) => (futures_util::future::ready(Ok(conn)).boxed().shared(), None),
            Err(e) => (establish(connector.clone()), Some(e)),
        };
        let commands = Self {
            shared: Arc::new(Slot {
                current: Mutex::new(Current {
                    generation: 0,
                    connection,
                }),
                connector,
            }),
        };
        (commands, failed)
    }

    /// A `Commands` that connects when a command first needs it.
    pub fn lazy(connector: Connector) -> Self {
        Self {
            shared: Arc::new(Slot {
                current: Mutex::new(Current {
                    generation: 0,
                    connection: establish(connector.clone()),
                }),
                connector,
            }),
        }
    }

    /// Another connection to where this one connects (made when a command
    /// first needs it), with its own pipeline: see [`super::shards::Shards::apart`].
    pub fn apart(&self) -> Self {
        Self::lazy(self.shared.connector.clone())
    }

    fn lock(&self) -> MutexGuard<'_, Current> {
        self.shared
            .current
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// The connection to send on, and its generation.
    async fn current(&self) -> RedisResult<(u64, MultiplexedConnection)> {
        let (generation, connecting) = {
            let current = self.lock();
            (current.generation, current.connection.clone())
        };
        match connecting.await {
            Ok(conn) => Ok((generation, conn)),
            Err(e) => {
                // The next command starts a new series of attempts.
                self.replace(generation, &e);
                Err(e)
            }
        }
    }

    /// Starts over with a new connection (made when a command next needs
    /// it), unless that already happened since `generation`.
    fn replace(&self, generation: u64, why: &RedisError) {
        let mut current = self.lock();
        if current.generation == generation {
            tracing::warn!(error = %why, "redis connection failed; reconnecting");
            current.generation += 1;
            current.connection = establish(self.shared.connector.clone());
        }
    }

    fn check(&self, generation: u64, failure: Option<&RedisError>) {
        if let Some(e) = failure {
            self.replace(generation, e);
        }
    }
}

/// Attempts to connect, with [`RETRIES`] retries and backoff.
fn establish(connector: Connector) -> Connecting {
    async move {
        let mut retries = 0;
        loop {
            match connector.command_connection().await {
                Ok(conn) => return Ok(conn),
                Err(e) if retries < RETRIES && worth_retrying(&e) => {
                    tokio::time::sleep(RETRY_BACKOFF.delay(retries)).await;
                    retries += 1;
                }
                Err(e) => return Err(e),
            }
        }
    }
    .boxed()
    .shared()
}

/// Whether Redis refused who the pod says it is (a wrong password, a user
/// without the rights): waiting will not help, a corrected Secret will.
pub fn refused(e: &RedisError) -> bool {
    !worth_retrying(e)
}

/// A wrong password or a bad address will not get better in a second.
fn worth_retrying(e: &RedisError) -> bool {
    !matches!(
        e.kind(),
        ErrorKind::AuthenticationFailed
            | ErrorKind::InvalidClientConfig
            | ErrorKind::Server(ServerErrorKind::NoPerm)
    )
}

/// Whether the connection that gave this error is to be replaced: it broke,
/// it timed out (a half-open socket, or a master that froze or was cut off
/// and replaced by the sentinels), or it is no longer to the master.
fn needs_new_connection(e: &RedisError) -> bool {
    e.is_unrecoverable_error() || e.is_timeout() || demoted(e.kind())
}

/// Whether a command failed because its connection was found broken (the
/// socket closed under it: Redis restarted, `CLIENT KILL`, a reset), rather
/// than timed out or refused: the connection is being replaced, and the same
/// command may well go through on the new one. Whether the command ran
/// before the connection broke is not known.
pub fn broke_under(e: &RedisError) -> bool {
    e.is_connection_dropped() && !e.is_connection_refusal() && !e.is_timeout()
}

fn demoted(kind: ErrorKind) -> bool {
    matches!(
        kind,
        ErrorKind::Server(ServerErrorKind::ReadOnly | ServerErrorKind::MasterDown)
    )
}

/// What, in a command's outcome, calls for a new connection: an error, or a
/// `READONLY` reply (redis-rs hands a server's error replies back as values).
fn failure(result: &RedisResult<Value>) -> Option<RedisError> {
    match result {
        Ok(reply) => demoted_reply(reply),
        Err(e) => needs_new_connection(e).then(|| e.clone()),
    }
}

/// [`failure`] for a pipeline's replies.
fn pipeline_failure(result: &RedisResult<Vec<Value>>) -> Option<RedisError> {
    match result {
        Ok(replies) => replies.iter().find_map(demoted_reply),
        Err(e) => needs_new_connection(e).then(|| e.clone()),
    }
}

fn demoted_reply(reply: &Value) -> Option<RedisError> {
    match reply {
        Value::ServerError(e) if e.kind().is_some_and(|k| demoted(ErrorKind::Server(k))) => {
            Some(RedisError::from(e.clone()))
        }
        _ => None,
    }
}

impl ConnectionLike for Commands {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        async move {
            let (generation, mut conn) = self.current().await?;
            let result = conn.req_packed_command(cmd).await;
            self.check(generation, failure(&result).as_ref());
            result
        }
        .boxed()
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        async move {
            let (generation, mut conn) = self.current().await?;
            let result = conn.req_packed_commands(pipeline, offset, count).await;
            self.check(generation, pipeline_failure(&result).as_ref());
            result
        }
        .boxed()
    }

    fn get_db(&self) -> i64 {
        self.shared.connector.inner.db
    }
}

pub(super) fn client(
    info: ConnectionInfo,
    certificates: Option<&TlsCertificates>,
) -> RedisResult<Client> {
    match certificates {
        Some(certificates) => Client::build_with_tls(info, certificates.clone()),
        None => Client::open(info),
    }
}

pub(super) fn address_of(host: String, port: u16, tls: bool) -> ConnectionAddr {
    if tls {
        ConnectionAddr::TcpTls {
            host,
            port,
            insecure: false,
            tls_params: None,
        }
    } else {
        ConnectionAddr::Tcp(host, port)
    }
}

pub(super) fn tcp_settings() -> TcpSettings {
    let keepalive = TcpKeepalive::new()
        .with_time(KEEPALIVE_IDLE)
        .with_interval(KEEPALIVE_INTERVAL)
        .with_retries(KEEPALIVE_RETRIES);
    TcpSettings::default()
        .set_nodelay(true)
        .set_keepalive(keepalive)
}

/// rustls needs one crypto provider: ring, as the JWKS client uses. Named
/// here, not left to rustls' crate features, which would panic at the first
/// connect if a dependency ever enabled a second one. (If something else
/// installed a provider first, that one is used: the install fails, and
/// nothing panics.)
fn install_crypto_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

/// With Sentinel, an I/O error says which node it came from (the message
/// names the sentinels only); its kind is kept, so that retries and
/// reconnects decide as before.
pub(super) fn at(client: &Client, e: RedisError) -> RedisError {
    if e.kind() != ErrorKind::Io {
        return e;
    }
    let kind = if e.is_timeout() {
        std::io::ErrorKind::TimedOut
    } else if e.is_connection_refusal() {
        std::io::ErrorKind::ConnectionRefused
    } else if e.is_connection_dropped() {
        std::io::ErrorKind::ConnectionReset
    } else {
        std::io::ErrorKind::Other
    };
    let addr = client.get_connection_info().addr();
    RedisError::from(std::io::Error::new(kind, format!("{addr}: {e}")))
}
