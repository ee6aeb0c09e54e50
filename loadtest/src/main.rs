//! `herald-loadtest`: reads the command line, runs one scenario, prints its
//! table and writes its JSON result; or renders BENCHMARKS.md from the
//! results (`report`). See
//! `herald-loadtest --help`.

use std::path::Path;
use std::process::ExitCode;

use anyhow::Context;
use clap::Parser;
use clap::error::ErrorKind;
use loadtest::bench;
use loadtest::cli::{Cli, Command, EXIT_USAGE};
use loadtest::proxy::{self, Faults, Proxy};
use loadtest::report::{self, Outcome};
use loadtest::scenarios::{
    chaos, fanout, floor, formats, hooks, idle, pods, presence, publish, slow, sse_failover, stall,
    storm, throughput, wire,
};

/// Exit code when a figure that must be zero was not.
const EXIT_FAILED: u8 = 1;
/// Exit code when the scenario could not run.
const EXIT_ERROR: u8 = 2;

fn main() -> ExitCode {
    let command = match Cli::try_parse() {
        Ok(cli) => cli.command,
        Err(e) => {
            let _ = e.print();
            return match e.kind() {
                ErrorKind::DisplayHelp
                | ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand
                | ErrorKind::DisplayVersion => ExitCode::SUCCESS,
                _ => ExitCode::from(EXIT_USAGE),
            };
        }
    };
    match run(command) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(EXIT_FAILED),
        Err(e) => {
            eprintln!("herald-loadtest: {e:#}");
            ExitCode::from(EXIT_ERROR)
        }
    }
}

/// Runs the scenario; whether it passed.
fn run(command: Command) -> anyhow::Result<bool> {
    if let Command::Report { dir, criterion } = &command {
        // No runtime: it reads files.
        let results = report::Results::read(dir, criterion)?;
        print!("{}", report::render(&results));
        return Ok(true);
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the runtime")?;
    runtime.block_on(async {
        match command {
            Command::Report { .. } => Ok(true),
            Command::Run(args) => {
                // Ctrl-C ends the run; its servers and scenario die with it
                // (each child is killed when its handle drops).
                tokio::select! {
                    passed = bench::run(args.run()) => Ok(passed?),
                    _ = tokio::signal::ctrl_c() => anyhow::bail!("{}: interrupted", args.name),
                }
            }
            Command::Pods(args) => {
                let outcome = pods::run(args.options()).await.context("pods")?;
                emit(&outcome, args.spread.out.out.as_deref())
            }
            Command::Publish(args) => {
                let outcome = publish::run(args.options()).await.context("publish")?;
                emit(&outcome, args.out.out.as_deref())
            }
            Command::Fanout(args) => {
                let options = args.options().context("finding this program for --floor")?;
                let outcome = fanout::run(options).await.context("fanout")?;
                emit(&outcome, args.rounds.spread.out.out.as_deref())
            }
            Command::Slow(args) => {
                let outcome = slow::run(args.options()).await.context("slow")?;
                emit(&outcome, args.rounds.spread.out.out.as_deref())
            }
            Command::Floor(args) => {
                let options = args
                    .options()
                    .context("finding this program for the readers")?;
                let outcome = floor::run(options).await.context("floor")?;
                emit(&outcome, args.out.out.as_deref())
            }
            Command::FloorReaders(args) => {
                // The writer reads these two lines from our stdout.
                let report = floor::readers(args.readers(), || println!("ready"))
                    .await
                    .context("floor readers")?;
                println!("{}", serde_json::to_string(&report).context("the report")?);
                Ok(true)
            }
            Command::Idle(args) => {
                let outcome = idle::run(args.options()).await.context("idle")?;
                emit(&outcome, args.out.out.as_deref())
            }
            Command::IdleWorker(args) => {
                idle::work(args.worker()).await.context("idle worker")?;
                Ok(true)
            }
            Command::Throughput(args) => {
                let outcome = throughput::run(args.options())
                    .await
                    .context("throughput")?;
                emit(&outcome, args.out.out.as_deref())
            }
            Command::Wire(args) => {
                let outcome = wire::run(args.options()).await.context("wire")?;
                emit(&outcome, args.out.out.as_deref())
            }
            Command::Formats(args) => {
                let outcome = formats::run(args.options()).await.context("formats")?;
                emit(&outcome, args.out.out.as_deref())
            }
            Command::Chaos(args) => {
                // Ctrl-C ends the run; its processes die with the runtime
                // (each child is killed when its handle drops).
                let outcome = tokio::select! {
                    outcome = chaos::run(args.options()) => outcome.context("chaos")?,
                    _ = tokio::signal::ctrl_c() => anyhow::bail!("chaos: interrupted"),
                };
                emit(&outcome, args.out.out.as_deref())
            }
            Command::Presence(args) => {
                // Ctrl-C ends the run; its pods and Redis die with it.
                let outcome = tokio::select! {
                    outcome = presence::run(args.options()) => outcome.context("presence")?,
                    _ = tokio::signal::ctrl_c() => anyhow::bail!("presence: interrupted"),
                };
                emit(&outcome, args.out.out.as_deref())
            }
            Command::Hooks(args) => {
                // Ctrl-C ends the run; its pods and backend die with it.
                let outcome = tokio::select! {
                    outcome = hooks::run(args.options()) => outcome.context("hooks")?,
                    _ = tokio::signal::ctrl_c() => anyhow::bail!("hooks: interrupted"),
                };
                emit(&outcome, args.out.out.as_deref())
            }
            Command::Storm(args) => {
                let outcome = storm::run(args.options()).await.context("storm")?;
                emit(&outcome, args.out.out.as_deref())
            }
            Command::SseFailover(args) => {
                let outcome = sse_failover::run(args.options())
                    .await
                    .context("sse-failover")?;
                emit(&outcome, args.out.out.as_deref())
            }
            Command::Stall(args) => {
                let outcome = stall::run(args.options()).await.context("stall")?;
                emit(&outcome, args.out.out.as_deref())
            }
            Command::Proxy(args) => {
                let faults = Faults {
                    delay: args.delay.into(),
                    ..Faults::default()
                };
                let proxy = Proxy::start(args.listen, args.upstream, faults)
                    .with_context(|| format!("listening on {}", args.listen))?;
                let control = tokio::net::TcpListener::bind(args.control)
                    .await
                    .with_context(|| format!("listening on {}", args.control))?;
                println!(
                    "proxy {} -> {}, control {}: {}",
                    proxy.addr(),
                    args.upstream,
                    args.control,
                    proxy::describe(&proxy.faults())
                );
                tokio::select! {
                    served = proxy::control(control, &proxy) => served.context("the control port")?,
                    _ = tokio::time::sleep(args.run_for.into()) => {}
                }
                Ok(true)
            }
        }
    })
}

/// Prints the table, writes the JSON file if asked; whether the run passed.
fn emit<T: Outcome>(outcome: &T, out: Option<&Path>) -> anyhow::Result<bool> {
    print!("{}", report::table(outcome));
    if let Some(path) = out {
        report::write_json(path, outcome)?;
        println!("  result: {}", path.display());
    }
    Ok(outcome.failures().is_empty())
}
