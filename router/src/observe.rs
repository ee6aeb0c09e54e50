//! What an engine reports about itself: the gateway turns these calls into
//! metrics. Every method has a default that ignores the event.

/// Events of the broker's own life.
pub trait Observer: Send + Sync + 'static {
    /// A Redis command finished (`op` is a fixed name: `publish`, `recover`, ...).
    fn redis_call(&self, _op: &'static str, _seconds: f64, _ok: bool) {}
    /// The pub/sub connection came up (`true`) or went down (`false`).
    fn pubsub_up(&self, _up: bool) {}
    /// Time from a publish to its arrival at this pod.
    fn pubsub_lag(&self, _seconds: f64) {}
    /// Publications delivered from history because live delivery skipped them.
    fn gap_filled(&self, _count: u64) {}
    /// A topic lost continuity on this pod; its subscribers were told.
    fn topic_reset(&self) {}
    /// Redis went back in time: a new lineage began (every topic written
    /// before it moves to a new epoch when next touched).
    fn redis_rewound(&self) {}
    /// Announcements held aside while a topic's history is read, on this
    /// pod: what waits for Redis.
    fn pubsub_backlog(&self, _held: usize) {}
    /// This pod removed a dead pod instance's presence from one topic
    /// (Redis): `members` users were in its part there.
    fn presence_cleaned(&self, _members: u64) {}
    /// A dead pod instance's presence is gone from every topic, removed by
    /// this pod.
    fn presence_pod_cleaned(&self) {}
    /// A presence replica skipped changes (a gap, a lost link) and re-read
    /// the room.
    fn presence_resync(&self) {}
}

/// An observer that ignores everything.
#[derive(Debug, Default)]
pub struct Ignore;

impl Observer for Ignore {}
