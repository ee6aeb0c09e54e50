//! Backend hooks, the proxies (issue #24): the application's own backend (a
//! real HTTP JSON server or a real gRPC `ProxyBackend` server, testkit's,
//! on 127.0.0.1:0) says who a client without a token is (from a cookie of
//! the upgrade request), refreshes it before its `expires`, approves or
//! refuses subscribes and publishes in namespaces that ask it, and answers
//! the client's `rpc`s. A token still wins; a backend that refuses, hangs,
//! is down or answers nonsense costs only what needs it.

use std::net::{IpAddr, Ipv4Addr};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use gateway::Config;
use gateway::config::Endpoint;
use router::{NamespaceSettings, Publish, Subscribe};
use serde_json::{Value, json};
use testkit::backend::Request;
use testkit::{Answer, Client, Gateway, GrpcBackend, HttpBackend};

use crate::server_subscriptions::token_signed;

/// The HMAC secret tokens are signed with (at least 32 bytes).
const SECRET: &str = "herald-backend-hooks-tests-secret-0123456789";

/// The cookie the example backend knows Alice by.
const ALICE_COOKIE: &str = "sid=alice-7f3a";

/// An endpoint at `url` with `timeout`; connect's forwards `Cookie` (and
/// `Origin`).
fn endpoint(url: String, timeout: Duration) -> Endpoint {
    Endpoint {
        url,
        timeout,
        headers: vec!["Cookie".to_owned(), "Origin".to_owned()],
    }
}

/// Tokens checked with [`SECRET`] (so that "token wins" can be seen), no
/// leeway on `expires`; namespaces `vip` (granted), `rooms` (the subscribe
/// proxy decides, with presence), `feed` (the publish proxy decides; no
/// client may publish by the rule), and `chat` (no proxy). Every proxy at
/// `url(name)`.
fn config(url: impl Fn(&str) -> String, timeout: Duration) -> Config {
    let mut config = Gateway::config();
    config.auth.hmac_secret = SECRET.to_owned();
    config.auth.leeway = Duration::ZERO;
    config.namespaces.insert(
        "vip".to_owned(),
        NamespaceSettings {
            subscribe: Subscribe::Granted,
            ..Default::default()
        },
    );
    config.namespaces.insert(
        "rooms".to_owned(),
        NamespaceSettings {
            subscribe: Subscribe::Granted,
            presence: true,
            subscribe_proxy: true,
            ..Default::default()
        },
    );
    config.namespaces.insert(
        "feed".to_owned(),
        NamespaceSettings {
            publish: Publish::Nobody,
            publish_proxy: true,
            ..Default::default()
        },
    );
    let proxy = &mut config.proxy;
    proxy.connect = Some(endpoint(url("connect"), timeout));
    proxy.refresh = Some(endpoint(url("refresh"), timeout));
    proxy.subscribe = Some(endpoint(url("subscribe"), timeout));
    proxy.publish = Some(endpoint(url("publish"), timeout));
    proxy.rpc = Some(endpoint(url("rpc"), timeout));
    config
}

/// A gateway whose proxies are `backend`'s HTTP paths.
async fn gateway_of(backend: &HttpBackend) -> Gateway {
    Gateway::with(config(
        |p| backend.url(&format!("/{p}")),
        Duration::from_secs(5),
    ))
    .await
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("after 1970")
        .as_secs()
}

/// The example application: Alice by her cookie (granted `vip:*`, put in
/// `vip:lobby`), nobody else; rooms open but `rooms:closed` (its own error
/// code) and `rooms:secret` (403); the feed shouts, swallows `"skip"`,
/// refuses `"spam"`; rpc `echo` echoes, `missing` is the backend's
/// `not_found`.
fn app(request: &Request) -> Answer {
    let body = &request.body;
    match request.path.as_str() {
        "/connect" => match body["headers"]["cookie"].as_str() {
            Some(ALICE_COOKIE) => Answer::json(json!({
                "user": "alice",
                "info": {"name": "Alice"},
                "subscribe": ["vip:*"],
                "topics": ["vip:lobby"],
            })),
            Some(_) => Answer::status(403),
            None => Answer::status(401),
        },
        "/refresh" => Answer::json(json!({"user": body["user"]})),
        "/subscribe" => match body["topic"].as_str() {
            Some("rooms:closed") => Answer::json(
                json!({"error": {"code": "room_closed", "message": "the room is closed"}}),
            ),
            Some("rooms:secret") => Answer::status(403),
            _ => Answer::json(json!({"info": {"seat": 3}, "data": {"welcome": body["data"]}})),
        },
        "/publish" => match &body["data"] {
            Value::String(s) if s == "skip" => Answer::json(json!({"skip": true})),
            Value::String(s) if s == "spam" => {
                Answer::json(json!({"error": {"code": "spam", "message": "no spam"}}))
            }
            Value::String(s) => Answer::json(json!({"data": format!("{}!", s.to_uppercase())})),
            _ => Answer::json(json!({})),
        },
        "/rpc" => match body["method"].as_str() {
            Some("echo") => {
                Answer::json(json!({"data": {"echo": body["data"], "user": body["user"]}}))
            }
            Some("missing") => {
                Answer::json(json!({"error": {"code": "not_found", "message": "no such thing"}}))
            }
            _ => Answer::status(404),
        },
        _ => Answer::status(404),
    }
}

/// A client of `gateway` sending `headers` with its upgrade.
async fn client_with(gateway: &Gateway, headers: &[(&str, &str)]) -> Client {
    Client::connect_from(&gateway.ws_url(), IpAddr::V4(Ipv4Addr::LOCALHOST), headers)
        .await
        .unwrap_or_else(|status| panic!("upgrade refused: {status}"))
}

/// Alice, by her cookie: her `welcome`, then her token-like `topics`' `ok`.
async fn alice(gateway: &Gateway) -> Client {
    let mut client = client_with(gateway, &[("Cookie", ALICE_COOKIE)]).await;
    client.hello(None).await;
    let ok = client.expect("ok").await;
    assert_eq!(
        (ok["topic"].as_str(), ok["reason"].as_str()),
        (Some("vip:lobby"), Some("token"))
    );
    client
}

/// Sends `command` and reads the `err` or close the server answers with:
/// the `err`, then the close code.
async fn refused(client: &mut Client, command: Value) -> (Value, Option<u16>) {
    client.send(command).await;
    let err = client.expect("err").await;
    (err, client.closed().await)
}

#[tokio::test]
async fn a_cookie_authenticates_a_client_without_a_token() {
    let backend = HttpBackend::start(app).await;
    let gateway = gateway_of(&backend).await;
    let mut client = client_with(
        &gateway,
        &[("Cookie", ALICE_COOKIE), ("X-Not-Forwarded", "secret")],
    )
    .await;
    client
        .send(json!({"op": "hello", "data": {"device": "phone"}}))
        .await;
    client.expect("welcome").await;
    // The reply's `topics`, subscribed as a token's are.
    let ok = client.expect("ok").await;
    assert_eq!(ok["topic"], "vip:lobby");
    // Its grants are the client's: `vip:*`, not `vip` for anyone.
    client.sub(1, "vip:backstage").await;

    let connect = &backend.requests()[0];
    assert_eq!(connect.path, "/connect");
    assert_eq!(connect.body["headers"], json!({"cookie": ALICE_COOKIE}));
    assert_eq!(connect.body["data"], json!({"device": "phone"}));
    assert_eq!(connect.body["transport"], "websocket");
    assert_eq!(connect.body["remote_addr"], "127.0.0.1");
    assert!(connect.body["client"].is_string(), "{}", connect.body);

    // Its `info` is its presence info, as a token's would be.
    client
        .send(json!({"op": "sub", "id": 2, "topic": "rooms:1"}))
        .await;
    client.expect("ok").await;
    drop(backend);
}

#[tokio::test]
async fn a_token_wins_over_the_connect_proxy() {
    let backend = HttpBackend::start(app).await;
    let gateway = gateway_of(&backend).await;
    // A valid token, and Alice's cookie: the token says who it is.
    let mut client = client_with(&gateway, &[("Cookie", ALICE_COOKIE)]).await;
    let token = token_signed(SECRET, "bob", json!({}));
    client.send(json!({"op": "hello", "token": token})).await;
    client.expect("welcome").await;
    client
        .send(json!({"op": "sub", "id": 1, "topic": "vip:lobby"}))
        .await;
    let err = client.expect("err").await;
    assert_eq!(err["code"], "forbidden", "bob has no grant: {err}");
    // A bad token is refused, the proxy not asked.
    let mut client = client_with(&gateway, &[("Cookie", ALICE_COOKIE)]).await;
    let (err, close) = refused(&mut client, json!({"op": "hello", "token": "nope"})).await;
    assert_eq!(
        (err["code"].as_str(), close),
        (Some("unauthorized"), Some(4502))
    );
    assert!(
        backend.requests().iter().all(|r| r.path != "/connect"),
        "{:?}",
        backend.requests()
    );
}

#[tokio::test]
async fn the_backends_refusals_close_like_a_refused_token() {
    let backend = HttpBackend::start(app).await;
    let gateway = gateway_of(&backend).await;
    // No cookie: 401.
    let mut client = client_with(&gateway, &[]).await;
    let (err, close) = refused(&mut client, json!({"op": "hello"})).await;
    assert_eq!(
        (err["code"].as_str(), close),
        (Some("unauthorized"), Some(4502))
    );
    // Somebody else's cookie: 403.
    let mut client = client_with(&gateway, &[("Cookie", "sid=mallory")]).await;
    let (err, close) = refused(&mut client, json!({"op": "hello"})).await;
    assert_eq!(
        (err["code"].as_str(), close),
        (Some("forbidden"), Some(4502))
    );
    // A first command without `hello` is an implied one: asked too.
    let mut client = client_with(&gateway, &[]).await;
    let (err, close) = refused(&mut client, json!({"op": "ping", "id": 1})).await;
    assert_eq!(
        (err["code"].as_str(), close),
        (Some("unauthorized"), Some(4502))
    );
    assert_eq!(backend.requests().len(), 3);
}

#[tokio::test]
async fn no_user_is_anonymous_where_anonymous_clients_are_let_in() {
    let backend = HttpBackend::start(|request: &Request| match request.path.as_str() {
        "/connect" => Answer::json(json!({"user": ""})),
        _ => app(request),
    })
    .await;
    let mut config = config(|p| backend.url(&format!("/{p}")), Duration::from_secs(5));
    let gateway = Gateway::with(config.clone()).await;
    let mut client = client_with(&gateway, &[]).await;
    let (err, close) = refused(&mut client, json!({"op": "hello"})).await;
    assert_eq!(
        (err["code"].as_str(), close),
        (Some("unauthorized"), Some(4502))
    );
    config.auth.allow_anonymous = true;
    let gateway = Gateway::with(config).await;
    let mut client = client_with(&gateway, &[]).await;
    client.hello(None).await;
    // Anonymous: no grant of `vip`, and not the authenticated of `chat`;
    // but in.
    client
        .send(json!({"op": "sub", "id": 1, "topic": "vip:lobby"}))
        .await;
    assert_eq!(client.expect("err").await["code"], "forbidden");
    client
        .send(json!({"op": "sub", "id": 2, "topic": "chat:general"}))
        .await;
    assert_eq!(client.expect("err").await["code"], "forbidden");
    client.send(json!({"op": "ping", "id": 3})).await;
    assert_eq!(client.expect("ok").await["id"], 3);
}

#[tokio::test]
async fn a_backend_down_is_unavailable_while_token_clients_connect() {
    // Down before the pod starts: the pod starts all the same.
    let backend = HttpBackend::start(app).await;
    backend.stop();
    let gateway = gateway_of(&backend).await;
    let mut client = client_with(&gateway, &[("Cookie", ALICE_COOKIE)]).await;
    let (err, close) = refused(&mut client, json!({"op": "hello"})).await;
    // Come back later: 4003.
    assert_eq!(
        (err["code"].as_str(), close),
        (Some("unavailable"), Some(4003))
    );
    let mut client = client_with(&gateway, &[]).await;
    let token = token_signed(SECRET, "bob", json!({}));
    client.send(json!({"op": "hello", "token": token})).await;
    client.expect("welcome").await;
    client.sub(1, "chat:general").await;
}

#[tokio::test]
async fn a_refresh_refused_ends_the_connection_as_an_expired_token() {
    // Connect: expires in 2 s (so refreshed at once: under the margin);
    // the first refresh approves for 2 s more, the second refuses.
    let refreshes = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counted = refreshes.clone();
    let backend = HttpBackend::start(move |request: &Request| match request.path.as_str() {
        "/connect" => Answer::json(json!({"user": "alice", "expires": unix_now() + 2})),
        "/refresh" if counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst) == 0 => {
            assert_eq!(request.body["user"], "alice");
            Answer::json(json!({"user": "alice", "expires": unix_now() + 2}))
        }
        "/refresh" => Answer::status(403),
        _ => Answer::status(404),
    })
    .await;
    let gateway = gateway_of(&backend).await;
    let mut client = client_with(&gateway, &[]).await;
    let started = Instant::now();
    let welcome = client.hello(None).await;
    assert!(welcome["expires"].as_u64().is_some(), "{welcome}");
    assert_eq!(client.closed().await, Some(4004));
    assert_eq!(refreshes.load(std::sync::atomic::Ordering::SeqCst), 2);
    // Before the second expiry, not after: refreshed ahead of it.
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
}

#[tokio::test]
async fn a_refresh_unanswered_is_asked_again_until_it_is_answered() {
    // Expires in 3 s: refreshed at once (under the margin); the backend
    // fails the first refresh (500), approves the second for a minute.
    let expires = unix_now() + 3;
    let refreshes = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counted = refreshes.clone();
    let backend = HttpBackend::start(move |request: &Request| match request.path.as_str() {
        "/connect" => Answer::json(json!({"user": "alice", "expires": expires})),
        "/refresh" if counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst) == 0 => {
            Answer::status(500)
        }
        "/refresh" => Answer::json(json!({"user": "alice", "expires": unix_now() + 60})),
        _ => Answer::status(404),
    })
    .await;
    let gateway = gateway_of(&backend).await;
    let mut client = client_with(&gateway, &[]).await;
    client.hello(None).await;
    // Past the first `expires` (a time to pass, not a wait for an event):
    // the connection lives on.
    let past = UNIX_EPOCH + Duration::from_secs(expires) + Duration::from_millis(500);
    let left = past.duration_since(SystemTime::now()).unwrap_or_default();
    tokio::time::sleep(left).await;
    client.send(json!({"op": "ping", "id": 1})).await;
    assert_eq!(client.expect("ok").await["id"], 1);
    assert_eq!(refreshes.load(std::sync::atomic::Ordering::SeqCst), 2);
}

#[tokio::test]
async fn a_forwarded_header_over_the_bound_is_left_out() {
    let backend = HttpBackend::start(app).await;
    let gateway = gateway_of(&backend).await;
    let huge = format!("{ALICE_COOKIE}; pad={}", "x".repeat(9000));
    let mut client = client_with(&gateway, &[("Cookie", &huge), ("Origin", "http://a.test")]).await;
    let (err, close) = refused(&mut client, json!({"op": "hello"})).await;
    assert_eq!(
        (err["code"].as_str(), close),
        (Some("unauthorized"), Some(4502))
    );
    let connect = &backend.requests()[0];
    assert_eq!(connect.body["headers"], json!({"origin": "http://a.test"}));
}

#[tokio::test]
async fn the_subscribe_proxy_approves_with_data_and_info_or_refuses() {
    let backend = HttpBackend::start(app).await;
    let gateway = gateway_of(&backend).await;
    let mut client = alice(&gateway).await;
    client
        .send(json!({"op": "sub", "id": 1, "topic": "rooms:1", "data": {"invite": "x1"}}))
        .await;
    let ok = client.expect("ok").await;
    assert_eq!(
        (ok["id"].as_u64(), ok["data"].clone()),
        (Some(1), json!({"welcome": {"invite": "x1"}}))
    );
    // The backend's `info` is Alice's in the room's presence.
    client
        .send(json!({"op": "presence", "id": 2, "topic": "rooms:1"}))
        .await;
    let page = client.expect("ok").await;
    assert_eq!(
        page["members"],
        json!([{"user": "alice", "info": {"seat": 3}}]),
        "{page}"
    );
    // The backend's own code, and a 403.
    client
        .send(json!({"op": "sub", "id": 3, "topic": "rooms:closed"}))
        .await;
    let err = client.expect("err").await;
    assert_eq!(
        (err["id"].as_u64(), err["code"].as_str()),
        (Some(3), Some("room_closed"))
    );
    assert_eq!(err["message"], "the room is closed");
    client
        .send(json!({"op": "sub", "id": 4, "topic": "rooms:secret"}))
        .await;
    let err = client.expect("err").await;
    assert_eq!(
        (err["id"].as_u64(), err["code"].as_str()),
        (Some(4), Some("forbidden"))
    );
    // Bad input costs no backend call.
    client
        .send(json!({"op": "sub", "id": 5, "topic": "nowhere:x"}))
        .await;
    assert_eq!(client.expect("err").await["code"], "unknown_namespace");
    let asked: Vec<_> = backend
        .requests()
        .into_iter()
        .filter(|r| r.path == "/subscribe")
        .map(|r| r.body["topic"].clone())
        .collect();
    assert_eq!(
        asked,
        [
            json!("rooms:1"),
            json!("rooms:closed"),
            json!("rooms:secret")
        ]
    );
    let first = backend
        .requests()
        .into_iter()
        .find(|r| r.path == "/subscribe")
        .expect("a subscribe");
    assert_eq!(first.body["user"], "alice");
    assert_eq!(first.body["data"], json!({"invite": "x1"}));
}

#[tokio::test]
async fn the_publish_proxy_modifies_refuses_or_skips() {
    let backend = HttpBackend::start(app).await;
    let gateway = gateway_of(&backend).await;
    let mut reader = alice(&gateway).await;
    reader.sub(1, "feed:news").await;
    let mut writer = alice(&gateway).await;
    // Modified: the subscriber sees the backend's data.
    writer
        .send(json!({"op": "pub", "id": 1, "topic": "feed:news", "data": "hello"}))
        .await;
    let ok = writer.expect("ok").await;
    assert!(ok["seq"].as_u64().is_some(), "{ok}");
    let (_, _, data) = reader.msg().await;
    assert_eq!(data, "HELLO!");
    // Skipped: accepted, no position, nothing delivered.
    writer
        .send(json!({"op": "pub", "id": 2, "topic": "feed:news", "data": "skip"}))
        .await;
    let ok = writer.expect("ok").await;
    assert_eq!(ok["id"], 2);
    assert!(ok.get("seq").is_none() && ok.get("epoch").is_none(), "{ok}");
    // Refused with the backend's code.
    writer
        .send(json!({"op": "pub", "id": 3, "topic": "feed:news", "data": "spam"}))
        .await;
    let err = writer.expect("err").await;
    assert_eq!(
        (err["id"].as_u64(), err["code"].as_str()),
        (Some(3), Some("spam"))
    );
    // As sent (`{}`): the next message the reader sees, so the skip
    // delivered nothing.
    writer
        .send(json!({"op": "pub", "id": 4, "topic": "feed:news", "data": {"n": 4}}))
        .await;
    writer.expect("ok").await;
    let (_, _, data) = reader.msg().await;
    assert_eq!(data, json!({"n": 4}));
}

#[tokio::test]
async fn an_rpc_goes_to_the_backend_and_back() {
    let backend = HttpBackend::start(app).await;
    let gateway = gateway_of(&backend).await;
    let mut client = alice(&gateway).await;
    client
        .send(json!({"op": "rpc", "id": 7, "method": "echo", "data": {"q": [1, 2]}}))
        .await;
    let ok = client.expect("ok").await;
    assert_eq!(
        ok,
        json!({"op": "ok", "id": 7, "data": {"echo": {"q": [1, 2]}, "user": "alice"}})
    );
    client
        .send(json!({"op": "rpc", "id": 8, "method": "missing"}))
        .await;
    let err = client.expect("err").await;
    assert_eq!(
        (err["id"].as_u64(), err["code"].as_str()),
        (Some(8), Some("not_found"))
    );
    // A method that is no name is the client's mistake, not the backend's.
    client
        .send(json!({"op": "rpc", "id": 9, "method": "a b"}))
        .await;
    assert_eq!(client.expect("err").await["code"], "malformed");
    let rpcs = backend
        .requests()
        .iter()
        .filter(|r| r.path == "/rpc")
        .count();
    assert_eq!(rpcs, 2);

    // Without `[proxy.rpc]`: `disabled`.
    let mut plain = Gateway::config();
    plain.proxy.rpc = None;
    let gateway = Gateway::with(plain).await;
    let mut client = Client::connect(&gateway).await;
    client.hello(None).await;
    client
        .send(json!({"op": "rpc", "id": 1, "method": "echo"}))
        .await;
    let err = client.expect("err").await;
    assert_eq!(
        (err["id"].as_u64(), err["code"].as_str()),
        (Some(1), Some("disabled"))
    );
}

#[tokio::test]
async fn a_backend_that_hangs_times_out_and_others_go_on() {
    let backend = HttpBackend::start(|request: &Request| match request.path.as_str() {
        "/rpc" => Answer::hang(),
        _ => app(request),
    })
    .await;
    let gateway = Gateway::with(config(
        |p| backend.url(&format!("/{p}")),
        Duration::from_millis(300),
    ))
    .await;
    let mut caller = alice(&gateway).await;
    let started = Instant::now();
    caller
        .send(json!({"op": "rpc", "id": 1, "method": "slow"}))
        .await;
    let err = caller.expect("err").await;
    assert_eq!(
        (err["id"].as_u64(), err["code"].as_str()),
        (Some(1), Some("unavailable"))
    );
    assert!(
        started.elapsed() >= Duration::from_millis(300),
        "{:?}",
        started.elapsed()
    );
    // The connection goes on: not a bad command, not closed.
    caller.send(json!({"op": "ping", "id": 2})).await;
    assert_eq!(caller.expect("ok").await["id"], 2);
    // A token client in a namespace without proxies never waited for it.
    let mut other = client_with(&gateway, &[]).await;
    let token = token_signed(SECRET, "bob", json!({}));
    other.send(json!({"op": "hello", "token": token})).await;
    other.expect("welcome").await;
    other.sub(1, "chat:general").await;
}

#[tokio::test]
async fn answers_that_are_no_answer_are_unavailable() {
    let backend = HttpBackend::start(|request: &Request| match request.body["method"].as_str() {
        Some("garbage") => Answer::raw(200, Some("application/json"), "{not json"),
        Some("html") => Answer::raw(200, Some("text/html"), "<html></html>"),
        Some("redirect") => Answer::status(307).header("location", "http://127.0.0.1:1/"),
        Some("teapot") => Answer::status(418),
        _ => app(request),
    })
    .await;
    let gateway = gateway_of(&backend).await;
    let mut client = alice(&gateway).await;
    for (id, method) in [(1, "garbage"), (2, "html"), (3, "redirect"), (4, "teapot")] {
        client
            .send(json!({"op": "rpc", "id": id, "method": method}))
            .await;
        let err = client.expect("err").await;
        assert_eq!(
            (err["id"].as_u64(), err["code"].as_str()),
            (Some(id), Some("unavailable")),
            "{method}: {err}"
        );
    }
    // And the connection is as good as before.
    client
        .send(json!({"op": "rpc", "id": 5, "method": "echo", "data": 5}))
        .await;
    assert_eq!(client.expect("ok").await["data"]["echo"], 5);
}

#[tokio::test]
async fn connect_and_rpc_over_grpc() {
    let backend = GrpcBackend::start(app).await;
    let gateway = Gateway::with(config(|_| backend.url(), Duration::from_secs(5))).await;
    let mut client = alice(&gateway).await;
    client
        .send(json!({"op": "rpc", "id": 1, "method": "echo", "data": [true]}))
        .await;
    let ok = client.expect("ok").await;
    assert_eq!(ok["data"], json!({"echo": [true], "user": "alice"}));
    client
        .send(json!({"op": "rpc", "id": 2, "method": "missing"}))
        .await;
    assert_eq!(client.expect("err").await["code"], "not_found");
    // A refusal over gRPC (PERMISSION_DENIED) closes as over HTTP.
    let mut client = client_with(&gateway, &[("Cookie", "sid=mallory")]).await;
    let (err, close) = refused(&mut client, json!({"op": "hello"})).await;
    assert_eq!(
        (err["code"].as_str(), close),
        (Some("forbidden"), Some(4502))
    );
    let connect = backend
        .requests()
        .into_iter()
        .find(|r| r.path == "/connect")
        .expect("a connect");
    assert_eq!(connect.body["headers"]["cookie"], ALICE_COOKIE);
}

#[tokio::test]
async fn a_saturated_proxy_is_unavailable_at_once() {
    // One call in flight at most; the backend's rpc hangs (past the test).
    let backend = HttpBackend::start(|request: &Request| match request.path.as_str() {
        "/rpc" => Answer::hang(),
        _ => app(request),
    })
    .await;
    let mut config = config(|p| backend.url(&format!("/{p}")), Duration::from_secs(30));
    config.proxy.max_in_flight = 1;
    let gateway = Gateway::with(config).await;
    let mut hanging = alice(&gateway).await;
    hanging
        .send(json!({"op": "rpc", "id": 1, "method": "slow"}))
        .await;
    // Once the backend holds that call, the next one is refused at once,
    // not queued behind it (the timeout is 30 s).
    testkit::eventually(testkit::WAIT, || async {
        match backend.requests().iter().any(|r| r.path == "/rpc") {
            true => Ok(()),
            false => Err("the first rpc has not reached the backend"),
        }
    })
    .await;
    let mut second = alice(&gateway).await;
    let started = Instant::now();
    second
        .send(json!({"op": "rpc", "id": 2, "method": "slow"}))
        .await;
    let err = second.expect("err").await;
    assert_eq!(
        (err["id"].as_u64(), err["code"].as_str()),
        (Some(2), Some("unavailable"))
    );
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    // Another proxy, and a namespace without any, are not held up.
    second.sub(2, "rooms:1").await;
    second.sub(3, "chat:general").await;
}

#[tokio::test]
async fn subscribe_and_publish_over_grpc() {
    let backend = GrpcBackend::start(app).await;
    let gateway = Gateway::with(config(|_| backend.url(), Duration::from_secs(5))).await;
    let mut client = alice(&gateway).await;
    client
        .send(json!({"op": "sub", "id": 1, "topic": "rooms:1", "data": "x"}))
        .await;
    assert_eq!(client.expect("ok").await["data"], json!({"welcome": "x"}));
    client
        .send(json!({"op": "sub", "id": 2, "topic": "rooms:closed"}))
        .await;
    assert_eq!(client.expect("err").await["code"], "room_closed");
    client.sub(3, "feed:news").await;
    client
        .send(json!({"op": "pub", "id": 4, "topic": "feed:news", "data": "skip"}))
        .await;
    assert!(client.expect("ok").await.get("seq").is_none());
    client
        .send(json!({"op": "pub", "id": 5, "topic": "feed:news", "data": "hi"}))
        .await;
    // The `ok` and the message, in either order.
    let (a, b) = (client.recv().await, client.recv().await);
    let msg = if a["op"] == "msg" { a } else { b };
    assert_eq!(msg["data"], "HI!");
}

#[tokio::test]
async fn a_session_resumes_as_the_user_the_backend_names() {
    let backend = HttpBackend::start(app).await;
    let gateway = gateway_of(&backend).await;
    let mut first = client_with(&gateway, &[("Cookie", ALICE_COOKIE)]).await;
    let welcome = first.hello(None).await;
    first.expect("ok").await;
    let session = welcome["session"].as_str().expect("session").to_owned();
    first.sub(1, "vip:backstage").await;
    drop(first);
    // Alice again, by her cookie: her session and its subscriptions.
    let mut again = client_with(&gateway, &[("Cookie", ALICE_COOKIE)]).await;
    let welcome = again.hello(Some(&session)).await;
    assert_eq!(welcome["resumed"], true, "{welcome}");
    let connects = backend
        .requests()
        .iter()
        .filter(|r| r.path == "/connect")
        .count();
    assert_eq!(connects, 2);
}
