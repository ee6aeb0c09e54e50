//! The messages that flow through the room while members come and go: a
//! paced publisher posting stamped payloads to a pod that is up (the next
//! one after a failure), paused for the quiet window.

use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use tokio::task::JoinHandle;
use tokio::time::MissedTickBehavior;

use super::member::Room;
use crate::latency::Stamp;
use crate::publish::{self, Connection};

/// The publisher's figures, and its switches.
#[derive(Default)]
pub struct Flow {
    pub paused: AtomicBool,
    pub stopped: AtomicBool,
    pub published: AtomicU64,
    pub errors: AtomicU64,
    pub last_error: Mutex<Option<String>>,
}

/// Starts publishing `rate` messages per second of `size` bytes to the room.
pub fn start(room: Arc<Room>, rate: f64, size: usize) -> (Arc<Flow>, JoinHandle<()>) {
    let flow = Arc::new(Flow::default());
    let state = Arc::clone(&flow);
    let task = tokio::spawn(async move {
        let mut every = tokio::time::interval(Duration::from_secs_f64(1.0 / rate.max(0.01)));
        every.set_missed_tick_behavior(MissedTickBehavior::Delay);
        let mut connections: Vec<Option<Connection>> = room.pods.iter().map(|_| None).collect();
        let mut pod = 0;
        let mut index = 0;
        while !state.stopped.load(Ordering::Relaxed) {
            every.tick().await;
            if state.paused.load(Ordering::Relaxed) {
                continue;
            }
            // The next pod that is up, from the one that last worked.
            let Some(next) = (0..room.pods.len())
                .map(|k| (pod + k) % room.pods.len())
                .find(|&p| room.up[p].load(Ordering::Relaxed))
            else {
                continue;
            };
            pod = next;
            let body = publish::body(&room.topic, &Stamp::now(index).encode(size));
            index += 1;
            let result = match connections[pod].take() {
                Some(mut c) => c.publish(body).await.map(|_| c),
                None => match Connection::open(room.pods[pod].addr).await {
                    Ok(mut c) => c.publish(body).await.map(|_| c),
                    Err(e) => Err(e),
                },
            };
            match result {
                Ok(c) => {
                    connections[pod] = Some(c);
                    state.published.fetch_add(1, Ordering::Relaxed);
                }
                Err(e) => {
                    state.errors.fetch_add(1, Ordering::Relaxed);
                    *state.last_error.lock().unwrap_or_else(|p| p.into_inner()) =
                        Some(e.to_string());
                    pod = (pod + 1) % room.pods.len();
                }
            }
        }
    });
    (flow, task)
}
