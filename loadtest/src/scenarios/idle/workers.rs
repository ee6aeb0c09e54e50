//! The worker processes: what one is told ([`Worker`], its command line),
//! what it does ([`work`], the hidden command) and says ([`Report`]), and
//! the handle [`run`](super::run) keeps on each ([`Part`]). Its own module:
//! the protocol between this process and its workers, both ends of it.

use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, ChildStdin, ChildStdout, Command};

use super::{COMPRESSION, Tally, WORKER_COMMAND, WORKER_GRACE, hold};
use crate::streams::Transport;
use crate::{Error, Target};

/// What one worker process is told to do (the hidden command's options).
#[derive(Debug, Clone, PartialEq)]
pub struct Worker {
    pub gateways: Vec<Target>,
    /// Its first client's number: it decides the gateway and source address.
    pub first: usize,
    pub clients: usize,
    pub topic: String,
    /// Stops by itself this long after connecting if not told to before.
    pub max_hold: Duration,
    pub transport: Transport,
    /// Its clients offer permessage-deflate.
    pub compression: bool,
}

impl Worker {
    /// Its command line (after the program name).
    pub fn args(&self) -> Vec<String> {
        let mut args = vec![WORKER_COMMAND.to_owned()];
        for g in &self.gateways {
            args.extend(["--gateway".to_owned(), g.ws_url()]);
        }
        args.extend([
            "--first".to_owned(),
            self.first.to_string(),
            "--clients".to_owned(),
            self.clients.to_string(),
            "--topic".to_owned(),
            self.topic.clone(),
            "--max-hold".to_owned(),
            format!("{}ms", self.max_hold.as_millis()),
            "--transport".to_owned(),
            self.transport.name().to_owned(),
        ]);
        if self.compression {
            args.push("--compression".to_owned());
        }
        args
    }
}

/// What a worker says, one JSON line each, on its stdout.
#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub(super) enum Report {
    /// Every client connected and subscribed; holding.
    Connected,
    Failed {
        error: String,
    },
    /// Told to stop (a line or EOF on stdin): what happened meanwhile.
    Done(Tally),
}

/// The hidden command: holds a share of a run's clients for the process
/// that started it (see the module docs).
pub async fn work(worker: Worker) -> Result<(), Error> {
    COMPRESSION.store(worker.compression, Ordering::Relaxed);
    let holding = match hold(
        &worker.gateways,
        worker.first,
        worker.clients,
        &worker.topic,
        worker.transport,
    )
    .await
    {
        Ok(h) => h,
        Err(e) => {
            say(&Report::Failed {
                error: e.to_string(),
            })
            .await;
            return Err(e);
        }
    };
    say(&Report::Connected).await;
    let mut stdin = BufReader::new(tokio::io::stdin());
    let mut line = String::new();
    // A line or EOF (the parent went) ends the hold; so does the deadline.
    let _ = tokio::time::timeout(worker.max_hold, stdin.read_line(&mut line)).await;
    say(&Report::Done(holding.finish())).await;
    Ok(())
}

async fn say(report: &Report) {
    let mut line = serde_json::to_string(report).unwrap_or_default();
    line.push('\n');
    let mut stdout = tokio::io::stdout();
    let _ = stdout.write_all(line.as_bytes()).await;
    let _ = stdout.flush().await;
}

/// A worker process started by [`run`](super::run).
pub(super) struct Part {
    pub(super) child: Child,
    stdin: ChildStdin,
    lines: tokio::io::Lines<BufReader<ChildStdout>>,
}

impl Part {
    pub(super) fn start(program: &PathBuf, worker: &Worker) -> Result<Self, Error> {
        let fail = |reason: String| Error::Worker(format!("starting: {reason}"));
        let mut child = Command::new(program)
            .args(worker.args())
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| fail(format!("{}: {e}", program.display())))?;
        let (Some(stdin), Some(stdout)) = (child.stdin.take(), child.stdout.take()) else {
            return Err(fail("no pipes".to_owned()));
        };
        Ok(Self {
            child,
            stdin,
            lines: BufReader::new(stdout).lines(),
        })
    }

    /// The worker's next report, within `within`.
    pub(super) async fn report(&mut self, within: Duration) -> Result<Report, Error> {
        let fail = |reason: String| Error::Worker(reason);
        match tokio::time::timeout(within, self.lines.next_line()).await {
            Err(_) => Err(fail(format!("no word within {within:?}"))),
            Ok(Err(e)) => Err(fail(e.to_string())),
            Ok(Ok(None)) => Err(fail("exited early".to_owned())),
            Ok(Ok(Some(line))) => serde_json::from_str(&line)
                .map_err(|e| fail(format!("said `{line}`, not understood: {e}"))),
        }
    }

    /// Tells it to stop and reads its tally.
    pub(super) async fn finish(mut self) -> Result<Tally, Error> {
        let _ = self.stdin.write_all(b"stop\n").await;
        let _ = self.stdin.flush().await;
        let report = self.report(WORKER_GRACE).await;
        let _ = tokio::time::timeout(WORKER_GRACE, self.child.wait()).await;
        match report? {
            Report::Done(tally) => Ok(tally),
            other => Err(Error::Worker(format!("said {other:?} when told to stop"))),
        }
    }
}
