#![allow(clippy::unwrap_used, clippy::expect_used)] // a test: a failed unwrap is a failed test

//! The client behind Herald's backend hooks (docs/hooks.md), against a
//! gateway whose connect and rpc proxies are a real HTTP backend
//! (testkit's): `hello_data` admits a client with no token, `rpc` returns
//! the backend's data or its own code, and `herald-cli rpc --hello-data`
//! does the same from a terminal.

mod common;

use std::time::Duration;

use gateway::config::Endpoint;
use herald_client::{Client, Error, ErrorCode, Event, State};
use serde_json::{Value, json};
use testkit::{Answer, Gateway, HttpBackend};

/// The application's backend: a `hello.data` holding `{"key": "k-alice"}`
/// is alice (no cookie here: a service's own credential), anything else
/// 401; `whoami` answers who asked and with what, `pay` refuses with the
/// backend's own code.
async fn backend() -> HttpBackend {
    HttpBackend::start(|request| match request.path.as_str() {
        "/connect" if request.body["data"]["key"] == "k-alice" => {
            Answer::json(json!({"user": "alice"}))
        }
        "/connect" => Answer::status(401),
        "/rpc" if request.body["method"] == "whoami" => Answer::json(
            json!({"data": {"user": request.body["user"], "data": request.body["data"]}}),
        ),
        "/rpc" => {
            Answer::json(json!({"error": {"code": "insufficient_funds", "message": "balance 0"}}))
        }
        _ => Answer::status(404),
    })
    .await
}

/// A gateway that requires tokens, with the connect and rpc proxies on `backend`.
async fn gateway(backend: &HttpBackend) -> Gateway {
    let mut config = Gateway::config();
    config.auth.hmac_secret = common::SECRET.to_owned();
    let endpoint = |path: &str| Endpoint {
        url: backend.url(path),
        timeout: Duration::from_secs(5),
        headers: Vec::new(),
    };
    config.proxy.connect = Some(endpoint("/connect"));
    config.proxy.rpc = Some(endpoint("/rpc"));
    Gateway::with(config).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hello_data_admits_a_client_without_a_token_and_rpc_answers_as_its_backend_says() {
    let backend = backend().await;
    let gateway = gateway(&backend).await;
    let (client, mut events) = Client::builder([gateway.ws_url()])
        .hello_data(&json!({"key": "k-alice"}))
        .build()
        .unwrap();
    common::until(&mut events, |e| {
        matches!(e, Event::State(State::Connected { .. })).then_some(())
    })
    .await;
    // Answers come while someone reads the stream.
    let reader = tokio::spawn(async move { while events.next().await.is_some() {} });
    let me = client.rpc("whoami", Some(&json!({"n": 1}))).await.unwrap();
    let me: Value = serde_json::from_str(me.get()).unwrap();
    assert_eq!(me, json!({"user": "alice", "data": {"n": 1}}));
    match client.rpc("pay", Some(&5)).await {
        Err(Error::Server { code, message, .. }) => {
            assert_eq!(code, ErrorCode::Other("insufficient_funds".to_owned()));
            assert_eq!(message, "balance 0");
        }
        other => panic!("not the backend's code: {other:?}"),
    }
    let connect = backend
        .requests()
        .into_iter()
        .find(|r| r.path == "/connect")
        .expect("the connect proxy was asked");
    assert_eq!(connect.body["data"], json!({"key": "k-alice"}));
    client.close();
    reader.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_backends_word_the_client_is_unauthorized_and_stops() {
    let backend = backend().await;
    let gateway = gateway(&backend).await;
    let (_client, mut events) = Client::builder([gateway.ws_url()])
        .hello_data(&json!({"key": "stolen"}))
        .build()
        .unwrap();
    let error = common::until(&mut events, |e| match e {
        Event::Error(e) if e.is_terminal() => Some(e.clone()),
        _ => None,
    })
    .await;
    assert!(matches!(error, Error::Unauthorized(_)), "{error:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn herald_cli_rpc_prints_the_backends_data_and_fails_with_its_code() {
    let backend = backend().await;
    let gateway = gateway(&backend).await;
    let cli = env!("CARGO_BIN_EXE_herald-cli");
    let run = |args: Vec<String>| {
        tokio::task::spawn_blocking(move || {
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            testkit::process::run(
                cli,
                &args,
                testkit::WAIT,
                "cargo builds herald-cli for this package's tests",
            )
        })
    };
    let url = gateway.ws_url();
    let args = |method: &str| -> Vec<String> {
        [
            "rpc",
            method,
            r#"{"x":1}"#,
            "--url",
            &url,
            "--hello-data",
            r#"{"key":"k-alice"}"#,
        ]
        .map(str::to_owned)
        .to_vec()
    };
    let output = run(args("whoami")).await.unwrap();
    assert!(
        output.status.success(),
        "{}",
        testkit::process::show(&output)
    );
    let printed: Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(printed, json!({"user": "alice", "data": {"x": 1}}));
    let output = run(args("pay")).await.unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("insufficient_funds: balance 0"), "{stderr}");
}
