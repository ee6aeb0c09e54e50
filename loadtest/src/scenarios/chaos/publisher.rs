//! `chaos`'s publishers: backends posting to a random pod, on a random
//! topic, at a steady pace whatever Redis is doing (each publish a task of
//! its own, so a frozen Redis does not slow the schedule). Each publish
//! carries an id of its own in its data (`{"i": <id>, ...}`), and every
//! attempt is kept with its answer: `(topic, epoch, seq)` when the pod said
//! 200, the error otherwise.

use std::sync::Arc;
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio::task::JoinSet;
use tokio::time::{Instant, MissedTickBehavior};

use super::Clock;
use crate::publish::{Pool, body};

/// Publishes waiting for an answer at once, per publisher; the schedule
/// waits beyond.
const MAX_IN_FLIGHT: usize = 2_000;

/// One publish and what came of it; times in ms from the run's start.
#[derive(Debug, Clone)]
pub struct Attempt {
    pub id: u64,
    pub topic: usize,
    pub sent: u32,
    /// What a 200 said, and when it came.
    pub answer: Result<Answer, String>,
}

#[derive(Debug, Clone)]
pub struct Answer {
    pub epoch: Arc<str>,
    pub seq: u64,
    pub at: u32,
}

/// The id of publisher `publisher`'s `n`-th publish: unique in the run.
pub fn publish_id(publisher: usize, n: u64) -> u64 {
    ((publisher as u64 + 1) << 40) | n
}

/// The data of publish `id`, padded with `x` to about `size` bytes.
pub fn data(id: u64, size: usize) -> String {
    let head = format!(r#"{{"i":{id}"#);
    let pad = size.saturating_sub(head.len() + 10);
    if pad == 0 {
        format!("{head}}}")
    } else {
        format!(r#"{head},"pad":"{}"}}"#, "x".repeat(pad))
    }
}

pub struct Publisher {
    pub index: usize,
    /// One pool per pod.
    pub pools: Vec<Arc<Pool>>,
    pub topics: Arc<[String]>,
    /// Publishes per second.
    pub rate: f64,
    pub size: usize,
    /// Picks topics and pods.
    pub seed: u64,
}

impl Publisher {
    /// Publishes until `until`, then waits for every answer (each bounded
    /// by the publish timeout); every attempt.
    pub async fn run(self, until: Instant, clock: Clock) -> Vec<Attempt> {
        let mut rng = StdRng::seed_from_u64(self.seed);
        let mut ticks = tokio::time::interval(Duration::from_secs_f64(1.0 / self.rate));
        ticks.set_missed_tick_behavior(MissedTickBehavior::Delay);
        let mut sends = JoinSet::new();
        let mut attempts = Vec::new();
        let mut n = 0u64;
        loop {
            ticks.tick().await;
            if Instant::now() >= until {
                break;
            }
            while let Some(done) = sends.try_join_next() {
                note(&mut attempts, done);
            }
            if sends.len() >= MAX_IN_FLIGHT
                && let Some(done) = sends.join_next().await
            {
                note(&mut attempts, done);
            }
            n += 1;
            let id = publish_id(self.index, n);
            let topic = rng.gen_range(0..self.topics.len());
            let pool = self.pools[rng.gen_range(0..self.pools.len())].clone();
            let body = body(&self.topics[topic], &data(id, self.size));
            let clock = clock.clone();
            sends.spawn(async move {
                let sent = clock.ms32();
                let answer = match pool.publish_with(|| body).await {
                    Ok(published) => Ok(Answer {
                        epoch: Arc::from(published.epoch.as_str()),
                        seq: published.seq,
                        at: clock.ms32(),
                    }),
                    Err(e) => Err(e.to_string()),
                };
                Attempt {
                    id,
                    topic,
                    sent,
                    answer,
                }
            });
        }
        while let Some(done) = sends.join_next().await {
            note(&mut attempts, done);
        }
        attempts
    }
}

fn note(attempts: &mut Vec<Attempt>, done: Result<Attempt, tokio::task::JoinError>) {
    match done {
        Ok(attempt) => attempts.push(attempt),
        Err(e) => std::panic::resume_unwind(e.into_panic()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn data_carries_the_id_and_is_padded() {
        assert_eq!(data(7, 0), r#"{"i":7}"#);
        let padded = data(publish_id(1, 3), 100);
        let value: serde_json::Value = serde_json::from_str(&padded).expect("json");
        assert_eq!(value["i"], (2u64 << 40) | 3);
        assert!((95..=105).contains(&padded.len()), "{}", padded.len());
        assert_ne!(publish_id(0, 1), publish_id(1, 1));
    }
}
