//! `chaos`: a soak of the whole system while Redis misbehaves. It runs
//! everything itself, on loopback: a Redis master (a dump only when told
//! to `SAVE`) and its replica, an in-process TCP proxy ([`rig::proxy`]) in
//! front of them (the address the pods know: a "virtual IP" that can add
//! latency, hold traffic, and switch to the replica while cutting every
//! connection, which is how a failover looks to Herald without Sentinel),
//! N `herald` pods, C
//! clients with sessions spread over the pods (they ack with the epoch, cut
//! their connection now and then and resume at a random pod), and P
//! publishers posting to random pods on T topics.
//!
//! A seeded schedule of [`faults`] cycles through: freezing Redis
//! (SIGSTOP), delaying it (the proxy), failing over to a replica that lags
//! (it stopped replicating some seconds before the master is killed),
//! restarting Redis from an older dump, and killing a pod. After the last
//! publish every client must catch up; then [`check`] judges every client's
//! stream per topic: complete and duplicate-free within each epoch, each
//! message the one its publisher was answered for, and each `reset` where
//! Redis really lost writes (or where the history could not bridge a gap).
//!
//! With `--redis cluster` the pods use a Redis Cluster of three masters
//! with a replica each instead ([`cluster_redis`]), the topics spread over
//! every master, and the faults fit a cluster: a master killed (its replica
//! promoted by the cluster, a fresh replica in its place after), a manual
//! failover, a failover to a replica that lagged (frozen and cut off while
//! its master took writes), a topic's slot migrated while it is published
//! to, and a pod killed. A fault hits one master: a reset is explained only
//! by a fault that lost writes on the master its topic was on.
//!
//! Layout: [`one_redis`] (behind the proxy), [`cluster_redis`], [`faults`]
//! (schedule and injection), [`client`], [`publisher`], [`check`],
//! [`outcome`] (the result and its table), [`streams_file`], [`clock`]. The
//! processes (`redis-server`s, the Redis Cluster, the `herald` pods) are
//! started by [`rig`], as the tests' are.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use rig::herald::{Herald, Spec};
use serde::{Deserialize, Serialize};
use tokio::sync::watch;
use tokio::time::Instant;

use self::client::{Client, Log, Phase, Positions, Record};
use self::cluster_redis::ClusterRedis;
use self::faults::{Kind, Rig, Store};
use self::one_redis::OneRedis;
use self::publisher::{Attempt, Publisher};
use super::unique_topic;
use crate::clients::{self, FD_MARGIN};
use crate::cpu::{Meter, Usage};
use crate::metrics::Scraper;
use crate::publish::Pool;
use crate::report::Outcome;
use crate::sessions::{Backoff, Cut, Plan};
use crate::{Error, Target};

pub mod check;
pub mod client;
mod clock;
pub mod cluster_redis;
pub mod faults;
pub mod one_redis;
mod outcome;
pub mod publisher;
mod streams_file;

pub use self::clock::Clock;
pub use self::outcome::Chaos;

/// Herald pods.
pub const DEFAULT_PODS: usize = 3;
/// Clients with sessions, over all pods.
pub const DEFAULT_CLIENTS: usize = 200;
pub const DEFAULT_TOPICS: usize = 4;
/// Topics each client subscribes to (client i: topics i, i+1, ... mod T).
pub const DEFAULT_SUBSCRIPTIONS: usize = 2;
pub const DEFAULT_PUBLISHERS: usize = 2;
/// Publishes per second, over all publishers.
pub const DEFAULT_RATE: f64 = 50.0;
/// How long the publishers publish.
pub const DEFAULT_DURATION: Duration = Duration::from_secs(120);
/// Mean time between a client's own cuts (exponential); 0s: never.
pub const DEFAULT_CHURN: Duration = Duration::from_secs(20);
/// From the first publish to the first fault.
pub const DEFAULT_WARMUP: Duration = Duration::from_secs(5);
/// No fault in the last part of the run: the system settles while publishing.
pub const DEFAULT_TAIL: Duration = Duration::from_secs(10);
/// Between the end of one fault's hold and the next fault, at random.
pub const DEFAULT_GAP: (Duration, Duration) = (Duration::from_secs(4), Duration::from_secs(8));
/// After the last publish, how long every client has to catch up.
pub const DEFAULT_DRAIN: Duration = Duration::from_secs(30);
/// Payload bytes.
pub const DEFAULT_SIZE: usize = 64;
/// Cumulative acks, at most this often per client.
pub const ACK_INTERVAL: Duration = Duration::from_millis(50);
/// The pods' `session.flush_interval`: acks reach Redis this fast.
pub const FLUSH_INTERVAL: &str = "50ms";
/// Herald's default `history_size`: a gap longer than this cannot be
/// bridged, so a `reset` in the same epoch is expected then.
pub const HISTORY_SIZE: u64 = 100;
/// Keep-alive connections per publisher per pod.
const PUBLISH_CONNECTIONS: usize = 2;
/// Between two looks at the clients' positions while draining.
const DRAIN_POLL: Duration = Duration::from_millis(50);
/// Longest the fault schedule may overrun the run (a fault's own waits
/// are bounded; this is the backstop).
const FAULTS_OVERRUN: Duration = Duration::from_secs(60);
/// Clients listed with their failures, at most.
const LISTED: usize = 5;
/// Most clients, pods, topics.
const MAX_CLIENTS: usize = 20_000;
const MAX_PODS: usize = 16;
const MAX_TOPICS: usize = 1_000;

/// The Redis the pods use: `--redis one` (a master and its replica behind
/// a proxy) or `--redis cluster` (three masters, a replica each).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum Redis {
    #[default]
    One,
    Cluster,
}

impl Redis {
    /// The faults that fit it, in the order a schedule cycles through.
    pub fn faults(self) -> Vec<Kind> {
        match self {
            Redis::One => Kind::ALL.to_vec(),
            Redis::Cluster => Kind::CLUSTER.to_vec(),
        }
    }

    fn fits(self, kind: Kind) -> bool {
        match self {
            Redis::One => kind.fits_one(),
            Redis::Cluster => kind.fits_cluster(),
        }
    }
}

#[derive(Debug, Clone)]
pub struct Options {
    /// The `herald` binary the pods run.
    pub herald: PathBuf,
    pub redis: Redis,
    pub pods: usize,
    pub clients: usize,
    pub topics: usize,
    pub subscriptions: usize,
    pub publishers: usize,
    pub rate: f64,
    pub duration: Duration,
    pub churn: Duration,
    /// The kinds the schedule cycles through, in order (they must fit
    /// `redis`: see [`Redis::faults`]).
    pub faults: Vec<Kind>,
    pub warmup: Duration,
    pub tail: Duration,
    pub gap: (Duration, Duration),
    /// The schedule's seed [default: random, printed].
    pub seed: Option<u64>,
    pub drain: Duration,
    pub size: usize,
    /// Where logs and dumps go [default: a fresh directory under the
    /// system's temporary one]; removed after a run that passed unless `keep`.
    pub dir: Option<PathBuf>,
    pub keep: bool,
    /// The pods' `HERALD_LOG__LEVEL`.
    pub log_level: String,
}

impl Options {
    pub fn new(herald: PathBuf) -> Self {
        Self {
            herald,
            redis: Redis::One,
            pods: DEFAULT_PODS,
            clients: DEFAULT_CLIENTS,
            topics: DEFAULT_TOPICS,
            subscriptions: DEFAULT_SUBSCRIPTIONS,
            publishers: DEFAULT_PUBLISHERS,
            rate: DEFAULT_RATE,
            duration: DEFAULT_DURATION,
            churn: DEFAULT_CHURN,
            faults: Kind::ALL.to_vec(),
            warmup: DEFAULT_WARMUP,
            tail: DEFAULT_TAIL,
            gap: DEFAULT_GAP,
            seed: None,
            drain: DEFAULT_DRAIN,
            size: DEFAULT_SIZE,
            dir: None,
            keep: false,
            log_level: "warn".to_owned(),
        }
    }

    fn validate(&self) -> Result<(), Error> {
        super::check_bounds(self.duration, self.size)?;
        let bad = |m: &str| Err(Error::Options(m.to_owned()));
        if !self.herald.is_file() {
            return Err(Error::Options(format!(
                "--herald {}: no such file (cargo build --release -p gateway)",
                self.herald.display()
            )));
        }
        if self.pods == 0 || self.pods > MAX_PODS {
            return bad("--pods must be 1 to 16");
        }
        if self.clients == 0 || self.clients > MAX_CLIENTS {
            return bad("--clients must be 1 to 20000");
        }
        if self.topics == 0 || self.topics > MAX_TOPICS {
            return bad("--topics must be 1 to 1000");
        }
        if self.subscriptions == 0 || self.subscriptions > self.topics {
            return bad("--subscriptions must be 1 to --topics");
        }
        if self.publishers == 0 || self.publishers > 64 {
            return bad("--publishers must be 1 to 64");
        }
        if !(self.rate > 0.0 && self.rate <= 5_000.0) {
            return bad("--rate must be over 0 and at most 5000");
        }
        if self.drain.is_zero() || self.drain > super::MAX_DURATION {
            return bad("--drain must be over 0s and at most the longest run");
        }
        if self.faults.is_empty() {
            return bad("--faults names no fault");
        }
        if let Some(kind) = self.faults.iter().find(|k| !self.redis.fits(**k)) {
            return Err(Error::Options(format!(
                "--faults {} does not fit --redis {}: those that do are {}",
                kind.name(),
                match self.redis {
                    Redis::One => "one",
                    Redis::Cluster => "cluster",
                },
                self.redis
                    .faults()
                    .iter()
                    .map(|k| k.name())
                    .collect::<Vec<_>>()
                    .join(", ")
            )));
        }
        if self.faults.contains(&Kind::PodKill) && self.pods < 2 {
            return bad("pod-kill needs at least two --pods (the clients resume at the others)");
        }
        if let Some(dir) = &self.dir
            && std::fs::read_dir(dir).is_ok_and(|mut d| d.next().is_some())
        {
            // An old dump there would be loaded by the first Redis.
            return Err(Error::Options(format!(
                "--dir {} is not empty",
                dir.display()
            )));
        }
        if self.warmup + self.tail >= self.duration {
            return bad("--duration must be longer than the warm-up and the tail");
        }
        Ok(())
    }
}

/// Runs the scenario (see the module's doc).
pub async fn run(options: Options) -> Result<Chaos, Error> {
    options.validate()?;
    clients::raise_fd_limit(
        (options.clients + options.publishers * options.pods * PUBLISH_CONNECTIONS) as u64
            + 4 * FD_MARGIN,
    )?;
    let seed = options.seed.unwrap_or_else(rand::random);
    let dir = options.dir.clone().unwrap_or_else(|| {
        std::env::temp_dir().join(format!(
            "herald-chaos-{}-{}",
            std::process::id(),
            crate::latency::now_micros()
        ))
    });
    std::fs::create_dir_all(&dir).map_err(|e| Error::Write {
        path: dir.display().to_string(),
        source: e,
    })?;
    let run_topic = unique_topic("chaos");
    let store = match options.redis {
        Redis::One => Store::One(Box::new(OneRedis::start(dir.clone()).await?)),
        Redis::Cluster => Store::Cluster(ClusterRedis::start(dir.join("redis-cluster")).await?),
    };
    let topics: Arc<[String]> = match &store {
        Store::One(_) => (0..options.topics)
            .map(|t| format!("{run_topic}.{t}"))
            .collect(),
        Store::Cluster(cluster) => cluster.spread(&run_topic, options.topics)?.into(),
    };
    let mut env: Vec<(String, String)> = [
        ("HERALD_BROKER", "redis".to_owned()),
        ("HERALD_SESSION__FLUSH_INTERVAL", FLUSH_INTERVAL.to_owned()),
        ("HERALD_LOG__LEVEL", options.log_level.clone()),
        ("HERALD_WEBSOCKET__MAX_CONNECTIONS_PER_IP", "0".to_owned()),
        // Every client comes from this machine's address: its budgets are off
        // too (thousands of clients' subscriptions, hundreds of topics).
        ("HERALD_SESSION__MAX_SUBSCRIPTIONS_PER_IP", "0".to_owned()),
        ("HERALD_SESSION__TOPICS_PER_MINUTE", "0".to_owned()),
        ("HERALD_SESSION__ANONYMOUS_MAX_TOPICS", "0".to_owned()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v))
    .collect();
    env.extend(store.env());
    let mut pods = Vec::with_capacity(options.pods);
    for i in 0..options.pods {
        let spec = Spec::new(&options.herald)
            .envs(env.clone())
            .log(dir.join(format!("herald-{i}.log")));
        pods.push(Herald::start(spec).await?);
    }
    let addrs: Vec<_> = pods.iter().map(|p| p.addr).collect();
    let mut rig = Rig::new(store, pods, topics.clone());
    let schedule = faults::schedule(
        seed,
        &options.faults,
        options.pods,
        options.warmup,
        options.gap,
        options.duration - options.tail,
    );
    println!(
        "chaos: seed {seed}, {} pods ({}), logs in {}",
        options.pods,
        rig.store.describe(),
        dir.display()
    );
    for p in &schedule {
        println!(
            "  at {:>6.1} s  {:<8}  hold {:.1} s{}",
            p.at.as_secs_f64(),
            p.kind.name(),
            p.hold.as_secs_f64(),
            if p.kind == Kind::PodKill {
                format!(" (pod {})", p.pod)
            } else {
                String::new()
            }
        );
    }

    // The clients, subscribed before anything is published.
    let gateways = addrs
        .iter()
        .map(|&a| Target::at(a))
        .collect::<Result<Vec<_>, _>>()?;
    let backoff = Backoff {
        first: Duration::from_millis(100),
        cap: Duration::from_secs(2),
    };
    let plan = Arc::new(Plan::new(gateways, backoff, Cut::Reset, ACK_INTERVAL));
    let names: Arc<[Arc<str>]> = topics.iter().map(|t| Arc::from(t.as_str())).collect();
    let clock = Clock::new();
    let (subscriptions, churn, pods_n) = (options.subscriptions, options.churn, options.pods);
    let opened = {
        let (plan, names, clock) = (plan.clone(), names.clone(), clock.clone());
        clients::open_all(options.clients, move |i| {
            let (plan, names, clock) = (plan.clone(), names.clone(), clock.clone());
            async move {
                let mine: Vec<usize> = (0..subscriptions).map(|k| (i + k) % names.len()).collect();
                Client::open(i, i % pods_n, &plan, &mine, &names, churn, &clock).await
            }
        })
        .await?
    };
    let positions: Vec<(Vec<usize>, Positions)> =
        opened.iter().map(|c| (c.topics(), c.positions())).collect();
    let (phase, phases) = watch::channel(Phase::Churn);
    let runners: Vec<_> = opened
        .into_iter()
        .map(|c| tokio::spawn(c.run(plan.clone(), phases.clone(), clock.clone())))
        .collect();

    // Publishers and faults, from the first publish.
    let meter = Meter::start(&[]);
    let started = clock.elapsed();
    let until = Instant::now() + options.duration;
    let mut publishing = Vec::with_capacity(options.publishers);
    for p in 0..options.publishers {
        let mut pools = Vec::with_capacity(addrs.len());
        for &addr in &addrs {
            pools.push(Arc::new(Pool::open(addr, PUBLISH_CONNECTIONS).await?));
        }
        let publisher = Publisher {
            index: p,
            pools,
            topics: topics.clone(),
            rate: options.rate / options.publishers as f64,
            size: options.size,
            seed: seed.wrapping_add(p as u64 + 1),
        };
        publishing.push(tokio::spawn(publisher.run(until, clock.clone())));
    }
    let injecting = {
        let clock = clock.clone();
        tokio::spawn(async move {
            let mut done = Vec::new();
            for planned in &schedule {
                tokio::time::sleep_until(
                    Instant::now() + (started + planned.at).saturating_sub(clock.elapsed()),
                )
                .await;
                let fault = rig.inject(planned, &clock).await;
                println!(
                    "  {:>6.1} s  {:<8}  {}{}",
                    fault.at_s,
                    fault.kind.name(),
                    fault.detail,
                    fault
                        .error
                        .as_deref()
                        .map(|e| format!("; FAILED: {e}"))
                        .unwrap_or_default()
                );
                done.push(fault);
            }
            (rig, done)
        })
    };
    let mut attempts: Vec<Attempt> = Vec::new();
    for p in publishing {
        match p.await {
            Ok(a) => attempts.extend(a),
            Err(e) => std::panic::resume_unwind(e.into_panic()),
        }
    }
    let published_at = Instant::now();
    let (rig, mut faults) = match tokio::time::timeout(FAULTS_OVERRUN, injecting).await {
        Ok(Ok(done)) => done,
        Ok(Err(e)) => std::panic::resume_unwind(e.into_panic()),
        Err(_) => {
            return Err(Error::Cluster(format!(
                "the fault schedule overran the run by {FAULTS_OVERRUN:?}"
            )));
        }
    };

    // The drain: every client in every topic's final epoch, at its newest seq.
    let _ = phase.send(Phase::Calm);
    let targets = targets(options.topics, &attempts);
    let drain_until = Instant::now() + options.drain;
    let caught_up = loop {
        let all = positions.iter().all(|(topics, at)| {
            let at = at.lock().map(|a| a.clone()).unwrap_or_default();
            topics
                .iter()
                .zip(at)
                .all(|(&t, (epoch, seq))| match &targets[t] {
                    Some((e, top)) => **e == *epoch && seq >= *top,
                    None => true,
                })
        });
        let settled = all && plan.resuming.load(Ordering::SeqCst) == 0;
        if settled || Instant::now() >= drain_until {
            break settled;
        }
        tokio::time::sleep(DRAIN_POLL).await;
    };
    let drain = published_at.elapsed();
    let _ = phase.send(Phase::Stop);
    let mut records: Vec<Record> = Vec::with_capacity(runners.len());
    for r in runners {
        match r.await {
            Ok(record) => records.push(record),
            Err(e) => std::panic::resume_unwind(e.into_panic()),
        }
    }
    let cpu = meter.stop();
    let ran = clock.elapsed();

    let streams: Vec<(usize, &Log)> = records
        .iter()
        .flat_map(|r| r.logs.iter().map(move |l| (r.client, l)))
        .collect();
    let verdict = check::check(
        options.topics,
        &attempts,
        &mut faults,
        &streams,
        HISTORY_SIZE,
    );
    if !verdict.problem_streams.is_empty() {
        // What the store holds of each problem client's session, for whoever looks.
        let mut stored = BTreeMap::new();
        for &(client, _) in &verdict.problem_streams {
            if let Some(r) = records.get(client)
                && !stored.contains_key(&client)
            {
                let key = format!("herald:session:{}", r.session);
                let value = rig.store.get(&key).await.unwrap_or_default();
                stored.insert(client, format!("{key} = {value}"));
            }
        }
        streams_file::write_streams(
            &dir.join("streams.txt"),
            &streams,
            &verdict.problem_streams,
            &addrs,
            &stored,
        );
    }
    let mut pod_rewinds = 0u64;
    for pod in &rig.pods {
        if let Ok(text) = Scraper::new(pod.addr).get("/metrics").await {
            pod_rewinds += counter(&text, "herald_redis_rewinds_total");
        }
    }
    drop(rig);

    let result = outcome::tally(
        &options,
        seed,
        &dir,
        faults,
        &attempts,
        &records,
        verdict,
        Tally {
            ran,
            drain,
            caught_up,
            pod_rewinds,
            cpu,
        },
    );
    if result.failures().is_empty() && !options.keep && options.dir.is_none() {
        let _ = std::fs::remove_dir_all(&dir);
    }
    Ok(result)
}

/// Per topic, the epoch of its newest answer and that epoch's newest seq.
fn targets(topics: usize, attempts: &[Attempt]) -> Vec<Option<(Arc<str>, u64)>> {
    let mut newest: Vec<Option<(u32, Arc<str>)>> = vec![None; topics];
    for a in attempts {
        if let Ok(answer) = &a.answer
            && newest[a.topic]
                .as_ref()
                .is_none_or(|(at, _)| answer.at >= *at)
        {
            newest[a.topic] = Some((answer.at, answer.epoch.clone()));
        }
    }
    newest
        .into_iter()
        .enumerate()
        .map(|(t, n)| {
            let (_, epoch) = n?;
            let top = attempts
                .iter()
                .filter_map(|a| a.answer.as_ref().ok().filter(|_| a.topic == t))
                .filter(|answer| answer.epoch == epoch)
                .map(|answer| answer.seq)
                .max()?;
            Some((epoch, top))
        })
        .collect()
}

/// A counter's value (summed over its labels) in Prometheus text.
fn counter(text: &str, name: &str) -> u64 {
    text.lines()
        .filter(|l| {
            l.strip_prefix(name)
                .is_some_and(|rest| rest.starts_with([' ', '{']))
        })
        .filter_map(|l| l.split_whitespace().last()?.parse::<f64>().ok())
        .sum::<f64>() as u64
}

/// What the run measured besides the streams.
struct Tally {
    ran: Duration,
    drain: Duration,
    caught_up: bool,
    pod_rewinds: u64,
    cpu: Usage,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_are_summed_over_labels() {
        let text = "# HELP herald_redis_rewinds_total x\n\
                    herald_redis_rewinds_total 2\n\
                    herald_redis_rewinds_total_other 5\n\
                    herald_redis_rewinds_total{a=\"b\"} 1e0\n";
        assert_eq!(counter(text, "herald_redis_rewinds_total"), 3);
    }
}
