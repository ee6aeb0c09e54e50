//! The readers' process, both ends of it: what it is told ([`Readers`],
//! its command line), what it does ([`readers`]: the readers connected,
//! then read until the writer closes them) and reports
//! ([`ReadersReport`]), and the writer's handle on it
//! ([`ReadersProcess`]). Its own module: the second process and the
//! exchange with it, apart from the writer thread this scenario measures.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Child, Stdio};
use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;

use super::{EXIT_WAIT, GREETING, Options, READERS_COMMAND};
use crate::Error;
use crate::clients::{self, CONNECT_TIMEOUT, End, FD_MARGIN, Subscriber, client_failure};
use crate::scenarios::fanout::engine::{self, Tally};
use crate::scenarios::fanout::{Round, Stats};

/// What the readers' process reports, as one line of JSON.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ReadersReport {
    pub connect_s: f64,
    pub tally: Tally,
    pub failed: u64,
    pub first_failure: Option<String>,
    pub stats: Stats,
    pub per_round: Vec<Round>,
}

/// The readers' side (`herald-loadtest __floor-readers`).
#[derive(Debug, Clone, PartialEq)]
pub struct Readers {
    /// The writer's listener.
    pub connect: SocketAddr,
    pub clients: usize,
    /// Rounds in all, warm-up included.
    pub rounds: usize,
    pub warmup: usize,
    /// When to stop reading, however far the rounds got.
    pub deadline: Duration,
}

impl Readers {
    /// The command line that starts them (the program's name left out).
    pub fn args(&self) -> Vec<String> {
        vec![
            READERS_COMMAND.to_owned(),
            "--connect".to_owned(),
            self.connect.to_string(),
            "--clients".to_owned(),
            self.clients.to_string(),
            "--rounds".to_owned(),
            self.rounds.to_string(),
            "--warmup".to_owned(),
            self.warmup.to_string(),
            "--deadline".to_owned(),
            format!("{}ms", self.deadline.as_millis()),
        ]
    }
}

/// The readers' process, killed if dropped before it finished.
pub(super) struct ReadersProcess {
    child: Option<Child>,
    lines: mpsc::UnboundedReceiver<String>,
}

impl ReadersProcess {
    pub(super) fn spawn(options: &Options, addr: SocketAddr) -> Result<Self, Error> {
        let readers = Readers {
            connect: addr,
            clients: options.clients,
            rounds: options.total(),
            warmup: options.warmup,
            deadline: options.readers_deadline(),
        };
        let mut child = std::process::Command::new(&options.readers_exe)
            .args(readers.args())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .map_err(|e| {
                Error::Options(format!(
                    "floor: starting the readers ({}): {e}",
                    options.readers_exe.display()
                ))
            })?;
        // Lines from its stdout, read by a thread of their own (the pipe is
        // blocking); the thread ends at the pipe's end.
        let (tx, lines) = mpsc::unbounded_channel();
        if let Some(stdout) = child.stdout.take() {
            std::thread::spawn(move || {
                for line in BufReader::new(stdout).lines() {
                    let Ok(line) = line else { break };
                    if tx.send(line).is_err() {
                        break;
                    }
                }
            });
        }
        Ok(Self {
            child: Some(child),
            lines,
        })
    }

    /// Its next line; `None` once its stdout is closed.
    pub(super) async fn line(&mut self) -> Option<String> {
        self.lines.recv().await
    }

    /// Reaps it: it exits after its report, or is killed after [`EXIT_WAIT`].
    pub(super) async fn finish(mut self) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        let deadline = Instant::now() + EXIT_WAIT;
        // std's `Child` has no awaitable exit: look every few milliseconds.
        while matches!(child.try_wait(), Ok(None)) && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let _ = child.kill();
        let _ = child.wait();
    }
}

impl Drop for ReadersProcess {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// The readers' process: connects `clients` readers to the writer, calls
/// `ready` once all read, and reads until the writer closes them all (or
/// the deadline).
pub async fn readers(options: Readers, ready: impl FnOnce()) -> Result<ReadersReport, Error> {
    clients::raise_fd_limit(options.clients as u64 + FD_MARGIN)?;
    let target = options.connect;
    if !target.ip().is_loopback() {
        return Err(Error::Options(format!(
            "floor-readers: {target} is not loopback"
        )));
    }
    let deadline = Instant::now() + options.deadline;
    let connecting = Instant::now();
    let subscribers = clients::open_all(options.clients, move |client| async move {
        let source = clients::source_addr(target.ip(), client);
        let fail = client_failure(client, source, target);
        let stream = tokio::time::timeout(CONNECT_TIMEOUT, clients::connect(source, target))
            .await
            .map_err(|_| fail(format!("not connected within {CONNECT_TIMEOUT:?}")))?
            .map_err(|e| fail(clients::describe(&e)))?;
        let mut reader = Subscriber::raw(client, stream).await;
        tokio::time::timeout(CONNECT_TIMEOUT, reader.greeted(GREETING))
            .await
            .map_err(|_| fail(format!("not greeted within {CONNECT_TIMEOUT:?}")))?
            .map_err(fail)?;
        Ok(reader)
    })
    .await?;
    let connect_s = connecting.elapsed().as_secs_f64();
    let progress = Arc::new(AtomicU64::new(0));
    let (stop, stopped) = watch::channel(false);
    let handles: Vec<_> = subscribers
        .into_iter()
        .map(|s| tokio::spawn(s.read(options.rounds, progress.clone(), stopped.clone())))
        .collect();
    ready();
    // The deadline bounds the wait; the readers end when the writer closes.
    let timer = tokio::spawn(async move {
        tokio::time::sleep_until(deadline).await;
        let _ = stop.send(true);
    });
    let mut received = Vec::with_capacity(handles.len());
    for handle in handles {
        match handle.await {
            Ok(r) => received.push(r),
            Err(e) => std::panic::resume_unwind(e.into_panic()),
        }
    }
    timer.abort();
    let failures: Vec<&str> = received
        .iter()
        .filter_map(|r| match &r.end {
            End::Failed(e) => Some(e.as_str()),
            _ => None,
        })
        .collect();
    let all = |_, _| true;
    Ok(ReadersReport {
        connect_s,
        tally: engine::tally(&received, all),
        failed: failures.len() as u64,
        first_failure: failures.first().map(|f| (*f).to_owned()),
        stats: engine::stats(&received, options.warmup..options.rounds, all),
        per_round: engine::per_round(&received, options.rounds, options.warmup, all),
    })
}
