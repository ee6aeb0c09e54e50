//! Why a process could not be started, asked or broken as asked: one error
//! for the whole rig, so that a caller (the load tool's `chaos`, a
//! benchmark run) reports it and the test kit turns it into a failed test.

use std::time::Duration;

/// Why a process could not do what was asked.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The program could not be started at all.
    #[error(
        "cannot run `{program}` ({source}): is it installed? (scripts/test.sh installs redis-server and redis-cli)"
    )]
    Spawn {
        program: String,
        #[source]
        source: std::io::Error,
    },
    /// A program run to completion overran its bound, and was killed.
    #[error("`{program} {args}` did not finish within {timeout:?}")]
    Timeout {
        program: String,
        args: String,
        timeout: Duration,
    },
    /// A file, a directory, a socket.
    #[error("{path}: {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
    /// A process exited before it was ready (its log's last lines).
    #[error("{what} exited with {status} before it was ready: {log}")]
    Exited {
        what: String,
        status: std::process::ExitStatus,
        log: String,
    },
    /// The processes are not, or did not come to be, as asked.
    #[error("{0}")]
    State(String),
}

/// An [`Error::State`].
pub(crate) fn state(what: impl Into<String>) -> Error {
    Error::State(what.into())
}

/// An [`Error::Io`] about `path`.
pub(crate) fn io(path: impl std::fmt::Display) -> impl FnOnce(std::io::Error) -> Error {
    let path = path.to_string();
    move |source| Error::Io { path, source }
}
