//! The two herald pods `hooks` runs, each a process of the binary under
//! test configured by a TOML file written for the run (the proxies' and
//! webhooks' keys are tables and lists, which the environment does not
//! carry well), with the load tool's usual settings on top
//! ([`pod_env`](crate::bench::servers::pod_env)):
//! - the *proxy pod*: `[proxy.connect]` (forwarding `Cookie`) and
//!   `[proxy.publish]` at the backend, HS256 tokens as well (a `hello` with
//!   a token is verified, one without goes to the connect proxy), namespace
//!   `hooked` with `publish_proxy` and `plain` without;
//! - the *webhooks pod*: `[webhooks]` at the backend with the connection,
//!   publish and occupancy events, namespace `events` open to publishing.
//!
//! Both on the memory broker: the figures are the hooks', not Redis's.

use std::path::{Path, PathBuf};

use rig::{Herald, Spec};

use super::Options;
use super::backend::{Backend, CONNECT_PATH, EVENTS_PATH, PUBLISH_PATH};
use crate::Error;

/// The namespace whose `pub`s go through the publish proxy.
pub const HOOKED: &str = "hooked";
/// The namespace whose `pub`s do not (the comparison).
pub const PLAIN: &str = "plain";
/// The webhooks pod's namespace.
pub const EVENTS: &str = "events";
/// The events the webhooks pod sends (all but presence's).
pub const WEBHOOK_EVENTS: [&str; 5] = [
    "connection.open",
    "connection.close",
    "client.publish",
    "topic.occupied",
    "topic.vacated",
];
/// Commands per second and burst per connection: the clients publish
/// faster than the default 50/s allows.
const COMMANDS_PER_SECOND: u32 = 100_000;

/// A pod and the configuration file it was started with (removed on drop
/// unless it is in the run's directory).
pub struct Pod {
    pub herald: Herald,
    config: PathBuf,
    keep: bool,
}

impl Drop for Pod {
    fn drop(&mut self) {
        if !self.keep {
            let _ = std::fs::remove_file(&self.config);
        }
    }
}

impl Pod {
    /// The proxy pod: connect and publish proxies at `backend`, tokens
    /// signed with `secret`.
    pub async fn proxies(
        options: &Options,
        backend: &Backend,
        secret: &str,
    ) -> Result<Self, Error> {
        let config = format!(
            "[auth]\n\
             hmac_secret = {secret:?}\n\
             \n\
             [proxy.connect]\n\
             url = {connect:?}\n\
             timeout = \"1s\"\n\
             headers = [\"Cookie\"]\n\
             \n\
             [proxy.publish]\n\
             url = {publish:?}\n\
             timeout = \"1s\"\n\
             {websocket}\
             \n\
             [namespaces.{HOOKED}]\n\
             publish_proxy = true\n\
             \n\
             [namespaces.{PLAIN}]\n\
             publish = \"authenticated\"\n",
            connect = backend.url(CONNECT_PATH),
            publish = backend.url(PUBLISH_PATH),
            websocket = websocket(),
        );
        Self::start(options, "proxies", &config).await
    }

    /// The webhooks pod: events to `backend`, a queue that holds all the run makes.
    pub async fn webhooks(options: &Options, backend: &Backend, queue: u64) -> Result<Self, Error> {
        let events: Vec<String> = options
            .webhook_events
            .iter()
            .map(|e| format!("{e:?}"))
            .collect();
        let config = format!(
            "[webhooks]\n\
             url = {url:?}\n\
             secret = \"herald-loadtest-webhooks-secret\"\n\
             events = [{events}]\n\
             queue = {queue}\n\
             {websocket}\
             \n\
             [namespaces.{EVENTS}]\n\
             publish = \"authenticated\"\n",
            url = backend.url(EVENTS_PATH),
            events = events.join(", "),
            websocket = websocket(),
        );
        Self::start(options, "webhooks", &config).await
    }

    async fn start(options: &Options, name: &str, config: &str) -> Result<Self, Error> {
        let (path, log, keep) = match &options.dir {
            Some(dir) => {
                std::fs::create_dir_all(dir).map_err(|e| write_err(dir, e))?;
                (
                    dir.join(format!("{name}.toml")),
                    Some(dir.join(format!("{name}.log"))),
                    true,
                )
            }
            None => (
                std::env::temp_dir().join(format!(
                    "herald-loadtest-hooks-{}-{name}.toml",
                    std::process::id()
                )),
                None,
                false,
            ),
        };
        std::fs::write(&path, config).map_err(|e| write_err(&path, e))?;
        let mut env = crate::bench::servers::pod_env(&options.herald).await;
        env.extend(options.env.iter().cloned());
        let mut spec = Spec::new(&options.herald)
            .args(["--config".to_owned(), path.display().to_string()])
            .envs(env);
        if let Some(log) = log {
            spec = spec.log(log);
        }
        let herald = Herald::start(spec).await?;
        println!(
            "hooks: {name} pod on {} (pid {})",
            herald.addr,
            herald
                .pid()
                .map_or_else(|| "?".to_owned(), |p| p.to_string())
        );
        Ok(Self {
            herald,
            config: path,
            keep,
        })
    }
}

/// `[websocket]`: the command rate out of the way.
fn websocket() -> String {
    format!(
        "\n[websocket]\n\
         commands_per_second = {COMMANDS_PER_SECOND}\n\
         commands_burst = {COMMANDS_PER_SECOND}\n"
    )
}

fn write_err(path: &Path, source: std::io::Error) -> Error {
    Error::Write {
        path: path.display().to_string(),
        source,
    }
}
