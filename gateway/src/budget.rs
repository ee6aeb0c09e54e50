//! What one principal may hold and touch on the pod, across all of its
//! connections: a user (its token's `sub`), or, for anonymous clients, the
//! address prefix they come from ([`crate::admission::address_key`]).
//!
//! The per-connection limits (`session.max_subscriptions`, the command rate)
//! leave a client free to open more connections: 1,000 connections from one
//! address x 1,000 subscriptions is a gigabyte of pod memory, and every
//! throwaway topic makes Redis keys that live the namespace's history age
//! (issue #21). So, per principal and pod:
//!
//! - subscriptions held (`session.max_subscriptions_per_user`, or
//!   `max_subscriptions_per_ip` for an anonymous address);
//! - distinct topics subscribed or published to in the last minute
//!   (`session.topics_per_minute`): a topic is "created" by whoever first
//!   touches it, and only the broker knows who that was, after the fact;
//!   counting every distinct topic a principal touches bounds it;
//! - distinct topics an anonymous address holds subscriptions to
//!   (`session.anonymous_max_topics`): each is a broker watch, a Redis
//!   channel and keys kept in use, whatever the number of connections.
//!
//! A principal's ledger lives while it has a connection that said `hello`
//! (an [`Account`]); the last one's end drops it, so the bookkeeping is
//! bounded by the connections the pod admits. Topics are kept as 64-bit
//! hashes, keyed per pod (a client cannot aim for collisions): a ledger
//! costs 8 bytes and change per topic, not the topic's name.

use std::collections::hash_map::{Entry, RandomState};
use std::collections::{HashMap, HashSet, VecDeque};
use std::hash::BuildHasher;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use ipnet::IpNet;
use proto::ErrorCode;
use router::Topic;
use tokio::time::Instant;

use crate::config::SessionConfig;
use crate::metrics::Metrics;

/// The window `session.topics_per_minute` counts distinct topics in.
pub const TOPIC_WINDOW: Duration = Duration::from_secs(60);

/// Whose budget a connection draws on.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Principal {
    /// An authenticated client's user: its budget follows it to any address.
    User(Arc<str>),
    /// Anonymous clients, by address prefix.
    Address(IpNet),
}

impl Principal {
    fn is_anonymous(&self) -> bool {
        matches!(self, Principal::Address(_))
    }
}

/// A budget a command would overdraw.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Limit {
    /// `session.max_subscriptions_per_user`.
    SubscriptionsPerUser,
    /// `session.max_subscriptions_per_ip`.
    SubscriptionsPerIp,
    /// `session.topics_per_minute`.
    TopicsPerMinute,
    /// `session.anonymous_max_topics`.
    AnonymousTopics,
}

impl Limit {
    /// Every `limit` of `herald_limit_refusals_total`.
    pub const ALL: [Limit; 4] = [
        Limit::SubscriptionsPerUser,
        Limit::SubscriptionsPerIp,
        Limit::TopicsPerMinute,
        Limit::AnonymousTopics,
    ];

    pub const fn as_str(self) -> &'static str {
        match self {
            Limit::SubscriptionsPerUser => "subscriptions_per_user",
            Limit::SubscriptionsPerIp => "subscriptions_per_ip",
            Limit::TopicsPerMinute => "topics_per_minute",
            Limit::AnonymousTopics => "anonymous_topics",
        }
    }

    /// The `err` code a client is refused with: a held budget is
    /// `too_many_subscriptions` (leave some first), the per-minute one
    /// `rate_limited` (wait).
    pub const fn code(self) -> ErrorCode {
        match self {
            Limit::TopicsPerMinute => ErrorCode::RateLimited,
            _ => ErrorCode::TooManySubscriptions,
        }
    }

    /// What the client is told, with the cap.
    pub fn message(self, config: &SessionConfig) -> String {
        match self {
            Limit::SubscriptionsPerUser => format!(
                "at most {} subscriptions per user, across its connections",
                config.max_subscriptions_per_user
            ),
            Limit::SubscriptionsPerIp => format!(
                "at most {} subscriptions for anonymous clients of one address, across their connections",
                config.max_subscriptions_per_ip
            ),
            Limit::TopicsPerMinute => format!(
                "at most {} distinct topics per minute",
                config.topics_per_minute
            ),
            Limit::AnonymousTopics => format!(
                "anonymous clients of one address may hold subscriptions to at most {} topics",
                config.anonymous_max_topics
            ),
        }
    }
}

/// The caps, from `[session]`; 0: none.
#[derive(Debug, Clone, Copy)]
struct Caps {
    subscriptions_per_user: usize,
    subscriptions_per_ip: usize,
    topics_per_minute: usize,
    anonymous_topics: usize,
}

/// The pod's ledgers, one per principal with a connection.
pub struct Budgets {
    caps: Caps,
    ledgers: Mutex<HashMap<Principal, Arc<Mutex<Ledger>>>>,
    hasher: RandomState,
    metrics: Arc<Metrics>,
}

/// What a principal holds and touched, across its connections.
#[derive(Default)]
struct Ledger {
    connections: usize,
    subscriptions: usize,
    /// Anonymous principals, with `anonymous_max_topics`: the distinct
    /// topics held, with the number of subscriptions to each.
    topics: HashMap<u64, u32>,
    /// With `topics_per_minute`: the topics touched in the last
    /// [`TOPIC_WINDOW`], oldest first, and the same as a set. A topic counts
    /// from its first touch until it leaves the window.
    recent: VecDeque<(u64, Instant)>,
    recent_set: HashSet<u64>,
}

impl Ledger {
    /// Whether `topic` is in the window already or fits in it (then it is
    /// added).
    fn touch(&mut self, topic: u64, now: Instant, cap: usize) -> bool {
        while let Some(&(old, at)) = self.recent.front() {
            if now.saturating_duration_since(at) < TOPIC_WINDOW {
                break;
            }
            self.recent.pop_front();
            self.recent_set.remove(&old);
        }
        if self.recent_set.contains(&topic) {
            return true;
        }
        if self.recent_set.len() >= cap {
            return false;
        }
        self.recent.push_back((topic, now));
        self.recent_set.insert(topic);
        true
    }
}

impl Budgets {
    pub fn new(config: &SessionConfig, metrics: Arc<Metrics>) -> Self {
        Self {
            caps: Caps {
                subscriptions_per_user: config.max_subscriptions_per_user,
                subscriptions_per_ip: config.max_subscriptions_per_ip,
                topics_per_minute: config.topics_per_minute,
                anonymous_topics: config.anonymous_max_topics,
            },
            ledgers: Mutex::new(HashMap::new()),
            hasher: RandomState::new(),
            metrics,
        }
    }

    fn ledgers(&self) -> MutexGuard<'_, HashMap<Principal, Arc<Mutex<Ledger>>>> {
        self.ledgers.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A connection's account with `principal`'s ledger, made if it is the
    /// principal's first.
    pub fn open(self: &Arc<Self>, principal: Principal) -> Account {
        let mut ledgers = self.ledgers();
        let ledger = ledgers.entry(principal.clone()).or_default().clone();
        lock(&ledger).connections += 1;
        self.metrics.budget_principals.set(gauge(ledgers.len()));
        Account {
            budgets: self.clone(),
            principal,
            ledger,
            held: HashSet::new(),
        }
    }

    /// Principals with a ledger.
    pub fn principals(&self) -> usize {
        self.ledgers().len()
    }

    fn key(&self, topic: &Topic) -> u64 {
        self.hasher.hash_one(topic.as_str())
    }
}

/// A connection's draw on its principal's budgets. Dropped, it gives back
/// what the connection held.
pub struct Account {
    budgets: Arc<Budgets>,
    principal: Principal,
    ledger: Arc<Mutex<Ledger>>,
    /// The topics this connection's subscriptions are charged for.
    held: HashSet<u64>,
}

impl Account {
    pub fn principal(&self) -> &Principal {
        &self.principal
    }

    /// The subscription cap that applies to this principal (0: none).
    pub fn subscriptions_cap(&self) -> usize {
        let caps = &self.budgets.caps;
        match self.principal {
            Principal::User(_) => caps.subscriptions_per_user,
            Principal::Address(_) => caps.subscriptions_per_ip,
        }
    }

    /// Whether distinct held topics are counted for this principal.
    fn counts_topics(&self) -> bool {
        self.principal.is_anonymous() && self.budgets.caps.anonymous_topics > 0
    }

    /// Charges a new subscription to `topic`, unless a budget would be
    /// overdrawn (then nothing is charged, and the refusal is counted).
    /// Give it back with [`Self::unsubscribed`] if the subscription fails.
    pub fn subscribe(&mut self, topic: &Topic) -> Result<(), Limit> {
        let key = self.budgets.key(topic);
        let caps = self.budgets.caps;
        let cap = self.subscriptions_cap();
        let counts_topics = self.counts_topics();
        let mut ledger = lock(&self.ledger);
        let refused = if cap > 0 && ledger.subscriptions >= cap {
            Some(match self.principal {
                Principal::User(_) => Limit::SubscriptionsPerUser,
                Principal::Address(_) => Limit::SubscriptionsPerIp,
            })
        } else if counts_topics
            && !ledger.topics.contains_key(&key)
            && ledger.topics.len() >= caps.anonymous_topics
        {
            Some(Limit::AnonymousTopics)
        } else if caps.topics_per_minute > 0
            && !ledger.touch(key, Instant::now(), caps.topics_per_minute)
        {
            Some(Limit::TopicsPerMinute)
        } else {
            None
        };
        if let Some(limit) = refused {
            drop(ledger);
            return Err(self.refused(limit));
        }
        if self.held.insert(key) {
            charge(&mut ledger, key, counts_topics);
        }
        Ok(())
    }

    /// Counts a publish to `topic` against the topics per minute.
    pub fn publish(&mut self, topic: &Topic) -> Result<(), Limit> {
        let cap = self.budgets.caps.topics_per_minute;
        if cap == 0 {
            return Ok(());
        }
        let key = self.budgets.key(topic);
        let fits = lock(&self.ledger).touch(key, Instant::now(), cap);
        if fits {
            Ok(())
        } else {
            Err(self.refused(Limit::TopicsPerMinute))
        }
    }

    /// Gives back the subscription to `topic`, if it was charged.
    pub fn unsubscribed(&mut self, topic: &Topic) {
        let key = self.budgets.key(topic);
        if self.held.remove(&key) {
            let counts_topics = self.counts_topics();
            release(&mut lock(&self.ledger), key, counts_topics);
        }
    }

    /// Makes the charge match `topics`, the connection's subscriptions, as a
    /// resume or a `refresh` left them: what a resume restored was admitted
    /// when it was first subscribed, and is charged without a check.
    pub fn settle(&mut self, topics: &[Topic]) {
        let now: HashSet<u64> = topics.iter().map(|t| self.budgets.key(t)).collect();
        let counts_topics = self.counts_topics();
        let mut ledger = lock(&self.ledger);
        for &key in self.held.difference(&now) {
            release(&mut ledger, key, counts_topics);
        }
        for &key in now.difference(&self.held) {
            charge(&mut ledger, key, counts_topics);
        }
        drop(ledger);
        self.held = now;
    }

    fn refused(&self, limit: Limit) -> Limit {
        self.budgets.metrics.limit_refused(limit.as_str());
        tracing::debug!(principal = ?self.principal, limit = limit.as_str(), "over a budget");
        limit
    }
}

impl Drop for Account {
    fn drop(&mut self) {
        // The map first, as `open` takes them: a new connection of the
        // principal finds either this ledger or none.
        let mut ledgers = self.budgets.ledgers();
        let counts_topics = self.counts_topics();
        let mut ledger = lock(&self.ledger);
        for &key in &self.held {
            release(&mut ledger, key, counts_topics);
        }
        ledger.connections -= 1;
        if ledger.connections == 0 {
            drop(ledger);
            ledgers.remove(&self.principal);
            self.budgets
                .metrics
                .budget_principals
                .set(gauge(ledgers.len()));
        }
    }
}

fn charge(ledger: &mut Ledger, key: u64, counts_topics: bool) {
    ledger.subscriptions += 1;
    if counts_topics {
        *ledger.topics.entry(key).or_insert(0) += 1;
    }
}

fn release(ledger: &mut Ledger, key: u64, counts_topics: bool) {
    ledger.subscriptions = ledger.subscriptions.saturating_sub(1);
    if counts_topics && let Entry::Occupied(mut held) = ledger.topics.entry(key) {
        *held.get_mut() -= 1;
        if *held.get() == 0 {
            held.remove();
        }
    }
}

fn lock(ledger: &Mutex<Ledger>) -> MutexGuard<'_, Ledger> {
    ledger.lock().unwrap_or_else(|e| e.into_inner())
}

fn gauge(n: usize) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn topic(name: &str) -> Topic {
        Topic::parse(name).unwrap_or_else(|e| panic!("{name}: {e}"))
    }

    fn budgets(
        per_user: usize,
        per_ip: usize,
        per_minute: usize,
        anonymous: usize,
    ) -> Arc<Budgets> {
        let config = SessionConfig {
            max_subscriptions_per_user: per_user,
            max_subscriptions_per_ip: per_ip,
            topics_per_minute: per_minute,
            anonymous_max_topics: anonymous,
            ..SessionConfig::default()
        };
        Arc::new(Budgets::new(&config, Arc::new(Metrics::new())))
    }

    fn address() -> Principal {
        Principal::Address("198.51.100.0/24".parse().unwrap_or_else(|e| panic!("{e}")))
    }

    #[tokio::test(start_paused = true)]
    async fn a_topic_counts_once_per_minute_from_its_first_touch() {
        let budgets = budgets(0, 0, 2, 0);
        let mut account = budgets.open(Principal::User(Arc::from("alice")));
        assert_eq!(account.publish(&topic("a")), Ok(()));
        tokio::time::advance(Duration::from_secs(30)).await;
        assert_eq!(account.subscribe(&topic("b")), Ok(()));
        // Touched again: no new topic.
        assert_eq!(account.publish(&topic("a")), Ok(()));
        assert_eq!(account.publish(&topic("c")), Err(Limit::TopicsPerMinute));
        // `a` leaves the window a minute after its first touch; `b` not yet.
        tokio::time::advance(Duration::from_secs(30)).await;
        assert_eq!(account.publish(&topic("c")), Ok(()));
        assert_eq!(account.publish(&topic("d")), Err(Limit::TopicsPerMinute));
        // Refused touches took no room.
        tokio::time::advance(Duration::from_secs(30)).await;
        assert_eq!(account.publish(&topic("d")), Ok(()));
    }

    #[test]
    fn connections_of_one_principal_share_its_budgets_until_the_last_one_goes() {
        let budgets = budgets(0, 4, 0, 2);
        let mut one = budgets.open(address());
        let mut two = budgets.open(address());
        assert_eq!(one.subscribe(&topic("a")), Ok(()));
        assert_eq!(two.subscribe(&topic("a")), Ok(()));
        assert_eq!(two.subscribe(&topic("b")), Ok(()));
        // A third distinct topic for the address is one too many...
        assert_eq!(one.subscribe(&topic("c")), Err(Limit::AnonymousTopics));
        // ...a held one is not...
        assert_eq!(one.subscribe(&topic("b")), Ok(()));
        // ...and a fifth subscription is one too many, even to a held topic.
        assert_eq!(two.subscribe(&topic("c")), Err(Limit::SubscriptionsPerIp));
        one.unsubscribed(&topic("b"));
        two.unsubscribed(&topic("b"));
        assert_eq!(one.subscribe(&topic("c")), Ok(()));
        assert_eq!(budgets.principals(), 1);
        drop(one);
        // What `one` held is given back with it: `a` once, `c` entirely.
        assert_eq!(two.subscribe(&topic("b")), Ok(()));
        assert_eq!(two.subscribe(&topic("c")), Err(Limit::AnonymousTopics));
        drop(two);
        assert_eq!(
            budgets.principals(),
            0,
            "the ledger goes with the last connection"
        );
    }

    #[test]
    fn every_limit_has_its_metric_label() {
        let labels: Vec<&str> = Limit::ALL.iter().map(|l| l.as_str()).collect();
        assert_eq!(labels, crate::metrics::LIMIT_REFUSALS);
    }

    #[test]
    fn a_settle_charges_what_a_resume_restored_and_gives_back_what_it_dropped() {
        let budgets = budgets(2, 0, 0, 0);
        let alice = || Principal::User(Arc::from("alice"));
        let mut resumed = budgets.open(alice());
        resumed.settle(&[topic("a"), topic("b")]);
        let mut other = budgets.open(alice());
        assert_eq!(
            other.subscribe(&topic("c")),
            Err(Limit::SubscriptionsPerUser)
        );
        resumed.settle(&[topic("a")]);
        assert_eq!(other.subscribe(&topic("c")), Ok(()));
        // Another user has a budget of its own.
        let mut bob = budgets.open(Principal::User(Arc::from("bob")));
        assert_eq!(bob.subscribe(&topic("c")), Ok(()));
    }
}
