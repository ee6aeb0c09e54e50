//! Occupancy across pods: which topics have a subscriber on some pod, and
//! exactly one `occupied`/`vacated` per transition ([`Deliver::occupancy`]).
//!
//! Tracked only when asked ([`crate::PresenceSettings::occupancy`]: webhooks
//! want the events); otherwise nothing here writes to Redis.
//!
//! Keys (the first in the topic's hash slot, so it works on a Cluster):
//! - `<prefix>:occupancy:{<topic>}`: `SET` of the instances with a local
//!   subscriber of the topic;
//! - `<prefix>:occupancy:pod:<instance>`: `SET` of the topics the instance
//!   is in (added before, removed after the topic's set), for the cleanup of
//!   a dead instance.
//!
//! This pod's count of local watches of a topic going 0→1 adds its
//! instance ([`OCCUPY`]: 1 when the set was empty: the topic became
//! occupied), 1→0 removes it ([`VACATE`]: 1 when it emptied the set). Each
//! script is atomic, so exactly one caller sees each transition, and that
//! pod tells its sink. A dead pod's instance is removed by the pod that
//! cleans up after it ([`Occupancy::clean`], from presence's liveness
//! cleanup), which tells its own sink of the `vacated` it caused.
//!
//! The writes leave from one task per pod, topic by topic, comparing what
//! this pod wants (a local watch or not) with what it wrote: a topic
//! watched and unwatched before its write left writes nothing (no event
//! for a transition nobody else could see), and a write that failed is
//! tried again a second later. A write whose reply was lost but that Redis
//! applied is seen as no transition when retried: that event is lost (the
//! one case where occupancy events are at most once).

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::{Arc, LazyLock, Mutex, MutexGuard, Weak};
use std::time::Duration;

use redis::{Script, Value};
use tokio::sync::Notify;

use super::call::{timed, unreadable};
use super::shards::Shards;
use crate::observe::Observer;
use crate::{BrokerError, Causes, Deliver, Topic};

/// How long a failed write waits before the next try.
const RETRY: Duration = Duration::from_secs(1);

/// Adds an instance to a topic's set: 1 when the set was empty before.
///
/// KEYS: the topic's set. ARGV: instance.
pub static OCCUPY: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r#"
if redis.call('SADD', KEYS[1], ARGV[1]) == 1 and redis.call('SCARD', KEYS[1]) == 1 then
  return 1
end
return 0
"#,
    )
});

/// Removes an instance from a topic's set: 1 when that emptied it.
///
/// KEYS: the topic's set. ARGV: instance.
pub static VACATE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r#"
if redis.call('SREM', KEYS[1], ARGV[1]) == 1 and redis.call('EXISTS', KEYS[1]) == 0 then
  return 1
end
return 0
"#,
    )
});

/// This pod's occupancy: its local watch counts and what it wrote.
pub struct Occupancy {
    shards: Shards,
    prefix: Arc<str>,
    instance: Arc<str>,
    sink: Arc<dyn Deliver>,
    observer: Arc<dyn Observer>,
    state: Mutex<State>,
    wake: Notify,
}

#[derive(Default)]
struct State {
    /// Local watches per topic (only topics with some).
    local: HashMap<Topic, u64>,
    /// Topics this instance is in Redis's set of.
    written: HashSet<Topic>,
    /// Topics whose wanted and written state may differ, each once.
    dirty: VecDeque<Topic>,
    queued: HashSet<Topic>,
}

impl State {
    fn mark(&mut self, topic: &Topic) {
        if self.queued.insert(topic.clone()) {
            self.dirty.push_back(topic.clone());
        }
    }
}

impl Occupancy {
    /// Starts the writer task (it ends when the occupancy is dropped).
    pub fn start(
        shards: Shards,
        prefix: &str,
        instance: Arc<str>,
        sink: Arc<dyn Deliver>,
        observer: Arc<dyn Observer>,
    ) -> Arc<Self> {
        let occupancy = Arc::new(Self {
            shards,
            prefix: Arc::from(prefix),
            instance,
            sink,
            observer,
            state: Mutex::new(State::default()),
            wake: Notify::new(),
        });
        tokio::spawn(run(Arc::downgrade(&occupancy)));
        occupancy
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn topic_key(&self, topic: &Topic) -> String {
        format!("{}:occupancy:{{{topic}}}", self.prefix)
    }

    fn pod_key(&self, instance: &str) -> String {
        format!("{}:occupancy:pod:{instance}", self.prefix)
    }

    /// A local watch of `topic` began.
    pub fn watched(&self, topic: &Topic) {
        let mut state = self.state();
        let count = state.local.entry(topic.clone()).or_insert(0);
        *count += 1;
        if *count == 1 {
            state.mark(topic);
            drop(state);
            self.wake.notify_one();
        }
    }

    /// A local watch of `topic` ended.
    pub fn unwatched(&self, topic: &Topic) {
        let mut state = self.state();
        let Some(count) = state.local.get_mut(topic) else {
            return;
        };
        *count -= 1;
        if *count == 0 {
            state.local.remove(topic);
            state.mark(topic);
            drop(state);
            self.wake.notify_one();
        }
    }

    /// Redis lost this instance's sets, or a cleaner took this pod for dead
    /// (and told of the `vacated`s): every watched topic is written again
    /// (and is `occupied` again where it was the only one).
    pub fn rewrite(&self) {
        let mut state = self.state();
        state.written.clear();
        let topics: Vec<Topic> = state.local.keys().cloned().collect();
        for topic in &topics {
            state.mark(topic);
        }
        drop(state);
        self.wake.notify_one();
    }

    /// Brings one topic's set in line with this pod's watch of it; the
    /// transition it caused, if any, goes to the sink.
    async fn settle(&self, topic: &Topic) -> Result<(), BrokerError> {
        let (wanted, written) = {
            let state = self.state();
            (
                state.local.contains_key(topic),
                state.written.contains(topic),
            )
        };
        if wanted == written {
            return Ok(());
        }
        let listing = self.pod_key(&self.instance);
        if wanted {
            let add = redis::cmd("SADD").arg(&listing).arg(topic.as_str()).clone();
            timed(
                &*self.observer,
                "occupancy",
                self.shards.command::<Value>(&listing, &add),
            )
            .await?;
        }
        let changed = self.transition(topic, &self.instance, wanted).await?;
        if !wanted {
            let remove = redis::cmd("SREM").arg(&listing).arg(topic.as_str()).clone();
            timed(
                &*self.observer,
                "occupancy",
                self.shards.command::<Value>(&listing, &remove),
            )
            .await?;
        }
        {
            let mut state = self.state();
            if wanted {
                state.written.insert(topic.clone());
            } else {
                state.written.remove(topic);
            }
        }
        if changed {
            self.sink.occupancy(topic, wanted);
        }
        Ok(())
    }

    /// [`OCCUPY`] or [`VACATE`] for `instance`: whether it made the
    /// transition.
    async fn transition(
        &self,
        topic: &Topic,
        instance: &str,
        occupy: bool,
    ) -> Result<bool, BrokerError> {
        let key = self.topic_key(topic);
        let script = if occupy { &*OCCUPY } else { &*VACATE };
        let mut invocation = script.prepare_invoke();
        invocation.key(&key).arg(instance);
        let reply = timed(
            &*self.observer,
            "occupancy",
            self.shards.script::<Value>(&key, script, &invocation),
        )
        .await?;
        match reply {
            Value::Int(n) => Ok(n == 1),
            _ => Err(unreadable("occupancy")),
        }
    }

    /// Removes a dead instance from every topic it was in; tells the sink
    /// of each `vacated` that caused. Idempotent: a cleaner stopped midway
    /// leaves the rest to the next. How many topics it was in.
    pub async fn clean(&self, dead: &str) -> Result<usize, BrokerError> {
        let listing = self.pod_key(dead);
        let list = redis::cmd("SMEMBERS").arg(&listing).clone();
        let topics = match timed(
            &*self.observer,
            "occupancy_clean",
            self.shards.command::<Value>(&listing, &list),
        )
        .await?
        {
            Value::Array(topics) | Value::Set(topics) => topics,
            _ => return Err(unreadable("occupancy topic set")),
        };
        let mut cleaned = 0;
        for name in topics {
            let Value::BulkString(name) = name else {
                continue;
            };
            if let Ok(topic) = Topic::parse(&String::from_utf8_lossy(&name)) {
                if self.transition(&topic, dead, false).await? {
                    self.sink.occupancy(&topic, false);
                }
                cleaned += 1;
            }
            let remove = redis::cmd("SREM").arg(&listing).arg(&name).clone();
            timed(
                &*self.observer,
                "occupancy_clean",
                self.shards.command::<Value>(&listing, &remove),
            )
            .await?;
        }
        Ok(cleaned)
    }
}

/// The writer: settles dirty topics in the order they became so.
async fn run(occupancy: Weak<Occupancy>) {
    loop {
        let Some(this) = occupancy.upgrade() else {
            return;
        };
        let next = {
            let mut state = this.state();
            let next = state.dirty.pop_front();
            if let Some(topic) = &next {
                state.queued.remove(topic);
            }
            next
        };
        let Some(topic) = next else {
            // Holding only a weak reference while idle, so a dropped
            // engine ends the task at its next wake.
            let wake = async {
                this.wake.notified().await;
            };
            let weak_wait = tokio::time::timeout(Duration::from_secs(5), wake);
            let _ = weak_wait.await;
            drop(this);
            continue;
        };
        if let Err(e) = this.settle(&topic).await {
            tracing::warn!(%topic, error = %Causes(&e), "occupancy: writing this pod's part failed; trying again");
            this.state().mark(&topic);
            drop(this);
            tokio::time::sleep(RETRY).await;
        }
    }
}
