//! `presence`: a room of many members (issue #23's 10,000) on several herald
//! pods sharing one Redis, each member a user with a token of its own and a
//! small `info` claim, while messages flow and members come and go. It runs
//! its own Redis and pods ([`cluster`]), so that it can drain, restart and
//! kill them, and measures, phase by phase:
//!
//! 1. join: every member connects (spread over the pods), says `hello` with
//!    its token and subscribes; until presence counts them all;
//! 2. flow: messages flow (latency at the members) while `churn` members
//!    leave (`unsub`) and join again: the diffs each subscriber is sent;
//! 3. quiet: the publisher paused, nobody joins or leaves: the room's
//!    presence memory in Redis ([`footprint`]) and the commands the pods
//!    send Redis over the window (writes per member);
//! 4. queries: a page of `page_size` members and the stats, timed by a
//!    backend over loopback and by the pod ([`query`]); every page walked;
//! 5. rolling restart: each pod in turn drained (SIGTERM: `reconnect`,
//!    members resume at another pod) and started again: the presence frames
//!    each subscriber got, the least users presence showed meanwhile;
//! 6. kill: the pod with the most members killed with SIGKILL, its members
//!    staying away: how long until presence no longer lists them, and until
//!    every other subscriber has been sent their leaves.
//!
//! With `presence` off (the namespace without it) only phases 1 and 2 run:
//! the message latency to compare with.
//!
//! Its parts: [`cluster`] (Redis and the pods), [`member`] (one member's
//! client), [`publisher`] (the messages), [`footprint`] (what Redis holds
//! and is sent), [`query`] (the presence API and the pod's histogram),
//! [`mod@outage`] (phases 5 and 6), [`outcome`] (the result and its table).

pub mod cluster;
pub mod footprint;
pub mod member;
mod outage;
pub mod outcome;
pub mod publisher;
pub mod query;

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::Duration;

use tokio::sync::{Semaphore, mpsc, watch};
use tokio::task::JoinSet;
use tokio::time::Instant;

use self::cluster::{Cluster, NAMESPACE};
use self::member::{Command, Member, Room, Tally};
use self::query::Reader;
use crate::Error;
use crate::clients::{CONNECT_CONCURRENCY, FD_MARGIN, raise_fd_limit};
use crate::cpu::{Meter, Usage};
use crate::latency::{Summary, now_micros};

pub use self::outcome::{Diffs, FlowPhase, Join, Kill, Presence, Queries, Quiet, Restart};

pub const DEFAULT_PODS: usize = 4;
pub const DEFAULT_MEMBERS: usize = 10_000;
/// Messages per second to the room while it is not quiet.
pub const DEFAULT_RATE: f64 = 2.0;
/// Payload bytes (the stamp needs ~40).
pub const DEFAULT_SIZE: usize = 128;
/// How long messages flow while members churn.
pub const DEFAULT_FLOW: Duration = Duration::from_secs(10);
/// Members that leave and join again during the flow.
pub const DEFAULT_CHURN: usize = 500;
/// The window with no joins, no leaves and no messages.
pub const DEFAULT_QUIET: Duration = Duration::from_secs(10);
/// Timed queries of each kind.
pub const DEFAULT_QUERIES: usize = 200;
/// Members per timed page (the gateway's default and largest page).
pub const DEFAULT_PAGE_SIZE: usize = 1000;
/// Cumulative acks at most this often per member.
pub const DEFAULT_ACK_INTERVAL: Duration = Duration::from_secs(5);
/// Longest the join, and each pod's return in the rolling restart, may take.
pub const DEFAULT_SETTLE: Duration = Duration::from_secs(120);
/// Longest to wait for a killed pod's members to be gone.
pub const DEFAULT_KILL_WAIT: Duration = Duration::from_secs(60);
/// Most members one run holds: one process, one descriptor each, under the
/// 20,000 a process may open here.
pub const MAX_MEMBERS: usize = 19_000;
/// Between two looks at the members, or at presence's counts. A stats
/// query also sends the pod's pending diff at once (so that it never spans
/// the position the answer gives), so presence is asked only where a phase
/// needs it (once every member is in; after a kill), and not too often.
const POLL: Duration = Duration::from_millis(250);
/// After the last phase change, diffs still on their way are counted for
/// this long (a few of the pods' coalescing intervals).
pub(super) const TAIL: Duration = Duration::from_secs(2);
/// Before the quiet window: the last acks' session saves, the last diffs.
const QUIET_SETTLE: Duration = Duration::from_secs(3);
/// Longest the members may take to close at the end.
const STOP_WAIT: Duration = Duration::from_secs(10);

#[derive(Debug, Clone)]
pub struct Options {
    /// The herald binary the pods run.
    pub herald: PathBuf,
    /// Where Redis's and the pods' logs go (kept); `None`: scratch files.
    pub dir: Option<PathBuf>,
    pub pods: usize,
    pub members: usize,
    /// The room's namespace with presence and join/leave diffs; off: only
    /// the join and the flow, for the message latency without presence.
    pub presence: bool,
    pub rate: f64,
    pub size: usize,
    pub flow: Duration,
    pub churn: usize,
    pub quiet: Duration,
    pub queries: usize,
    pub page_size: usize,
    pub ack_interval: Duration,
    pub settle: Duration,
    pub kill_wait: Duration,
    /// Phases 5 and 6 (the smoke test may leave them out).
    pub restart: bool,
    pub kill: bool,
    /// More `HERALD_*` settings for every pod.
    pub env: Vec<(String, String)>,
}

impl Options {
    pub fn new(herald: PathBuf) -> Self {
        Self {
            herald,
            dir: None,
            pods: DEFAULT_PODS,
            members: DEFAULT_MEMBERS,
            presence: true,
            rate: DEFAULT_RATE,
            size: DEFAULT_SIZE,
            flow: DEFAULT_FLOW,
            churn: DEFAULT_CHURN,
            quiet: DEFAULT_QUIET,
            queries: DEFAULT_QUERIES,
            page_size: DEFAULT_PAGE_SIZE,
            ack_interval: DEFAULT_ACK_INTERVAL,
            settle: DEFAULT_SETTLE,
            kill_wait: DEFAULT_KILL_WAIT,
            restart: true,
            kill: true,
            env: Vec::new(),
        }
    }

    fn check(&self) -> Result<(), Error> {
        let bad = |what: &str| Err(Error::Options(what.to_owned()));
        if self.pods < 2 {
            return bad("--pods must be at least 2 (members resume at another pod)");
        }
        if self.members == 0 || self.members > MAX_MEMBERS {
            return bad("--members must be over 0 and at most 19,000");
        }
        if self.churn > self.members {
            return bad("--churn must be at most --members");
        }
        if !(self.rate > 0.0 && self.rate <= 1000.0) {
            return bad("--rate must be over 0 and at most 1000");
        }
        if self.page_size == 0 || self.queries == 0 {
            return bad("--page-size and --queries must be over 0");
        }
        for (name, d) in [
            ("--flow", self.flow),
            ("--quiet", self.quiet),
            ("--settle", self.settle),
            ("--kill-wait", self.kill_wait),
        ] {
            if d.is_zero() || d > super::MAX_DURATION {
                return Err(Error::Options(format!(
                    "{name} must be over 0s and at most {}s",
                    super::MAX_DURATION.as_secs()
                )));
            }
        }
        super::check_bounds(self.flow, self.size)
    }
}

/// The `info` claim of member `n`: about 20 bytes of compact JSON.
fn info(n: usize) -> serde_json::Value {
    serde_json::json!({"name": format!("member-{n:05}")})
}

/// The members' running tasks and what the scenario holds of them.
pub(super) struct Members {
    tallies: Vec<Arc<Tally>>,
    commands: Vec<mpsc::Sender<Command>>,
    stop: watch::Sender<bool>,
    tasks: JoinSet<()>,
}

impl Members {
    fn connected(&self) -> usize {
        self.tallies
            .iter()
            .filter(|t| t.connected.load(Ordering::Relaxed))
            .count()
    }

    fn by_pod(&self, pods: usize) -> Vec<u64> {
        let mut by_pod = vec![0; pods];
        for t in &self.tallies {
            if t.connected.load(Ordering::Relaxed)
                && let Some(n) = by_pod.get_mut(t.pod.load(Ordering::Relaxed))
            {
                *n += 1;
            }
        }
        by_pod
    }

    fn reset_phase(&self) {
        for t in &self.tallies {
            t.reset_phase();
        }
    }

    /// The diffs of the phase, over the members not told to stay away.
    fn diffs(&self) -> Diffs {
        let mut d = Diffs::default();
        for t in self
            .tallies
            .iter()
            .filter(|t| !t.stay_away.load(Ordering::Relaxed))
        {
            let frames = u64::from(t.frames.load(Ordering::Relaxed));
            d.subscribers += 1;
            d.frames_max = d.frames_max.max(frames);
            d.frames_total += frames;
            d.joins_total += u64::from(t.joins.load(Ordering::Relaxed));
            d.leaves_total += u64::from(t.leaves.load(Ordering::Relaxed));
            d.counts_only_total += u64::from(t.counts_only.load(Ordering::Relaxed));
        }
        d
    }

    fn sum(&self, field: impl Fn(&Tally) -> u64) -> u64 {
        self.tallies.iter().map(|t| field(t)).sum()
    }

    async fn stop(mut self) {
        let _ = self.stop.send(true);
        let all = async { while self.tasks.join_next().await.is_some() {} };
        if tokio::time::timeout(STOP_WAIT, all).await.is_err() {
            self.tasks.abort_all();
        }
    }
}

/// A bound on a wait that looks every [`POLL`].
pub(super) struct Deadline {
    started: Instant,
    within: Duration,
}

impl Deadline {
    fn new(within: Duration) -> Self {
        Self {
            started: Instant::now(),
            within,
        }
    }

    /// Seconds since the start.
    fn elapsed_s(&self) -> f64 {
        self.started.elapsed().as_secs_f64()
    }

    /// Waits one [`POLL`]; false once the bound has passed.
    async fn again(&self) -> bool {
        if self.started.elapsed() >= self.within {
            return false;
        }
        tokio::time::sleep(POLL).await;
        true
    }
}

/// Whether presence on `reader`'s pod counts `users` users now.
pub(super) async fn counts(reader: &mut Reader, users: u64) -> bool {
    matches!(reader.stats().await, Ok(s) if s.users == users)
}

pub async fn run(options: Options) -> Result<Presence, Error> {
    options.check()?;
    raise_fd_limit(options.members as u64 + FD_MARGIN + 4 * options.pods as u64)?;
    let secret = crate::token::secret();
    let mut cluster = Cluster::start(&options, &secret).await?;
    let topic = format!(
        "{NAMESPACE}:lt{}x{}",
        std::process::id(),
        now_micros() % 1_000_000_000
    );
    let room = Arc::new(Room {
        topic: topic.clone(),
        pods: cluster.targets()?,
        up: (0..options.pods).map(|_| AtomicBool::new(true)).collect(),
        ack_interval: options.ack_interval,
        leave_target: AtomicU32::new(0),
        measuring: AtomicBool::new(false),
        connecting: Semaphore::new(CONNECT_CONCURRENCY),
        recording: AtomicBool::new(false),
        leaves_seen: Default::default(),
    });
    let mut watched: Vec<u32> = cluster.pods.iter().filter_map(rig::Herald::pid).collect();
    watched.extend(cluster.redis.pid());
    let meter = Meter::start(&watched);
    let mut result = Presence {
        pods: options.pods,
        members: options.members,
        presence: options.presence,
        topic: topic.clone(),
        info_bytes: info(0).to_string().len(),
        rate_per_s: options.rate,
        join: Join::default(),
        flow: FlowPhase::default(),
        quiet: None,
        queries: None,
        restart: None,
        kill: None,
        member_errors: 0,
        last_member_error: None,
        cpu: Usage::default(),
        problems: Vec::new(),
    };

    // 1. join
    let (stop, stopped) = watch::channel(false);
    let mut members = Members {
        tallies: Vec::with_capacity(options.members),
        commands: Vec::with_capacity(options.members),
        stop,
        tasks: JoinSet::new(),
    };
    for index in 0..options.members {
        let user = format!("m{index:05}");
        let token = crate::token::mint(&secret, &user, Some(&info(index)))?;
        let (commands, receiver) = mpsc::channel(4);
        let tally = Arc::new(Tally::new());
        members.tallies.push(Arc::clone(&tally));
        members.commands.push(commands);
        members.tasks.spawn(
            Member {
                index,
                token,
                room: Arc::clone(&room),
                tally,
                commands: receiver,
                stop: stopped.clone(),
            }
            .run(),
        );
    }
    let mut reader = Reader::new(cluster.pods[0].addr, &topic);
    let everyone = options.members as u64;
    let wait = Deadline::new(options.settle);
    result.join.all_in_s = loop {
        if members.connected() == options.members
            && (!options.presence || counts(&mut reader, everyone).await)
        {
            break Some(wait.elapsed_s());
        }
        if !wait.again().await {
            break None;
        }
    };
    result.join.members_by_pod = members.by_pod(options.pods);
    if result.join.all_in_s.is_none() {
        result.problems.push(format!(
            "join: {} of {} members in; presence showed: {}",
            members.connected(),
            options.members,
            reader.last
        ));
    }
    tokio::time::sleep(TAIL).await;
    result.join.diffs = members.diffs();
    println!(
        "presence: join {} ({} members by pod {:?})",
        result
            .join
            .all_in_s
            .map_or_else(|| "incomplete".to_owned(), |s| format!("{s:.1} s")),
        members.connected(),
        result.join.members_by_pod
    );
    if result.join.all_in_s.is_none() {
        return finish(result, members, cluster, &meter).await;
    }

    // 2. flow, with churn
    let (flow, publisher) = publisher::start(Arc::clone(&room), options.rate, options.size);
    members.reset_phase();
    room.measuring.store(true, Ordering::Relaxed);
    let published_before = flow.published.load(Ordering::Relaxed);
    let messages_before = members.sum(|t| t.messages.load(Ordering::Relaxed));
    let mut churn = JoinSet::new();
    for k in 0..options.churn {
        let commands = members.commands[k * options.members / options.churn.max(1)].clone();
        let half = options.flow / 2;
        churn.spawn(async move {
            tokio::time::sleep(half.mul_f64(rand::random::<f64>())).await;
            let _ = commands.send(Command::Unsub).await;
            tokio::time::sleep(half.mul_f64(0.25 + 0.75 * rand::random::<f64>())).await;
            let _ = commands.send(Command::Sub).await;
        });
    }
    tokio::time::sleep(options.flow).await;
    // Each churner is back by now unless the machine lagged: wait for the
    // stragglers a little, so that none is left out of the room.
    let back = async { while churn.join_next().await.is_some() {} };
    if tokio::time::timeout(options.flow, back).await.is_err() {
        result
            .problems
            .push("churners still out of the room after twice --flow".to_owned());
        churn.abort_all();
    }
    room.measuring.store(false, Ordering::Relaxed);
    tokio::time::sleep(TAIL).await;
    let mut latency: Vec<u32> = Vec::new();
    for t in &members.tallies {
        latency.append(&mut t.latency.lock().unwrap_or_else(|p| p.into_inner()));
    }
    result.flow = FlowPhase {
        duration_s: options.flow.as_secs_f64(),
        churners: options.churn as u64,
        published: flow.published.load(Ordering::Relaxed) - published_before,
        messages: members.sum(|t| t.messages.load(Ordering::Relaxed)) - messages_before,
        latency: Summary::of(&mut latency),
        diffs: members.diffs(),
    };
    println!("presence: flow, latency {}", result.flow.latency.brief());
    if !options.presence {
        flow.stopped.store(true, Ordering::Relaxed);
        let _ = publisher.await;
        return finish(result, members, cluster, &meter).await;
    }

    // 3. quiet
    flow.paused.store(true, Ordering::Relaxed);
    tokio::time::sleep(QUIET_SETTLE).await;
    members.reset_phase();
    match quiet(&cluster, &topic, &options).await {
        Ok(mut q) => {
            q.diffs = members.diffs();
            result.quiet = Some(q);
        }
        Err(e) => result.problems.push(format!("quiet window: {e}")),
    }
    println!("presence: quiet window done");

    // 4. queries
    let mut queries = Queries {
        page_size: options.page_size as u64,
        ..Queries::default()
    };
    match time_queries(&mut reader, &options, &mut queries).await {
        Ok(()) => {}
        Err(e) => result.problems.push(format!("queries: {e}")),
    }
    result.queries = Some(queries);
    // The CPU up to here: the pods restarted after are other processes.
    result.cpu = meter.stop();
    flow.paused.store(false, Ordering::Relaxed);

    // 5. rolling restart
    if options.restart {
        let restart =
            outage::rolling_restart(&mut cluster, &room, &members, &flow, &options, &topic).await;
        match restart {
            Ok(r) => result.restart = Some(r),
            Err(e) => result.problems.push(format!("rolling restart: {e}")),
        }
    }

    // 6. kill -9
    if options.kill {
        match outage::kill(&mut cluster, &room, &members, &options, &topic).await {
            Ok(k) => result.kill = Some(k),
            Err(e) => result.problems.push(format!("kill: {e}")),
        }
    }
    flow.stopped.store(true, Ordering::Relaxed);
    let _ = publisher.await;
    finish(result, members, cluster, &meter).await
}

/// Phase 3: the room's presence memory, then Redis's commands over the
/// quiet window.
async fn quiet(cluster: &Cluster, topic: &str, options: &Options) -> Result<Quiet, Error> {
    let memory = footprint::memory(&cluster.redis, topic)?;
    let before = footprint::calls(&cluster.redis)?;
    let window = Instant::now();
    tokio::time::sleep(options.quiet).await;
    let after = footprint::calls(&cluster.redis)?;
    let window_s = window.elapsed().as_secs_f64();
    let commands = footprint::between(&cluster.redis, &before, &after, window_s)?;
    Ok(Quiet {
        writes_per_member: commands.writes as f64 / options.members as f64,
        writes_per_s: commands.writes as f64 / window_s,
        memory,
        commands,
        diffs: Diffs::default(),
    })
}

/// Phase 4: timed pages and stats, every page walked, the pod's histogram.
async fn time_queries(
    reader: &mut Reader,
    options: &Options,
    queries: &mut Queries,
) -> Result<(), Error> {
    let (page, members) = reader
        .time_pages(options.queries, options.page_size)
        .await?;
    queries.page = page;
    queries.page_members = members as u64;
    queries.stats = reader.time_stats(options.queries).await?;
    queries.users = reader.stats().await?.users;
    let max_pages = options.members / options.page_size + 2;
    let (walked, pages) = reader.walk(options.page_size, max_pages).await?;
    queries.walked_members = walked;
    queries.walked_pages = pages as u64;
    queries.server = reader.server_timing().await?;
    Ok(())
}

/// Stops the members and the processes; the result with the CPU figures.
async fn finish(
    mut result: Presence,
    members: Members,
    cluster: Cluster,
    meter: &Meter,
) -> Result<Presence, Error> {
    if result.cpu.wall_s == 0.0 {
        result.cpu = meter.stop();
    }
    result.member_errors = members.sum(|t| u64::from(t.errors.load(Ordering::Relaxed)));
    result.last_member_error = members.tallies.iter().find_map(|t| {
        t.last_error
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    });
    members.stop().await;
    drop(cluster);
    Ok(result)
}
