//! `herald`: loads the configuration, sets up logging and (if configured)
//! trace export, binds, and runs the gateway until SIGTERM or SIGINT, then
//! drains and flushes the traces. SIGHUP, or an edit of the configuration
//! file, reloads what can change without a restart ([`gateway::reload`]). `herald status` asks a running pod for its
//! [`gateway::admin::Status`].

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use gateway::admin::Status;
use gateway::config::{CONFIG_FILE_VAR, EXIT_BAD_CONFIG, LogFormat};
use gateway::node::StartError;
use gateway::reload;
use gateway::telemetry::{self, Tracing};
use gateway::{Config, Listeners, Node};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::runtime::Runtime;
use tokio::signal::unix::{Signal, SignalKind, signal};
use tracing_subscriber::Layer;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;

const USAGE: &str = "\
herald: a realtime WebSocket gateway

Usage: herald [--config <file.toml>] [--check]
       herald status [--url <url>] [--key <api key>]

Options:
  -c, --config <file>  TOML configuration (docs/herald.sample.toml lists every key);
                       HERALD_CONFIG names one too
      --check          validate the configuration and exit
  -h, --help           print this help
  -V, --version        print the version

status: prints what a running pod holds (GET /v1/admin/status on its API
listener): connections, sessions, topics, its broker's state.
      --url <url>      the pod's API, default http://127.0.0.1:8080
      --key <key>      an API key (http.api_keys), if the pod has any;
                       HERALD_API_KEY gives it where `ps` cannot see it

SIGHUP, or a change of the configuration file (looked at every 2s),
re-reads the configuration: log.level and the API keys (and the
http.api_keys_file, also read again whenever it changes) apply at once;
other changes are logged as needing a restart.

Every key can be set from the environment: HERALD_<KEY>, with __ between
nested keys, e.g. HERALD_LISTEN=127.0.0.1:9000 or
HERALD_WEBSOCKET__PING_INTERVAL=10s. The environment wins over the file.

Without a file or variables, herald listens on 0.0.0.0:8080 (WebSocket and
HTTP) and 0.0.0.0:9090 (gRPC) with the embedded single-pod broker.";

struct Args {
    config: Option<PathBuf>,
    check: bool,
    /// `herald status`: where, and with which key.
    status: Option<StatusArgs>,
}

struct StatusArgs {
    url: String,
    key: Option<String>,
}

/// Where `herald status` asks by default: a pod on this host, API on `listen`.
const DEFAULT_STATUS_URL: &str = "http://127.0.0.1:8080";

/// The variable `herald status` takes its API key from. (Not a configuration
/// key: the configuration ignores `HERALD_*` variables it does not know.)
const API_KEY_VAR: &str = "HERALD_API_KEY";

fn parse_args() -> Result<Option<Args>, String> {
    let mut args = Args {
        config: None,
        check: false,
        status: None,
    };
    let mut it = std::env::args_os().skip(1).peekable();
    if it.peek().and_then(|a| a.to_str()) == Some("status") {
        it.next();
        let mut status = StatusArgs {
            url: DEFAULT_STATUS_URL.to_owned(),
            // From the environment unless `--key` says otherwise: a key on
            // the command line is in every `ps` listing.
            key: std::env::var(API_KEY_VAR).ok().filter(|k| !k.is_empty()),
        };
        while let Some(arg) = it.next() {
            let mut value = |name: &str| {
                it.next()
                    .and_then(|v| v.into_string().ok())
                    .ok_or(format!("{name} needs a value"))
            };
            match arg.to_str() {
                Some("--url") => status.url = value("--url")?,
                Some("--key") => status.key = Some(value("--key")?),
                Some("-h" | "--help") => {
                    println!("{USAGE}");
                    return Ok(None);
                }
                _ => return Err(format!("unexpected argument {arg:?}; see --help")),
            }
        }
        args.status = Some(status);
        return Ok(Some(args));
    }
    while let Some(arg) = it.next() {
        match arg.to_str() {
            Some("-h" | "--help") => {
                println!("{USAGE}");
                return Ok(None);
            }
            Some("-V" | "--version") => {
                println!("herald {}", env!("CARGO_PKG_VERSION"));
                return Ok(None);
            }
            Some("-c" | "--config") => {
                let path = it.next().ok_or("--config needs a file")?;
                args.config = Some(PathBuf::from(path));
            }
            Some("--check") => args.check = true,
            _ => return Err(format!("unexpected argument {arg:?}; see --help")),
        }
    }
    Ok(Some(args))
}

fn main() -> ExitCode {
    let args = match parse_args() {
        Ok(Some(args)) => args,
        Ok(None) => return ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("herald: {e}");
            return ExitCode::from(EXIT_BAD_CONFIG as u8);
        }
    };
    if let Some(status) = args.status {
        return print_status(&status);
    }
    let file = args
        .config
        .or_else(|| std::env::var_os(CONFIG_FILE_VAR).map(PathBuf::from));
    let config = match Config::load(file.as_deref(), std::env::vars()) {
        Ok(config) => config,
        Err(e) => {
            eprintln!("herald: bad configuration: {e}");
            return ExitCode::from(EXIT_BAD_CONFIG as u8);
        }
    };
    if args.check {
        println!("configuration ok");
        return ExitCode::SUCCESS;
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("herald: starting the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    // The exporter's channel lives on the runtime.
    let traces = match runtime.block_on(async { Tracing::start(&config.telemetry) }) {
        Ok(traces) => traces,
        Err(e) => {
            eprintln!(
                "herald: bad configuration: invalid value for `telemetry.otlp_endpoint`: {e}"
            );
            return ExitCode::from(EXIT_BAD_CONFIG as u8);
        }
    };
    let set_level = init_logging(&config, traces.as_ref());
    let served = serve(config, file, set_level, &runtime);
    // After the drain: what the last publishes traced is exported before
    // exit. Blocking here, on the main thread, leaves the runtime's workers
    // free to drive the export.
    if let Some(traces) = traces {
        traces.shutdown();
    }
    match served {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            // Each cause once (`{e:#}` would repeat the Redis error's).
            let why = router::Causes(e.as_ref());
            tracing::error!("{why}");
            eprintln!("herald: {why}");
            if e.downcast_ref::<StartError>()
                .is_some_and(StartError::is_config)
            {
                ExitCode::from(EXIT_BAD_CONFIG as u8)
            } else {
                ExitCode::FAILURE
            }
        }
    }
}

/// Applies a new `log.level` (validated already) to the running logger.
type SetLevel = Box<dyn Fn(&str) -> Result<(), String> + Send + Sync>;

/// The filter of `level`, never letting [`telemetry::TARGET`]'s spans into
/// the log.
fn log_filter(level: &str) -> tracing_subscriber::EnvFilter {
    let mut filter = tracing_subscriber::EnvFilter::new(level);
    if let Ok(off) = format!("{}=off", telemetry::TARGET).parse() {
        filter = filter.add_directive(off);
    }
    filter
}

/// Logs to stderr as `log` says; with `traces`, the spans of
/// [`telemetry::TARGET`] go to the exporter, and never to the log. The level
/// can be changed later through what this returns (SIGHUP).
fn init_logging(config: &Config, traces: Option<&Tracing>) -> SetLevel {
    let (filter, handle) = tracing_subscriber::reload::Layer::new(log_filter(&config.log.level));
    // Colour codes only for a person at a terminal, never into a log file.
    let fmt = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()));
    let fmt = match config.log.format {
        LogFormat::Text => fmt.boxed(),
        LogFormat::Json => fmt.json().boxed(),
    };
    tracing_subscriber::registry()
        .with(fmt.with_filter(filter))
        .with(traces.map(Tracing::layer))
        .init();
    Box::new(move |level| handle.reload(log_filter(level)).map_err(|e| e.to_string()))
}

fn serve(
    config: Config,
    file: Option<PathBuf>,
    set_level: SetLevel,
    runtime: &Runtime,
) -> anyhow::Result<()> {
    // Each connection is a file descriptor: take all the process may have.
    match rlimit::increase_nofile_limit(u64::MAX) {
        Ok(limit) => tracing::debug!(limit, "file descriptor limit"),
        Err(e) => tracing::warn!(error = %e, "could not raise the file descriptor limit"),
    }
    runtime.block_on(async {
        // Before anything else: SIGHUP's default is to end the process.
        let hangups = signal(SignalKind::hangup());
        let http = bind(config.listen).await?;
        let grpc = bind(config.grpc.listen).await?;
        let api = match config.http.api_listen {
            Some(addr) => Some(bind(addr).await?),
            None => None,
        };
        let api_addr = match &api {
            Some(api) => api.local_addr()?,
            None => http.local_addr()?,
        };
        tracing::info!(
            listen = %http.local_addr()?,
            api = %api_addr,
            grpc = %grpc.local_addr()?,
            broker = ?config.broker,
            "herald listening"
        );
        warn_if_exposed(&config, api_addr, grpc.local_addr()?);
        let listeners = Listeners {
            http,
            api,
            grpc: Some(grpc),
        };
        let node = Node::start(config.clone())
            .await
            .context("starting the broker")?;
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
        gateway::serve(node, listeners, shutdown_signal()).await;
        tracing::info!("stopped");
        Ok(())
    })
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
fn warn_if_exposed(config: &Config, api: std::net::SocketAddr, grpc: std::net::SocketAddr) {
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

async fn bind(addr: std::net::SocketAddr) -> anyhow::Result<TcpListener> {
    TcpListener::bind(addr)
        .await
        .with_context(|| format!("binding {addr}"))
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

/// Longest `herald status` waits for the pod.
const STATUS_TIMEOUT: Duration = Duration::from_secs(5);
/// Largest status answer read.
const STATUS_MAX_BYTES: u64 = 1024 * 1024;

/// `herald status`: prints the pod's status, or why it could not be read
/// (exit 1).
fn print_status(args: &StatusArgs) -> ExitCode {
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("herald status: starting the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let fetched = runtime.block_on(async {
        tokio::time::timeout(STATUS_TIMEOUT, fetch_status(args))
            .await
            .unwrap_or_else(|_| Err(anyhow::anyhow!("no answer within {STATUS_TIMEOUT:?}")))
    });
    match fetched {
        Ok(status) => {
            print!("{}", status.render());
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("herald status: {}: {e:#}", args.url);
            ExitCode::FAILURE
        }
    }
}

/// `GET /v1/admin/status` over plain HTTP/1.1: one request, so a few lines
/// of our own rather than an HTTP client.
async fn fetch_status(args: &StatusArgs) -> anyhow::Result<Status> {
    let uri: hyper::Uri = args.url.parse().context("not a URL")?;
    anyhow::ensure!(
        uri.scheme_str() == Some("http"),
        "only http:// URLs (the API listener speaks plain HTTP)"
    );
    let authority = uri.authority().context("no host in the URL")?;
    let port = authority.port_u16().unwrap_or(80);
    let mut stream = TcpStream::connect((authority.host(), port))
        .await
        .context("connecting")?;
    let key = args
        .key
        .as_deref()
        .map(|k| format!("Authorization: Bearer {k}\r\n"))
        .unwrap_or_default();
    let request = format!(
        "GET /v1/admin/status HTTP/1.1\r\nHost: {authority}\r\n{key}Connection: close\r\n\r\n"
    );
    stream.write_all(request.as_bytes()).await?;
    let mut response = Vec::new();
    stream
        .take(STATUS_MAX_BYTES)
        .read_to_end(&mut response)
        .await?;
    let text = String::from_utf8_lossy(&response);
    let (head, body) = text.split_once("\r\n\r\n").context("not an HTTP answer")?;
    let code = head
        .split_whitespace()
        .nth(1)
        .context("not an HTTP answer")?;
    anyhow::ensure!(code == "200", "HTTP {code}: {}", body.trim());
    serde_json::from_str(body).context("not a status")
}
