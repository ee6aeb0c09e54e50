//! SSE (`GET /sse`) and HTTP-streaming (`POST /stream`), from clients that
//! speak plain HTTP over raw TCP (and Python's `http.client`): events with
//! ids, a reconnect with `Last-Event-ID` (to the same pod, and to another
//! pod sharing a Redis) that gets exactly what it missed, a gap history
//! cannot bridge answered with `reset`, bad requests refused with a status
//! before any event, the heartbeat, the drain's `retry:` and `reconnect`;
//! an NDJSON stream's `welcome`, its token's topics, a server-side
//! subscription, and its session resumed on another `POST /stream`.

use std::net::SocketAddr;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use gateway::Config;
use jsonwebtoken::{EncodingKey, Header};
use router::NamespaceSettings;
use serde_json::{Value, json};
use testkit::{Gateway, Herald, Redis, WAIT};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

use crate::pod::HERALD;

const SECRET: &str = "herald-sse-tests-hmac-secret-0123456789abcdef";

fn token(user: &str, topics: &[&str]) -> String {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("after 1970")
        .as_secs();
    let mut claims = json!({"sub": user, "exp": now + 600});
    if !topics.is_empty() {
        claims["topics"] = json!(topics);
    }
    jsonwebtoken::encode(
        &Header::default(),
        &claims,
        &EncodingKey::from_secret(SECRET.as_bytes()).expect("a key"),
    )
    .expect("a token")
}

/// Open mode, `chat` (history 100) and `tiny` (history 2).
fn config() -> Config {
    let mut config = Gateway::config();
    config.namespaces.insert(
        "tiny".to_owned(),
        NamespaceSettings {
            history_size: 2,
            ..Default::default()
        },
    );
    config
}

/// A stream's response, read line by line off a raw socket.
pub(crate) struct Stream {
    pub status: u16,
    pub head: String,
    reader: BufReader<TcpStream>,
    /// Heartbeat comments seen so far.
    pub comments: usize,
}

/// One SSE event.
#[derive(Debug, Clone)]
pub(crate) struct Event {
    pub id: Option<String>,
    pub retry: Option<u64>,
    pub data: Value,
}

impl Stream {
    /// Sends `request` (a whole HTTP/1.1 request) and reads the response's head.
    pub async fn request(addr: SocketAddr, request: String) -> Stream {
        let mut tcp = TcpStream::connect(addr).await.expect("connect");
        tcp.write_all(request.as_bytes()).await.expect("request");
        let mut reader = BufReader::new(tcp);
        let mut head = String::new();
        tokio::time::timeout(WAIT, async {
            loop {
                let mut line = String::new();
                if reader.read_line(&mut line).await.expect("head") == 0 {
                    break;
                }
                if line == "\r\n" {
                    break;
                }
                head.push_str(&line);
            }
        })
        .await
        .expect("a response head in time");
        let status = head
            .split(' ')
            .nth(1)
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| panic!("a status line: {head:?}"));
        Stream {
            status,
            head,
            reader,
            comments: 0,
        }
    }

    /// `GET /sse?<query>` with `headers`.
    pub async fn sse(addr: SocketAddr, query: &str, headers: &[(&str, &str)]) -> Stream {
        let mut request =
            format!("GET /sse?{query} HTTP/1.1\r\nHost: herald\r\nAccept: text/event-stream\r\n");
        for (name, value) in headers {
            request.push_str(&format!("{name}: {value}\r\n"));
        }
        request.push_str("\r\n");
        Self::request(addr, request).await
    }

    /// `POST /stream` with `hello`.
    pub async fn ndjson(addr: SocketAddr, hello: Value) -> Stream {
        let body = hello.to_string();
        let request = format!(
            "POST /stream HTTP/1.1\r\nHost: herald\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        );
        Self::request(addr, request).await
    }

    /// The body of a refusal.
    pub async fn body(mut self) -> Value {
        let mut body = String::new();
        let _ = tokio::time::timeout(WAIT, self.reader.read_to_string(&mut body)).await;
        serde_json::from_str(&body).unwrap_or_else(|_| panic!("a JSON body: {body:?}"))
    }

    async fn line(&mut self) -> Option<String> {
        let mut line = String::new();
        let read = tokio::time::timeout(WAIT, self.reader.read_line(&mut line))
            .await
            .expect("a line in time")
            .ok()?;
        (read > 0).then_some(line)
    }

    /// The next SSE event with data; `None` when the stream ended.
    pub async fn event(&mut self) -> Option<Event> {
        let mut event = Event {
            id: None,
            retry: None,
            data: Value::Null,
        };
        let mut data: Option<String> = None;
        loop {
            let line = self.line().await?;
            let line = line.trim_end_matches('\n');
            if line.is_empty() {
                if let Some(data) = data.take() {
                    event.data = serde_json::from_str(&data).expect("JSON data");
                    return Some(event);
                }
                continue;
            }
            if line.starts_with(':') {
                self.comments += 1;
                continue;
            }
            let (field, value) = line.split_once(": ").unwrap_or((line, ""));
            match field {
                "id" => event.id = Some(value.to_owned()),
                "retry" => event.retry = value.parse().ok(),
                "data" => data = Some(value.to_owned()),
                other => panic!("unexpected field {other:?}"),
            }
        }
    }

    /// The next NDJSON line that is not a heartbeat.
    pub async fn frame(&mut self) -> Option<Value> {
        loop {
            let line = self.line().await?;
            if line.trim().is_empty() {
                self.comments += 1;
                continue;
            }
            return Some(serde_json::from_str(&line).expect("a JSON line"));
        }
    }

    /// Reads until `n` heartbeats came (an SSE comment, an empty NDJSON
    /// line), and no event meanwhile.
    pub async fn heartbeats(&mut self, n: usize) {
        let mut seen = 0;
        while seen < n {
            let line = self.line().await.expect("a heartbeat");
            assert!(matches!(line.as_str(), ":\n" | "\n"), "{line:?}");
            seen += 1;
        }
        self.comments += seen;
    }

    /// Whether the response ends (EOF) within [`WAIT`].
    pub async fn ended(&mut self) -> bool {
        let mut rest = Vec::new();
        matches!(
            tokio::time::timeout(WAIT, self.reader.read_to_end(&mut rest)).await,
            Ok(Ok(_))
        )
    }
}

/// The next `n` `msg` events: their ids and seqs.
async fn msgs(stream: &mut Stream, n: usize) -> Vec<(String, u64)> {
    topic_msgs(stream, n)
        .await
        .into_iter()
        .map(|(id, _, seq)| (id, seq))
        .collect()
}

/// The next `n` `msg` events: their ids, topics and seqs.
async fn topic_msgs(stream: &mut Stream, n: usize) -> Vec<(String, String, u64)> {
    let mut got = Vec::new();
    while got.len() < n {
        let event = stream.event().await.expect("an event");
        if event.data["op"] == "msg" {
            got.push((
                event.id.expect("an id"),
                event.data["topic"].as_str().expect("topic").to_owned(),
                event.data["seq"].as_u64().expect("seq"),
            ));
        }
    }
    got
}

async fn oks(stream: &mut Stream, n: usize) -> Vec<Event> {
    let mut got = Vec::new();
    for _ in 0..n {
        let event = stream.event().await.expect("an ok");
        assert_eq!(event.data["op"], "ok", "{event:?}");
        assert_eq!(event.data["reason"], "sse", "{event:?}");
        assert!(event.data.get("id").is_none(), "{event:?}");
        got.push(event);
    }
    got
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_carry_ids_and_a_reconnect_gets_exactly_what_it_missed() {
    let gw = Gateway::with(config()).await;
    gw.publish("chat:a", json!(1)).await;
    let mut sse = Stream::sse(gw.addr, "topic=chat:a&topic=chat:b", &[]).await;
    assert_eq!(sse.status, 200, "{}", sse.head);
    let head = sse.head.to_ascii_lowercase();
    assert!(
        head.contains("content-type: text/event-stream; charset=utf-8"),
        "{head}"
    );
    assert!(
        head.contains("cache-control: no-cache, no-transform"),
        "{head}"
    );
    assert!(head.contains("x-accel-buffering: no"), "{head}");
    let ok = oks(&mut sse, 2).await;
    let epoch_a = ok[0].data["epoch"].as_str().expect("epoch").to_owned();
    assert_eq!(ok[0].data["topic"], "chat:a");
    // The first topic is placed at its seq by its `ok`, the second not yet.
    assert!(
        ok[0]
            .id
            .as_deref()
            .unwrap()
            .starts_with(&format!("{epoch_a}:1.")),
        "{ok:?}"
    );
    for i in 2..=3 {
        gw.publish("chat:a", json!(i)).await;
    }
    let seq_b = gw.publish("chat:b", json!("b")).await;
    let seen = msgs(&mut sse, 3).await;
    assert_eq!(seen[0].1, 2);
    assert_eq!(seen[1].1, 3);
    let last = seen[2].0.clone();
    assert!(last.starts_with(&format!("{epoch_a}:3.")), "{last}");
    assert!(last.ends_with(&format!(":{seq_b}")), "{last}");
    drop(sse);
    // Missed while away: 4..=6 on a, one on b.
    for i in 4..=6 {
        gw.publish("chat:a", json!(i)).await;
    }
    gw.publish("chat:b", json!("b2")).await;
    let mut again = Stream::sse(
        gw.addr,
        "topic=chat:a&topic=chat:b",
        &[("Last-Event-ID", &last)],
    )
    .await;
    assert_eq!(again.status, 200);
    // Exactly what was missed, each topic in order (a topic's replay comes
    // before the next topic's `ok`), then live.
    let marker = gw.publish("chat:b", json!("live")).await;
    let mut got = Vec::new();
    let mut ok = Vec::new();
    while got.len() < 5 {
        let event = again.event().await.expect("an event");
        match event.data["op"].as_str() {
            Some("ok") => ok.push(event),
            Some("msg") => got.push((
                event.id.expect("an id"),
                event.data["topic"].as_str().expect("topic").to_owned(),
                event.data["seq"].as_u64().expect("seq"),
            )),
            _ => panic!("{event:?}"),
        }
    }
    assert_eq!(ok.len(), 2, "{ok:?}");
    assert!(ok.iter().all(|o| o.data["recovered"] == true), "{ok:?}");
    let of =
        |topic: &str| -> Vec<u64> { got.iter().filter(|m| m.1 == topic).map(|m| m.2).collect() };
    assert_eq!(of("chat:a"), [4, 5, 6], "{got:?}");
    assert_eq!(of("chat:b"), [seq_b + 1, marker], "{got:?}");
    assert!(
        got.last().unwrap().0.starts_with(&format!("{epoch_a}:6.")),
        "{got:?}"
    );
    // The query's form does the same (`?lastEventId=` for polyfills).
    let mut polyfill = Stream::sse(
        gw.addr,
        &format!("topic=chat:a&topic=chat:b&lastEventId={last}"),
        &[],
    )
    .await;
    let msgs = topic_msgs(&mut polyfill, 5).await;
    assert_eq!(
        msgs.iter().filter(|m| m.1 == "chat:a").count(),
        3,
        "{msgs:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gap_history_cannot_bridge_is_a_reset_event() {
    let gw = Gateway::with(config()).await;
    gw.publish("tiny:x", json!(1)).await;
    let mut sse = Stream::sse(gw.addr, "topic=tiny:x", &[]).await;
    let ok = oks(&mut sse, 1).await;
    let id = ok[0].id.clone().expect("an id");
    drop(sse);
    for i in 2..=6 {
        gw.publish("tiny:x", json!(i)).await;
    }
    let mut again = Stream::sse(gw.addr, "topic=tiny:x", &[("Last-Event-ID", &id)]).await;
    let ok = oks(&mut again, 1).await;
    assert_eq!(ok[0].data["recovered"], false, "{ok:?}");
    let reset = again.event().await.expect("a reset");
    assert_eq!(reset.data["op"], "reset", "{reset:?}");
    assert_eq!(reset.data["seq"], 6);
    assert!(reset.id.unwrap().ends_with(":6"));
    gw.publish("tiny:x", json!(7)).await;
    assert_eq!(msgs(&mut again, 1).await[0].1, 7);
}

/// A refused request: its query, headers, status and error code.
type Case<'a> = (&'a str, &'a [(&'a str, &'a str)], u16, &'a str);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_requests_are_refused_with_a_status_before_any_event() {
    let mut config = config();
    config.auth.hmac_secret = SECRET.to_owned();
    config.streams.max_topics = 2;
    let gw = Gateway::with(config).await;
    let good = token("ann", &[]);
    let bearer = format!("Bearer {good}");
    let auth = [("Authorization", bearer.as_str())];
    let cases: [Case; 7] = [
        ("topic=nowhere:x", &auth, 400, "unknown_namespace"),
        (
            "topic=chat:a&topic=chat:b&topic=chat:c",
            &auth,
            400,
            "too_many_topics",
        ),
        ("", &auth, 400, "malformed"),
        (
            "topic=chat:a&topic=chat:b&lastEventId=ab:1",
            &auth,
            400,
            "malformed",
        ),
        (
            "topic=chat:a",
            &[("Last-Event-ID", "nothex:1")],
            400,
            "malformed",
        ),
        ("topic=chat:a", &[], 401, "unauthorized"),
        ("topic=chat:a&token=not-a-token", &[], 401, "unauthorized"),
    ];
    for (query, headers, status, code) in cases {
        let refused = Stream::sse(gw.addr, query, headers).await;
        assert_eq!(refused.status, status, "{query}: {}", refused.head);
        let body = refused.body().await;
        assert_eq!(body["error"]["code"], code, "{query}: {body}");
    }
    let refused = gw
        .metric("herald_streams_refused_total{reason=\"too_many_topics\",transport=\"sse\"}")
        .await;
    assert_eq!(refused, 1.0);
    // The token by query or by cookie, as an `EventSource` sends it.
    let mut by_query = Stream::sse(gw.addr, &format!("topic=chat:a&token={good}"), &[]).await;
    assert_eq!(by_query.status, 200);
    oks(&mut by_query, 1).await;
    let cookie = format!("other=1; herald_token={good}");
    let mut by_cookie = Stream::sse(gw.addr, "topic=chat:a", &[("Cookie", &cookie)]).await;
    assert_eq!(by_cookie.status, 200);
    oks(&mut by_cookie, 1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_topic_the_token_does_not_grant_is_an_err_event_and_the_end() {
    let mut config = config();
    config.auth.hmac_secret = SECRET.to_owned();
    config.namespaces.insert(
        "mine".to_owned(),
        NamespaceSettings {
            subscribe: router::Subscribe::Granted,
            ..Default::default()
        },
    );
    let gw = Gateway::with(config).await;
    let bearer = format!("Bearer {}", token("ann", &[]));
    let mut sse = Stream::sse(gw.addr, "topic=mine:bob", &[("Authorization", &bearer)]).await;
    assert_eq!(sse.status, 200);
    let err = sse.event().await.expect("an err");
    assert_eq!(err.data["op"], "err", "{err:?}");
    assert_eq!(err.data["code"], "forbidden");
    assert_eq!(err.data["topic"], "mine:bob");
    assert!(err.data.get("id").is_none(), "{err:?}");
    assert!(sse.ended().await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_stream_gets_heartbeats_and_a_drain_gets_retry_and_reconnect() {
    let mut config = config();
    config.websocket.ping_interval = Duration::from_millis(100);
    let gw = Gateway::with(config).await;
    let mut sse = Stream::sse(gw.addr, "topic=chat:a", &[]).await;
    oks(&mut sse, 1).await;
    let mut nd = Stream::ndjson(gw.addr, json!({"op": "hello"})).await;
    assert_eq!(nd.frame().await.expect("welcome")["op"], "welcome");
    gw.await_metric("herald_streams_open{transport=\"sse\"}", 1.0)
        .await;
    gw.await_metric("herald_streams_open{transport=\"ndjson\"}", 1.0)
        .await;
    // Heartbeats are comment lines, then events go on as before.
    sse.heartbeats(2).await;
    nd.heartbeats(2).await;
    gw.publish("chat:a", json!("after")).await;
    assert_eq!(msgs(&mut sse, 1).await.len(), 1);
    gw.shutdown().await;
    let advice = sse.event().await.expect("the drain's advice");
    assert_eq!(advice.data["op"], "reconnect", "{advice:?}");
    assert!(advice.retry.is_some(), "{advice:?}");
    assert!(sse.ended().await);
    let advice = nd.frame().await.expect("the drain's advice");
    assert_eq!(advice["op"], "reconnect", "{advice}");
    assert!(nd.ended().await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ndjson_stream_is_a_whole_session_resumed_on_another_post() {
    let mut config = config();
    config.auth.hmac_secret = SECRET.to_owned();
    let gw = Gateway::with(config).await;
    let tok = token("ann", &["chat:t"]);
    let mut nd = Stream::ndjson(gw.addr, json!({"op": "hello", "token": tok})).await;
    assert_eq!(nd.status, 200, "{}", nd.head);
    assert!(
        nd.head
            .to_ascii_lowercase()
            .contains("application/x-ndjson")
    );
    let welcome = nd.frame().await.expect("welcome");
    assert_eq!(welcome["op"], "welcome", "{welcome}");
    let session = welcome["session"].as_str().expect("session").to_owned();
    let ok = nd.frame().await.expect("the token's topic");
    assert_eq!(
        (&ok["op"], &ok["reason"]),
        (&json!("ok"), &json!("token")),
        "{ok}"
    );
    gw.publish("chat:t", json!({"n": 1})).await;
    let msg = nd.frame().await.expect("msg");
    assert_eq!(
        (&msg["op"], &msg["data"]),
        (&json!("msg"), &json!({"n": 1})),
        "{msg}"
    );
    // A backend subscribes the user: the stream gets it too.
    let (status, body) = testkit::http(
        gw.addr,
        "POST",
        "/v1/subscribe",
        &[],
        json!({"user": "ann", "topic": "chat:s"})
            .to_string()
            .as_bytes(),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let ok = nd.frame().await.expect("server-side ok");
    assert_eq!(
        (&ok["topic"], &ok["reason"]),
        (&json!("chat:s"), &json!("server")),
        "{ok}"
    );
    gw.publish("chat:s", json!("s")).await;
    assert_eq!(nd.frame().await.expect("msg")["topic"], "chat:s");
    drop(nd);
    gw.await_metric("herald_streams_open{transport=\"ndjson\"}", 0.0)
        .await;
    // Resumed on a new POST, with the token in the header this time.
    let hello = json!({"op": "hello", "resume": session});
    let body = hello.to_string();
    let request = format!(
        "POST /stream HTTP/1.1\r\nHost: herald\r\nAuthorization: Bearer {tok}\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    let mut again = Stream::request(gw.addr, request).await;
    let welcome = again.frame().await.expect("welcome");
    assert_eq!(welcome["resumed"], true, "{welcome}");
    gw.publish("chat:t", json!({"n": 2})).await;
    let next = loop {
        let frame = again.frame().await.expect("a frame");
        if frame["op"] == "msg" && frame["topic"] == "chat:t" && frame["seq"] == 2 {
            break frame;
        }
    };
    assert_eq!(next["data"], json!({"n": 2}));
    // A bad hello: 400; a bad token: 401.
    let refused = Stream::ndjson(gw.addr, json!({"op": "sub", "id": 1, "topic": "chat:t"})).await;
    assert_eq!(refused.status, 400);
    let refused = Stream::ndjson(gw.addr, json!({"op": "hello", "token": "nope"})).await;
    assert_eq!(refused.status, 401);
}

/// Two `herald` processes on one Redis: a stream read on pod a, then
/// resumed with its `Last-Event-ID` on pod b, gets exactly what it missed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reconnect_to_another_pod_gets_exactly_what_it_missed() {
    let redis = Redis::start().await;
    let env = [("HERALD_NAMESPACES__CHAT__SUBSCRIBE", "anyone")];
    let a = Herald::pod(HERALD, &redis.url(), &env).await;
    let b = Herald::pod(HERALD, &redis.url(), &env).await;
    let publish = |addr: SocketAddr, i: u64| async move {
        let body = json!({"topic": "chat:x", "data": i}).to_string();
        let (status, answer) =
            testkit::http(addr, "POST", "/v1/publish", &[], body.as_bytes()).await;
        assert_eq!(status, 200, "{answer}");
    };
    publish(a.addr, 1).await;
    let mut on_a = Stream::sse(a.addr, "topic=chat:x", &[]).await;
    oks(&mut on_a, 1).await;
    for i in 2..=4 {
        publish(b.addr, i).await;
    }
    let seen = msgs(&mut on_a, 3).await;
    assert_eq!(seen.iter().map(|s| s.1).collect::<Vec<_>>(), [2, 3, 4]);
    let last = seen[2].0.clone();
    drop(on_a);
    for i in 5..=8 {
        publish(a.addr, i).await;
    }
    let mut on_b = Stream::sse(b.addr, "topic=chat:x", &[("Last-Event-ID", &last)]).await;
    let ok = oks(&mut on_b, 1).await;
    assert_eq!(ok[0].data["recovered"], true);
    publish(b.addr, 9).await;
    let got = msgs(&mut on_b, 5).await;
    assert_eq!(
        got.iter().map(|s| s.1).collect::<Vec<_>>(),
        [5, 6, 7, 8, 9],
        "{got:?}"
    );
}

/// A plain Python HTTP client (`http.client`, no SSE library) reads the
/// stream: what a script or a tool sees.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_python_http_client_reads_events_with_ids() {
    let gw = Gateway::with(config()).await;
    let script = r#"
import http.client, json, sys
host, port = sys.argv[1].rsplit(":", 1)
conn = http.client.HTTPConnection(host, int(port), timeout=20)
conn.request("GET", "/sse?topic=chat:py", headers={"Accept": "text/event-stream"})
resp = conn.getresponse()
assert resp.status == 200, resp.status
assert resp.getheader("Content-Type").startswith("text/event-stream")
events, event = [], {}
print("open", flush=True)
while len(events) < 3:
    line = resp.fp.readline().decode()
    if line == "":
        break
    line = line.rstrip("\n")
    if line == "":
        if "data" in event:
            events.append(event)
            if json.loads(event["data"])["op"] == "ok":
                print("subscribed", flush=True)
        event = {}
        continue
    if line.startswith(":"):
        continue
    field, _, value = line.partition(": ")
    event[field] = value
for e in events:
    print(e.get("id", ""), e["data"], flush=True)
"#;
    let mut child = tokio::process::Command::new("python3")
        .arg("-c")
        .arg(script)
        .arg(gw.addr.to_string())
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("python3");
    let mut out = BufReader::new(child.stdout.take().expect("stdout"));
    let mut line = String::new();
    tokio::time::timeout(WAIT, async {
        loop {
            line.clear();
            out.read_line(&mut line).await.expect("python output");
            if line.starts_with("subscribed") || line.is_empty() {
                break;
            }
        }
    })
    .await
    .expect("python subscribed in time");
    gw.publish("chat:py", json!({"n": 1})).await;
    gw.publish("chat:py", json!({"n": 2})).await;
    let mut rest = String::new();
    tokio::time::timeout(WAIT, out.read_to_string(&mut rest))
        .await
        .expect("python done in time")
        .expect("output");
    let status = tokio::time::timeout(WAIT, child.wait())
        .await
        .expect("exit")
        .expect("status");
    assert!(status.success(), "{rest}");
    let lines: Vec<&str> = rest.lines().collect();
    assert_eq!(lines.len(), 3, "{rest}");
    assert!(lines[1].contains(r#""seq":1"#), "{rest}");
    let (id, data) = lines[2].split_once(' ').expect("id and data");
    assert!(id.ends_with(":2"), "{rest}");
    let data: Value = serde_json::from_str(data).expect("json");
    assert_eq!(data["data"], json!({"n": 2}));
}
