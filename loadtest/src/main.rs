//! `herald-loadtest`: reads the command line, runs one scenario, prints its
//! table and writes its JSON result. See `herald-loadtest --help`.

use std::path::Path;
use std::process::ExitCode;

use anyhow::Context;
use loadtest::cli::{self, Command, EXIT_USAGE, USAGE};
use loadtest::report::{self, Outcome};
use loadtest::scenarios::{fanout, floor, idle, pods, publish, slow, storm, throughput, wire};

/// Exit code when a figure that must be zero was not.
const EXIT_FAILED: u8 = 1;
/// Exit code when the scenario could not run.
const EXIT_ERROR: u8 = 2;

fn main() -> ExitCode {
    let args: Vec<String> = match std::env::args_os()
        .skip(1)
        .map(|a| a.into_string())
        .collect()
    {
        Ok(args) => args,
        Err(a) => {
            eprintln!("herald-loadtest: argument {a:?} is not UTF-8");
            return ExitCode::from(EXIT_USAGE);
        }
    };
    let command = match cli::parse(args) {
        Ok(Command::Help) => {
            println!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        Ok(command) => command,
        Err(e) => {
            eprintln!("herald-loadtest: {e}; see --help");
            return ExitCode::from(EXIT_USAGE);
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
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the runtime")?;
    runtime.block_on(async {
        match command {
            Command::Help => Ok(true),
            Command::Pods { options, out } => {
                let outcome = pods::run(options).await.context("pods")?;
                emit(&outcome, out.as_deref())
            }
            Command::Publish { options, out } => {
                let outcome = publish::run(options).await.context("publish")?;
                emit(&outcome, out.as_deref())
            }
            Command::Fanout { options, out } => {
                let outcome = fanout::run(options).await.context("fanout")?;
                emit(&outcome, out.as_deref())
            }
            Command::Slow { options, out } => {
                let outcome = slow::run(options).await.context("slow")?;
                emit(&outcome, out.as_deref())
            }
            Command::Floor { options, out } => {
                let outcome = floor::run(options).await.context("floor")?;
                emit(&outcome, out.as_deref())
            }
            Command::FloorReaders(readers) => {
                // The writer reads these two lines from our stdout.
                let report = floor::readers(readers, || println!("ready"))
                    .await
                    .context("floor readers")?;
                println!("{}", serde_json::to_string(&report).context("the report")?);
                Ok(true)
            }
            Command::Idle { options, out } => {
                let outcome = idle::run(options).await.context("idle")?;
                emit(&outcome, out.as_deref())
            }
            Command::IdleWorker(worker) => {
                idle::work(worker).await.context("idle worker")?;
                Ok(true)
            }
            Command::Throughput { options, out } => {
                let outcome = throughput::run(options).await.context("throughput")?;
                emit(&outcome, out.as_deref())
            }
            Command::Wire { options, out } => {
                let outcome = wire::run(options).await.context("wire")?;
                emit(&outcome, out.as_deref())
            }
            Command::Storm { options, out } => {
                let outcome = storm::run(options).await.context("storm")?;
                emit(&outcome, out.as_deref())
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
