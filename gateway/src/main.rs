//! `herald`: reads its command line, loads the configuration, sets up
//! logging and (if configured) trace export, and runs the gateway
//! ([`gateway::process::run`]) until SIGTERM or SIGINT, then flushes the
//! traces. SIGHUP, or an edit of the configuration file, reloads what can
//! change without a restart ([`gateway::reload`]). `herald status` asks a
//! running pod for its [`gateway::admin::Status`].

use std::path::PathBuf;
use std::process::ExitCode;

use clap::error::ErrorKind;
use clap::{ArgAction, Args, Parser, Subcommand};
use gateway::Config;
use gateway::admin::Status;
use gateway::config::{CONFIG_FILE_VAR, EXIT_BAD_CONFIG, LogFormat};
use gateway::process::{self, RunError, SetLevel};
use gateway::telemetry::{self, Tracing};
use router::Causes;
use tracing_subscriber::Layer;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;

/// What `--help` ends with: what the options do not say.
const AFTER_HELP: &str = "\
SIGHUP, or a change of the configuration file (looked at every 2s),
re-reads the configuration: log.level and the API keys (and the
http.api_keys_file, also read again whenever it changes) apply at once;
other changes are logged as needing a restart.

Every key can be set from the environment: HERALD_<KEY>, with __ between
nested keys, e.g. HERALD_LISTEN=127.0.0.1:9000 or
HERALD_WEBSOCKET__PING_INTERVAL=10s. The environment wins over the file.

Without a file or variables, herald listens on 0.0.0.0:8080 (WebSocket and
HTTP) and 0.0.0.0:9090 (gRPC) with the embedded single-pod broker.

Exit codes: 0 done, 1 failed (herald status: no status read), 64 a bad
command line or configuration.";

/// herald: a realtime WebSocket gateway
#[derive(Parser)]
#[command(
    name = "herald",
    version,
    override_usage = "herald [--config <file.toml>] [--check]\n       \
                      herald status [--url <url>] [--key <api key>]",
    after_help = AFTER_HELP,
    flatten_help = true,
    args_conflicts_with_subcommands = true,
    disable_help_subcommand = true,
    disable_help_flag = true,
    disable_version_flag = true
)]
struct Cli {
    /// TOML configuration (docs/herald.sample.toml lists every key);
    /// HERALD_CONFIG names one too
    #[arg(short, long, value_name = "file", verbatim_doc_comment)]
    config: Option<PathBuf>,
    /// validate the configuration and exit
    #[arg(long)]
    check: bool,
    /// print this help
    #[arg(short, long, action = ArgAction::Help)]
    help: Option<bool>,
    /// print the version
    #[arg(short = 'V', long, action = ArgAction::Version)]
    version: Option<bool>,
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Subcommand)]
enum Command {
    /// prints what a running pod holds (GET /v1/admin/status on its API
    /// listener): connections, sessions, topics, its broker's state.
    #[command(verbatim_doc_comment, disable_help_flag = true)]
    Status(StatusArgs),
}

#[derive(Args)]
struct StatusArgs {
    /// the pod's API
    #[arg(long, value_name = "url", default_value = DEFAULT_STATUS_URL)]
    url: String,
    /// an API key (http.api_keys), if the pod has any;
    /// HERALD_API_KEY gives it where `ps` cannot see it
    #[arg(long, value_name = "key", verbatim_doc_comment)]
    key: Option<String>,
    /// print this help
    #[arg(short, long, action = ArgAction::Help)]
    help: Option<bool>,
}

/// Where `herald status` asks by default: a pod on this host, API on `listen`.
const DEFAULT_STATUS_URL: &str = "http://127.0.0.1:8080";

/// The variable `herald status` takes its API key from. (Not a configuration
/// key: the configuration ignores `HERALD_*` variables it does not know.)
const API_KEY_VAR: &str = "HERALD_API_KEY";

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            // Help and version go to stdout, and are no error.
            let _ = e.print();
            return match e.kind() {
                ErrorKind::DisplayHelp | ErrorKind::DisplayVersion => ExitCode::SUCCESS,
                _ => bad_config(),
            };
        }
    };
    if let Some(Command::Status(status)) = cli.command {
        return print_status(status);
    }
    let file = cli
        .config
        .or_else(|| std::env::var_os(CONFIG_FILE_VAR).map(PathBuf::from));
    let config = match Config::load(file.as_deref(), std::env::vars()) {
        Ok(config) => config,
        Err(e) => {
            eprintln!("herald: bad configuration: {e}");
            return bad_config();
        }
    };
    if cli.check {
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
            return bad_config();
        }
    };
    let set_level = init_logging(&config, traces.as_ref());
    let served = runtime.block_on(process::run(config, file, set_level));
    // After the drain: what the last publishes traced is exported before
    // exit. Blocking here, on the main thread, leaves the runtime's workers
    // free to drive the export.
    if let Some(traces) = traces {
        traces.shutdown();
    }
    match served {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            let bad_config = matches!(&e, RunError::Start(start) if start.is_config());
            let e = Causes(&e);
            tracing::error!("{e}");
            eprintln!("herald: {e}");
            if bad_config {
                ExitCode::from(EXIT_BAD_CONFIG as u8)
            } else {
                ExitCode::FAILURE
            }
        }
    }
}

/// Exit 64 (EX_USAGE): the command line or the configuration is wrong.
fn bad_config() -> ExitCode {
    ExitCode::from(u8::try_from(EXIT_BAD_CONFIG).unwrap_or(64))
}

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

/// `herald status`: prints the pod's status, or why it could not be read
/// (exit 1).
fn print_status(args: StatusArgs) -> ExitCode {
    // From the environment unless `--key` says otherwise: a key on the
    // command line is in every `ps` listing.
    let key = args
        .key
        .or_else(|| std::env::var(API_KEY_VAR).ok().filter(|k| !k.is_empty()));
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
    match runtime.block_on(Status::fetch(&args.url, key.as_deref())) {
        Ok(status) => {
            print!("{}", status.render());
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("herald status: {}: {}", args.url, Causes(&e));
            ExitCode::FAILURE
        }
    }
}
