//! Presence, as a client and a backend see it: who is subscribed to a topic
//! of a presence namespace, each user once however many connections it
//! has; a page at a position and the diffs after it (`presence_diff`, one
//! per topic per `presence.diff_interval`, each user once, counts only above
//! the namespace's threshold); a connection dropped without a close stays a
//! member for its resume window, and a resume within it is neither a leave
//! nor a join, while a user the backend disconnects leaves at once. A page
//! comes after the diff up to its position. Asked over the WebSocket
//! (`presence`), HTTP (`GET /v1/presence`, `/v1/presence/stats`) and gRPC
//! (`Presence`, `PresenceStats`); refused with `disabled` where the namespace keeps no
//! presence, `malformed` for a bad cursor or limit, and a token whose `info`
//! is too long is refused at `hello`. (With Redis, across pods:
//! `presence_pods`.)

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use gateway::Config;
use jsonwebtoken::{EncodingKey, Header};
use router::{NamespaceSettings, Subscribe};
use serde_json::{Value, json};
use testkit::{Client, Gateway, WAIT};

/// The HMAC secret of the pods under test.
pub(crate) const SECRET: &str = "herald-presence-tests-hmac-secret-0123456789";
/// The diff interval of most tests: short, so that a story is quick.
const INTERVAL: Duration = Duration::from_millis(100);

/// A token for `user`, with `info` when given, valid for ten minutes.
pub(crate) fn token(user: &str, info: Option<Value>) -> String {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("after 1970")
        .as_secs();
    let mut claims = json!({"sub": user, "exp": now + 600});
    if let Some(info) = info {
        claims["info"] = info;
    }
    jsonwebtoken::encode(
        &Header::default(),
        &claims,
        &EncodingKey::from_secret(SECRET.as_bytes()).expect("a key"),
    )
    .expect("a token")
}

/// Tokens checked, anonymous clients let in, and the namespaces: `room`
/// (presence and diffs), `big` (counts only above 2 users), `quiet`
/// (presence, no diffs); `chat` keeps none.
fn config() -> Config {
    let mut config = Gateway::config();
    config.auth.hmac_secret = SECRET.to_owned();
    config.auth.allow_anonymous = true;
    config.presence.diff_interval = INTERVAL;
    config.presence.page_size = 3;
    let ns = |join_leave, counts_only_above| NamespaceSettings {
        subscribe: Subscribe::Anyone,
        presence: true,
        join_leave,
        presence_counts_only_above: counts_only_above,
        ..Default::default()
    };
    config.namespaces.insert("room".into(), ns(true, 0));
    config.namespaces.insert("big".into(), ns(true, 2));
    config.namespaces.insert("quiet".into(), ns(false, 0));
    config
}

/// `message` with the API key of [`a_backend_asks_over_http_and_grpc`].
fn request<T>(message: T) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    request
        .metadata_mut()
        .insert("authorization", "Bearer secret".parse().expect("metadata"));
    request
}

/// A client of `url` that said `hello` as `user` (anonymous for `None`);
/// its session id.
pub(crate) async fn connect(url: &str, user: Option<&str>) -> (Client, String) {
    let mut client = Client::connect_url(url).await;
    let session = hello(&mut client, user, None).await;
    (client, session)
}

/// `hello` as `user`, resuming `resume`; the session id.
pub(crate) async fn hello(client: &mut Client, user: Option<&str>, resume: Option<&str>) -> String {
    let mut hello = json!({"op": "hello"});
    if let Some(user) = user {
        hello["token"] = json!(token(user, Some(json!({"name": user.to_uppercase()}))));
    }
    if let Some(resume) = resume {
        hello["resume"] = json!(resume);
    }
    client.send(hello).await;
    let welcome = client.expect("welcome").await;
    welcome["session"].as_str().expect("a session").to_owned()
}

/// A `presence` query and its answer (`ok` or `err`).
pub(crate) async fn ask(client: &mut Client, id: u64, query: Value) -> Value {
    let mut command = json!({"op": "presence", "id": id});
    if let (Some(command), Some(query)) = (command.as_object_mut(), query.as_object()) {
        command.extend(query.clone());
    }
    client.send(command).await;
    reply(client, id).await
}

/// `sub` and its `ok`, past the diffs of topics subscribed before.
pub(crate) async fn sub(client: &mut Client, id: u64, topic: &str) {
    client
        .send(json!({"op": "sub", "id": id, "topic": topic}))
        .await;
    let ok = reply(client, id).await;
    assert_eq!(ok["op"], "ok", "{ok}");
}

/// The reply to command `id` (diffs may come before it).
pub(crate) async fn reply(client: &mut Client, id: u64) -> Value {
    loop {
        let answer = client.recv().await;
        if answer["id"] == id {
            return answer;
        }
    }
}

pub(crate) fn users(page: &Value) -> Vec<String> {
    page["members"]
        .as_array()
        .expect("members")
        .iter()
        .map(|m| m["user"].as_str().expect("user").to_owned())
        .collect()
}

/// The diffs `client` receives until one satisfies `until` (that one
/// included), within [`WAIT`].
pub(crate) async fn diffs_until(client: &mut Client, until: impl Fn(&Value) -> bool) -> Vec<Value> {
    let mut diffs = Vec::new();
    let deadline = Instant::now() + WAIT;
    loop {
        assert!(Instant::now() < deadline, "no such diff in time: {diffs:?}");
        let message = client.recv().await;
        if message["op"] != "presence_diff" {
            continue;
        }
        let done = until(&message);
        diffs.push(message);
        if done {
            return diffs;
        }
    }
}

pub(crate) fn names(diff: &Value, key: &str) -> Vec<String> {
    diff[key]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|m| {
                    m.get("user")
                        .unwrap_or(m)
                        .as_str()
                        .expect("a user")
                        .to_owned()
                })
                .collect()
        })
        .unwrap_or_default()
}

pub(crate) fn joins(diff: &Value, user: &str) -> bool {
    names(diff, "joins").iter().any(|u| u == user)
}

pub(crate) fn leaves(diff: &Value, user: &str) -> bool {
    names(diff, "leaves").iter().any(|u| u == user)
}

#[tokio::test]
async fn a_subscriber_that_asks_sees_itself_with_its_info() {
    let gw = Gateway::with(config()).await;
    let (mut alice, _) = connect(&gw.ws_url(), Some("alice")).await;
    alice.sub(1, "room:1").await;
    let page = ask(&mut alice, 2, json!({"topic": "room:1"})).await;
    assert_eq!(page["op"], "ok", "{page}");
    assert_eq!(page["topic"], "room:1");
    assert_eq!(
        (page["users"].as_u64(), page["connections"].as_u64()),
        (Some(1), Some(1))
    );
    assert!(page["position"].as_u64().expect("position") >= 1, "{page}");
    assert_eq!(
        page["members"],
        json!([{"user": "alice", "info": {"name": "ALICE"}}])
    );
    assert!(page.get("cursor").is_none(), "one page: {page}");
    // Anyone who may subscribe may look, subscribed or not; an anonymous
    // connection counts in `connections` only.
    let (mut anonymous, _) = connect(&gw.ws_url(), None).await;
    anonymous.sub(1, "room:1").await;
    let page = ask(&mut anonymous, 2, json!({"topic": "room:1"})).await;
    assert_eq!(
        (page["users"].as_u64(), page["connections"].as_u64()),
        (Some(1), Some(2))
    );
    assert_eq!(users(&page), ["alice"]);
}

#[tokio::test]
async fn pages_follow_their_cursor_in_user_order() {
    let gw = Gateway::with(config()).await;
    let mut clients = Vec::new();
    for user in ["erin", "bob", "dave", "alice", "carol"] {
        let (mut client, _) = connect(&gw.ws_url(), Some(user)).await;
        client.sub(1, "quiet:1").await;
        clients.push(client);
    }
    let asker = &mut clients[0];
    let mut seen = Vec::new();
    let mut cursor: Option<String> = None;
    for id in 10.. {
        let mut query = json!({"topic": "quiet:1", "limit": 2});
        if let Some(cursor) = &cursor {
            query["cursor"] = json!(cursor);
        }
        let page = ask(asker, id, query).await;
        assert_eq!(page["users"], 5, "{page}");
        seen.extend(users(&page));
        match page["cursor"].as_str() {
            Some(next) => cursor = Some(next.to_owned()),
            None => break,
        }
        assert!(id < 20, "the pages never ended: {seen:?}");
    }
    assert_eq!(seen, ["alice", "bob", "carol", "dave", "erin"]);
    // Without a limit: `presence.page_size` (3).
    let page = ask(asker, 30, json!({"topic": "quiet:1"})).await;
    assert_eq!(users(&page), ["alice", "bob", "carol"]);
    assert!(page["cursor"].is_string());
}

#[tokio::test]
async fn a_user_with_two_connections_joins_once_and_leaves_once() {
    let gw = Gateway::with(config()).await;
    let (mut carol, _) = connect(&gw.ws_url(), Some("carol")).await;
    carol.sub(1, "room:2").await;
    let (mut first, _) = connect(&gw.ws_url(), Some("alice")).await;
    first.sub(1, "room:2").await;
    let (mut second, _) = connect(&gw.ws_url(), Some("alice")).await;
    second.sub(1, "room:2").await;
    let mut seen = diffs_until(&mut carol, |d| d["connections"] == 3).await;
    // Her first connection goes (unsubscribed): she is still in.
    first
        .send(json!({"op": "unsub", "id": 2, "topic": "room:2"}))
        .await;
    assert_eq!(reply(&mut first, 2).await["op"], "ok");
    seen.extend(diffs_until(&mut carol, |d| d["connections"] == 2).await);
    // Her last one closes: she leaves at once.
    second.ws.close(None).await.expect("close");
    seen.extend(diffs_until(&mut carol, |d| leaves(d, "alice")).await);
    let joined = seen.iter().filter(|d| joins(d, "alice")).count();
    let left = seen.iter().filter(|d| leaves(d, "alice")).count();
    assert_eq!((joined, left), (1, 1), "{seen:?}");
    let last = seen.last().expect("a diff");
    assert_eq!(
        (last["users"].as_u64(), last["connections"].as_u64()),
        (Some(1), Some(1))
    );
    // Each diff starts where the one before ended.
    for pair in seen.windows(2) {
        assert_eq!(pair[1]["from"], pair[0]["to"], "{seen:?}");
    }
    // Its info came with the join.
    let join = seen.iter().find(|d| joins(d, "alice")).expect("the join");
    assert_eq!(join["joins"][0]["info"], json!({"name": "ALICE"}));
}

#[tokio::test]
async fn many_joins_in_one_interval_are_one_diff() {
    let mut config = config();
    // Long enough for five clients to join within one interval, or two.
    config.presence.diff_interval = Duration::from_secs(3);
    let gw = Gateway::with(config).await;
    let (mut watcher, _) = connect(&gw.ws_url(), None).await;
    watcher.sub(1, "room:3").await;
    let mut clients = Vec::new();
    for user in ["a", "b", "c", "d", "e"] {
        let (mut client, _) = connect(&gw.ws_url(), Some(user)).await;
        client.sub(1, "room:3").await;
        clients.push(client);
    }
    let diffs = diffs_until(&mut watcher, |d| d["users"] == 5).await;
    assert!(
        diffs.len() <= 2,
        "five joins in {} diffs: {diffs:?}",
        diffs.len()
    );
    let mut joined: Vec<String> = diffs.iter().flat_map(|d| names(d, "joins")).collect();
    joined.sort();
    assert_eq!(joined, ["a", "b", "c", "d", "e"]);
}

#[tokio::test]
async fn above_the_threshold_a_diff_carries_counts_only() {
    let gw = Gateway::with(config()).await;
    let (mut watcher, _) = connect(&gw.ws_url(), None).await;
    watcher.sub(1, "big:1").await;
    let mut clients = Vec::new();
    for user in ["a", "b"] {
        let (mut client, _) = connect(&gw.ws_url(), Some(user)).await;
        client.sub(1, "big:1").await;
        clients.push(client);
    }
    let diffs = diffs_until(&mut watcher, |d| d["users"] == 2).await;
    assert!(diffs.iter().all(|d| d.get("joins").is_some()), "{diffs:?}");
    let (mut client, _) = connect(&gw.ws_url(), Some("c")).await;
    client.sub(1, "big:1").await;
    let diffs = diffs_until(&mut watcher, |d| d["users"] == 3).await;
    let last = diffs.last().expect("a diff");
    assert!(
        last.get("joins").is_none() && last.get("leaves").is_none(),
        "{last}"
    );
    assert_eq!(last["connections"], 4);
    // A page still lists them.
    let page = ask(&mut watcher, 2, json!({"topic": "big:1"})).await;
    assert_eq!(users(&page), ["a", "b", "c"]);
}

#[tokio::test]
async fn a_resume_within_the_window_is_neither_a_leave_nor_a_join() {
    let gw = Gateway::with(config()).await;
    let url = gw.ws_url();
    let (mut watcher, _) = connect(&url, None).await;
    watcher.sub(1, "room:4").await;
    let (mut alice, session) = connect(&url, Some("alice")).await;
    alice.sub(1, "room:4").await;
    let mut seen = diffs_until(&mut watcher, |d| joins(d, "alice")).await;
    // Her connection drops without a close, and she resumes.
    drop(alice);
    let mut alice = Client::connect_url(&url).await;
    hello(&mut alice, Some("alice"), Some(&session)).await;
    // Then someone else joins: every change before it has been sent.
    let (mut bob, _) = connect(&url, Some("bob")).await;
    bob.sub(1, "room:4").await;
    seen.extend(diffs_until(&mut watcher, |d| joins(d, "bob")).await);
    let joined = seen.iter().filter(|d| joins(d, "alice")).count();
    let left = seen.iter().filter(|d| leaves(d, "alice")).count();
    assert_eq!((joined, left), (1, 0), "{seen:?}");
    let page = ask(&mut watcher, 2, json!({"topic": "room:4"})).await;
    assert_eq!(users(&page), ["alice", "bob"]);
    assert_eq!(page["connections"], 3, "{page}");
}

#[tokio::test]
async fn a_dropped_connection_leaves_once_its_resume_window_ends() {
    let mut config = config();
    let window = Duration::from_secs(1);
    config.session.resume_window = window;
    let gw = Gateway::with(config).await;
    let (mut watcher, _) = connect(&gw.ws_url(), None).await;
    watcher.sub(1, "room:5").await;
    let (mut alice, _) = connect(&gw.ws_url(), Some("alice")).await;
    alice.sub(1, "room:5").await;
    diffs_until(&mut watcher, |d| joins(d, "alice")).await;
    drop(alice);
    let dropped = Instant::now();
    diffs_until(&mut watcher, |d| leaves(d, "alice")).await;
    assert!(
        dropped.elapsed() >= window,
        "left after {:?}",
        dropped.elapsed()
    );
    let page = ask(&mut watcher, 2, json!({"topic": "room:5"})).await;
    assert_eq!(
        (page["users"].as_u64(), page["connections"].as_u64()),
        (Some(0), Some(1))
    );
}

#[tokio::test]
async fn bad_queries_are_refused_with_their_code() {
    let gw = Gateway::with(config()).await;
    let (mut client, _) = connect(&gw.ws_url(), Some("alice")).await;
    let refused = |answer: &Value, code: &str| {
        assert_eq!(answer["op"], "err", "{answer}");
        assert_eq!(answer["code"], code, "{answer}");
    };
    let answer = ask(&mut client, 1, json!({"topic": "chat:1"})).await;
    refused(&answer, "disabled");
    assert_eq!(answer["topic"], "chat:1");
    refused(
        &ask(&mut client, 2, json!({"topic": "room:1", "cursor": "***"})).await,
        "malformed",
    );
    refused(
        &ask(&mut client, 3, json!({"topic": "room:1", "limit": 0})).await,
        "malformed",
    );
    refused(
        &ask(&mut client, 4, json!({"topic": "room:1", "limit": 4})).await,
        "malformed",
    );
    refused(
        &ask(&mut client, 5, json!({"topic": "nowhere:1"})).await,
        "unknown_namespace",
    );
    refused(&ask(&mut client, 6, json!({})).await, "missing_field");
    // Still connected: these were the client's mistakes, not the server's.
    client.sub(7, "room:1").await;
}

#[tokio::test]
async fn a_token_whose_info_is_too_long_is_refused_at_hello() {
    let mut config = config();
    config.presence.max_info_bytes = 32;
    let gw = Gateway::with(config).await;
    let mut client = Client::connect(&gw).await;
    let info = json!({"name": "a name much longer than thirty-two bytes"});
    client
        .send(json!({"op": "hello", "token": token("alice", Some(info))}))
        .await;
    let err = client.expect("err").await;
    assert_eq!(err["code"], "unauthorized");
    let message = err["message"].as_str().expect("message");
    assert!(
        message.contains("`info`") && message.contains("32"),
        "{message}"
    );
    assert_eq!(client.closed().await, Some(4502));
    // Not an object: refused too.
    let mut client = Client::connect(&gw).await;
    client
        .send(json!({"op": "hello", "token": token("alice", Some(json!([1])))}))
        .await;
    assert_eq!(client.expect("err").await["code"], "unauthorized");
    // Within the limit: welcome.
    let mut client = Client::connect(&gw).await;
    let info = json!({"n": 1});
    client
        .send(json!({"op": "hello", "token": token("alice", Some(info))}))
        .await;
    client.expect("welcome").await;
}

#[tokio::test]
async fn a_backend_asks_over_http_and_grpc() {
    let mut config = config();
    config.http.api_keys = vec!["secret".into()];
    let gw = Gateway::with(config).await;
    let (mut alice, _) = connect(&gw.ws_url(), Some("alice")).await;
    alice.sub(1, "room:6").await;
    let key = [("authorization", "Bearer secret")];
    let get = |path: String| {
        let addr = gw.addr;
        async move {
            let (status, body) = testkit::http(addr, "GET", &path, &key, b"").await;
            (
                status,
                serde_json::from_str::<Value>(&body).unwrap_or(Value::Null),
            )
        }
    };
    let (status, page) = get("/v1/presence?topic=room%3A6".into()).await;
    assert_eq!(status, 200, "{page}");
    assert_eq!(
        page["members"],
        json!([{"user": "alice", "info": {"name": "ALICE"}}])
    );
    assert!(
        page.get("op").is_none() && page.get("id").is_none(),
        "{page}"
    );
    let (status, stats) = get("/v1/presence/stats?topic=room:6".into()).await;
    assert_eq!(status, 200, "{stats}");
    assert_eq!(stats["topic"], "room:6");
    assert_eq!(
        (stats["users"].as_u64(), stats["connections"].as_u64()),
        (Some(1), Some(1))
    );
    assert_eq!(stats["position"], page["position"]);
    let (status, err) = get("/v1/presence?topic=chat:1".into()).await;
    assert_eq!(
        (status, err["code"].as_str()),
        (400, Some("disabled")),
        "{err}"
    );
    let (status, err) = get("/v1/presence?topic=room:6&limit=9".into()).await;
    assert_eq!(
        (status, err["code"].as_str()),
        (400, Some("malformed")),
        "{err}"
    );
    let (status, err) = get("/v1/presence/stats".into()).await;
    assert_eq!(
        (status, err["code"].as_str()),
        (400, Some("missing_field")),
        "{err}"
    );
    let (status, _) = testkit::http(gw.addr, "GET", "/v1/presence?topic=room:6", &[], b"").await;
    assert_eq!(status, 401);

    let mut grpc = testkit::grpc_client(gw.grpc_addr).await;
    let page = grpc
        .presence(request(proto::v1::PresenceRequest {
            topic: "room:6".into(),
            cursor: None,
            limit: None,
        }))
        .await
        .expect("Presence")
        .into_inner();
    assert_eq!(page.members.len(), 1);
    assert_eq!(page.members[0].user, "alice");
    assert_eq!(
        page.members[0].info.as_deref(),
        Some(&br#"{"name":"ALICE"}"#[..])
    );
    let stats = grpc
        .presence_stats(request(proto::v1::PresenceStatsRequest {
            topic: "room:6".into(),
        }))
        .await
        .expect("PresenceStats")
        .into_inner();
    assert_eq!((stats.users, stats.connections), (1, 1));
    let refused = grpc
        .presence_stats(request(proto::v1::PresenceStatsRequest {
            topic: "chat:1".into(),
        }))
        .await
        .expect_err("no presence in chat");
    assert_eq!(refused.code(), tonic::Code::FailedPrecondition);
}

#[tokio::test]
async fn a_page_comes_after_the_diff_up_to_its_position() {
    let mut config = config();
    // No tick in the test's time: only the page writes and sends.
    config.presence.diff_interval = Duration::from_secs(30);
    config.presence.pod_ttl = Duration::from_secs(60);
    let gw = Gateway::with(config).await;
    let (mut watcher, _) = connect(&gw.ws_url(), None).await;
    watcher.sub(1, "room:7").await;
    let (mut alice, _) = connect(&gw.ws_url(), Some("alice")).await;
    alice.sub(1, "room:7").await;
    watcher
        .send(json!({"op": "presence", "id": 2, "topic": "room:7"}))
        .await;
    let diff = watcher.expect("presence_diff").await;
    let page = watcher.expect("ok").await;
    assert_eq!(users(&page), ["alice"]);
    assert_eq!(diff["to"], page["position"], "{diff} then {page}");
    assert!(joins(&diff, "alice"), "{diff}");
}

#[tokio::test]
async fn a_user_the_backend_disconnects_leaves_at_once() {
    let gw = Gateway::with(config()).await;
    let (mut watcher, _) = connect(&gw.ws_url(), None).await;
    watcher.sub(1, "room:8").await;
    let (mut alice, _) = connect(&gw.ws_url(), Some("alice")).await;
    alice.sub(1, "room:8").await;
    diffs_until(&mut watcher, |d| joins(d, "alice")).await;
    let body = json!({"user": "alice"}).to_string();
    let (status, _) = testkit::http(gw.addr, "POST", "/v1/disconnect", &[], body.as_bytes()).await;
    assert_eq!(status, 200);
    assert_eq!(alice.closed().await, Some(4503));
    // Well within the resume window (2 minutes): no lingering.
    let asked = Instant::now();
    diffs_until(&mut watcher, |d| leaves(d, "alice")).await;
    assert!(asked.elapsed() < Duration::from_secs(60));
    // One who only lingers (dropped without a close) leaves at once too.
    let (mut bob, _) = connect(&gw.ws_url(), Some("bob")).await;
    bob.sub(1, "room:8").await;
    diffs_until(&mut watcher, |d| joins(d, "bob")).await;
    drop(bob);
    // Its connection ended (the watcher's is the last): bob only lingers.
    gw.await_metric("herald_connections", 1.0).await;
    let page = ask(&mut watcher, 2, json!({"topic": "room:8"})).await;
    assert_eq!(users(&page), ["bob"], "bob lingers: {page}");
    let body = json!({"user": "bob"}).to_string();
    let (status, _) = testkit::http(gw.addr, "POST", "/v1/disconnect", &[], body.as_bytes()).await;
    assert_eq!(status, 200);
    let asked = Instant::now();
    diffs_until(&mut watcher, |d| leaves(d, "bob")).await;
    assert!(asked.elapsed() < Duration::from_secs(60));
}
