//! The processes `presence` runs: one `redis-server` and the herald pods
//! sharing it, each pod a real process of the binary under test, so that
//! the scenario can drain one (SIGTERM), start it again on its ports, and
//! kill one with SIGKILL. Everything stops when the [`Cluster`] drops.

use std::path::PathBuf;
use std::time::Duration;

use rig::{Herald, Redis, Spec};

use super::Options;
use crate::{Error, Target};

/// Longest a drained pod may take to exit: its drain timeout (10 s by
/// default) and a margin.
const EXIT_WAIT: Duration = Duration::from_secs(30);

/// The namespace of the room's topic, configured with presence on (or off,
/// for the run that compares message latency without it).
pub const NAMESPACE: &str = "room";

/// One Redis and the pods that share it.
pub struct Cluster {
    // Dropped in this order: the pods before their Redis.
    pub pods: Vec<Herald>,
    pub redis: Redis,
}

impl Cluster {
    /// Starts Redis, then `options.pods` pods verifying tokens with
    /// `secret`, the room's namespace set as `options` says.
    pub async fn start(options: &Options, secret: &str) -> Result<Self, Error> {
        let redis = match &options.dir {
            Some(dir) => Redis::start_in(dir.join("redis"), None, &[]).await?,
            None => Redis::start().await?,
        };
        let mut env = crate::bench::servers::pod_env(&options.herald).await;
        let ns = format!("HERALD_NAMESPACES__{}", NAMESPACE.to_ascii_uppercase());
        env.extend([
            ("HERALD_BROKER".to_owned(), "redis".to_owned()),
            ("HERALD_REDIS__URL".to_owned(), redis.url()),
            // Thousands of subs at once on a busy machine.
            ("HERALD_REDIS__COMMAND_TIMEOUT".to_owned(), "5s".to_owned()),
            ("HERALD_AUTH__HMAC_SECRET".to_owned(), secret.to_owned()),
        ]);
        if options.presence {
            env.push((format!("{ns}__PRESENCE"), "true".to_owned()));
            env.push((format!("{ns}__JOIN_LEAVE"), "true".to_owned()));
        } else {
            // The namespace as it is by default, in words a build without
            // presence knows too.
            env.push((format!("{ns}__SUBSCRIBE"), "authenticated".to_owned()));
        }
        env.extend(options.env.iter().cloned());
        let mut pods = Vec::with_capacity(options.pods);
        for n in 0..options.pods {
            let mut spec = Spec::new(&options.herald).envs(env.iter().cloned());
            if let Some(dir) = &options.dir {
                spec = spec.log(log_path(dir, n));
            }
            let pod = Herald::start(spec).await?;
            println!(
                "presence: pod {n} on {} (pid {})",
                pod.addr,
                pod.pid().map_or_else(|| "?".to_owned(), |p| p.to_string())
            );
            pods.push(pod);
        }
        Ok(Self { pods, redis })
    }

    /// The pods as the members' targets.
    pub fn targets(&self) -> Result<Vec<Target>, Error> {
        self.pods.iter().map(|p| Target::at(p.addr)).collect()
    }

    /// Drains pod `n` (SIGTERM: it tells its clients to `reconnect` and
    /// exits), then starts it again on its ports; how long the drain took.
    pub async fn restart(&mut self, n: usize) -> Result<f64, Error> {
        let pod = self
            .pods
            .get_mut(n)
            .ok_or_else(|| Error::Options(format!("no pod {n}")))?;
        let started = tokio::time::Instant::now();
        pod.signal("-TERM")?;
        let exited = pod.wait_exit(EXIT_WAIT).await;
        let drained = started.elapsed().as_secs_f64();
        if exited.is_none() {
            eprintln!("presence: pod {n} still running {drained:.1} s after SIGTERM: killed");
        }
        // Kills it if it still runs, and starts it on the same ports.
        pod.restart().await?;
        Ok(drained)
    }

    /// SIGKILL of pod `n`: no drain, no goodbye to Redis.
    pub fn kill(&mut self, n: usize) {
        if let Some(pod) = self.pods.get_mut(n) {
            pod.kill9();
        }
    }
}

fn log_path(dir: &std::path::Path, n: usize) -> PathBuf {
    dir.join(format!("pod-{}.log", n + 1))
}
