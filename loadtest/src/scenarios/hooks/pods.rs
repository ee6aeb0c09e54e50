//! The two herald pods `hooks` runs, each a process of the binary under
//! test configured through `HERALD_*` variables (as every pod the load tool
//! starts), on top of the load tool's usual settings
//! ([`pod_env`](crate::bench::servers::pod_env)):
//! - the *proxy pod*: `[proxy.connect]` (forwarding `Cookie`) and
//!   `[proxy.publish]` at the backend, HS256 tokens as well (a `hello` with
//!   a token is verified, one without goes to the connect proxy), namespace
//!   `hooked` with `publish_proxy` and `plain` without;
//! - the *webhooks pod*: `[webhooks]` at the backend with the connection,
//!   publish and occupancy events, namespace `events` open to publishing.
//!
//! Both on the memory broker: the figures are the hooks', not Redis's.

use std::path::Path;
use std::time::Duration;

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
const COMMANDS_PER_SECOND: &str = "100000";
/// The connect proxy's forwarded headers: the backend names the user by
/// its cookie. A build that cannot take the list from the environment
/// forwards none, and the backend names the user by the connection.
const CONNECT_HEADERS: (&str, &str) = ("HERALD_PROXY__CONNECT__HEADERS", "Cookie");
/// Longest `herald --check` may take.
const CHECK_WAIT: Duration = Duration::from_secs(10);

/// A running pod.
pub struct Pod {
    pub herald: Herald,
}

impl Pod {
    /// The proxy pod: connect and publish proxies at `backend`, tokens
    /// signed with `secret`.
    pub async fn proxies(
        options: &Options,
        backend: &Backend,
        secret: &str,
    ) -> Result<Self, Error> {
        let mut env = vec![
            var("HERALD_AUTH__HMAC_SECRET", secret),
            var("HERALD_PROXY__CONNECT__URL", &backend.url(CONNECT_PATH)),
            var("HERALD_PROXY__CONNECT__TIMEOUT", "1s"),
            var("HERALD_PROXY__PUBLISH__URL", &backend.url(PUBLISH_PATH)),
            var("HERALD_PROXY__PUBLISH__TIMEOUT", "1s"),
            var("HERALD_NAMESPACES__HOOKED__PUBLISH_PROXY", "true"),
            var("HERALD_NAMESPACES__PLAIN__PUBLISH", "authenticated"),
        ];
        let mut with_headers = env.clone();
        with_headers.push(var(CONNECT_HEADERS.0, CONNECT_HEADERS.1));
        if check(options, &with_headers).await.is_ok() {
            env = with_headers;
        } else {
            println!(
                "hooks: this build takes no {}: the connect proxy is given no headers",
                CONNECT_HEADERS.0
            );
        }
        Self::start(options, "proxies", env).await
    }

    /// The webhooks pod: events to `backend`, a queue that holds all the run makes.
    pub async fn webhooks(options: &Options, backend: &Backend, queue: u64) -> Result<Self, Error> {
        let env = vec![
            var("HERALD_WEBHOOKS__URL", &backend.url(EVENTS_PATH)),
            var("HERALD_WEBHOOKS__SECRET", "herald-loadtest-webhooks-secret"),
            var("HERALD_WEBHOOKS__EVENTS", &options.webhook_events.join(",")),
            var("HERALD_WEBHOOKS__QUEUE", &queue.to_string()),
            var("HERALD_NAMESPACES__EVENTS__PUBLISH", "authenticated"),
        ];
        Self::start(options, "webhooks", env).await
    }

    async fn start(
        options: &Options,
        name: &str,
        mut env: Vec<(String, String)>,
    ) -> Result<Self, Error> {
        env.push(var(
            "HERALD_WEBSOCKET__COMMANDS_PER_SECOND",
            COMMANDS_PER_SECOND,
        ));
        env.push(var("HERALD_WEBSOCKET__COMMANDS_BURST", COMMANDS_PER_SECOND));
        let mut all = crate::bench::servers::pod_env(&options.herald).await;
        all.extend(env);
        all.extend(options.env.iter().cloned());
        let mut spec = Spec::new(&options.herald).envs(all);
        if let Some(dir) = &options.dir {
            std::fs::create_dir_all(dir).map_err(|e| write_err(dir, e))?;
            spec = spec.log(dir.join(format!("{name}.log")));
        }
        let herald = Herald::start(spec).await?;
        println!(
            "hooks: {name} pod on {} (pid {})",
            herald.addr,
            herald
                .pid()
                .map_or_else(|| "?".to_owned(), |p| p.to_string())
        );
        Ok(Self { herald })
    }
}

fn var(key: &str, value: &str) -> (String, String) {
    (key.to_owned(), value.to_owned())
}

/// Whether `herald --check` takes `env` (with the run's other settings).
async fn check(options: &Options, env: &[(String, String)]) -> Result<(), String> {
    let mut command = tokio::process::Command::new(&options.herald);
    command
        .arg("--check")
        .envs(env.iter().cloned())
        .envs(options.env.iter().cloned())
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true);
    match tokio::time::timeout(CHECK_WAIT, command.output()).await {
        Ok(Ok(out)) if out.status.success() => Ok(()),
        Ok(Ok(out)) => Err(String::from_utf8_lossy(&out.stderr).into_owned()),
        Ok(Err(e)) => Err(e.to_string()),
        Err(_) => Err("herald --check took too long".to_owned()),
    }
}

fn write_err(path: &Path, source: std::io::Error) -> Error {
    Error::Write {
        path: path.display().to_string(),
        source,
    }
}
