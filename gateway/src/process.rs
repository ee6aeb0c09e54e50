//! The herald process around the gateway: raises the file descriptor limit,
//! binds the listeners, warns at start about what anyone could reach, serves
//! until SIGTERM or SIGINT, and meanwhile reloads what can change without a
//! restart ([`crate::reload`]) on SIGHUP or an edit of its configuration
//! file. The binary parses its command line, loads the configuration and
//! sets up logging, then calls [`run`].

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use tokio::net::TcpListener;
use tokio::signal::unix::{Signal, SignalKind, signal};

use crate::config::Config;
use crate::node::{Node, StartError};
use crate::reload;
use crate::server::{self, Listeners};

/// Applies a new `log.level` (validated already) to the running logger.
pub type SetLevel = Box<dyn Fn(&str) -> Result<(), String> + Send + Sync>;

/// Why the process could not serve.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error("binding {addr}")]
    Bind {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("reading a listener's address")]
    LocalAddr(#[source] std::io::Error),
    #[error("starting the broker")]
    Start(#[source] StartError),
}

/// Serves `config` until SIGTERM or SIGINT, then drains. `file` is where
/// the configuration came from (read again on SIGHUP and watched for
/// changes, with the same variables), and `set_level` applies a reloaded
/// `log.level`.
pub async fn run(
    config: Config,
    file: Option<PathBuf>,
    set_level: SetLevel,
) -> Result<(), RunError> {
    // Each connection is a file descriptor: take all the process may have.
    match rlimit::increase_nofile_limit(u64::MAX) {
        Ok(limit) => tracing::debug!(limit, "file descriptor limit"),
        Err(e) => tracing::warn!(error = %e, "could not raise the file descriptor limit"),
    }
    // Before anything else: SIGHUP's default is to end the process.
    let hangups = signal(SignalKind::hangup());
    let http = bind(config.listen).await?;
    let grpc = bind(config.grpc.listen).await?;
    let api = match config.http.api_listen {
        Some(addr) => Some(bind(addr).await?),
        None => None,
    };
    let local = |listener: &TcpListener| listener.local_addr().map_err(RunError::LocalAddr);
    let api_addr = match &api {
        Some(api) => local(api)?,
        None => local(&http)?,
    };
    tracing::info!(
        listen = %local(&http)?,
        api = %api_addr,
        grpc = %local(&grpc)?,
        broker = ?config.broker,
        "herald listening"
    );
    warn_if_exposed(&config, api_addr, local(&grpc)?);
    let listeners = Listeners {
        http,
        api,
        grpc: Some(grpc),
    };
    let node = Node::start(config.clone()).await.map_err(RunError::Start)?;
    match hangups {
        Ok(hangups) => {
            tokio::spawn(reload_on_hangup(
                hangups,
                file,
                config,
                node.clone(),
                set_level,
            ));
        }
        Err(e) => tracing::warn!(error = %e, "cannot listen for SIGHUP: no reloads"),
    }
    server::serve(node, listeners, shutdown_signal()).await;
    tracing::info!("stopped");
    Ok(())
}

/// On each SIGHUP, and when the configuration file's content changes (read
/// every [`reload::FILE_POLL`]: a ConfigMap's volume is updated in place,
/// and a pod cannot be sent a signal easily): loads the configuration again
/// (the same file and variables), applies `log.level` and the API keys, and
/// names the sections whose changes need a restart. A configuration that no
/// longer loads changes nothing.
async fn reload_on_hangup(
    mut hangups: Signal,
    file: Option<PathBuf>,
    mut config: Config,
    node: Arc<Node>,
    set_level: SetLevel,
) {
    let mut watched = file.clone().map(reload::WatchedFile::new);
    loop {
        let why = tokio::select! {
            hangup = hangups.recv() => match hangup {
                Some(()) => {
                    if let Some(watched) = &mut watched {
                        watched.seen();
                    }
                    "SIGHUP"
                }
                None => return,
            },
            changed = file_changed(&mut watched) => {
                if !changed {
                    continue;
                }
                "configuration file changed"
            }
        };
        let new = match reload::load(file.as_deref(), std::env::vars(), &node.api_keys) {
            Ok(new) => new,
            Err(refusal) => {
                let reloads = &node.metrics.config_reloads;
                reloads.with_label_values(&[refusal.label()]).inc();
                tracing::error!(
                    why,
                    error = &refusal as &dyn std::error::Error,
                    "configuration not reloaded: the running one stays"
                );
                continue;
            }
        };
        node.metrics
            .config_reloads
            .with_label_values(&["applied"])
            .inc();
        if new.log.level != config.log.level {
            match set_level(&new.log.level) {
                Ok(()) => {
                    tracing::info!(why, level = %new.log.level, "log level changed");
                    config.log.level.clone_from(&new.log.level);
                }
                Err(e) => tracing::warn!(why, error = %e, "log level not changed"),
            }
        }
        node.api_keys.reload(Some(&new.http));
        config.http.api_keys.clone_from(&new.http.api_keys);
        let restart = reload::needs_restart(&config, &new);
        if restart.is_empty() {
            tracing::info!(why, "configuration reloaded");
        } else {
            tracing::warn!(
                why,
                sections = %restart.join(", "),
                "these changes need a restart; not applied"
            );
        }
    }
}

/// [`reload::WatchedFile::changed`]; never, without a configuration file.
async fn file_changed(watched: &mut Option<reload::WatchedFile>) -> bool {
    match watched {
        Some(watched) => watched.changed().await,
        None => std::future::pending().await,
    }
}

/// Says so at start when what is open could be reached by anyone, and what
/// else in the configuration is allowed but risky.
fn warn_if_exposed(config: &Config, api: SocketAddr, grpc: SocketAddr) {
    for caution in config.auth.cautions() {
        tracing::warn!("{caution}");
    }
    if !config.auth.enabled() {
        tracing::warn!(
            "no [auth] key is configured: any client may subscribe to any topic its namespace \
             allows (open mode; see docs/security.md)"
        );
    }
    if config.http.api_keys.is_empty() && config.http.api_keys_file.is_empty() {
        for (what, addr) in [("HTTP API and metrics", api), ("gRPC API", grpc)] {
            if !addr.ip().is_loopback() {
                tracing::warn!(
                    %addr,
                    "the {what} has no http.api_keys and listens beyond loopback: anyone who \
                     reaches it may publish and disconnect users"
                );
            }
        }
    }
}

async fn bind(addr: SocketAddr) -> Result<TcpListener, RunError> {
    TcpListener::bind(addr)
        .await
        .map_err(|source| RunError::Bind { addr, source })
}

/// SIGTERM (Kubernetes) or SIGINT (a terminal).
async fn shutdown_signal() {
    let (Ok(mut term), Ok(mut int)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        tracing::error!("cannot listen for signals; stop herald with SIGKILL");
        return std::future::pending().await;
    };
    tokio::select! {
        _ = term.recv() => tracing::info!("SIGTERM"),
        _ = int.recv() => tracing::info!("SIGINT"),
    }
}
