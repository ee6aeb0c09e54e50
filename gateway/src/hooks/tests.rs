//! The proxies against real backends on loopback (testkit's HTTP JSON
//! server and gRPC `ProxyBackend` server, answering what each test says):
//! every proxy's happy path over both transports, the refusals, and every
//! kind of failure with its metric, none a panic.

use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use serde_json::value::RawValue;
use serde_json::{Value, json};
use testkit::backend::Request;
use testkit::{Answer, GrpcBackend, HttpBackend, WAIT};
use tokio::time::Instant;

use super::*;
use crate::config::{Config, Endpoint, Scheme};
use crate::metrics::Metrics;

/// A backend of either transport, answering every proxy at `/<proxy>`.
enum Backend {
    Http(HttpBackend),
    Grpc(GrpcBackend),
}

#[derive(Debug, Clone, Copy)]
enum Over {
    Http,
    Grpc,
}

const BOTH: [Over; 2] = [Over::Http, Over::Grpc];

impl Backend {
    async fn start(
        over: Over,
        handler: impl Fn(&Request) -> Answer + Send + Sync + 'static,
    ) -> Self {
        match over {
            Over::Http => Backend::Http(HttpBackend::start(handler).await),
            Over::Grpc => Backend::Grpc(GrpcBackend::start(handler).await),
        }
    }

    fn url(&self, path: &str) -> String {
        match self {
            Backend::Http(b) => b.url(path),
            Backend::Grpc(b) => b.url(),
        }
    }

    fn requests(&self) -> Vec<Request> {
        match self {
            Backend::Http(b) => b.requests(),
            Backend::Grpc(b) => b.requests(),
        }
    }

    fn connections(&self) -> usize {
        match self {
            Backend::Http(b) => b.connections(),
            Backend::Grpc(b) => b.connections(),
        }
    }

    /// Every proxy of `[proxy]` at this backend, with `timeout`.
    fn config(&self, timeout: Duration) -> ProxyConfig {
        let endpoint = |path: &str| {
            Some(Endpoint {
                url: self.url(path),
                timeout,
                headers: Vec::new(),
            })
        };
        ProxyConfig {
            connect: endpoint("/connect"),
            refresh: endpoint("/refresh"),
            subscribe: endpoint("/subscribe"),
            publish: endpoint("/publish"),
            rpc: endpoint("/rpc"),
            ..ProxyConfig::default()
        }
    }
}

fn hooks(config: &ProxyConfig) -> (Hooks, Arc<Metrics>) {
    let metrics = Arc::new(Metrics::new());
    let hooks = Hooks::build(config, Arc::from("pod-a"), 256, metrics.clone()).unwrap();
    (hooks, metrics)
}

fn calls(metrics: &Metrics, proxy: &str, result: &str) -> u64 {
    metrics
        .proxy
        .calls
        .with_label_values(&[proxy, result])
        .get()
}

fn failures(metrics: &Metrics, proxy: &str, reason: &str) -> u64 {
    metrics
        .proxy
        .failures
        .with_label_values(&[proxy, reason])
        .get()
}

fn raw(value: Value) -> Box<RawValue> {
    serde_json::value::to_raw_value(&value).unwrap()
}

fn topic() -> Topic {
    Topic::parse("chat:lobby").unwrap()
}

async fn rpc(hooks: &Hooks, data: Option<&RawValue>) -> Result<RpcReply, HookError> {
    let request = RpcRequest {
        client: 9,
        user: Some("ann"),
        method: "echo",
        data,
    };
    hooks.rpc(&request).await
}

async fn connect(hooks: &Hooks) -> Result<Claims, HookError> {
    let headers = [("cookie".into(), "sid=1".into())];
    let request = ConnectRequest {
        client: 7,
        remote_addr: IpAddr::from([10, 0, 0, 1]),
        headers: &headers,
        data: None,
    };
    hooks.connect(&request).await
}

/// The backend of the happy paths: what a real application would answer.
fn application(request: &Request) -> Answer {
    let body = &request.body;
    match request.path.as_str() {
        "/connect" => Answer::json(json!({
            "user": format!("user-{}", body["data"]["name"].as_str().unwrap_or("none")),
            "info": {"role": "admin"},
            "subscribe": ["chat:*"],
            "publish": ["chat:lobby"],
            "topics": ["chat:lobby"],
            "expires": 4_102_444_800_u64,
            "unknown": "ignored",
        })),
        "/refresh" => Answer::json(json!({"user": body["user"], "subscribe": ["chat:*"]})),
        "/subscribe" => {
            Answer::json(json!({"info": {"seat": 3}, "data": {"welcome": body["topic"]}}))
        }
        "/publish" => match body["data"]["x"].as_u64() {
            Some(1) => Answer::json(json!({})),
            Some(2) => Answer::json(json!({"data": {"y": 2}})),
            _ => Answer::json(json!({"skip": true})),
        },
        "/rpc" => Answer::json(json!({"data": {"echo": body["data"], "method": body["method"]}})),
        _ => Answer::status(404),
    }
}

#[tokio::test]
async fn every_proxy_answers_over_http_and_grpc() {
    for over in BOTH {
        let backend = Backend::start(over, application).await;
        let (hooks, metrics) = hooks(&backend.config(WAIT));

        let headers = [("cookie".into(), "sid=1".into())];
        let data = raw(json!({"name": "ann"}));
        let claims = hooks
            .connect(&ConnectRequest {
                client: 7,
                remote_addr: IpAddr::from([10, 0, 0, 1]),
                headers: &headers,
                data: Some(&data),
            })
            .await
            .unwrap();
        assert_eq!(&*claims.user, "user-ann", "{over:?}");
        assert!(claims.subscribe.allows("chat:x") && !claims.subscribe.allows("news:x"));
        assert!(claims.publish.allows("chat:lobby") && !claims.publish.allows("chat:x"));
        assert_eq!(&*claims.topics, [Box::from("chat:lobby")]);
        assert_eq!(claims.info.as_deref(), Some(&br#"{"role":"admin"}"#[..]));
        let expires = claims
            .expires
            .unwrap()
            .duration_since(std::time::UNIX_EPOCH);
        assert_eq!(expires.unwrap().as_secs(), 4_102_444_800);

        let claims = hooks
            .refresh(&RefreshRequest {
                client: 7,
                user: "user-ann",
            })
            .await
            .unwrap();
        assert_eq!(&*claims.user, "user-ann");
        assert_eq!(claims.expires, None);

        let topic = topic();
        let sub_data = raw(json!({"seat": "any"}));
        let reply = hooks
            .subscribe(&SubscribeRequest {
                client: 7,
                user: None,
                topic: &topic,
                data: Some(&sub_data),
            })
            .await
            .unwrap();
        assert_eq!(reply.info.as_deref(), Some(&br#"{"seat":3}"#[..]));
        assert_eq!(reply.data.unwrap().get(), r#"{"welcome":"chat:lobby"}"#);

        let mut published = Vec::new();
        for x in 1..=3 {
            let data = raw(json!({"x": x}));
            let request = PublishRequest {
                client: 7,
                user: Some("user-ann"),
                topic: &topic,
                data: &data,
            };
            published.push(hooks.publish(&request).await.unwrap());
        }
        assert!(matches!(published[0], PublishReply::AsIs), "{published:?}");
        assert!(matches!(&published[1], PublishReply::Replace(d) if d.get() == r#"{"y":2}"#));
        assert!(matches!(published[2], PublishReply::Skip));

        let reply = rpc(&hooks, Some(&raw(json!([1, 2])))).await.unwrap();
        assert_eq!(
            reply.data.unwrap().get(),
            r#"{"echo":[1,2],"method":"echo"}"#
        );

        // What the backend was told: the contract's fields.
        let requests = backend.requests();
        let paths: Vec<&str> = requests.iter().map(|r| r.path.as_str()).collect();
        assert_eq!(
            paths,
            [
                "/connect",
                "/refresh",
                "/subscribe",
                "/publish",
                "/publish",
                "/publish",
                "/rpc"
            ]
        );
        assert_eq!(
            requests[0].body,
            json!({"client": "7", "pod": "pod-a", "transport": "websocket",
                   "remote_addr": "10.0.0.1", "headers": {"cookie": "sid=1"},
                   "data": {"name": "ann"}}),
            "{over:?}"
        );
        assert_eq!(
            requests[1].body,
            json!({"client": "7", "pod": "pod-a", "user": "user-ann"})
        );
        assert_eq!(
            requests[2].body,
            json!({"client": "7", "pod": "pod-a", "topic": "chat:lobby", "data": {"seat": "any"}})
        );
        assert_eq!(
            requests[3].body,
            json!({"client": "7", "pod": "pod-a", "user": "user-ann", "topic": "chat:lobby",
                   "data": {"x": 1}})
        );
        assert_eq!(
            requests[6].body,
            json!({"client": "9", "pod": "pod-a", "user": "ann", "method": "echo", "data": [1, 2]})
        );
        if let Over::Http = over {
            let content_type = requests[0].header("content-type");
            assert_eq!(content_type, Some("application/json"));
        }
        for (proxy, n) in [
            ("connect", 1),
            ("refresh", 1),
            ("subscribe", 1),
            ("publish", 3),
            ("rpc", 1),
        ] {
            assert_eq!(calls(&metrics, proxy, "ok"), n, "{over:?} {proxy}");
        }
        let observed = metrics.proxy.duration.with_label_values(&["publish"]);
        assert_eq!(observed.get_sample_count(), 3);
        assert_eq!(metrics.proxy.in_flight.with_label_values(&["rpc"]).get(), 0);
    }
}

#[tokio::test]
async fn refusals_are_the_backends_words() {
    fn refusing(request: &Request) -> Answer {
        match (request.path.as_str(), request.body["data"].as_str()) {
            ("/connect", _) => {
                Answer::raw(401, Some("application/json"), r#"{"message":"log in"}"#)
            }
            ("/refresh", _) => Answer::json(json!({"user": "mallory"})),
            ("/rpc", Some("forbidden")) => Answer::raw(403, None, r#"{"message":"not yours"}"#),
            ("/rpc", Some("bad code")) => Answer::json(json!({"error": {"code": "Not-A-Code"}})),
            (_, _) => Answer::json(json!({"error": {"code": "no_seat", "message": "full"}})),
        }
    }
    for over in BOTH {
        let backend = Backend::start(over, refusing).await;
        let (hooks, metrics) = hooks(&backend.config(WAIT));
        let refused = connect(&hooks).await.unwrap_err();
        assert!(
            matches!(&refused, HookError::Unauthorized(_)),
            "{over:?} {refused:?}"
        );
        if let Over::Http = over {
            assert_eq!(refused.to_string(), "log in");
        }
        let refused = hooks
            .refresh(&RefreshRequest {
                client: 1,
                user: "ann",
            })
            .await
            .unwrap_err();
        assert!(
            matches!(&refused, HookError::Forbidden(_)),
            "another user: {refused:?}"
        );

        let forbidden = raw(json!("forbidden"));
        let refused = rpc(&hooks, Some(&forbidden)).await.unwrap_err();
        assert!(
            matches!(&refused, HookError::Forbidden(_)),
            "{over:?} {refused:?}"
        );
        if let Over::Http = over {
            assert_eq!(refused.to_string(), "not yours");
        }
        let refused = rpc(&hooks, None).await.unwrap_err();
        assert!(
            matches!(&refused, HookError::Refused { code, message } if code == "no_seat" && message == "full"),
            "{over:?} {refused:?}"
        );
        let bad_code = raw(json!("bad code"));
        let refused = rpc(&hooks, Some(&bad_code)).await.unwrap_err();
        assert!(matches!(&refused, HookError::Refused { code, .. } if code == "forbidden"));

        let topic = topic();
        let data = raw(json!(1));
        let refused = hooks
            .publish(&PublishRequest {
                client: 1,
                user: None,
                topic: &topic,
                data: &data,
            })
            .await
            .unwrap_err();
        assert!(matches!(&refused, HookError::Refused { code, .. } if code == "no_seat"));

        assert_eq!(calls(&metrics, "connect", "unauthorized"), 1);
        assert_eq!(calls(&metrics, "refresh", "forbidden"), 1);
        assert_eq!(calls(&metrics, "rpc", "forbidden"), 1);
        assert_eq!(calls(&metrics, "rpc", "refused"), 2);
        assert_eq!(calls(&metrics, "publish", "refused"), 1);
        assert_eq!(calls(&metrics, "rpc", "unavailable"), 0);
    }
}

#[tokio::test]
async fn an_app_error_at_connect_is_forbidden() {
    for over in BOTH {
        let backend = Backend::start(over, |_: &Request| {
            Answer::json(json!({"error": {"code": "banned", "message": "go away"}}))
        })
        .await;
        let (hooks, _) = hooks(&backend.config(WAIT));
        let refused = connect(&hooks).await.unwrap_err();
        assert!(
            matches!(&refused, HookError::Forbidden(m) if m == "go away"),
            "{refused:?}"
        );
    }
}

#[tokio::test]
async fn a_hanging_backend_times_out() {
    for over in BOTH {
        let backend = Backend::start(over, |_: &Request| Answer::hang()).await;
        let (hooks, metrics) = hooks(&backend.config(Duration::from_millis(200)));
        let started = Instant::now();
        let failed = tokio::time::timeout(WAIT, rpc(&hooks, None)).await.unwrap();
        assert!(
            matches!(failed, Err(HookError::Unavailable(Failure::Timeout))),
            "{over:?} {failed:?}"
        );
        assert!(started.elapsed() >= Duration::from_millis(200));
        assert_eq!(failures(&metrics, "rpc", "timeout"), 1);
        assert_eq!(calls(&metrics, "rpc", "unavailable"), 1);
        assert_eq!(metrics.proxy.in_flight.with_label_values(&["rpc"]).get(), 0);
    }
}

#[tokio::test]
async fn one_call_over_max_in_flight_is_saturated_at_once() {
    for over in BOTH {
        let backend = Backend::start(over, |_: &Request| Answer::hang()).await;
        let mut config = backend.config(WAIT * 6);
        config.max_in_flight = 3;
        let (hooks, metrics) = hooks(&config);
        let hooks = Arc::new(hooks);
        let mut waiting = tokio::task::JoinSet::new();
        for _ in 0..3 {
            let hooks = hooks.clone();
            waiting.spawn(async move { rpc(&hooks, None).await.map(|_| ()) });
        }
        let gauge = metrics.proxy.in_flight.with_label_values(&["rpc"]);
        testkit::eventually(WAIT, || async {
            let asked = backend.requests().len();
            if asked == 3 && gauge.get() == 3 {
                Ok(())
            } else {
                Err(format!("{asked} asked, {} in flight", gauge.get()))
            }
        })
        .await;
        let started = Instant::now();
        let refused = rpc(&hooks, None).await;
        assert!(
            matches!(refused, Err(HookError::Unavailable(Failure::Saturated))),
            "{over:?} {refused:?}"
        );
        assert!(started.elapsed() < Duration::from_secs(1), "at once");
        assert_eq!(backend.requests().len(), 3, "the backend was not asked");
        assert_eq!(failures(&metrics, "rpc", "saturated"), 1);
        // Another proxy has slots of its own.
        let topic = topic();
        let data = raw(json!(1));
        let request = PublishRequest {
            client: 1,
            user: None,
            topic: &topic,
            data: &data,
        };
        let publish = hooks.publish(&request);
        assert!(
            tokio::time::timeout(Duration::from_millis(100), publish)
                .await
                .is_err()
        );
        // Calls given up (their client left) free their slots.
        waiting.shutdown().await;
        assert_eq!(gauge.get(), 0);
    }
}

/// What a broken backend answers, by `data`.
fn broken(request: &Request) -> Answer {
    let big = "x".repeat(70 * 1024);
    match request.body["data"].as_str().unwrap_or("") {
        "garbage" => Answer::raw(200, Some("application/json"), "not json{"),
        "array" => Answer::raw(200, Some("application/json"), "[]"),
        "wrong type" => Answer::json(json!({"data": 1, "error": "oops"})),
        "oversize" => Answer::json(json!({"data": big})),
        "html" => Answer::raw(200, Some("text/html"), "<p>hi</p>"),
        "no type" => Answer::raw(200, None, "{}"),
        "redirect" => Answer::status(307).header("location", "/elsewhere"),
        "500" => Answer::status(500),
        "204" => Answer::raw(204, None, ""),
        "grpc unavailable" => Answer::grpc(tonic::Code::Unavailable),
        "deadline" => Answer::grpc(tonic::Code::DeadlineExceeded),
        _ => Answer::json(json!({})),
    }
}

async fn rpc_fails(hooks: &Hooks, data: &str) -> Failure {
    let data = raw(json!(data));
    match tokio::time::timeout(WAIT, rpc(hooks, Some(&data)))
        .await
        .unwrap()
    {
        Err(HookError::Unavailable(failure)) => failure,
        other => panic!("{data}: {other:?}"),
    }
}

#[tokio::test]
async fn bad_answers_over_http_are_failures() {
    let backend = Backend::start(Over::Http, broken).await;
    let (hooks, metrics) = hooks(&backend.config(WAIT));
    for (data, failure) in [
        ("garbage", Failure::Malformed),
        ("array", Failure::Malformed),
        ("wrong type", Failure::Malformed),
        ("oversize", Failure::TooLarge),
        ("html", Failure::ContentType),
        ("no type", Failure::ContentType),
        ("redirect", Failure::Redirect),
        ("500", Failure::Status),
        ("204", Failure::Status),
    ] {
        assert_eq!(rpc_fails(&hooks, data).await, failure, "{data}");
    }
    let asked: Vec<String> = backend.requests().iter().map(|r| r.path.clone()).collect();
    assert!(
        !asked.contains(&"/elsewhere".to_owned()),
        "the redirect was not followed"
    );
    for (reason, n) in [
        ("malformed", 3),
        ("too_large", 1),
        ("content_type", 2),
        ("redirect", 1),
        ("status", 2),
    ] {
        assert_eq!(failures(&metrics, "rpc", reason), n, "{reason}");
    }
    assert_eq!(calls(&metrics, "rpc", "unavailable"), 9);
    // The pod's client still works.
    assert!(rpc(&hooks, None).await.is_ok());
}

#[tokio::test]
async fn bad_answers_over_grpc_are_failures() {
    let backend = Backend::start(Over::Grpc, broken).await;
    let (hooks, metrics) = hooks(&backend.config(WAIT));
    for (data, failure) in [
        ("oversize", Failure::TooLarge),
        ("500", Failure::Status),
        ("grpc unavailable", Failure::Status),
        ("deadline", Failure::Timeout),
    ] {
        assert_eq!(rpc_fails(&hooks, data).await, failure, "{data}");
    }
    assert_eq!(failures(&metrics, "rpc", "status"), 2);
    assert!(rpc(&hooks, None).await.is_ok());
}

#[tokio::test]
async fn claims_beyond_a_tokens_bounds_are_malformed() {
    let long_user = "u".repeat(257);
    let big_info = json!({"x": "y".repeat(300)});
    for over in BOTH {
        for reply in [
            json!({"user": long_user}),
            json!({"user": "ann", "info": big_info}),
            json!({"user": "ann", "info": [1]}),
            json!({"user": "ann", "subscribe": ["a*b"]}),
            json!({"user": "ann", "topics": [""]}),
            json!({"user": 5}),
        ] {
            let answer = Answer::json(reply.clone());
            let backend = Backend::start(over, move |_: &Request| answer.clone()).await;
            let (hooks, metrics) = hooks(&backend.config(WAIT));
            let failed = connect(&hooks).await;
            // gRPC carries `user` as a string: a number cannot be sent.
            if matches!(over, Over::Grpc) && reply["user"] == 5 {
                continue;
            }
            assert!(
                matches!(failed, Err(HookError::Unavailable(Failure::Malformed))),
                "{over:?} {reply}: {failed:?}"
            );
            assert_eq!(failures(&metrics, "connect", "malformed"), 1);
        }
    }
}

#[tokio::test]
async fn an_anonymous_answer_has_an_empty_user() {
    for over in BOTH {
        let backend = Backend::start(over, |_: &Request| Answer::json(json!({}))).await;
        let (hooks, _) = hooks(&backend.config(WAIT));
        let claims = connect(&hooks).await.unwrap();
        assert_eq!(&*claims.user, "");
        assert!(claims.subscribe.is_empty() && claims.expires.is_none());
    }
}

#[tokio::test]
async fn a_backend_that_is_down_is_a_connect_failure() {
    // A port nothing listens on: bound, then let go.
    let addr = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    for url in [format!("http://{addr}/rpc"), format!("grpc://{addr}")] {
        let config = ProxyConfig {
            rpc: Some(Endpoint {
                url: url.clone(),
                timeout: WAIT,
                headers: Vec::new(),
            }),
            ..ProxyConfig::default()
        };
        let (hooks, metrics) = hooks(&config);
        for _ in 0..2 {
            let failed = tokio::time::timeout(WAIT, rpc(&hooks, None)).await.unwrap();
            assert!(
                matches!(failed, Err(HookError::Unavailable(Failure::Connect))),
                "{url}: {failed:?}"
            );
        }
        assert_eq!(failures(&metrics, "rpc", "connect"), 2);
    }
}

#[tokio::test]
async fn sequential_calls_share_one_connection() {
    for over in BOTH {
        let backend = Backend::start(over, application).await;
        let (hooks, _) = hooks(&backend.config(WAIT));
        for _ in 0..20 {
            rpc(&hooks, None).await.unwrap();
            let topic = topic();
            let data = raw(json!({"x": 1}));
            let request = PublishRequest {
                client: 1,
                user: None,
                topic: &topic,
                data: &data,
            };
            hooks.publish(&request).await.unwrap();
        }
        assert_eq!(backend.requests().len(), 40);
        // HTTP: the pod's one client for every proxy; gRPC: a channel per
        // proxy (two here), each one connection.
        let connections = match over {
            Over::Http => 1,
            Over::Grpc => 2,
        };
        assert_eq!(backend.connections(), connections, "{over:?}: keep-alive");
    }
}

#[tokio::test]
async fn a_proxy_not_configured_is_unavailable_without_a_call() {
    let (hooks, metrics) = hooks(&ProxyConfig::default());
    assert!(!hooks.connects());
    let failed = rpc(&hooks, None).await;
    assert!(matches!(
        failed,
        Err(HookError::Unavailable(Failure::NotConfigured))
    ));
    assert_eq!(calls(&metrics, "rpc", "unavailable"), 0);
}

#[test]
fn connect_headers_are_lower_case() {
    let config = ProxyConfig {
        connect: Some(Endpoint {
            url: "http://127.0.0.1:1/connect".into(),
            timeout: WAIT,
            headers: vec!["Cookie".into(), "X-Forwarded-For".into(), "cookie".into()],
        }),
        ..ProxyConfig::default()
    };
    let hooks = Hooks::new(&config, Arc::new(Metrics::new()));
    assert_eq!(hooks.forwarded_headers(), ["cookie", "x-forwarded-for"]);
}

fn refused_key(vars: &[(&str, &str)]) -> String {
    let env = vars.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned()));
    match Config::load(None, env) {
        Ok(_) => panic!("{vars:?} loaded"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn bad_proxy_settings_are_refused_naming_their_key() {
    let url = "HERALD_PROXY__CONNECT__URL";
    for (vars, key) in [
        (vec![(url, "ftp://x/connect")], "proxy.connect.url"),
        (vec![(url, "not a url")], "proxy.connect.url"),
        (vec![(url, "http://user:pw@x/connect")], "proxy.connect.url"),
        (
            vec![("HERALD_PROXY__RPC__URL", "grpc://x:1/path")],
            "proxy.rpc.url",
        ),
        (
            vec![
                (url, "http://x/c"),
                ("HERALD_PROXY__CONNECT__TIMEOUT", "0s"),
            ],
            "proxy.connect.timeout",
        ),
        (
            vec![
                (url, "http://x/c"),
                ("HERALD_PROXY__CONNECT__HEADERS", "Cookie,Bad Name"),
            ],
            "proxy.connect.headers",
        ),
        (
            vec![("HERALD_PROXY__MAX_IN_FLIGHT", "0")],
            "proxy.max_in_flight",
        ),
        (
            vec![("HERALD_PROXY__MAX_RESPONSE_BYTES", "1")],
            "proxy.max_response_bytes",
        ),
        (
            vec![("HERALD_NAMESPACES__CHAT__SUBSCRIBE_PROXY", "true")],
            "proxy.subscribe.url",
        ),
        (
            vec![("HERALD_NAMESPACES__CHAT__PUBLISH_PROXY", "true")],
            "proxy.publish.url",
        ),
    ] {
        let error = refused_key(&vars);
        assert!(error.contains(key), "{vars:?}: {error}");
    }
}

#[test]
fn only_the_connect_proxy_forwards_headers() {
    let path = std::env::temp_dir().join(format!("herald-hooks-test-{}.toml", std::process::id()));
    let toml = "[proxy.rpc]\nurl = \"http://x/rpc\"\nheaders = [\"Cookie\"]\n";
    std::fs::write(&path, toml).unwrap();
    let loaded = Config::load(Some(&path), std::iter::empty());
    let _ = std::fs::remove_file(&path);
    let error = loaded.unwrap_err().to_string();
    assert!(error.contains("proxy.rpc.headers"), "{error}");
}

#[test]
fn good_proxy_settings_load() {
    let env = [
        (
            "HERALD_PROXY__CONNECT__URL",
            "https://auth.example.com/herald/connect",
        ),
        ("HERALD_PROXY__RPC__URL", "grpc://backend:50051"),
        ("HERALD_PROXY__MAX_IN_FLIGHT", "8"),
    ]
    .map(|(k, v)| (k.to_owned(), v.to_owned()));
    let config = Config::load(None, env).unwrap();
    assert_eq!(config.proxy.max_in_flight, 8);
    assert_eq!(config.proxy.max_response_bytes, 64 * 1024);
    let rpc = config.proxy.rpc.as_ref().unwrap();
    assert_eq!(rpc.timeout, Duration::from_secs(1));
    let (scheme, uri) = rpc.target().unwrap();
    assert_eq!(
        (scheme, uri.to_string().as_str()),
        (Scheme::Grpc, "http://backend:50051/")
    );
}

/// An HTTP backend written by hand, for answers testkit's does not give:
/// a chunked body that never ends (`endless`), or headers and then
/// nothing (`stall`). Its tasks end with the returned set.
async fn raw_backend(endless: bool) -> (std::net::SocketAddr, tokio::task::JoinSet<()>) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let mut tasks = tokio::task::JoinSet::new();
    tasks.spawn(async move {
        let Ok((mut stream, _)) = listener.accept().await else {
            return;
        };
        let mut request = [0; 4096];
        let _ = stream.read(&mut request).await;
        let head = "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n\
                    transfer-encoding: chunked\r\n\r\n";
        if stream.write_all(head.as_bytes()).await.is_err() {
            return;
        }
        let chunk = format!("2000\r\n{}\r\n", " ".repeat(0x2000));
        if !endless {
            let _ = stream.write_all(b"1\r\n{\r\n").await;
            std::future::pending::<()>().await;
        }
        // Until the client hangs up (it must).
        while stream.write_all(chunk.as_bytes()).await.is_ok() {}
    });
    (addr, tasks)
}

#[tokio::test]
async fn an_endless_answer_is_cut_at_max_response_bytes_and_a_stalled_one_times_out() {
    for (endless, timeout, failure) in [
        (true, WAIT, Failure::TooLarge),
        (false, Duration::from_millis(300), Failure::Timeout),
    ] {
        let (addr, _backend) = raw_backend(endless).await;
        let config = ProxyConfig {
            rpc: Some(Endpoint {
                url: format!("http://{addr}/rpc"),
                timeout,
                headers: Vec::new(),
            }),
            ..ProxyConfig::default()
        };
        let (hooks, metrics) = hooks(&config);
        let failed = tokio::time::timeout(WAIT, rpc(&hooks, None)).await.unwrap();
        assert!(
            matches!(failed, Err(HookError::Unavailable(f)) if f == failure),
            "{failed:?}"
        );
        assert_eq!(failures(&metrics, "rpc", failure.as_str()), 1);
    }
}

#[tokio::test]
async fn an_https_proxy_speaks_tls_and_http_proxies_share_its_client() {
    // A plain HTTP backend: the TLS handshake with it fails.
    let backend = HttpBackend::start(application).await;
    let https = backend.url("/rpc").replace("http://", "https://");
    let config = ProxyConfig {
        rpc: Some(Endpoint {
            url: https,
            timeout: WAIT,
            headers: Vec::new(),
        }),
        publish: Some(Endpoint {
            url: backend.url("/publish"),
            timeout: WAIT,
            headers: Vec::new(),
        }),
        ..ProxyConfig::default()
    };
    let metrics = Arc::new(Metrics::new());
    let hooks = match Hooks::build(&config, Arc::from("pod-a"), 256, metrics.clone()) {
        Ok(hooks) => hooks,
        // A machine without root certificates.
        Err(HooksError::Roots(_)) => return,
        Err(other) => panic!("{other:?}"),
    };
    let failed = tokio::time::timeout(WAIT, rpc(&hooks, None)).await.unwrap();
    assert!(
        matches!(failed, Err(HookError::Unavailable(Failure::Connect))),
        "{failed:?}"
    );
    // The same client speaks plain HTTP to an http:// proxy.
    let topic = topic();
    let data = raw(json!({"x": 1}));
    let request = PublishRequest {
        client: 1,
        user: None,
        topic: &topic,
        data: &data,
    };
    assert!(matches!(
        hooks.publish(&request).await,
        Ok(PublishReply::AsIs)
    ));
    let paths: Vec<String> = backend.requests().iter().map(|r| r.path.clone()).collect();
    assert_eq!(paths, ["/publish"], "the TLS hello was no request");
}
