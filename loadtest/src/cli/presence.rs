//! The flags of `presence`: the room, its pods, and each phase's length.

use std::path::PathBuf;

use clap::Args;

use super::output::Out;
use super::run::key_value;
use super::values::{number, rate};
use crate::scenarios::presence::{self, Options};

#[derive(Debug, Args)]
pub struct PresenceArgs {
    /// The herald binary the pods run (target/release/herald).
    #[arg(long, value_name = "PATH")]
    pub herald: PathBuf,
    /// Where Redis's and the pods' logs go [default: scratch files].
    #[arg(long, value_name = "DIR")]
    pub dir: Option<PathBuf>,
    /// Herald pods sharing one redis-server.
    #[arg(long, value_name = "N", value_parser = number, default_value_t = presence::DEFAULT_PODS)]
    pub pods: usize,
    /// Members of the room, each a user with a token, spread over the pods.
    #[arg(long, value_name = "N", value_parser = number, default_value_t = presence::DEFAULT_MEMBERS)]
    pub members: usize,
    /// The room's namespace without presence: only the join and the flow
    /// run, for the message latency to compare with.
    #[arg(long)]
    pub presence_off: bool,
    /// Messages per second to the room.
    #[arg(long, value_name = "MSGS_PER_S", value_parser = rate, default_value_t = presence::DEFAULT_RATE)]
    pub rate: f64,
    /// Payload bytes (the send-time stamp needs ~40).
    #[arg(long, value_name = "BYTES", value_parser = number, default_value_t = presence::DEFAULT_SIZE)]
    pub size: usize,
    /// How long messages flow while members churn.
    #[arg(long, value_name = "TIME", default_value_t = presence::DEFAULT_FLOW.into())]
    pub flow: humantime::Duration,
    /// Members that leave (unsub) and join again during the flow.
    #[arg(long, value_name = "N", value_parser = number, default_value_t = presence::DEFAULT_CHURN)]
    pub churn: usize,
    /// The window with no joins, leaves or messages: Redis's writes.
    #[arg(long, value_name = "TIME", default_value_t = presence::DEFAULT_QUIET.into())]
    pub quiet: humantime::Duration,
    /// Timed queries of each kind (page, stats).
    #[arg(long, value_name = "N", value_parser = number, default_value_t = presence::DEFAULT_QUERIES)]
    pub queries: usize,
    /// Members per timed page.
    #[arg(long, value_name = "N", value_parser = number, default_value_t = presence::DEFAULT_PAGE_SIZE)]
    pub page_size: usize,
    /// Cumulative acks at most this often per member.
    #[arg(long, value_name = "TIME", default_value_t = presence::DEFAULT_ACK_INTERVAL.into())]
    pub ack_interval: humantime::Duration,
    /// Longest the join, and each pod's return in the rolling restart, may take.
    #[arg(long, value_name = "TIME", default_value_t = presence::DEFAULT_SETTLE.into())]
    pub settle: humantime::Duration,
    /// Longest to wait for a killed pod's members to be gone.
    #[arg(long, value_name = "TIME", default_value_t = presence::DEFAULT_KILL_WAIT.into())]
    pub kill_wait: humantime::Duration,
    /// Leave out the rolling restart.
    #[arg(long)]
    pub no_restart: bool,
    /// Leave out the kill -9.
    #[arg(long)]
    pub no_kill: bool,
    /// A setting for every pod, HERALD_KEY=value; repeat for several.
    #[arg(long = "env", value_name = "KEY=VALUE", value_parser = key_value)]
    pub env: Vec<(String, String)>,
    #[command(flatten)]
    pub out: Out,
}

impl PresenceArgs {
    pub fn options(&self) -> Options {
        let mut options = Options::new(self.herald.clone());
        options.dir = self.dir.clone();
        options.pods = self.pods;
        options.members = self.members;
        options.presence = !self.presence_off;
        options.rate = self.rate;
        options.size = self.size;
        options.flow = self.flow.into();
        options.churn = self.churn;
        options.quiet = self.quiet.into();
        options.queries = self.queries;
        options.page_size = self.page_size;
        options.ack_interval = self.ack_interval.into();
        options.settle = self.settle.into();
        options.kill_wait = self.kill_wait.into();
        options.restart = !self.no_restart;
        options.kill = !self.no_kill;
        options.env = self.env.clone();
        options
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use crate::cli::Command;
    use crate::cli::tests::{assert_named, parse};

    #[test]
    fn presence_reads_its_room_and_phases() {
        let Ok(Command::Presence(args)) = parse(
            "presence --herald target/release/herald --pods 2 --members 200 --churn 20 \
             --quiet 2s --no-kill --env HERALD_PRESENCE__DIFF_INTERVAL=200ms",
        ) else {
            panic!("parsed");
        };
        let options = args.options();
        assert_eq!((options.pods, options.members, options.churn), (2, 200, 20));
        assert_eq!(options.quiet, Duration::from_secs(2));
        assert!(options.presence && options.restart && !options.kill);
        assert_eq!(
            options.env,
            vec![(
                "HERALD_PRESENCE__DIFF_INTERVAL".to_owned(),
                "200ms".to_owned()
            )]
        );
        assert_named(&[
            ("presence", "--herald"),
            ("presence --herald h --members lots", "--members"),
        ]);
    }
}
