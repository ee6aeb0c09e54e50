//! A pod that starts while its Redis is away: it runs, says on `/readyz` why
//! it is not ready, refuses clients and publishes meanwhile, and is ready
//! about a second after Redis comes back, without a restart. (Before, it
//! exited, and during an outage new pods crash-looped and backed off for
//! minutes after Redis returned.)

use std::time::Duration;

use serde_json::{Value, json};
use testkit::http::get;
use testkit::sentinel::{MASTER_NAME, SentinelGroup};
use testkit::{Client, Herald, Redis, WAIT, eventually};
use tokio::time::Instant;
use tokio_tungstenite::tungstenite;

use crate::pod::HERALD;

/// How long Redis stays away after the pod's first attempts (the scenario,
/// not a wait for an event).
const OUTAGE: Duration = Duration::from_secs(4);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_started_without_redis_waits_not_ready_and_serves_once_redis_is_up() {
    // A port nobody listens on: Redis's, once it starts.
    let mut redis = Redis::start().await;
    redis.stop();
    let url = redis.url();
    let herald = Herald::start_live(
        HERALD,
        &[
            ("HERALD_BROKER", "redis"),
            ("HERALD_REDIS__URL", &url),
            ("HERALD_REDIS__COMMAND_TIMEOUT", "500ms"),
        ],
        &[],
    )
    .await;

    // Not ready, and why: where it connects, and what went wrong.
    let target = format!("redis: connecting to 127.0.0.1:{}: ", redis.port);
    let why = eventually(WAIT, || async {
        match get(herald.addr, "/readyz").await {
            Ok((503, body)) if body.starts_with(&target) => Ok(body),
            other => Err(format!("expected 503 `{target}...`, got {other:?}")),
        }
    })
    .await;
    assert!(why.contains("refused"), "{why}");

    // Clients are refused before the upgrade, with the reason.
    let refused = tokio::time::timeout(WAIT, tokio_tungstenite::connect_async(herald.ws_url()))
        .await
        .expect("an answer in time");
    match refused {
        Err(tungstenite::Error::Http(response)) => {
            assert_eq!(response.status(), 503);
            let body = String::from_utf8_lossy(response.body().as_deref().unwrap_or_default());
            assert!(
                body.starts_with("not ready: redis: connecting to"),
                "{body}"
            );
        }
        Ok(_) => panic!("a pod without Redis took a client"),
        Err(e) => panic!("expected an HTTP refusal, got {e}"),
    }
    // Publishes fail at once, as `unavailable`.
    let body = json!({"topic": "news", "data": 1}).to_string();
    let started = Instant::now();
    let (status, answer) =
        testkit::http(herald.addr, "POST", "/v1/publish", &[], body.as_bytes()).await;
    assert_eq!(status, 503, "{answer}");
    let answer: Value = serde_json::from_str(&answer).expect("JSON");
    assert_eq!(answer["code"], "unavailable", "{answer}");
    // Saying why, down to what the last attempt met.
    let message = answer["message"].as_str().unwrap_or_default();
    assert!(
        message.starts_with(&format!("broker unavailable: {target}")),
        "{answer}"
    );
    assert!(started.elapsed() < Duration::from_millis(400), "fails fast");
    // Still running: no exit, no restart.
    assert_eq!(get(herald.addr, "/healthz").await.expect("live").0, 200);

    // An outage long enough for the retries to back off to their longest:
    // the pod must still be back about a second after Redis is. (Backing
    // off to 5 s, as reconnects did before, it took up to 5 s more.)
    tokio::time::sleep(OUTAGE).await;
    redis.restart_empty().await;
    let back = Instant::now();
    eventually(WAIT, || async {
        matches!(get(herald.addr, "/readyz").await, Ok((200, _)))
    })
    .await;
    let after = back.elapsed();
    eprintln!("ready {after:?} after Redis answered");
    assert!(
        after < Duration::from_secs(2),
        "ready only {after:?} after Redis"
    );

    // And serves: a subscriber gets a publish.
    let mut client = Client::subscriber(&herald.ws_url(), "news").await;
    let (status, answer) =
        testkit::http(herald.addr, "POST", "/v1/publish", &[], body.as_bytes()).await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(client.msg().await, ("news".into(), 1, json!(1)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_sentinel_a_pod_whose_master_is_down_waits_not_ready_and_serves_once_it_is_up() {
    let mut group = SentinelGroup::start().await;
    // Nothing to promote: the sentinels keep naming the master that is down.
    group.replica.stop();
    group.master.stop();
    let addresses = group.addresses().join(",");
    let herald = Herald::start_live(
        HERALD,
        &[
            ("HERALD_BROKER", "redis"),
            ("HERALD_REDIS__URL", "redis://127.0.0.1"),
            ("HERALD_REDIS__SENTINEL__MASTER_NAME", MASTER_NAME),
            ("HERALD_REDIS__SENTINEL__ADDRESSES", &addresses),
            ("HERALD_REDIS__COMMAND_TIMEOUT", "500ms"),
        ],
        &[],
    )
    .await;
    // Why, naming the sentinels and the node they named.
    let target = format!("redis: connecting to master `{MASTER_NAME}` of the sentinels ");
    let node = format!("127.0.0.1:{}", group.master.port);
    eventually(WAIT, || async {
        match get(herald.addr, "/readyz").await {
            Ok((503, body)) if body.starts_with(&target) && body.contains(&node) => Ok(()),
            other => Err(format!(
                "expected 503 `{target}...{node}...`, got {other:?}"
            )),
        }
    })
    .await;

    group.master.restart_empty().await;
    eventually(WAIT, || async {
        matches!(get(herald.addr, "/readyz").await, Ok((200, _)))
    })
    .await;
    let mut client = Client::subscriber(&herald.ws_url(), "news").await;
    let body = json!({"topic": "news", "data": 1}).to_string();
    let (status, answer) =
        testkit::http(herald.addr, "POST", "/v1/publish", &[], body.as_bytes()).await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(client.msg().await, ("news".into(), 1, json!(1)));
}
