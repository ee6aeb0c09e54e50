//! The composition root: builds the pod's parts (configuration, hub, broker,
//! session store, live sessions, metrics, the drain signal), wires them
//! together, and runs its background work (the session flusher, the
//! rebalancer). One per running gateway. Its sessions get the parts they use
//! as a [`Pod`]; no part it builds imports it.

use std::future::Future;
use std::sync::{Arc, Weak};
use std::time::Duration;

use router::{
    Broker, Deliver, Forward, Member, MemoryBroker, Position, PresenceChange, PresenceSettings,
    Publication, RedisBroker, ServerSubscription, SessionStore, Topic,
};
use tokio::sync::{Notify, Semaphore, SemaphorePermit};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::admission::Slots;
use crate::auth::{AuthError, Verifier};
use crate::budget::Budgets;
use crate::config::{BrokerKind, Config};
use crate::hooks::{Hooks, HooksError};
use crate::hub::Hub;
use crate::metrics::Metrics;
use crate::outbound::Writing;
use crate::presence::Presence;
use crate::rebalance;
use crate::reload::{self, ApiKeys};
use crate::session::{Pod, Post, Registry, Replays};
use crate::webhooks::{Event as WebhookEvent, Type as WebhookType, Webhooks};

pub struct Node {
    pub config: Arc<Config>,
    pub hub: Arc<Hub>,
    pub broker: Arc<dyn Broker>,
    pub sessions: Arc<dyn SessionStore>,
    /// The sessions this pod's connections serve.
    pub live: Arc<Registry>,
    pub metrics: Arc<Metrics>,
    /// Cancelled when the pod starts draining.
    pub drain: CancellationToken,
    /// Every connection task, upgraded or not: shutdown waits for them.
    pub tasks: TaskTracker,
    /// What its sessions use of the pod: the same handles as above, with
    /// the token verifier, the namespaces and the writers' settings.
    pub pod: Arc<Pod>,
    /// The WebSocket connection slots.
    pub slots: Arc<Slots>,
    /// Slots for API requests served at once (`http.max_concurrent_requests`).
    api_requests: Semaphore,
    /// The API keys, reloaded without a restart ([`crate::reload`]).
    pub api_keys: Arc<ApiKeys>,
    /// This pod's name among the pods that rebalance.
    pub pod_name: Arc<str>,
    /// Who is subscribed to the presence topics.
    pub presence: Arc<Presence>,
}

/// Why the pod could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error(transparent)]
    Broker(#[from] router::redis::StartError),
    #[error(transparent)]
    Auth(#[from] AuthError),
    #[error(transparent)]
    Hooks(#[from] HooksError),
}

impl StartError {
    /// Whether a setting is at fault (`herald` exits with
    /// [`crate::config::EXIT_BAD_CONFIG`]), not what the pod found when it
    /// started.
    pub fn is_config(&self) -> bool {
        matches!(
            self,
            Self::Broker(router::redis::StartError::Config(_))
                | Self::Hooks(HooksError::Url { .. })
        )
    }
}

/// Where the broker hands what it has for this pod: publications and resets
/// to the hub, a backend's disconnects and server-side subscriptions to the
/// live sessions.
struct Sink {
    hub: Arc<Hub>,
    live: Arc<Registry>,
    metrics: Arc<Metrics>,
    presence: Arc<Presence>,
    /// Events to the backend: occupancy and members as the engine tells
    /// them (one pod each, across pods).
    webhooks: Arc<Webhooks>,
    /// The bytes of posted commands a session may have waiting.
    posted_bytes: usize,
}

impl Deliver for Sink {
    fn deliver(&self, publication: &Publication, traceparent: Option<&str>) {
        self.hub.deliver(publication, traceparent);
    }

    fn reset(&self, topic: &Topic, position: &Position) {
        self.hub.reset(topic, position);
    }

    fn resumed(&self, session: &str) {
        self.presence.resumed_elsewhere(session);
    }

    fn disconnect(&self, user: &str) {
        self.presence.revoked(user);
        let closed = self.live.disconnect(user);
        tracing::info!(closed, "a backend disconnected a user");
    }

    fn subscription(&self, user: &str, command: &ServerSubscription) {
        let (queued, refused) = self.live.subscription(user, command);
        let name = match command {
            ServerSubscription::Subscribe { .. } => "subscribe",
            ServerSubscription::Unsubscribe { .. } => "unsubscribe",
        };
        if refused > 0 {
            self.metrics
                .server_subscriptions_applied
                .with_label_values(&[name, "dropped"])
                .inc_by(refused as u64);
            tracing::warn!(
                refused,
                command = name,
                "server-side subscription commands dropped: connections had too many waiting"
            );
        }
        tracing::debug!(
            queued,
            command = name,
            "a backend's server-side subscription"
        );
    }

    fn presence(&self, topic: &Topic, change: &PresenceChange) {
        self.presence.change(topic, change);
    }

    fn forward(&self, forward: &Forward) {
        let user = forward.user.as_deref();
        let posted =
            self.live
                .forwarded(&forward.session, user, &forward.commands, self.posted_bytes);
        let result = match posted {
            // Another pod's session: every pod hears every forward.
            Post::NotHere => return,
            Post::Queued => "queued",
            Post::Full => "dropped",
            Post::OtherUser => "other_user",
        };
        self.metrics
            .stream_commands
            .forwarded
            .with_label_values(&[result])
            .inc();
        tracing::debug!(
            commands = forward.commands.len(),
            result,
            "commands posted on another pod for a session here"
        );
    }

    fn members(&self, topic: &Topic, joins: &[Member], leaves: &[Arc<str>]) {
        if self.webhooks.wants(WebhookType::Join) {
            for member in joins {
                self.webhooks.emit(WebhookEvent::Join {
                    topic: topic.clone(),
                    user: member.user.clone(),
                    info: member.info.clone(),
                });
            }
        }
        if self.webhooks.wants(WebhookType::Leave) {
            for user in leaves {
                self.webhooks.emit(WebhookEvent::Leave {
                    topic: topic.clone(),
                    user: user.clone(),
                });
            }
        }
    }

    fn occupancy(&self, topic: &Topic, occupied: bool) {
        let topic = topic.clone();
        self.webhooks.emit(if occupied {
            WebhookEvent::Occupied { topic }
        } else {
            WebhookEvent::Vacated { topic }
        });
    }
}

impl Node {
    /// Builds the pod's state and starts its broker. For Redis, only
    /// credentials that Redis refuses fail it: while Redis cannot be reached
    /// the pod runs, not ready ([`Node::not_ready`]), and keeps trying.
    pub async fn start(config: Config) -> Result<Arc<Self>, StartError> {
        let metrics = Arc::new(Metrics::new());
        let slots = Arc::new(Slots::new(&config.websocket, metrics.clone()));
        // What a replaying subscriber holds aside is bounded as its queue is.
        let hub = Arc::new(Hub::new(
            metrics.clone(),
            config.queue.frames,
            config.queue.bytes,
        ));
        let live = Arc::new(Registry::default());
        let namespaces = Arc::new(config.namespaces());
        let presence = Arc::new(Presence::new(
            &config,
            namespaces.clone(),
            hub.clone(),
            metrics.clone(),
        ));
        let pod_name = pod_name(std::env::vars());
        let webhooks = Webhooks::start(&config.webhooks, &pod_name, metrics.clone());
        let sink = Arc::new(Sink {
            hub: hub.clone(),
            live: live.clone(),
            metrics: metrics.clone(),
            presence: presence.clone(),
            webhooks: webhooks.clone(),
            posted_bytes: crate::session::max_posted_bytes(config.websocket.max_message_bytes),
        });
        let verifier = Verifier::new(&config.auth).await?;
        let (broker, sessions): (Arc<dyn Broker>, Arc<dyn SessionStore>) = match config.broker {
            BrokerKind::Memory => {
                let memory = MemoryBroker::new(namespaces.clone(), sink);
                (Arc::new(memory.clone()), Arc::new(memory))
            }
            BrokerKind::Redis => {
                let mut settings = config.redis.settings();
                settings.presence = PresenceSettings {
                    pod_ttl: config.presence.pod_ttl,
                    pod: pod_name.to_string(),
                    occupancy: config.webhooks.tracks_occupancy(),
                    members: config.webhooks.wants("presence.join")
                        || config.webhooks.wants("presence.leave"),
                };
                let redis =
                    RedisBroker::start(settings, namespaces.clone(), sink, metrics.clone()).await?;
                (Arc::new(redis.clone()), Arc::new(redis))
            }
        };
        presence.attach(&broker);
        let shared_sessions = config.broker != BrokerKind::Memory;
        let flush_soon = shared_sessions.then(|| Arc::new(Notify::new()));
        let api_requests = Semaphore::new(config.http.max_concurrent_requests);
        let api_keys = Arc::new(ApiKeys::new(&config.http));
        let drain = CancellationToken::new();
        let clock = Instant::now();
        let writing = Arc::new(Writing::new(&config, metrics.clone(), clock));
        let config = Arc::new(config);
        let tasks = TaskTracker::new();
        let pod = Arc::new(Pod {
            config: config.clone(),
            hub: hub.clone(),
            broker: broker.clone(),
            sessions: sessions.clone(),
            live: live.clone(),
            verifier,
            namespaces,
            replays: Replays::new(&config.replay, metrics.clone()),
            metrics: metrics.clone(),
            writing,
            flush_soon: flush_soon.clone(),
            budgets: Arc::new(Budgets::new(&config.session, metrics.clone())),
            presence: presence.clone(),
            hooks: Arc::new(Hooks::start(&config, pod_name.clone(), metrics.clone())?),
            webhooks,
        });
        let node = Arc::new(Self {
            config,
            hub,
            broker,
            sessions,
            live,
            metrics,
            drain,
            tasks,
            pod,
            slots,
            api_requests,
            api_keys,
            pod_name,
            presence,
        });
        if !node.config.http.api_keys_file.is_empty() {
            let path = node.config.http.api_keys_file.clone();
            tokio::spawn(reload::watch_keys_file(
                Arc::downgrade(&node.api_keys),
                path,
            ));
        }
        // A pod-local store loses sessions with the pod anyway; a shared one
        // gets what changed, in batches, so that a pod killed without warning
        // loses at most one interval of acks.
        if let Some(soon) = flush_soon {
            let interval = node.config.session.flush_interval;
            let job = |node: Arc<Node>| async move {
                let window = node.config.session.resume_window;
                node.live.flush(&*node.sessions, window).await;
                true
            };
            tokio::spawn(every(Arc::downgrade(&node), interval, Some(soon), job));
        }
        // Presence: this pod's changes to the broker, and the diffs to its
        // subscribers, once per interval.
        let interval = node.config.presence.diff_interval;
        tokio::spawn(every(
            Arc::downgrade(&node),
            interval,
            None,
            |node| async move {
                node.presence.tick().await;
                true
            },
        ));
        if node.config.rebalance.enabled {
            let pod = node.pod_name.clone();
            tracing::info!(%pod, "rebalancing with the other pods");
            let interval = node.config.rebalance.interval;
            tokio::spawn(every(Arc::downgrade(&node), interval, None, move |node| {
                let pod = pod.clone();
                async move {
                    if node.is_draining() {
                        return false;
                    }
                    let connections = node.slots.taken();
                    let (broker, metrics) = (&*node.broker, &node.metrics);
                    let config = &node.config.rebalance;
                    rebalance::round(&pod, connections, broker, &node.live, metrics, config).await;
                    true
                }
            }));
        }
        Ok(node)
    }

    pub fn is_draining(&self) -> bool {
        self.drain.is_cancelled()
    }

    /// Why the pod cannot serve clients yet (its broker has not reached
    /// Redis since the start); `None`: it can.
    pub fn not_ready(&self) -> Option<String> {
        self.broker.status().not_ready
    }

    /// One of the pod's API request slots (HTTP and gRPC share them), held
    /// for the request; `None`, counted as `busy`, when all are taken.
    pub fn api_slot(&self) -> Option<SemaphorePermit<'_>> {
        let slot = self.api_requests.try_acquire().ok();
        if slot.is_none() {
            self.metrics
                .http_rejected
                .with_label_values(&["busy"])
                .inc();
        }
        slot
    }
}

/// The variables that name the pod: `HERALD_POD_NAME`, or `POD_NAME` (the
/// chart sets it from the downward API's `metadata.name`).
pub const POD_NAME_VARS: [&str; 2] = ["HERALD_POD_NAME", "POD_NAME"];

/// The pod's name: the first of [`POD_NAME_VARS`] set in `env`, else the host
/// name and a random suffix (two processes may share a host). It names the
/// pod in Redis's load table (`<prefix>:pods`) and in the admin status, so
/// that an operator can tell which pod is which.
pub fn pod_name(env: impl IntoIterator<Item = (String, String)>) -> Arc<str> {
    let env: Vec<(String, String)> = env.into_iter().collect();
    for var in POD_NAME_VARS {
        if let Some((_, name)) = env.iter().find(|(k, v)| k == var && !v.trim().is_empty()) {
            return Arc::from(name.trim());
        }
    }
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|h| h.trim().to_owned())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "herald".to_owned());
    Arc::from(format!("{host}-{:08x}", rand::random::<u32>()))
}

/// Calls `job` every `interval`, and whenever `soon` is notified, until the
/// node is gone or `job` says to stop. Holds the node only while `job` runs:
/// a dropped node ends it.
async fn every<F, Fut>(node: Weak<Node>, interval: Duration, soon: Option<Arc<Notify>>, job: F)
where
    F: Fn(Arc<Node>) -> Fut,
    Fut: Future<Output = bool>,
{
    let mut tick = tokio::time::interval(interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        match &soon {
            Some(soon) => {
                tokio::select! {
                    _ = tick.tick() => {}
                    () = soon.notified() => tick.reset(),
                }
            }
            None => {
                tick.tick().await;
            }
        }
        let Some(node) = node.upgrade() else {
            return;
        };
        if !job(node).await {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(vars: &[(&str, &str)]) -> Vec<(String, String)> {
        vars.iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn a_pod_is_named_as_kubernetes_names_it_else_by_its_host() {
        let both = env(&[
            ("POD_NAME", "herald-7d9f-x2k4p"),
            ("HERALD_POD_NAME", "mine"),
        ]);
        assert_eq!(&*pod_name(both), "mine");
        let downward = env(&[("POD_NAME", "herald-7d9f-x2k4p")]);
        assert_eq!(&*pod_name(downward), "herald-7d9f-x2k4p");
        // Outside Kubernetes: the host and a suffix, so that two processes
        // on one host differ.
        let (a, b) = (pod_name(env(&[("POD_NAME", " ")])), pod_name(env(&[])));
        assert_ne!(a, b);
        assert_eq!(
            a.as_bytes().get(a.len().saturating_sub(9)),
            Some(&b'-'),
            "{a}"
        );
    }

    #[tokio::test]
    async fn a_redis_setting_that_went_bad_after_the_check_fails_the_start_as_configuration() {
        let pki = testkit::pki::Pki::new();
        let ca = pki.dir().join("ca-copy.pem");
        std::fs::copy(pki.ca(), &ca).expect("copy the CA");
        let config = Config::load(
            None,
            env(&[
                ("HERALD_BROKER", "redis"),
                ("HERALD_REDIS__URL", "rediss://127.0.0.1:1"),
                ("HERALD_REDIS__TLS_CA", &ca.to_string_lossy()),
            ]),
        )
        .expect("a valid configuration");
        // Gone between the check and the start: a configuration error still.
        std::fs::remove_file(&ca).expect("remove the CA");
        match Node::start(config).await {
            Err(e) => assert!(e.is_config(), "{}", router::Causes(&e)),
            Ok(_) => panic!("started without its CA"),
        }
    }
}
