//! What this pod knows of the Redis dataset's history: the highest lineage
//! clock it has seen (every script carries it, so that Redis can tell that
//! it went back in time) and the lineage id, whose change is logged and
//! counted.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use crate::observe::Observer;

pub struct Lineage {
    clock: AtomicU64,
    id: Mutex<Option<Arc<str>>>,
    observer: Arc<dyn Observer>,
}

impl Lineage {
    pub fn new(observer: Arc<dyn Observer>) -> Self {
        Self {
            clock: AtomicU64::new(0),
            id: Mutex::new(None),
            observer,
        }
    }

    /// The highest clock seen: the argument every script gets.
    pub fn known(&self) -> u64 {
        self.clock.load(Ordering::Acquire)
    }

    /// Records a clock Redis issued (an announcement's).
    pub fn saw_clock(&self, clock: u64) {
        self.clock.fetch_max(clock, Ordering::AcqRel);
    }

    /// Records a script's answer: the lineage and its clock.
    pub fn saw(&self, id: &str, clock: u64) {
        self.saw_clock(clock);
        let mut current = self.id.lock().unwrap_or_else(|e| e.into_inner());
        match current.as_deref() {
            Some(known) if known == id => {}
            Some(_) => {
                tracing::warn!(
                    lineage = id,
                    clock,
                    "redis went back in time (or lost its data): topics written before start new epochs"
                );
                self.observer.redis_rewound();
                *current = Some(Arc::from(id));
            }
            None => *current = Some(Arc::from(id)),
        }
    }
}

/// A fresh random lineage id: 64 bits, hex.
pub fn fresh() -> String {
    format!("{:016x}", rand::random::<u64>())
}
