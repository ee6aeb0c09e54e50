//! The servers one bench run measures, started for it from built binaries
//! and stopped after it: herald pods, a `redis-server` or a Redis Cluster of
//! three masters for them to share, a delaying proxy between the pods and
//! Redis, connections that read every announcement; and the flags that
//! point a scenario at them (`--gateway`, `--gateway-pid`, `--publish-to`,
//! `--watch-pid`, ...), as `scripts/bench.sh` used to pass them by hand.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rig::cluster::Shape;
use rig::{Herald, Redis, RedisCluster, Spec};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

use super::BenchError;
use crate::proxy::{self, Faults, Proxy};

/// Headroom under the hard file-descriptor limit for what a pod opens
/// besides its connections.
const FD_HEADROOM: u64 = 500;

/// The Redis the pods share, if any.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum RedisKind {
    /// One `redis-server`.
    One,
    /// A Redis Cluster of three masters, no replicas.
    Cluster,
}

/// What a run needs started.
#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    /// The herald binary the pods run.
    pub herald: PathBuf,
    pub pods: usize,
    pub redis: Option<RedisKind>,
    /// The pods reach Redis through a proxy whose delay the scenario sets
    /// (`stall`).
    pub redis_proxy: bool,
    /// Connections subscribed to every publish's announcement channel,
    /// reading all (standing for pods; what announcements cost Redis).
    pub redis_subscribers: usize,
    /// More `HERALD_*` settings for every pod (`KEY=value`).
    pub env: Vec<(String, String)>,
    /// The pod the clients connect to; `None`: spread over all.
    pub clients_on: Option<usize>,
}

/// The Redis a run started.
enum Store {
    One(Redis),
    Cluster(RedisCluster),
}

/// What a run started; everything stops when it drops.
pub struct Servers {
    // Dropped in this order: the pods before what they reach.
    pods: Vec<Herald>,
    proxy: Option<(Arc<Proxy>, SocketAddr, JoinHandle<()>)>,
    subscribers: Vec<JoinHandle<()>>,
    store: Option<Store>,
    clients_on: Option<usize>,
}

impl Drop for Servers {
    fn drop(&mut self) {
        for task in &self.subscribers {
            task.abort();
        }
        if let Some((_, _, control)) = &self.proxy {
            control.abort();
        }
    }
}

impl Servers {
    /// Starts what `plan` says; the pods' logs go to `dir`, the first named
    /// `<name>.log`, the others `<name>-2.log`, ...
    pub async fn start(plan: &Plan, dir: &Path, name: &str) -> Result<Self, BenchError> {
        let mut servers = Self {
            pods: Vec::new(),
            proxy: None,
            subscribers: Vec::new(),
            store: None,
            clients_on: plan.clients_on,
        };
        let mut env = pod_env(&plan.herald).await;
        match plan.redis {
            None => {}
            Some(RedisKind::One) => {
                let redis = Redis::start_in(dir.join(format!("{name}-redis")), None, &[]).await?;
                println!("redis: {} (pid {})", redis.url(), show(redis.pid()));
                let mut url = redis.url();
                if plan.redis_proxy {
                    let proxy = Proxy::start(loopback(), redis.addr(), Faults::default())
                        .map_err(|e| BenchError::Io("starting the proxy".into(), e))?;
                    let control = TcpListener::bind(loopback())
                        .await
                        .map_err(|e| BenchError::Io("the proxy's control port".into(), e))?;
                    let control_addr = control
                        .local_addr()
                        .map_err(|e| BenchError::Io("the proxy's control port".into(), e))?;
                    url = format!("redis://{}", proxy.addr());
                    println!(
                        "proxy: {} -> {}, control {control_addr}",
                        proxy.addr(),
                        redis.addr()
                    );
                    let proxy = Arc::new(proxy);
                    let handle = Arc::clone(&proxy);
                    let task = tokio::spawn(async move {
                        if let Err(e) = proxy::control(control, &handle).await {
                            eprintln!("the proxy's control port: {e}");
                        }
                    });
                    servers.proxy = Some((proxy, control_addr, task));
                }
                for _ in 0..plan.redis_subscribers {
                    servers.subscribers.push(subscriber(redis.addr()).await?);
                }
                env.push(("HERALD_BROKER".into(), "redis".into()));
                env.push(("HERALD_REDIS__URL".into(), url));
                servers.store = Some(Store::One(redis));
            }
            Some(RedisKind::Cluster) => {
                let shape = Shape {
                    masters: 3,
                    replicas: 0,
                };
                let cluster =
                    RedisCluster::start_shaped(rig::cluster::scratch_dir(name), true, shape)
                        .await?;
                println!("redis cluster: {}", cluster.urls().join(","));
                env.push(("HERALD_BROKER".into(), "redis".into()));
                env.push(("HERALD_REDIS__CLUSTER".into(), cluster.urls().join(",")));
                servers.store = Some(Store::Cluster(cluster));
            }
        }
        env.extend(plan.env.iter().cloned());
        for n in 0..plan.pods {
            let log = if n == 0 {
                format!("{name}.log")
            } else {
                format!("{name}-{}.log", n + 1)
            };
            let spec = Spec::new(&plan.herald)
                .envs(env.iter().cloned())
                .log(dir.join(log));
            let pod = Herald::start(spec).await?;
            println!("{name}: {} (pid {})", pod.addr, show(pod.pid()));
            servers.pods.push(pod);
        }
        Ok(servers)
    }

    /// The pods' process ids.
    fn pod_pids(&self) -> Vec<u32> {
        self.pods.iter().filter_map(Herald::pid).collect()
    }

    /// The Redis processes' ids.
    fn redis_pids(&self) -> Vec<u32> {
        match &self.store {
            None => Vec::new(),
            Some(Store::One(redis)) => redis.pid().into_iter().collect(),
            Some(Store::Cluster(cluster)) => cluster
                .ports()
                .into_iter()
                .filter_map(|p| cluster.pid(p).ok())
                .collect(),
        }
    }

    /// The pods the clients connect to.
    fn client_pods(&self) -> Vec<&Herald> {
        match self.clients_on {
            Some(n) => self.pods.get(n).into_iter().collect(),
            None => self.pods.iter().collect(),
        }
    }

    /// The first pod's process id, for a profiler.
    pub fn first_pid(&self) -> Option<u32> {
        self.pods.first().and_then(Herald::pid)
    }

    /// The flags that point `scenario` at these servers.
    pub fn flags(&self, scenario: &str) -> Result<Vec<String>, BenchError> {
        let first = self.pods.first().ok_or(BenchError::NoPods)?;
        let mut flags = Vec::new();
        let mut add = |flag: &str, value: String| {
            flags.push(flag.to_owned());
            flags.push(value);
        };
        match scenario {
            // Clients on the pods, each pod's CPU and memory per round.
            "fanout" | "slow" | "idle" => {
                for pod in self.client_pods() {
                    add("--gateway", pod.ws_url());
                }
                for pid in self.pod_pids() {
                    add("--gateway-pid", pid.to_string());
                }
                for pid in self.redis_pids() {
                    add("--watch-pid", pid.to_string());
                }
            }
            "throughput" | "formats" => {
                add("--gateway", first.ws_url());
                if let Some(pid) = first.pid() {
                    add("--gateway-pid", pid.to_string());
                }
            }
            // The publisher on the first pod, the clients where asked.
            "pods" => {
                for pod in self.client_pods() {
                    add("--gateway", pod.ws_url());
                }
                add("--publish-to", first.http_url());
                for pid in self.pod_pids().into_iter().chain(self.redis_pids()) {
                    add("--watch-pid", pid.to_string());
                }
            }
            "storm" => {
                for pod in self.client_pods() {
                    add("--gateway", pod.ws_url());
                }
                for pid in self.pod_pids() {
                    add("--watch-pid", pid.to_string());
                }
            }
            // SSE clients over every pod; the last one killed, the
            // publisher on the first.
            "sse-failover" => {
                for pod in self.client_pods() {
                    add("--gateway", pod.http_url());
                }
                add("--publish-to", first.http_url());
                if self.pods.len() > 1
                    && let Some(pid) = self.pods.last().and_then(Herald::pid)
                {
                    add("--kill-pid", pid.to_string());
                }
                for pid in self.pod_pids().into_iter().chain(self.redis_pids()) {
                    add("--watch-pid", pid.to_string());
                }
            }
            "wire" => add("--gateway", first.ws_url()),
            "publish" => {
                add("--publish-to", first.http_url());
                for pid in self.pod_pids().into_iter().chain(self.redis_pids()) {
                    add("--watch-pid", pid.to_string());
                }
            }
            // Redis itself for CLIENT KILL, the proxy's control for the delay.
            "stall" => {
                add("--gateway", first.ws_url());
                let (Some(Store::One(redis)), Some((_, control, _))) = (&self.store, &self.proxy)
                else {
                    return Err(BenchError::Plan(
                        "stall needs --redis one --redis-proxy".into(),
                    ));
                };
                add("--redis", redis.url());
                add("--proxy-control", control.to_string());
            }
            other => return Err(BenchError::Scenario(other.to_owned())),
        }
        Ok(flags)
    }

    /// On a Redis Cluster, the keys each node holds: every node must hold
    /// some, or the publishes did not spread over the shards (or went to
    /// some other Redis). `None` without a cluster.
    pub fn keys_per_node(&self) -> Option<Vec<Option<u64>>> {
        let Some(Store::Cluster(cluster)) = &self.store else {
            return None;
        };
        Some(
            cluster
                .ports()
                .into_iter()
                .map(|p| cluster.cli(p, &["DBSIZE"]).ok()?.trim().parse().ok())
                .collect(),
        )
    }
}

/// The budgets per address and per user, each turned off.
const BUDGETS_OFF: [(&str, &str); 4] = [
    ("HERALD_SESSION__MAX_SUBSCRIPTIONS_PER_IP", "0"),
    ("HERALD_SESSION__MAX_SUBSCRIPTIONS_PER_USER", "0"),
    ("HERALD_SESSION__TOPICS_PER_MINUTE", "0"),
    ("HERALD_SESSION__ANONYMOUS_MAX_TOPICS", "0"),
];

/// Longest `herald --check` may take.
const CHECK_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

/// The settings every pod of `herald` gets. Every client comes from
/// 127.0.0.x (and `storm-auth`'s are all one user): the budgets per address
/// and per user are off, as the connection cap per address is, for every
/// build that knows them, the build before included, so that both are
/// measured alike.
pub(crate) async fn pod_env(herald: &Path) -> Vec<(String, String)> {
    let hard = rlimit::getrlimit(rlimit::Resource::NOFILE).map_or(65536, |(_, hard)| hard);
    let mut env = vec![
        (
            "HERALD_WEBSOCKET__MAX_CONNECTIONS".to_owned(),
            hard.saturating_sub(FD_HEADROOM).to_string(),
        ),
        (
            "HERALD_WEBSOCKET__MAX_CONNECTIONS_PER_IP".to_owned(),
            "0".to_owned(),
        ),
        ("HERALD_LOG__LEVEL".to_owned(), "warn".to_owned()),
    ];
    if knows_budgets(herald).await {
        env.extend(BUDGETS_OFF.map(|(k, v)| (k.to_owned(), v.to_owned())));
    } else {
        println!(
            "{}: no budget settings (an older build): left as they are",
            herald.display()
        );
    }
    env
}

/// Whether `herald` takes the budget settings: an older build refuses to
/// start on a key it does not know, and `herald --check` says so.
async fn knows_budgets(herald: &Path) -> bool {
    let mut command = tokio::process::Command::new(herald);
    command
        .arg("--check")
        .envs(BUDGETS_OFF)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true);
    matches!(
        tokio::time::timeout(CHECK_WAIT, command.status()).await,
        Ok(Ok(status)) if status.success()
    )
}

/// A connection to Redis subscribed to the channels of the load tool's
/// publishes (a pattern: the tool names its topics per run), reading all
/// it is sent until the run ends.
async fn subscriber(redis: SocketAddr) -> Result<JoinHandle<()>, BenchError> {
    let mut stream = TcpStream::connect(redis)
        .await
        .map_err(|e| BenchError::Io(format!("connecting to {redis}"), e))?;
    let pattern = "herald:{loadtest.publish.*";
    let command = format!(
        "*2\r\n$10\r\nPSUBSCRIBE\r\n${}\r\n{pattern}\r\n",
        pattern.len()
    );
    stream
        .write_all(command.as_bytes())
        .await
        .map_err(|e| BenchError::Io(format!("subscribing on {redis}"), e))?;
    Ok(tokio::spawn(async move {
        let mut buffer = vec![0; 1 << 20];
        while matches!(stream.read(&mut buffer).await, Ok(n) if n > 0) {}
    }))
}

fn loopback() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], 0))
}

fn show(pid: Option<u32>) -> String {
    pid.map_or_else(|| "?".to_owned(), |p| p.to_string())
}
