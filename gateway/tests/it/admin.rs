//! Asking a pod what it holds: `GET /v1/admin/status` on the API listener
//! (with an API key, like every `/v1` route), and `herald status`, which
//! prints it for a person. The pod's name is the one Kubernetes gave it,
//! here and in Redis's load table.

use std::process::Command;

use serde_json::Value;
use testkit::{Client, Herald, Redis, WAIT, eventually};

use crate::pod::HERALD;

async fn status(herald: &Herald, key: Option<&str>) -> (u16, String) {
    let auth = key.map(|k| format!("Bearer {k}"));
    let headers: Vec<(&str, &str)> = auth
        .as_deref()
        .map(|a| ("authorization", a))
        .into_iter()
        .collect();
    testkit::http(herald.addr, "GET", "/v1/admin/status", &headers, b"").await
}

/// Runs `herald status` with `args` and `env`: exit code, stdout, stderr.
async fn herald_status(
    args: Vec<String>,
    env: &[(&'static str, &'static str)],
) -> (Option<i32>, String, String) {
    let env = env.to_vec();
    let output = tokio::task::spawn_blocking(move || {
        Command::new(HERALD)
            .arg("status")
            .args(&args)
            .env_remove("HERALD_API_KEY")
            .envs(env)
            .output()
            .expect("run herald status")
    })
    .await
    .expect("joined");
    (
        output.status.code(),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_tells_what_it_holds_to_a_backend_with_a_key_and_to_herald_status() {
    let redis = Redis::start().await;
    let herald = Herald::pod(
        HERALD,
        &redis.url(),
        &[
            ("HERALD_HTTP__API_KEYS", "k1"),
            ("HERALD_POD_NAME", "herald-7d9f-x2k4p"),
            ("HERALD_REBALANCE__ENABLED", "true"),
            ("HERALD_REBALANCE__INTERVAL", "100ms"),
        ],
    )
    .await;
    let mut client = Client::connect_url(&herald.ws_url()).await;
    client.hello(None).await;
    client.sub(1, "news").await;
    client.sub(2, "chat").await;

    assert_eq!(status(&herald, None).await.0, 401);
    assert_eq!(status(&herald, Some("k2")).await.0, 401);
    let (code, body) = status(&herald, Some("k1")).await;
    assert_eq!(code, 200, "{body}");
    let status: Value = serde_json::from_str(&body).expect("JSON");
    assert_eq!(status["pod"], "herald-7d9f-x2k4p", "{status}");
    assert_eq!(status["version"], env!("CARGO_PKG_VERSION"));
    assert_eq!(
        (&status["ready"], &status["draining"]),
        (&true.into(), &false.into())
    );
    assert_eq!(status["connections"], 1, "{status}");
    assert_eq!(status["sessions"], 1, "{status}");
    assert_eq!(status["topics"], 2, "{status}");
    assert_eq!(status["subscriptions"], 2, "{status}");
    assert_eq!(status["broker"]["kind"], "redis", "{status}");
    assert_eq!(status["broker"]["connected"], true, "{status}");
    assert_eq!(status["broker"]["pubsub_backlog"], 0, "{status}");
    assert!(status["broker"]["lineage_clock"].is_u64(), "{status}");

    // The same, for a person.
    let url = herald.http_url();
    let (code, stdout, stderr) = herald_status(
        vec!["--url".into(), url.clone(), "--key".into(), "k1".into()],
        &[],
    )
    .await;
    assert_eq!(code, Some(0), "{stderr}");
    for line in [
        "pod            herald-7d9f-x2k4p (herald ",
        "state          ready",
        "connections    1",
        "sessions       1",
        "topics         2",
        "subscriptions  2",
        "broker         redis: connected, pub/sub backlog 0, lineage clock ",
    ] {
        assert!(stdout.contains(line), "`{line}` in:\n{stdout}");
    }
    let (code, _, stderr) = herald_status(vec!["--url".into(), url.clone()], &[]).await;
    assert_eq!(code, Some(1));
    assert!(stderr.contains("HTTP 401"), "{stderr}");
    // The key from the environment, out of `ps`'s sight; `--key` wins.
    let (code, stdout, stderr) = herald_status(
        vec!["--url".into(), url.clone()],
        &[("HERALD_API_KEY", "k1")],
    )
    .await;
    assert_eq!(code, Some(0), "{stderr}");
    assert!(stdout.contains("connections    1"), "{stdout}");
    let (code, _, stderr) = herald_status(
        vec!["--url".into(), url, "--key".into(), "k2".into()],
        &[("HERALD_API_KEY", "k1")],
    )
    .await;
    assert_eq!(code, Some(1));
    assert!(stderr.contains("HTTP 401"), "{stderr}");

    // Its name, not random hex, in the load table the pods compare.
    eventually(WAIT, || async {
        redis.cli(&["HKEYS", "herald:pods"]).trim() == "herald-7d9f-x2k4p"
    })
    .await;
}
