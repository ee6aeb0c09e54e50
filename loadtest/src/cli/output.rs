//! The flags every scenario's result takes: where its JSON goes, and the
//! local processes whose CPU it reports.

use std::path::PathBuf;

use clap::Args;

/// Where the JSON result goes.
#[derive(Debug, Args)]
pub struct Out {
    /// Write the JSON result there.
    #[arg(long, value_name = "FILE")]
    pub out: Option<PathBuf>,
}

/// Local processes to watch.
#[derive(Debug, Args)]
pub struct Watch {
    /// A local process (gateway, redis) whose CPU time to report; repeat for
    /// several. The machine's busy cores and this tool's CPU are always
    /// reported.
    #[arg(long = "watch-pid", value_name = "PID")]
    pub watch_pid: Vec<u32>,
}
