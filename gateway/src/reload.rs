//! What changes without a restart, so that raising the log level or rotating
//! an API key does not roll every client off the fleet: the API keys (the
//! `http.api_keys_file` is read again when it changes, and everything on
//! SIGHUP), and the log level (the binary applies it on SIGHUP and when its
//! configuration file changes). Any other key changed is named in a warning
//! and not applied.

use std::path::{Path, PathBuf};
use std::sync::{Arc, PoisonError, RwLock, Weak};
use std::time::Duration;

use tokio::time::{Interval, MissedTickBehavior};

use crate::config::{Config, ConfigError, HttpConfig};

/// How often a watched file (the keys file, the configuration file) is read
/// for changes. Its content is compared, not its mtime: a Secret's or
/// ConfigMap's volume swaps a symlink, and a rewrite within the same second
/// keeps the mtime.
pub const FILE_POLL: Duration = Duration::from_secs(2);

/// A file read every [`FILE_POLL`] for a change of its content (one that
/// cannot be read reads as nothing).
pub struct WatchedFile {
    path: PathBuf,
    content: Option<Vec<u8>>,
    poll: Interval,
}

impl WatchedFile {
    /// Takes the content as it is now as the one seen.
    pub fn new(path: PathBuf) -> Self {
        let mut poll = tokio::time::interval(FILE_POLL);
        poll.set_missed_tick_behavior(MissedTickBehavior::Delay);
        let content = std::fs::read(&path).ok();
        Self {
            path,
            content,
            poll,
        }
    }

    /// Waits for the next look at the file; whether its content changed
    /// since the last one. Cancel-safe: nothing is recorded across an await.
    pub async fn changed(&mut self) -> bool {
        self.poll.tick().await;
        let now = std::fs::read(&self.path).ok();
        if now == self.content {
            return false;
        }
        self.content = now;
        true
    }

    /// Takes the content as it is now as seen: it was just read otherwise.
    pub fn seen(&mut self) {
        self.content = std::fs::read(&self.path).ok();
    }
}

/// Why a reload was refused: the running configuration stays, whole.
#[derive(Debug, thiserror::Error)]
pub enum Refusal {
    /// The configuration does not load (a file cut mid-write may not parse).
    #[error("it does not load")]
    Unreadable(#[source] ConfigError),
    /// The file is empty: most likely being written. An empty file is a
    /// valid all-defaults configuration at start, never on a reload.
    #[error("the configuration file is empty")]
    Empty,
    /// It would leave the API with no key, i.e. open to anyone, without
    /// saying so (`http.open_api = true`).
    #[error(
        "it would remove every API key and so open the API; a configuration that means it says \
         http.open_api = true"
    )]
    OpensApi,
}

impl Refusal {
    /// Its `result` label on `herald_config_reloads_total`.
    pub fn label(&self) -> &'static str {
        match self {
            Refusal::Unreadable(_) => "unreadable",
            Refusal::Empty => "empty",
            Refusal::OpensApi => "opens_api",
        }
    }
}

/// Loads the configuration again for a reload, from `file` and `env` as at
/// start, unless it must not replace the running one: it does not load, the
/// file is empty, or it would open the API that `keys` guard now.
pub fn load(
    file: Option<&Path>,
    env: impl IntoIterator<Item = (String, String)>,
    keys: &ApiKeys,
) -> Result<Config, Refusal> {
    if let Some(path) = file
        && std::fs::read(path).is_ok_and(|text| text.iter().all(u8::is_ascii_whitespace))
    {
        return Err(Refusal::Empty);
    }
    let new = Config::load(file, env).map_err(Refusal::Unreadable)?;
    if keys.would_open(&new.http) {
        return Err(Refusal::OpensApi);
    }
    Ok(new)
}

/// The API keys in use (`http.api_keys` and the keys file's); none: the API
/// is open.
#[derive(Debug)]
pub struct ApiKeys {
    state: RwLock<Keys>,
}

#[derive(Debug)]
struct Keys {
    /// Where they come from: `http.api_keys` as last configured, and the
    /// file's path.
    http: HttpConfig,
    current: Arc<[String]>,
}

impl Keys {
    /// Where a reload reads the keys from: `http.api_keys` from `http` when
    /// given (a reload's new configuration), the keys file as configured at
    /// start (a new path needs a restart: [`needs_restart`] says so).
    fn source(&self, http: Option<&HttpConfig>) -> HttpConfig {
        let mut source = self.http.clone();
        if let Some(http) = http {
            source.api_keys.clone_from(&http.api_keys);
        }
        source
    }
}

impl ApiKeys {
    /// `http`'s keys, read and checked by [`HttpConfig::keys`] at load: a
    /// file that fails now leaves none until it is read again.
    pub fn new(http: &HttpConfig) -> Self {
        let current = http.keys().unwrap_or_default().into();
        Self {
            state: RwLock::new(Keys {
                http: http.clone(),
                current,
            }),
        }
    }

    /// The keys a request is checked against now.
    pub fn current(&self) -> Arc<[String]> {
        self.state
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .current
            .clone()
    }

    /// Whether reloading with `http` (a reload's new configuration) would
    /// leave no key where there is one now, without `http.open_api`.
    pub fn would_open(&self, http: &HttpConfig) -> bool {
        let state = self.state.read().unwrap_or_else(PoisonError::into_inner);
        if state.current.is_empty() || http.open_api {
            return false;
        }
        // A keys file that fails keeps the keys in use (see `reload`).
        state
            .source(Some(http))
            .keys()
            .is_ok_and(|keys| keys.is_empty())
    }

    /// Reads the keys again, the file as it is now, with `http.api_keys`
    /// from `http` when given (a SIGHUP's new configuration); keeps those in
    /// use when the file cannot be read or holds none. Whether they changed.
    pub fn reload(&self, http: Option<&HttpConfig>) -> bool {
        let mut state = self.state.write().unwrap_or_else(PoisonError::into_inner);
        let source = state.source(http);
        match source.keys() {
            Ok(keys) => {
                state.http = source;
                if *state.current == *keys {
                    return false;
                }
                state.current = keys.into();
                tracing::info!(keys = state.current.len(), "API keys reloaded");
                true
            }
            Err(e) => {
                tracing::warn!(error = %e, "API keys not reloaded: the keys in use stay");
                false
            }
        }
    }
}

/// Reads the keys file every [`FILE_POLL`] and reloads `keys` when its
/// content changed, until the keys (their pod) are gone.
pub async fn watch_keys_file(keys: Weak<ApiKeys>, path: String) {
    let mut file = WatchedFile::new(path.into());
    loop {
        let changed = file.changed().await;
        let Some(keys) = keys.upgrade() else {
            return;
        };
        if changed {
            keys.reload(None);
        }
    }
}

/// The sections of `new` that differ from `old` in what a reload does not
/// apply (anything but `log.level`, `http.api_keys` and the keys file's
/// content): they need a restart.
pub fn needs_restart(old: &Config, new: &Config) -> Vec<&'static str> {
    let mut new = new.clone();
    new.log.level.clone_from(&old.log.level);
    new.http.api_keys.clone_from(&old.http.api_keys);
    // Read by each reload itself (see [`load`]).
    new.http.open_api = old.http.open_api;
    // Compared as they print: every section is `Debug`, and a password
    // prints redacted, so a changed password is not noticed here.
    macro_rules! changed {
        ($($section:ident),*) => {
            [$((stringify!($section), format!("{:?}", old.$section) != format!("{:?}", new.$section))),*]
        };
    }
    let sections = changed!(
        listen, broker, redis, websocket, queue, session, http, grpc, shutdown, rebalance, log,
        telemetry, auth, namespaces
    );
    sections
        .into_iter()
        .filter(|&(_, changed)| changed)
        .map(|(name, _)| name)
        .collect()
}
