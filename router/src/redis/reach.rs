//! Whether the pod has reached Redis since it started, and if not, why: a
//! pod starts while Redis is away, says so on `/readyz`, and refuses work at
//! once (rather than each request waiting for a connection attempt) until
//! its pub/sub connection first comes up.

use std::sync::Arc;

use tokio::sync::watch;

use crate::{BrokerError, Unavailable};

/// Shared by the broker (which asks) and the pub/sub task (which tells).
pub struct Reach {
    /// Where Redis is, for messages.
    target: String,
    state: watch::Sender<State>,
}

#[derive(Debug, Clone, Default)]
struct State {
    /// Connection attempts of the pub/sub task so far.
    attempts: u64,
    /// Up at least once since the start: the pod can serve.
    reached: bool,
    /// Up now.
    connected: bool,
    /// Why the last attempt failed.
    error: Option<String>,
}

impl Reach {
    pub fn new(target: String) -> Arc<Self> {
        Arc::new(Self {
            target,
            state: watch::Sender::new(State::default()),
        })
    }

    /// The pub/sub connection is up (subscribed).
    pub fn up(&self) {
        self.state.send_modify(|s| {
            s.attempts += 1;
            s.reached = true;
            s.connected = true;
            s.error = None;
        });
    }

    /// An attempt failed, or the connection was lost.
    pub fn down(&self, error: &str) {
        self.state.send_modify(|s| {
            s.attempts += 1;
            s.connected = false;
            s.error = Some(error.to_owned());
        });
    }

    pub fn connected(&self) -> bool {
        self.state.borrow().connected
    }

    /// `None` once Redis was reached; before, why not, as `/readyz` shows it.
    pub fn not_ready(&self) -> Option<String> {
        let state = self.state.borrow();
        if state.reached {
            return None;
        }
        Some(match &state.error {
            Some(error) => format!("redis: connecting to {}: {error}", self.target),
            None => format!("redis: connecting to {}", self.target),
        })
    }

    /// Fails at once while Redis was never reached.
    pub fn check(&self) -> Result<(), BrokerError> {
        match self.not_ready() {
            None => Ok(()),
            Some(why) => Err(BrokerError::Unavailable(Unavailable::NotReached(why))),
        }
    }

    /// Waits for the pub/sub task's first attempt to end, either way.
    pub async fn first_attempt(&self) {
        let mut state = self.state.subscribe();
        let _ = state.wait_for(|s| s.attempts > 0).await;
    }
}
