//! How a pod gets into Redis: over TLS only (a CA of the operator's, a
//! client certificate), as an ACL user with exactly the rights
//! docs/security.md lists; a start that Redis refuses (a wrong password)
//! stops with a message that says why, and one that cannot get in yet (a
//! certificate from another CA) waits not ready, saying why.

use std::path::Path;
use std::process::Output;
use std::time::Duration;

use serde_json::json;
use testkit::http::get;
use testkit::pki::Pki;
use testkit::{Client, Herald, Redis, WAIT, eventually, metric_sum};

use crate::pod::{HERALD, path, publish};

/// Runs the binary with `env` until it exits (at most [`WAIT`]): it must
/// not start.
async fn failed_start(env: &[(&str, &str)]) -> Output {
    let mut command = tokio::process::Command::new(HERALD);
    for (key, _) in std::env::vars_os() {
        if key.to_string_lossy().starts_with("HERALD_") {
            command.env_remove(key);
        }
    }
    command
        .env("HERALD_LISTEN", "127.0.0.1:0")
        .env("HERALD_GRPC__LISTEN", "127.0.0.1:0")
        .env("HERALD_BROKER", "redis")
        .envs(env.iter().copied())
        .kill_on_drop(true);
    tokio::time::timeout(WAIT, command.output())
        .await
        .expect("herald gave up in time")
        .expect("run herald")
}

/// A subscriber gets what is published through a pod whose Redis speaks
/// nothing but TLS.
async fn publishes_and_delivers(herald: &Herald) {
    let mut client = Client::subscriber(&herald.ws_url(), "news").await;
    let (status, answer) = publish(herald.addr, "news", json!({"n": 1}), None).await;
    assert_eq!(status, 200, "{answer}");
    let (topic, seq, data) = client.msg().await;
    assert_eq!((topic.as_str(), seq, data), ("news", 1, json!({"n": 1})));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_reaches_a_tls_only_redis_with_its_ca_and_client_certificate() {
    let pki = Pki::new();
    let redis = Redis::start_tls(&pki).await;
    let (cert, key) = pki.client();
    let herald = Herald::pod(
        HERALD,
        &redis.url(),
        &[
            ("HERALD_REDIS__TLS_CA", path(&pki.ca())),
            ("HERALD_REDIS__TLS_CERT", path(&cert)),
            ("HERALD_REDIS__TLS_KEY", path(&key)),
        ],
    )
    .await;
    publishes_and_delivers(&herald).await;
    // Over TLS, for want of anything else: the server has no plain port.
    assert!(redis.cli(&["CONFIG", "GET", "port"]).contains("\n0"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_certificate_signed_by_another_ca_keeps_the_pod_not_ready_and_says_why() {
    let pki = Pki::new();
    let redis = Redis::start_tls(&pki).await;
    let (cert, key) = pki.client();
    let url = redis.url();
    // The server's certificate may be reissued (cert-manager): the pod waits,
    // not ready, rather than exit.
    let herald = Herald::start_live(
        HERALD,
        &[
            ("HERALD_BROKER", "redis"),
            ("HERALD_REDIS__URL", &url),
            ("HERALD_REDIS__TLS_CA", path(&pki.other_ca())),
            ("HERALD_REDIS__TLS_CERT", path(&cert)),
            ("HERALD_REDIS__TLS_KEY", path(&key)),
        ],
        &[],
    )
    .await;
    let target = format!("redis: connecting to 127.0.0.1:{}: ", redis.port);
    eventually(WAIT, || async {
        match get(herald.addr, "/readyz").await {
            Ok((503, body))
                if body.starts_with(&target)
                    && body.contains("invalid peer certificate: UnknownIssuer") =>
            {
                Ok(())
            }
            other => Err(format!(
                "expected 503 `{target}...UnknownIssuer`, got {other:?}"
            )),
        }
    })
    .await;

    // A CA file that is no certificate is a configuration error (64), named.
    let output = failed_start(&[
        ("HERALD_REDIS__URL", &url),
        ("HERALD_REDIS__TLS_CA", path(&key)),
    ])
    .await;
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(64), "{stderr}");
    assert!(stderr.contains("`redis.tls_ca`"), "{stderr}");
}

/// The rule docs/security.md gives for Herald's ACL user, with `password`.
fn documented_acl_rule(password: &str) -> Vec<String> {
    let docs = Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/security.md");
    let text = std::fs::read_to_string(docs).expect("read docs/security.md");
    let rule = text
        .lines()
        .find(|line| line.starts_with("ACL SETUSER herald "))
        .expect("docs/security.md gives the ACL rule");
    rule.split_whitespace()
        .map(|word| word.replace(">PASSWORD", &format!(">{password}")))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acl_user_with_the_documented_rights_is_all_a_pod_needs() {
    let redis = Redis::start().await;
    let rule = documented_acl_rule("s3cret");
    let rule: Vec<&str> = rule.iter().map(String::as_str).collect();
    assert_eq!(redis.cli(&rule).trim(), "OK");
    // The user in the URL, its password apart (as from a Secret).
    let url = format!("redis://herald@127.0.0.1:{}", redis.port);
    let herald = Herald::pod(
        HERALD,
        &url,
        &[
            ("HERALD_REDIS__PASSWORD", "s3cret"),
            ("HERALD_REBALANCE__ENABLED", "true"),
            ("HERALD_REBALANCE__INTERVAL", "100ms"),
            ("HERALD_NAMESPACES__BRIEF__HISTORY_TTL", "300ms"),
        ],
    )
    .await;
    // A topic whose history outlives its age: every 16th publish trims it
    // (a publish every 100 ms keeps the history itself alive meanwhile).
    for _ in 0..16 {
        let (status, answer) = publish(herald.addr, "brief:x", json!(0), None).await;
        assert_eq!(status, 200, "{answer}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let kept: u64 = redis
        .cli(&["XLEN", "herald:{brief:x}:hist"])
        .trim()
        .parse()
        .expect("a length");
    assert!(kept < 16, "{kept} entries: the old ones were trimmed");

    // Every path: watch and publish, an idempotent retry, a resumed session,
    // a revocation, pods comparing loads.
    let mut client = Client::connect_url(&herald.ws_url()).await;
    let welcome = client.hello(None).await;
    let session = welcome["session"].as_str().expect("a session").to_owned();
    client.sub(1, "news").await;
    for _ in 0..2 {
        let (status, answer) = publish(herald.addr, "news", json!("a"), Some("k1")).await;
        assert_eq!((status, &answer["seq"]), (200, &json!(1)), "{answer}");
    }
    assert_eq!(client.msg().await.1, 1);
    // A connection that ends saves its session first.
    drop(client);
    eventually(WAIT, || async {
        testkit::metric(herald.addr, "herald_connections").await == 0.0
    })
    .await;
    let (status, answer) = publish(herald.addr, "news", json!("b"), None).await;
    assert_eq!(status, 200, "{answer}");
    let mut client = Client::connect_url(&herald.ws_url()).await;
    let welcome = client.hello(Some(&session)).await;
    assert_eq!(welcome["resumed"], true, "{welcome}");
    // Nothing was acked: both come again.
    assert_eq!(client.msg().await, ("news".into(), 1, json!("a")));
    assert_eq!(client.msg().await, ("news".into(), 2, json!("b")));
    // History both ways (issue #23), and a server-side subscription.
    for query in ["topic=news&limit=1", "topic=news&reverse=true"] {
        let path = format!("/v1/history?{query}");
        let (status, body) = testkit::http(herald.addr, "GET", &path, &[], b"").await;
        assert_eq!(status, 200, "{query}: {body}");
    }
    let (status, body) = testkit::http(
        herald.addr,
        "POST",
        "/v1/subscribe",
        &[],
        br#"{"user":"alice","topic":"news"}"#,
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let (status, body) = testkit::http(
        herald.addr,
        "POST",
        "/v1/disconnect",
        &[],
        br#"{"user":"alice"}"#,
    )
    .await;
    assert_eq!(status, 200, "{body}");
    eventually(WAIT, || async {
        let (_, body) = testkit::http(herald.addr, "GET", "/metrics", &[], b"").await;
        body.contains("herald_redis_command_seconds_count{op=\"pod_loads\"}")
    })
    .await;

    assert_eq!(
        metric_sum(herald.addr, "herald_redis_errors_total").await,
        0.0
    );
    // Nothing was refused, not even what redis-rs sends and ignores.
    assert_eq!(redis.cli(&["ACL", "LOG"]).trim(), "");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_password_stops_the_start() {
    let redis = Redis::start().await;
    let rule = documented_acl_rule("s3cret");
    let rule: Vec<&str> = rule.iter().map(String::as_str).collect();
    assert_eq!(redis.cli(&rule).trim(), "OK");
    let url = format!("redis://herald:wrong@127.0.0.1:{}", redis.port);
    let output = failed_start(&[("HERALD_REDIS__URL", &url)]).await;
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    let last = stderr.lines().last().unwrap_or_default();
    assert!(
        last.starts_with(
            "herald: starting the broker: broker unavailable: redis: connecting to 127.0.0.1:"
        ) && last.contains("Password authentication failed"),
        "{stderr}"
    );
    // The password is not in the message.
    assert!(!stderr.contains("wrong"), "{stderr}");
}
