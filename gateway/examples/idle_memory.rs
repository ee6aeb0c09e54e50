//! Measures what an idle connection costs the gateway: starts the `herald`
//! binary given as the first argument, opens N connections (default 5,000)
//! that each subscribe to one shared topic, and reports
//! the growth of herald's resident memory per connection.
//!
//! `cargo build --release -p gateway && cargo run --release -p gateway --example idle_memory -- target/release/herald 5000`

use std::process::{Command, Stdio};
use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use tokio_tungstenite::tungstenite::Message;

fn rss_bytes(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024)
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let binary = args
        .next()
        .unwrap_or_else(|| "target/release/herald".into());
    let count: usize = args.next().map_or(Ok(5000), |n| n.parse())?;
    rlimit::increase_nofile_limit(u64::MAX)?;

    let port = std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port();
    let herald = Command::new(&binary)
        .env("HERALD_LISTEN", format!("127.0.0.1:{port}"))
        // Not the default 0.0.0.0:9090, which may be taken.
        .env("HERALD_GRPC__LISTEN", "127.0.0.1:0")
        .env(
            "HERALD_WEBSOCKET__MAX_CONNECTIONS",
            (count + WARM_UP + 10).to_string(),
        )
        .env("HERALD_LOG__LEVEL", "warn")
        .stderr(Stdio::inherit())
        .spawn()
        .map(KillOnDrop)?;
    let url = format!("ws://127.0.0.1:{port}/ws");
    for _ in 0..100 {
        if tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .is_ok()
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // Warm up: the first connections pay for allocator arenas and the runtime.
    let mut clients = Vec::with_capacity(count + WARM_UP);
    for _ in 0..WARM_UP {
        clients.push(open(&url).await?);
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let before = rss_bytes(herald.0.id());
    for _ in 0..count {
        clients.push(open(&url).await?);
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    let after = rss_bytes(herald.0.id());
    let per = (after.saturating_sub(before)) as f64 / count as f64;
    println!(
        "{count} idle connections (subscribed to one topic): herald RSS {:.1} MiB -> {:.1} MiB, {per:.0} bytes per connection",
        before as f64 / 1048576.0,
        after as f64 / 1048576.0
    );
    drop(clients);
    Ok(())
}

const WARM_UP: usize = 100;

/// The gateway, killed however this program ends.
struct KillOnDrop(std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

async fn open(
    url: &str,
) -> anyhow::Result<
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>,
> {
    let (mut ws, _) = tokio_tungstenite::connect_async(url).await?;
    ws.send(Message::text(r#"{"op":"sub","id":1,"topic":"idle"}"#))
        .await?;
    // welcome, then ok
    for _ in 0..2 {
        ws.next().await.ok_or_else(|| anyhow::anyhow!("closed"))??;
    }
    Ok(ws)
}
