//! Measures what an idle connection costs the gateway: starts the `herald`
//! binary given as the first argument, opens N connections (default 5,000)
//! that each subscribe to one shared topic, and reports
//! the growth of herald's resident memory per connection. With `auth` as the
//! third argument herald checks tokens (HS256) and every client says `hello`
//! with a token of its own user first, so the figure includes its claims.
//!
//! `cargo build --release -p gateway && cargo run --release -p gateway --example idle_memory -- target/release/herald 5000 [auth]`

#![allow(clippy::unwrap_used, clippy::expect_used)] // a test: a failed expectation is the failure

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
    let auth = args.next().as_deref() == Some("auth");
    rlimit::increase_nofile_limit(u64::MAX)?;

    let port = std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port();
    let mut herald = Command::new(&binary);
    if auth {
        herald.env("HERALD_AUTH__HMAC_SECRET", SECRET);
    }
    let herald = herald
        .env("HERALD_LISTEN", format!("127.0.0.1:{port}"))
        // Every client comes from 127.0.0.1.
        .env("HERALD_WEBSOCKET__MAX_CONNECTIONS_PER_IP", "0")
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
    let token = |i: usize| auth.then(|| token(i));
    for i in 0..WARM_UP {
        clients.push(open(&url, token(i)).await?);
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let before = rss_bytes(herald.0.id());
    for i in 0..count {
        clients.push(open(&url, token(WARM_UP + i)).await?);
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    let after = rss_bytes(herald.0.id());
    let per = (after.saturating_sub(before)) as f64 / count as f64;
    let (before_mib, after_mib) = (before as f64 / 1048576.0, after as f64 / 1048576.0);
    let with = if auth { ", each with a token" } else { "" };
    println!(
        "{count} idle connections (subscribed to one topic{with}): herald RSS {before_mib:.1} MiB -> {after_mib:.1} MiB, {per:.0} bytes per connection"
    );
    drop(clients);
    Ok(())
}

const WARM_UP: usize = 100;
/// The HMAC secret herald checks tokens with, with `auth`.
const SECRET: &str = "idle-memory-probe-secret-of-at-least-32-bytes";

/// A token for user `user-<i>`, valid for an hour, granting the probe's topic.
fn token(i: usize) -> String {
    let exp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
        + 3600;
    let claims = serde_json::json!({"sub": format!("user-{i}"), "exp": exp, "subscribe": ["idle"]});
    jsonwebtoken::EncodingKey::from_secret(SECRET.as_bytes())
        .and_then(|key| jsonwebtoken::encode(&jsonwebtoken::Header::default(), &claims, &key))
        .unwrap_or_default()
}

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
    token: Option<String>,
) -> anyhow::Result<
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>,
> {
    let (mut ws, _) = tokio_tungstenite::connect_async(url).await?;
    if let Some(token) = token {
        let hello = serde_json::json!({"op": "hello", "token": token});
        ws.send(Message::text(hello.to_string())).await?;
    }
    ws.send(Message::text(r#"{"op":"sub","id":1,"topic":"idle"}"#))
        .await?;
    // welcome, then ok
    for _ in 0..2 {
        ws.next().await.ok_or_else(|| anyhow::anyhow!("closed"))??;
    }
    Ok(ws)
}
