//! The pod's pub/sub connections, and the order of what they deliver.
//!
//! One task ([`run`]) owns the connections and, per watched topic, where
//! delivery stands ([`Flow`](flow::Flow)). It never waits for Redis itself:
//! reading the connections is separate from every round trip. Subscribing,
//! reading a new topic's position, filling a gap from history and
//! resyncing after a reconnect run as their own tasks and report back
//! ([`Done`]); meanwhile that topic's announcements are held
//! aside (at most [`MAX_HELD`](flow::MAX_HELD); past that they are read from
//! history afterwards), and every other topic keeps flowing.
//!
//! # The parts
//! The task's state is one [`Pubsub`]; its work is in a file per noun:
//! - [`watch`]: the broker's commands ([`Command`]), how many watch each
//!   topic, and the end of a subscription nobody watched for the linger.
//! - [`link`]: the connections ([`Link`]), one to the one Redis or to each
//!   cluster master, made again with backoff and jitter when they drop, and
//!   what they push.
//! - [`subscription`]: subscribing and unsubscribing channels on a link, and
//!   what Redis answered ([`Subscription`](subscription::Subscription)).
//! - [`cluster`]: following a cluster's slot map: a topic whose slot has
//!   another master now moves to that master's link.
//! - [`announcement`]: decoding what a channel carries: a publication's
//!   announcement (alone or in a batch), or a control message.
//! - [`flow`]: ordering each topic's flow: the merge rule
//!   ([`decide`](flow::decide)), announcements held aside, gaps, resets.
//! - [`history`]: the reads of Redis a flow waits for: a new topic's
//!   position, a catch-up from where it stood, a gap's publications.
//! - [`report`]: what the tasks that talk to Redis report back, and whether
//!   a report still applies.
//!
//! # A publication's way
//! A link's connection pushes a message ([`Pubsub::push`]);
//! [`Pubsub::message`] splits a batch and [`Pubsub::announcement`] parses
//! each announcement; [`Pubsub::arrive`] runs it through the merge rule. The
//! next seq goes to the sink ([`Pubsub::deliver`]); one delivered already is
//! dropped; while the topic reads from Redis it is held aside; a jump starts
//! a catch-up: [`Pubsub::fill`] reads the gap from history in a task, whose
//! [`Done::Filled`] comes back through
//! [`Pubsub::done`] to [`Pubsub::filled`], which delivers the gap (or resets
//! the topic's subscribers past it) and then what was held
//! ([`Pubsub::replay_held`]).
//!
//! # A watch's way
//! [`Command::Watch`] reaches [`Pubsub::command`], which finds the topic's
//! link ([`Pubsub::link_for`]) and subscribes it there
//! ([`Pubsub::subscribe`]; on a link still connecting, once it is up:
//! [`Pubsub::connected`]). [`Pubsub::subscribed`] reads its position
//! ([`Pubsub::read`]); [`Pubsub::positioned`] makes the topic live, answers
//! the watch and replays what arrived meanwhile. When a link drops
//! ([`Pubsub::link_lost`]), its topics go back to subscribing: once it is up
//! again (or at their slot's new master) they are subscribed again and read
//! from where they stood, through the same steps.

mod announcement;
mod cluster;
mod flow;
mod history;
mod link;
mod report;
mod subscription;
mod watch;

use std::collections::HashMap;
use std::sync::Arc;

use tokio::sync::mpsc;
use tokio::time::Instant;

use super::RedisSettings;
use super::connection::Connector;
use super::lineage::Lineage;
use super::presence::Replicas;
use super::reach::Reach;
use super::scripts::Keys;
use super::shards::Shards;
use crate::observe::Observer;
use crate::{Deliver, Namespaces, Topic};
use cluster::MAP_CHECK;
use link::{Link, MIN_BACKOFF, Push};
use report::Done;
pub use watch::Command;
use watch::Watched;

/// The task's state: the links, and where each watched topic stands (see
/// the module's docs).
pub struct Pubsub {
    client: Connector,
    shards: Shards,
    sink: Arc<dyn Deliver>,
    observer: Arc<dyn Observer>,
    lineage: Arc<Lineage>,
    namespaces: Arc<Namespaces>,
    settings: RedisSettings,
    /// The names of this deployment's keys and channels.
    keys: Keys,
    /// Told when the connection comes up or fails.
    reach: Arc<Reach>,
    control_channel: String,
    /// The link the control channel is subscribed on (`SUBSCRIBE`: in a
    /// cluster, every node hears every `PUBLISH`).
    control: Option<usize>,
    topics: HashMap<Topic, Watched>,
    links: Vec<Link>,
    done: mpsc::UnboundedSender<Done>,
    reports: mpsc::UnboundedReceiver<Done>,
    push_sender: mpsc::UnboundedSender<Push>,
    pushes: mpsc::UnboundedReceiver<Push>,
    /// A read of the cluster's map is under way, or wanted.
    mapping: bool,
    map_wanted: bool,
    /// Announcements held over all topics.
    held: usize,
    /// The rooms of the presence topics it subscribes.
    presence: Arc<Replicas>,
}

impl Pubsub {
    // One argument per part it shares with the broker.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        client: Connector,
        shards: Shards,
        sink: Arc<dyn Deliver>,
        observer: Arc<dyn Observer>,
        lineage: Arc<Lineage>,
        namespaces: Arc<Namespaces>,
        settings: RedisSettings,
        reach: Arc<Reach>,
        presence: Arc<Replicas>,
    ) -> Self {
        let (done, reports) = mpsc::unbounded_channel();
        let (push_sender, pushes) = mpsc::unbounded_channel();
        let keys = Keys::new(&settings.prefix, shards.is_cluster());
        Self {
            control_channel: keys.control_channel(),
            keys,
            reach,
            client,
            shards,
            sink,
            observer,
            lineage,
            namespaces,
            settings,
            control: None,
            topics: HashMap::new(),
            links: Vec::new(),
            done,
            reports,
            push_sender,
            pushes,
            mapping: false,
            map_wanted: false,
            held: 0,
            presence,
        }
    }
}

/// Runs the task until the broker drops its end of `commands`.
pub async fn run(mut ps: Pubsub, mut commands: mpsc::UnboundedReceiver<Command>) {
    // The control channel's link first: its connection decides readiness.
    let control = ps.link_for(&ps.control_channel.clone());
    ps.control = control;
    let mut ticks = tokio::time::interval(MIN_BACKOFF);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut last_linger = Instant::now();
    let mut last_map = Instant::now();
    loop {
        tokio::select! {
            command = commands.recv() => {
                let Some(command) = command else { return };
                let mut batch = vec![command];
                while let Ok(more) = commands.try_recv() {
                    batch.push(more);
                }
                ps.command(batch);
            }
            Some(push) = ps.pushes.recv() => ps.push(push),
            Some(done) = ps.reports.recv() => ps.done(done),
            _ = ticks.tick() => {
                let now = Instant::now();
                ps.reconnect_due(now);
                let linger = ps.settings.linger.max(MIN_BACKOFF);
                if now.duration_since(last_linger) >= linger {
                    last_linger = now;
                    ps.unsubscribe_idle();
                }
                if ps.shards.is_cluster() && now.duration_since(last_map) >= MAP_CHECK {
                    last_map = now;
                    ps.read_map();
                }
                ps.resubscribe_waiting();
            }
        }
    }
}
