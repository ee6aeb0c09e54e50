//! What this pod knows of the Redis dataset's history: the highest lineage
//! clock it has seen (every script carries it, so that Redis can tell that
//! it went back in time) and the lineage id, whose change is logged and
//! counted.
//!
//! One Redis has one lineage. A cluster has one per hash slot (its key is
//! tagged into the slot, [`super::scripts::Keys::lineage`]), so that each
//! lineage moves with its slot's keys, and a script's keys share a slot.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use super::slots::SLOTS;
use crate::observe::Observer;

pub struct Lineage {
    /// One per line: one, or one per slot.
    clocks: Box<[AtomicU64]>,
    ids: Mutex<Vec<Option<Arc<str>>>>,
    observer: Arc<dyn Observer>,
}

impl Lineage {
    /// One lineage, or (`per_slot`) one per slot of a cluster.
    pub fn new(observer: Arc<dyn Observer>, per_slot: bool) -> Self {
        let lines = if per_slot { SLOTS } else { 1 };
        Self {
            clocks: (0..lines).map(|_| AtomicU64::new(0)).collect(),
            ids: Mutex::new(vec![None; lines]),
            observer,
        }
    }

    /// The line of `slot` (its own, or the one).
    fn line(&self, slot: u16) -> usize {
        usize::from(slot) % self.clocks.len()
    }

    /// The highest clock seen on `slot`'s line: the argument every script
    /// gets.
    pub fn known(&self, slot: u16) -> u64 {
        self.clocks[self.line(slot)].load(Ordering::Acquire)
    }

    /// The highest clock seen on any line.
    pub fn highest(&self) -> u64 {
        self.clocks
            .iter()
            .map(|c| c.load(Ordering::Acquire))
            .max()
            .unwrap_or(0)
    }

    /// Records a clock Redis issued (an announcement's).
    pub fn saw_clock(&self, slot: u16, clock: u64) {
        self.clocks[self.line(slot)].fetch_max(clock, Ordering::AcqRel);
    }

    /// Records a script's answer: the lineage and its clock.
    pub fn saw(&self, slot: u16, id: &str, clock: u64) {
        self.saw_clock(slot, clock);
        let line = self.line(slot);
        let mut ids = self.ids.lock().unwrap_or_else(|e| e.into_inner());
        let Some(current) = ids.get_mut(line) else {
            return;
        };
        match current.as_deref() {
            Some(known) if known == id => {}
            Some(_) => {
                tracing::warn!(
                    lineage = id,
                    clock,
                    slot = (self.clocks.len() > 1).then_some(slot),
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
