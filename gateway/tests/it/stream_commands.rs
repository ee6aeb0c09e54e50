//! HTTP-streaming's commands (issue #25): `POST /stream/<session>` taken by
//! any pod. A pod that does not hold the session forwards the commands
//! through the broker (Redis: the control channel) to the one that does,
//! and their replies come on the session's own connection, in order; the
//! embedded broker does the same on its one pod. Bad input gets a clear
//! status, and nothing reaches the session it named: an unknown session
//! and another user's get the very same answer.
//!
//! The sessions are HTTP-streaming's (`POST /stream`, NDJSON), read by a
//! client written here over a plain socket; a WebSocket's session takes
//! posted commands the same way (the flood's).

use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

use gateway::Config;
use serde_json::{Value, json};
use testkit::backend::Request;
use testkit::{Answer, Client, Gateway, Herald, HttpBackend, Redis, WAIT};

use crate::pod::{HERALD, publish, saved};
use crate::server_subscriptions::token_signed;

/// The HMAC secret tokens are signed with (at least 32 bytes).
const SECRET: &str = "herald-stream-commands-tests-secret-0123456";

/// The cookie the connect proxy knows as alice's.
const ALICE_COOKIE: &str = "sid=alice-51c0";

fn token(sub: &str) -> String {
    token_signed(SECRET, sub, json!({}))
}

/// `POST /stream/<session>` to `addr` with `body` and `headers`: the
/// status and the answer (JSON).
async fn post(
    addr: SocketAddr,
    session: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> (u16, Value) {
    let path = format!("/stream/{session}");
    let (status, answer) = testkit::http(addr, "POST", &path, headers, body.as_bytes()).await;
    let answer = serde_json::from_str(&answer).unwrap_or_else(|_| panic!("JSON: {answer}"));
    (status, answer)
}

/// [`post`] with `token` as the bearer.
async fn post_as(addr: SocketAddr, session: &str, token: &str, body: &str) -> (u16, Value) {
    let bearer = format!("Bearer {token}");
    post(addr, session, &[("authorization", &bearer)], body).await
}

/// Newline-delimited commands, as a POST carries them.
fn lines(commands: &[Value]) -> String {
    commands.iter().map(|c| format!("{c}\n")).collect()
}

/// A client of `url` logged in as `token`'s user: it and its session id.
async fn login(url: &str, token: &str) -> (Client, String) {
    let mut client = Client::connect_url(url).await;
    client.send(json!({"op": "hello", "token": token})).await;
    let welcome = client.expect("welcome").await;
    let session = welcome["session"].as_str().expect("session").to_owned();
    (client, session)
}

/// An HTTP-streaming session (`POST /stream`), its NDJSON lines read as
/// they come: what a client without WebSockets holds.
struct Stream {
    read: BufReader<TcpStream>,
}

impl Stream {
    /// Opens a stream at `addr` with `hello` (a token in it, or none): the
    /// stream, after its response head, and the session's id.
    async fn open(addr: SocketAddr, hello: Value) -> (Self, String) {
        let body = hello.to_string();
        let request = format!(
            "POST /stream HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        );
        let mut socket = TcpStream::connect(addr).await.expect("connect");
        socket.write_all(request.as_bytes()).await.expect("request");
        let mut read = BufReader::new(socket);
        let mut status = String::new();
        let reading = read.read_line(&mut status);
        tokio::time::timeout(WAIT, reading)
            .await
            .expect("head in time")
            .expect("head");
        assert!(status.starts_with("HTTP/1.1 200"), "{status}");
        loop {
            let mut line = String::new();
            let reading = read.read_line(&mut line);
            tokio::time::timeout(WAIT, reading)
                .await
                .expect("head in time")
                .expect("head");
            if line == "\r\n" {
                break;
            }
            assert!(!line.is_empty(), "the head ended early");
        }
        let mut stream = Self { read };
        let welcome = stream.expect("welcome").await;
        let session = welcome["session"].as_str().expect("session").to_owned();
        (stream, session)
    }

    /// The next frame (heartbeats, empty lines, skipped).
    async fn recv(&mut self) -> Value {
        loop {
            let mut line = String::new();
            let reading = self.read.read_line(&mut line);
            let n = tokio::time::timeout(WAIT, reading)
                .await
                .expect("a frame in time")
                .expect("the stream open");
            assert!(n > 0, "the stream ended");
            if !line.trim().is_empty() {
                return serde_json::from_str(&line).unwrap_or_else(|_| panic!("JSON: {line}"));
            }
        }
    }

    async fn expect(&mut self, op: &str) -> Value {
        let frame = self.recv().await;
        assert_eq!(frame["op"], op, "expected `{op}`, got {frame}");
        frame
    }

    /// The next `msg`: (topic, seq, data).
    async fn msg(&mut self) -> (String, u64, Value) {
        let m = self.expect("msg").await;
        (
            m["topic"].as_str().expect("topic").to_owned(),
            m["seq"].as_u64().expect("seq"),
            m["data"].clone(),
        )
    }
}

/// Two pods sharing `redis`, tokens checked with [`SECRET`], clients may
/// publish in `chat`.
async fn pods(redis: &Redis) -> (Herald, Herald) {
    let env = [
        ("HERALD_REDIS__COMMAND_TIMEOUT", "2s"),
        ("HERALD_AUTH__HMAC_SECRET", SECRET),
        ("HERALD_NAMESPACES__CHAT__PUBLISH", "authenticated"),
    ];
    (
        Herald::pod(HERALD, &redis.url(), &env).await,
        Herald::pod(HERALD, &redis.url(), &env).await,
    )
}

/// The next `n` frames of `client`, by op and id (a reply), or op and seq (a
/// `msg`): the order between a `pub`'s `ok` and its own `msg` is the
/// fan-out's, not the commands'.
async fn next_frames(client: &mut Stream, n: usize) -> Vec<Value> {
    let mut frames = Vec::new();
    for _ in 0..n {
        frames.push(client.recv().await);
    }
    frames
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn commands_posted_to_the_pod_that_does_not_hold_the_session_are_answered_on_its_stream() {
    let redis = Redis::start().await;
    let (a, b) = pods(&redis).await;
    let alice = token("alice");
    let (mut client, session) = Stream::open(a.addr, json!({"op": "hello", "token": alice})).await;
    // At once, to the other pod: the session may not be stored yet (a pod
    // saves a new session at its next flush), and is found all the same.
    let sub = json!({"op": "sub", "id": 1, "topic": "chat:room"});
    let (status, answer) = post_as(b.addr, &session, &alice, &lines(&[sub])).await;
    assert_eq!((status, answer), (202, json!({"accepted": 1})));
    let ok = client.expect("ok").await;
    assert_eq!(
        (ok["id"].as_u64(), ok["topic"].as_str()),
        (Some(1), Some("chat:room"))
    );
    // Subscribed for real: a publish on either pod reaches it.
    let (status, _) = publish(b.addr, "chat:room", json!("hello"), None).await;
    assert_eq!(status, 200);
    assert_eq!(
        client.msg().await,
        ("chat:room".to_owned(), 1, json!("hello"))
    );

    // Several in one POST, run in their order: a publish and a ping.
    let commands = [
        json!({"op": "pub", "id": 2, "topic": "chat:room", "data": "posted"}),
        json!({"op": "ping", "id": 3}),
    ];
    let (status, answer) = post_as(b.addr, &session, &alice, &lines(&commands)).await;
    assert_eq!((status, answer), (202, json!({"accepted": 2})));
    let frames = next_frames(&mut client, 3).await;
    let replies: Vec<_> = frames.iter().filter(|f| f["op"] == "ok").collect();
    assert_eq!(replies.len(), 2, "{frames:?}");
    assert_eq!(
        (replies[0]["id"].as_u64(), replies[0]["seq"].as_u64()),
        (Some(2), Some(2))
    );
    assert_eq!(replies[1]["id"], 3, "in the order posted");
    let msg = frames
        .iter()
        .find(|f| f["op"] == "msg")
        .expect("its own message");
    assert_eq!(
        (msg["seq"].as_u64(), &msg["data"]),
        (Some(2), &json!("posted"))
    );
    // An ack of what it was sent: the session is saved with it.
    let ack = json!({"op": "ack", "topic": "chat:room", "seq": 2});
    assert_eq!(
        post_as(b.addr, &session, &alice, &lines(&[ack])).await.0,
        202
    );
    saved(&redis, &session, "\n2 ").await;
    let forwarded = testkit::metric(
        b.addr,
        r#"herald_stream_commands_forwarded_total{result="sent"}"#,
    )
    .await;
    assert_eq!(forwarded, 3.0);
    let queued = testkit::metric(
        a.addr,
        r#"herald_stream_commands_forwarded_total{result="queued"}"#,
    )
    .await;
    assert_eq!(queued, 3.0);
}

/// Tokens checked with [`SECRET`]; the connect proxy knows alice by her
/// cookie; the rpc proxy's `slow` never answers (within its 10 s), `echo`
/// echoes.
fn hooked(backend: &HttpBackend) -> Config {
    let mut config = Gateway::config();
    config.auth.hmac_secret = SECRET.to_owned();
    let endpoint = |path: &str| gateway::config::Endpoint {
        url: backend.url(path),
        timeout: Duration::from_secs(10),
        headers: vec!["Cookie".to_owned()],
    };
    config.proxy.connect = Some(endpoint("/connect"));
    config.proxy.rpc = Some(endpoint("/rpc"));
    config
}

fn app(request: &Request) -> Answer {
    match request.path.as_str() {
        "/connect" => match request.body["headers"]["cookie"].as_str() {
            Some(ALICE_COOKIE) => Answer::json(json!({"user": "alice"})),
            _ => Answer::status(401),
        },
        "/rpc" => match request.body["method"].as_str() {
            Some("slow") => Answer::hang(),
            _ => Answer::json(json!({"data": request.body["data"]})),
        },
        _ => Answer::status(404),
    }
}

#[tokio::test]
async fn the_embedded_broker_runs_posted_commands_on_its_pods_session_and_the_proxy_is_asked_again()
{
    let backend = HttpBackend::start(app).await;
    let gw = Gateway::with(hooked(&backend)).await;
    let alice = token("alice");
    let (mut client, session) = Stream::open(gw.addr, json!({"op": "hello", "token": alice})).await;
    let commands = [
        json!({"op": "sub", "id": 1, "topic": "chat:room"}),
        json!({"op": "pub", "id": 2, "topic": "chat:room", "data": 7}),
    ];
    let (status, _) = post_as(gw.addr, &session, &alice, &lines(&commands)).await;
    assert_eq!(status, 202);
    let frames = next_frames(&mut client, 3).await;
    assert_eq!(
        (frames[0]["op"].as_str(), frames[0]["id"].as_u64()),
        (Some("ok"), Some(1))
    );
    let seqs: Vec<_> = frames[1..]
        .iter()
        .map(|f| (f["op"].clone(), f["seq"].clone()))
        .collect();
    assert!(seqs.contains(&(json!("ok"), json!(1))), "{frames:?}");
    assert!(seqs.contains(&(json!("msg"), json!(1))), "{frames:?}");

    // Without a token, the connect proxy says who posts: alice, by her
    // cookie; anyone else is not let in.
    let rpc = json!({"op": "rpc", "id": 3, "method": "echo", "data": "by cookie"});
    let (status, _) = post(
        gw.addr,
        &session,
        &[("cookie", ALICE_COOKIE)],
        &lines(&[rpc]),
    )
    .await;
    assert_eq!(status, 202);
    let reply = client.expect("ok").await;
    assert_eq!(
        (reply["id"].as_u64(), &reply["data"]),
        (Some(3), &json!("by cookie"))
    );
    let (status, answer) = post(
        gw.addr,
        &session,
        &[("cookie", "sid=eve")],
        "{\"op\":\"ping\",\"id\":4}",
    )
    .await;
    assert_eq!(
        (status, answer["error"]["code"].as_str()),
        (401, Some("unauthorized"))
    );

    // A page of another origin may post: its preflight is answered, and
    // so is the POST, for it to read.
    let origin = [("origin", "https://app.example")];
    let path = format!("/stream/{session}");
    let (status, headers, _) =
        testkit::http_with_headers(gw.addr, "OPTIONS", &path, &origin, b"").await;
    assert_eq!(status, 204);
    assert_eq!(
        headers["access-control-allow-origin"],
        "https://app.example"
    );
    let allowed = headers["access-control-allow-headers"]
        .to_str()
        .expect("text");
    assert!(allowed.contains("authorization"), "{allowed}");
    let bearer = format!("Bearer {alice}");
    let headers = [origin[0], ("authorization", bearer.as_str())];
    let ping = lines(&[json!({"op": "ping", "id": 6})]);
    let (status, answer_headers, _) =
        testkit::http_with_headers(gw.addr, "POST", &path, &headers, ping.as_bytes()).await;
    assert_eq!(status, 202);
    assert_eq!(
        answer_headers["access-control-allow-origin"],
        "https://app.example"
    );
    assert_eq!(client.expect("ok").await["id"], 6);

    // The session's own dispatch: a command it refuses is its `err`,
    // counted as a frame's would be.
    let bad = json!({"op": "unsub", "id": 5, "topic": "chat:elsewhere"});
    let (status, _) = post_as(gw.addr, &session, &alice, &lines(&[bad])).await;
    assert_eq!(status, 202, "well-formed: the session judges it");
    let err = client.expect("err").await;
    assert_eq!(
        (err["id"].as_u64(), err["code"].as_str()),
        (Some(5), Some("not_subscribed"))
    );
    gw.shutdown().await;
}

#[tokio::test]
async fn a_flood_of_posts_is_refused_with_429_once_the_session_has_too_many_waiting() {
    let backend = HttpBackend::start(app).await;
    let gw = Gateway::with(hooked(&backend)).await;
    let alice = token("alice");
    let (_client, session) = login(&gw.ws_url(), &alice).await;
    // A call that holds the session's loop: what is posted meanwhile waits.
    let slow = json!({"op": "rpc", "id": 1, "method": "slow"});
    assert_eq!(
        post_as(gw.addr, &session, &alice, &lines(&[slow])).await.0,
        202
    );
    let pings: Vec<Value> = (0..64)
        .map(|i| json!({"op": "ping", "id": 100 + i}))
        .collect();
    let full = lines(&pings);
    let max = gateway::session::MAX_POSTED_COMMANDS / 64;
    for _ in 0..max - 1 {
        assert_eq!(post_as(gw.addr, &session, &alice, &full).await.0, 202);
    }
    // However far the loop got (the slow call taken, or not yet), one more
    // full POST is past the bound.
    let mut statuses = Vec::new();
    for _ in 0..2 {
        let (status, answer) = post_as(gw.addr, &session, &alice, &full).await;
        statuses.push(status);
        if status == 429 {
            assert_eq!(answer["error"]["code"], "rate_limited", "{answer}");
            break;
        }
    }
    assert_eq!(statuses.last(), Some(&429), "{statuses:?}");
    let refused = gw
        .node
        .metrics
        .stream_commands
        .posts
        .with_label_values(&["rate_limited"])
        .get();
    assert_eq!(refused, 1);
    // (No drain: it would wait for the slow call.)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_posts_get_a_clear_status_and_nothing_reaches_the_session_they_name() {
    let redis = Redis::start().await;
    let (a, b) = pods(&redis).await;
    let alice = token("alice");
    let (mut victim, session) = Stream::open(a.addr, json!({"op": "hello", "token": alice})).await;
    let sub = json!({"op": "sub", "id": 1, "topic": "marker"});
    assert_eq!(
        post_as(a.addr, &session, &alice, &lines(&[sub])).await.0,
        202
    );
    assert_eq!(victim.expect("ok").await["id"], 1);
    saved(&redis, &session, "marker").await;
    // What every refused POST asks: it would be seen at once.
    let harm = lines(&[json!({"op": "unsub", "id": 9, "topic": "marker"})]);
    let unknown = "0123456789abcdef0123456789abcdef";
    let mallory = token("mallory");
    let forged = token_signed(
        "another-secret-of-at-least-32-bytes-0000",
        "alice",
        json!({}),
    );
    let oversize = format!(
        "{{\"op\":\"ping\",\"id\":1,\"pad\":\"{}\"}}",
        "x".repeat(70 * 1024)
    );
    let many = lines(
        &(0..65)
            .map(|i| json!({"op": "ping", "id": i}))
            .collect::<Vec<_>>(),
    );
    // The pod that holds the session and the one that does not answer alike.
    for pod in [&a, &b] {
        let (status, none) = post_as(pod.addr, unknown, &alice, &harm).await;
        assert_eq!(status, 404);
        assert_eq!(none["error"]["code"], "unknown_session", "{none}");
        let (status, theirs) = post_as(pod.addr, &session, &mallory, &harm).await;
        assert_eq!(
            (status, &theirs),
            (404, &none),
            "one answer: nothing leaked"
        );
        for headers in [vec![], vec![("authorization", "Bearer not.a.jwt")]] {
            let (status, answer) = post(pod.addr, &session, &headers, &harm).await;
            assert_eq!(
                (status, answer["error"]["code"].as_str()),
                (401, Some("unauthorized"))
            );
        }
        let (status, answer) = post_as(pod.addr, &session, &forged, &harm).await;
        assert_eq!(
            (status, answer["error"]["code"].as_str()),
            (401, Some("unauthorized"))
        );
        for malformed in [
            format!("{harm}{{\"op\":"),
            "{\"op\":\"hello\"}".to_owned(),
            String::new(),
        ] {
            let (status, answer) = post_as(pod.addr, &session, &alice, &malformed).await;
            assert_eq!(
                (status, answer["error"]["code"].as_str()),
                (400, Some("malformed")),
                "{malformed}"
            );
            assert!(answer["error"]["message"].is_string(), "{answer}");
        }
        for large in [&oversize, &many] {
            let (status, answer) =
                post_as(pod.addr, &session, &alice, &format!("{harm}{large}")).await;
            assert_eq!(
                (status, answer["error"]["code"].as_str()),
                (413, Some("too_large"))
            );
        }
        let refused = testkit::metric(
            pod.addr,
            r#"herald_stream_commands_total{result="unknown_session"}"#,
        )
        .await;
        assert_eq!(refused, 2.0);
    }
    // The victim's stream: nothing came before the next publication, and it
    // is still the only one of its session.
    let (status, _) = publish(b.addr, "marker", json!("still here"), None).await;
    assert_eq!(status, 200);
    assert_eq!(
        victim.msg().await,
        ("marker".to_owned(), 1, json!("still here"))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn commands_forwarded_to_a_session_with_too_many_waiting_are_dropped_and_its_client_told() {
    let backend = HttpBackend::start(app).await;
    let redis = Redis::start().await;
    let rpc = backend.url("/rpc");
    let env = [
        ("HERALD_REDIS__COMMAND_TIMEOUT", "2s"),
        ("HERALD_AUTH__HMAC_SECRET", SECRET),
        ("HERALD_PROXY__RPC__URL", rpc.as_str()),
        ("HERALD_PROXY__RPC__TIMEOUT", "8s"),
    ];
    let a = Herald::pod(HERALD, &redis.url(), &env).await;
    let b = Herald::pod(HERALD, &redis.url(), &env).await;
    let alice = token("alice");
    let (mut client, session) = Stream::open(a.addr, json!({"op": "hello", "token": alice})).await;
    // A call that holds the session's loop (until the proxy's timeout):
    // what is forwarded meanwhile waits on pod a, four bodies' worth at
    // most.
    let slow = json!({"op": "rpc", "id": 1, "method": "slow"});
    assert_eq!(
        post_as(b.addr, &session, &alice, &lines(&[slow])).await.0,
        202
    );
    let pad = "x".repeat(60_000);
    for id in 2..=6 {
        let big = json!({"op": "ping", "id": id, "pad": pad});
        let (status, _) = post_as(b.addr, &session, &alice, &lines(&[big])).await;
        assert_eq!(status, 202, "pod b cannot know: it forwards");
    }
    // The slow call ends; the four that fitted run, in order; the client is
    // told of the one dropped.
    let err = client.expect("err").await;
    assert_eq!(
        (err["id"].as_u64(), err["code"].as_str()),
        (Some(1), Some("unavailable"))
    );
    for id in 2..=5 {
        assert_eq!(client.expect("ok").await["id"], id);
    }
    let dropped = client.expect("err").await;
    assert_eq!(dropped["code"], "rate_limited", "{dropped}");
    assert!(dropped.get("id").is_none(), "{dropped}");
    let message = dropped["message"].as_str().expect("message");
    assert!(message.starts_with("1 posted command"), "{message}");
    let counted = testkit::metric(
        a.addr,
        r#"herald_stream_commands_forwarded_total{result="dropped"}"#,
    )
    .await;
    assert_eq!(counted, 1.0);
}
