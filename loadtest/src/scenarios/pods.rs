//! `pods`: N clients spread over one or more gateways, all subscribed to one
//! topic; a publisher posts to one gateway at a steady rate. Every
//! (message, client) pair is a latency sample, and every pair must arrive
//! exactly once. Run it with the clients on the publisher's pod and then on
//! another pod: the difference is what crossing pods (through Redis) costs.
//!
//! It is [`fanout`] over several gateways, with the schedule given as a rate
//! and a duration: each message is a round. The first [`DEFAULT_WARMUP`]
//! messages are checked for loss like the others but left out of the
//! latency figures (first connections, Redis scripts loading).

use std::ops::Deref;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::MAX_DURATION;
use super::fanout::{self, Fanout};
use crate::report::{Outcome, Row};
use crate::{Error, Target};

/// Clients, over all gateways.
pub const DEFAULT_CLIENTS: usize = 1000;
/// Messages per second.
pub const DEFAULT_RATE: f64 = 100.0;
/// How long the publisher publishes (after the warm-up).
pub const DEFAULT_DURATION: Duration = Duration::from_secs(10);
/// Messages before the measured ones.
pub const DEFAULT_WARMUP: usize = 10;
/// Highest rate.
pub const MAX_RATE: f64 = 100_000.0;

#[derive(Debug, Clone)]
pub struct Options {
    /// The gateways, publisher, clients, payload, warm-up messages, drain,
    /// topic and watched processes. Its schedule (`topics`, `rounds`,
    /// `interval`) and `floor` are not read: one topic, and the rounds
    /// follow from `rate` and `duration`.
    pub fanout: fanout::Options,
    /// Messages per second.
    pub rate: f64,
    pub duration: Duration,
}

impl Options {
    /// The defaults, against one gateway that also takes the publishes.
    pub fn new(gateway: Target) -> Self {
        Self {
            fanout: fanout::Options {
                clients: DEFAULT_CLIENTS,
                warmup: DEFAULT_WARMUP,
                ..fanout::Options::new(gateway)
            },
            rate: DEFAULT_RATE,
            duration: DEFAULT_DURATION,
        }
    }

    /// Messages measured: `rate × duration`, at least one.
    pub fn measured(&self) -> usize {
        ((self.rate * self.duration.as_secs_f64()).round() as usize).max(1)
    }

    /// The same run as a fan-out: one round per message, one topic.
    pub fn fanout(&self) -> Result<fanout::Options, Error> {
        if !(self.rate > 0.0 && self.rate <= MAX_RATE) {
            return Err(Error::Options(format!(
                "--rate must be over 0 and at most {MAX_RATE}"
            )));
        }
        if self.duration.is_zero() || self.duration > MAX_DURATION {
            return Err(Error::Options(format!(
                "--duration must be over 0s and at most {}s",
                MAX_DURATION.as_secs()
            )));
        }
        Ok(fanout::Options {
            topics: 1,
            rounds: self.measured(),
            interval: Duration::from_secs_f64(1.0 / self.rate),
            floor: None,
            ..self.fanout.clone()
        })
    }
}

/// The result of a `pods` run: a fan-out's.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Pods(pub Fanout);

impl Deref for Pods {
    type Target = Fanout;

    fn deref(&self) -> &Fanout {
        &self.0
    }
}

/// Runs the scenario (see [`fanout::run`]).
pub async fn run(options: Options) -> Result<Pods, Error> {
    fanout::run(options.fanout()?).await.map(Pods)
}

impl Outcome for Pods {
    const SCENARIO: &'static str = "pods";

    fn rows(&self) -> Vec<Row> {
        self.0.rows()
    }

    fn failures(&self) -> Vec<String> {
        self.0.failures()
    }
}
