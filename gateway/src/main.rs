//! `herald`: loads the configuration, sets up logging and (if configured)
//! trace export, binds, and runs the gateway until SIGTERM or SIGINT, then
//! drains and flushes the traces.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use gateway::config::{CONFIG_FILE_VAR, EXIT_BAD_CONFIG, LogFormat};
use gateway::telemetry::{self, Tracing};
use gateway::{Config, Listeners};
use tokio::net::TcpListener;
use tokio::runtime::Runtime;
use tracing_subscriber::Layer;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;

const USAGE: &str = "\
herald: a realtime WebSocket gateway

Usage: herald [--config <file.toml>] [--check]

Options:
  -c, --config <file>  TOML configuration (docs/herald.sample.toml lists every key);
                       HERALD_CONFIG names one too
      --check          validate the configuration and exit
  -h, --help           print this help
  -V, --version        print the version

Every key can be set from the environment: HERALD_<KEY>, with __ between
nested keys, e.g. HERALD_LISTEN=127.0.0.1:9000 or
HERALD_WEBSOCKET__PING_INTERVAL=10s. The environment wins over the file.

Without a file or variables, herald listens on 0.0.0.0:8080 (WebSocket and
HTTP) and 0.0.0.0:9090 (gRPC) with the embedded single-pod broker.";

struct Args {
    config: Option<PathBuf>,
    check: bool,
}

fn parse_args() -> Result<Option<Args>, String> {
    let mut args = Args {
        config: None,
        check: false,
    };
    let mut it = std::env::args_os().skip(1);
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
    init_logging(&config, traces.as_ref());
    let served = serve(config, &runtime);
    // After the drain: what the last publishes traced is exported before
    // exit. Blocking here, on the main thread, leaves the runtime's workers
    // free to drive the export.
    if let Some(traces) = traces {
        traces.shutdown();
    }
    match served {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!("{e:#}");
            eprintln!("herald: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// Logs to stderr as `log` says; with `traces`, the spans of
/// [`telemetry::TARGET`] go to the exporter, and never to the log.
fn init_logging(config: &Config, traces: Option<&Tracing>) {
    let mut filter = tracing_subscriber::EnvFilter::new(&config.log.level);
    if let Ok(off) = format!("{}=off", telemetry::TARGET).parse() {
        filter = filter.add_directive(off);
    }
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
}

fn serve(config: Config, runtime: &Runtime) -> anyhow::Result<()> {
    // Each connection is a file descriptor: take all the process may have.
    match rlimit::increase_nofile_limit(u64::MAX) {
        Ok(limit) => tracing::debug!(limit, "file descriptor limit"),
        Err(e) => tracing::warn!(error = %e, "could not raise the file descriptor limit"),
    }
    runtime.block_on(async {
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
        gateway::run(config, listeners, shutdown_signal())
            .await
            .context("starting the broker")?;
        tracing::info!("stopped");
        Ok(())
    })
}

/// Says so at start when what is open could be reached by anyone.
fn warn_if_exposed(config: &Config, api: std::net::SocketAddr, grpc: std::net::SocketAddr) {
    if !config.auth.enabled() {
        tracing::warn!(
            "no [auth] key is configured: any client may subscribe to any topic its namespace \
             allows (open mode; see docs/security.md)"
        );
    }
    if config.http.api_keys.is_empty() {
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
    use tokio::signal::unix::{SignalKind, signal};
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
