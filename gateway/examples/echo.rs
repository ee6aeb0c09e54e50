//! A WebSocket echo server over Herald's own connection code (its frame
//! reader, outgoing queue and writer: `gateway::session::echo`), for
//! conformance suites such as Autobahn|Testsuite's fuzzingclient; see
//! docs/conformance.md.
//!
//! `cargo run -p gateway --example echo -- [ADDRESS]` (default
//! 127.0.0.1:9001; port 0 picks one). Prints `listening on ADDRESS` once it
//! accepts connections. Any path upgrades.

#![allow(clippy::unwrap_used, clippy::expect_used)] // a test: a failed expectation is the failure

use std::time::Duration;

use gateway::Config;
use gateway::session::echo::Echo;
use tokio::net::TcpListener;

const DEFAULT_ADDRESS: &str = "127.0.0.1:9001";
/// Autobahn's largest messages are 16 MiB (cases 9.1.6, 9.2.6); Herald's
/// default limit is 64 KiB.
const MAX_MESSAGE_BYTES: usize = 16 << 20;
/// Its slowest message: 1 MiB sent in 64-byte chunks (case 9.5.1).
const MESSAGE_TIMEOUT: Duration = Duration::from_secs(120);
/// Heartbeat pings are Herald's business, not the echo's.
const PING_INTERVAL: Duration = Duration::from_secs(3600);

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let address = std::env::args()
        .nth(1)
        .unwrap_or_else(|| DEFAULT_ADDRESS.into());
    let mut config = Config::default();
    config.websocket.max_message_bytes = MAX_MESSAGE_BYTES;
    config.websocket.message_timeout = MESSAGE_TIMEOUT;
    config.websocket.ping_interval = PING_INTERVAL;
    // permessage-deflate, offered by 12.* and 13.*: every echo compressed
    // (kosoku 0.1.0 mishandles an uncompressed text echo on a compressed
    // connection; see tests/it/conformance.rs).
    config.websocket.compression.enabled = true;
    config.websocket.compression.min_bytes = 0;
    let listener = TcpListener::bind(&address).await?;
    println!("listening on {}", listener.local_addr()?);
    Echo::new(&config).run(listener).await?;
    Ok(())
}
