//! `herald-loadtest run`: one run of scripts/bench.sh, the servers it
//! starts and the scenario after `--`.

use std::path::PathBuf;

use clap::Args;

use super::values::number;
use crate::bench;

#[derive(Debug, Args)]
pub struct RunArgs {
    /// The run's name: its result DIR/NAME.json, its first pod's log
    /// NAME.log (the others NAME-2.log, ...).
    pub name: String,
    /// Where results and logs go (scripts/bench.sh's $OUT).
    #[arg(long, value_name = "DIR", default_value = "target/bench")]
    pub dir: PathBuf,
    /// The herald binary the pods run.
    #[arg(long, value_name = "PATH")]
    pub herald: PathBuf,
    /// An older herald binary: the run again against it.
    #[arg(long, value_name = "PATH")]
    pub before: Option<PathBuf>,
    /// How the page names the build before [default: its path].
    #[arg(long, value_name = "TEXT", requires = "before")]
    pub before_label: Option<String>,
    /// Herald pods.
    #[arg(long, value_name = "N", value_parser = number, default_value_t = 1)]
    pub pods: usize,
    /// A Redis the pods share (HERALD_BROKER=redis): one redis-server, or a
    /// Redis Cluster of 3 masters without replicas.
    #[arg(long, value_enum)]
    pub redis: Option<bench::servers::RedisKind>,
    /// The pods reach Redis through a proxy whose delay the scenario sets
    /// (--proxy-control, for stall).
    #[arg(long, requires = "redis")]
    pub redis_proxy: bool,
    /// Connections to Redis subscribed to every publish's channel, reading
    /// all (standing for pods).
    #[arg(long, value_name = "N", value_parser = number, default_value_t = 0, requires = "redis")]
    pub redis_subscribers: usize,
    /// A setting for every pod, HERALD_KEY=value; repeat for several.
    #[arg(long = "env", value_name = "KEY=VALUE", value_parser = key_value)]
    pub env: Vec<(String, String)>,
    /// The clients connect to this pod only (0 is the first, the one the
    /// publisher posts to) [default: spread over all].
    #[arg(long, value_name = "N", value_parser = number)]
    pub clients_on: Option<usize>,
    /// Profile the first pod with `perf record` during the run, its report
    /// by shared object and symbol in DIR/NAME.txt.
    #[arg(long)]
    pub perf: bool,
    /// The scenario and its flags.
    #[arg(last = true, required = true, value_name = "SCENARIO")]
    pub scenario: Vec<String>,
}

impl RunArgs {
    pub fn run(&self) -> bench::Run {
        bench::Run {
            name: self.name.clone(),
            dir: self.dir.clone(),
            plan: bench::servers::Plan {
                herald: self.herald.clone(),
                pods: self.pods,
                redis: self.redis,
                redis_proxy: self.redis_proxy,
                redis_subscribers: self.redis_subscribers,
                env: self.env.clone(),
                clients_on: self.clients_on,
            },
            before: self.before.clone().map(|before| {
                let label = self
                    .before_label
                    .clone()
                    .unwrap_or_else(|| before.display().to_string());
                (before, label)
            }),
            perf: self.perf,
            scenario: self.scenario.clone(),
        }
    }
}

/// `KEY=value`.
pub(super) fn key_value(s: &str) -> Result<(String, String), String> {
    s.split_once('=')
        .filter(|(k, _)| !k.is_empty())
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .ok_or_else(|| format!("`{s}`: expected KEY=value"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::Command;
    use crate::cli::tests::{assert_named, parse};

    #[test]
    fn run_takes_the_servers_then_the_scenario_after_the_dashes() {
        let Ok(Command::Run(args)) = parse(
            "run pods-cross-pod --herald target/release/herald --pods 2 --redis one \
             --clients-on 1 --env HERALD_LOG__LEVEL=info --before old/herald \
             -- pods --clients 10 --rate 5",
        ) else {
            panic!("parsed");
        };
        let run = args.run();
        assert_eq!(run.name, "pods-cross-pod");
        assert_eq!(run.dir, PathBuf::from("target/bench"));
        assert_eq!(run.plan.pods, 2);
        assert_eq!(run.plan.redis, Some(bench::servers::RedisKind::One));
        assert_eq!(run.plan.clients_on, Some(1));
        assert_eq!(
            run.plan.env,
            vec![("HERALD_LOG__LEVEL".to_owned(), "info".to_owned())]
        );
        // The page names the build before by its path unless told.
        assert_eq!(
            run.before,
            Some((PathBuf::from("old/herald"), "old/herald".to_owned()))
        );
        assert_eq!(run.scenario, ["pods", "--clients", "10", "--rate", "5"]);
        assert_named(&[
            ("run x -- fanout", "--herald"),
            ("run x --herald h", "SCENARIO"),
            ("run x --herald h --env NOEQUALS -- wire", "KEY=value"),
            ("run x --herald h --before-label y -- wire", "--before"),
            ("run x --herald h --redis-proxy -- stall", "--redis"),
        ]);
    }
}
