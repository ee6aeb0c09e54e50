//! The flags of `hooks`: the handshakes, the publishes, the webhooks, and
//! the backend's delay.

use std::path::PathBuf;

use clap::Args;

use super::output::Out;
use super::run::key_value;
use super::values::{number, rate};
use crate::scenarios::hooks::Options;

#[derive(Debug, Args)]
pub struct HooksArgs {
    /// The herald binary the pods run (target/release/herald).
    #[arg(long, value_name = "PATH")]
    pub herald: PathBuf,
    /// Where the pods' logs go [default: scratch files].
    #[arg(long, value_name = "DIR")]
    pub dir: Option<PathBuf>,
    /// A run of well under a minute (1,000 handshakes of each kind, 3 s of
    /// publishes, 20 webhook clients); the flags below still override it.
    #[arg(long)]
    pub quick: bool,
    /// Handshakes of each kind (connect proxy, token).
    #[arg(long, value_name = "N", value_parser = number)]
    pub handshakes: Option<usize>,
    /// Clients handshaking at once.
    #[arg(long, value_name = "N", value_parser = number)]
    pub concurrency: Option<usize>,
    /// The backend's delay before each proxy answer.
    #[arg(long, value_name = "TIME")]
    pub delay: Option<humantime::Duration>,
    /// Clients publishing (each with a token).
    #[arg(long, value_name = "N", value_parser = number)]
    pub publish_clients: Option<usize>,
    /// Their publishes per second, in all.
    #[arg(long, value_name = "PUBS_PER_S", value_parser = rate)]
    pub publish_rate: Option<f64>,
    /// How long they publish.
    #[arg(long, value_name = "TIME")]
    pub publish_duration: Option<humantime::Duration>,
    /// Clients making webhook events (each connects, publishes, closes).
    #[arg(long, value_name = "N", value_parser = number)]
    pub webhook_clients: Option<usize>,
    /// Publishes of each of them.
    #[arg(long, value_name = "N", value_parser = number)]
    pub webhook_publishes: Option<usize>,
    /// The event types the webhooks pod sends, comma-separated [default:
    /// connection.open, connection.close, client.publish, topic.occupied,
    /// topic.vacated].
    #[arg(long, value_name = "TYPES", value_delimiter = ',')]
    pub webhook_events: Option<Vec<String>>,
    /// Longest to wait for the last webhook after the clients are done.
    #[arg(long, value_name = "TIME")]
    pub settle: Option<humantime::Duration>,
    /// A setting for both pods, HERALD_KEY=value; repeat for several.
    #[arg(long = "env", value_name = "KEY=VALUE", value_parser = key_value)]
    pub env: Vec<(String, String)>,
    #[command(flatten)]
    pub out: Out,
}

impl HooksArgs {
    pub fn options(&self) -> Options {
        let mut options = Options::new(self.herald.clone());
        if self.quick {
            options = options.quick();
        }
        options.dir = self.dir.clone();
        options.handshakes = self.handshakes.unwrap_or(options.handshakes);
        options.concurrency = self.concurrency.unwrap_or(options.concurrency);
        options.delay = self.delay.map_or(options.delay, Into::into);
        options.publish_clients = self.publish_clients.unwrap_or(options.publish_clients);
        options.publish_rate = self.publish_rate.unwrap_or(options.publish_rate);
        options.publish_duration = self
            .publish_duration
            .map_or(options.publish_duration, Into::into);
        options.webhook_clients = self.webhook_clients.unwrap_or(options.webhook_clients);
        options.webhook_publishes = self
            .webhook_publishes
            .map_or(options.webhook_publishes, |n| n as u64);
        if let Some(events) = &self.webhook_events {
            options.webhook_events = events.clone();
        }
        options.settle = self.settle.map_or(options.settle, Into::into);
        options.env = self.env.clone();
        options
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use crate::cli::Command;
    use crate::cli::tests::{assert_named, parse};
    use crate::scenarios::hooks;

    #[test]
    fn hooks_reads_its_phases_and_quick_sizes() {
        let Ok(Command::Hooks(args)) = parse(
            "hooks --herald target/release/herald --handshakes 2_000 --delay 2ms \
             --publish-rate 300 --env HERALD_LOG__LEVEL=info",
        ) else {
            panic!("parsed");
        };
        let options = args.options();
        assert_eq!(options.handshakes, 2000);
        assert_eq!(options.delay, Duration::from_millis(2));
        assert_eq!(options.publish_rate, 300.0);
        assert_eq!(options.concurrency, hooks::DEFAULT_CONCURRENCY);
        assert_eq!(options.env.len(), 1);

        let Ok(Command::Hooks(args)) = parse("hooks --herald h --quick --webhook-clients 7") else {
            panic!("parsed");
        };
        let options = args.options();
        assert_eq!(options.handshakes, 1000, "quick");
        assert_eq!(options.webhook_clients, 7, "a flag wins over quick");
        assert_named(&[
            ("hooks", "--herald"),
            ("hooks --herald h --delay 1", "--delay"),
        ]);
    }
}
