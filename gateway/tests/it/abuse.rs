//! Abuse, scripted: clients and backends that misbehave on purpose, each
//! refused or closed by the limit meant for it, while a well-behaved client
//! on the same pod keeps getting its messages.
//!
//! A connection that never says `hello` is closed with 4005, pongs or not; a
//! command flood gets `rate_limited` and then 4504, acks excepted; thousands
//! of throwaway subscriptions leave Redis nothing that outlives the
//! namespace's history age; one address holds at most
//! `websocket.max_connections_per_ip` connections (behind a trusted proxy,
//! counted per forwarded address; a forged `X-Forwarded-For` counts for
//! nothing); API requests that trickle in get 408 and a full house gets 503
//! `busy`, while health probes always answer; and with `http.api_listen` the
//! API is not reachable from the client port at all. The last test sets the
//! same limits on the real `herald` binary through `HERALD_*` variables.

// A test that cannot go on should stop and say why.

use std::io::Write;
use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use gateway::config::BrokerKind;
use serde_json::{Value, json};
use testkit::raw::{CLOSE, FIN, PING, PONG, RawClient, encode};
use testkit::{Client, Gateway, WAIT, eventually};
use testkit::{Herald, Redis};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::time::{Instant, sleep, timeout};
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::{self, Message};

use crate::pod::HERALD;

/// The topic the well-behaved client follows.
const ROOM: &str = "chat:room";

/// A well-behaved client on `gw`: a session, subscribed to [`ROOM`].
async fn bystander(gw: &Gateway) -> Client {
    Client::subscriber(&gw.ws_url(), ROOM).await
}

/// A backend publishes to [`ROOM`] at the gateway `gw`; `client` gets it
/// (each wait bounded by [`WAIT`]).
async fn still_served(gw: impl Into<Addr>, client: &mut Client, n: u64) {
    let Addr(addr) = gw.into();
    let body = json!({"topic": ROOM, "data": {"n": n}}).to_string();
    let (status, answer) = testkit::http(addr, "POST", "/v1/publish", &[], body.as_bytes()).await;
    assert_eq!(status, 200, "publish: {answer}");
    let answer: Value = serde_json::from_str(&answer).expect("JSON");
    let seq = answer["seq"].as_u64().expect("seq");
    let (topic, got, data) = client.msg().await;
    assert_eq!((topic.as_str(), got, data), (ROOM, seq, json!({ "n": n })));
}

/// Where a gateway serves HTTP: in this process or a `herald` process.
struct Addr(SocketAddr);

impl From<&Gateway> for Addr {
    fn from(gw: &Gateway) -> Self {
        Self(gw.addr)
    }
}

// ---------------------------------------------------------------------------
// hello_timeout

#[tokio::test]
async fn a_connection_that_never_says_hello_is_closed_with_4005_pongs_or_not() {
    const HELLO_TIMEOUT: Duration = Duration::from_millis(400);
    let mut config = Gateway::config();
    config.websocket.hello_timeout = HELLO_TIMEOUT;
    // Pings often enough that the polite one answers some before its time is up.
    config.websocket.ping_interval = Duration::from_millis(100);
    let gw = Gateway::with(config).await;
    let mut good = bystander(&gw).await;

    // Silent: upgrades, then says nothing at all.
    let silent = async {
        let started = Instant::now();
        let mut silent = RawClient::connect(gw.addr).await;
        let close = timeout(WAIT, async {
            loop {
                let frame = silent.read_frame().await;
                if frame.opcode == CLOSE {
                    return frame;
                }
                assert_eq!(frame.opcode, PING, "only pings before the close");
            }
        })
        .await
        .expect("the close, in time");
        close.assert_plain();
        assert_eq!(close.close_code(), 4005);
        assert!(started.elapsed() >= HELLO_TIMEOUT, "closed early");
        silent.expect_tcp_end().await;
    };

    // Polite: answers every ping and pings the server too, but never sends
    // a command. Liveness is not a session.
    let polite = async {
        let mut polite = RawClient::connect(gw.addr).await;
        let (mut pings, mut pongs) = (0, 0);
        let close = timeout(WAIT, async {
            loop {
                let _ = polite
                    .try_send_bytes(&encode(FIN | PING, b"here", true))
                    .await;
                let frame = polite.read_frame().await;
                match frame.opcode {
                    PING => {
                        pings += 1;
                        let _ = polite
                            .try_send_bytes(&encode(FIN | PONG, &frame.payload, true))
                            .await;
                    }
                    PONG => pongs += 1,
                    CLOSE => return frame,
                    other => panic!("only pings, pongs and the close, got {other:#x}"),
                }
            }
        })
        .await
        .expect("the close, in time");
        assert_eq!(close.close_code(), 4005);
        assert!(pings > 0 && pongs > 0, "pings {pings}, pongs {pongs}");
        polite.expect_tcp_end().await;
    };
    tokio::join!(silent, polite);

    still_served(&gw, &mut good, 1).await;
    gw.await_metric(
        r#"herald_connections_closed_total{reason="hello_timeout"}"#,
        2.0,
    )
    .await;
    gw.shutdown().await;
}

// ---------------------------------------------------------------------------
// The command rate

/// Floods `client` with `sub`/`unsub` pairs as fast as it can write while it
/// reads what comes back; returns (the close code, `rate_limited` errs seen,
/// `ok`s seen). Sending stops once the close has come.
async fn flood(client: Client, pairs: usize) -> (Option<u16>, usize, usize) {
    let (mut sink, mut stream) = client.ws.split();
    let closed = Arc::new(AtomicBool::new(false));
    let sending = {
        let closed = closed.clone();
        async move {
            for i in 0..pairs {
                if closed.load(Ordering::Relaxed) {
                    break;
                }
                let topic = format!("chat:flood-{i}");
                let sub = json!({"op": "sub", "id": 2 * i, "topic": topic});
                let unsub = json!({"op": "unsub", "id": 2 * i + 1, "topic": topic});
                // The server may close mid-flood: a failed write ends it.
                if sink.feed(Message::text(sub.to_string())).await.is_err()
                    || sink.send(Message::text(unsub.to_string())).await.is_err()
                {
                    break;
                }
            }
            sink
        }
    };
    let reading = async {
        let (mut limited, mut oks) = (0, 0);
        let code = timeout(WAIT, async {
            while let Some(message) = stream.next().await {
                match message {
                    Ok(Message::Text(text)) => {
                        let m: Value = serde_json::from_str(&text).expect("JSON");
                        match m["op"].as_str() {
                            Some("err") if m["code"] == "rate_limited" => limited += 1,
                            Some("ok") => oks += 1,
                            _ => {}
                        }
                    }
                    Ok(Message::Close(frame)) => {
                        closed.store(true, Ordering::Relaxed);
                        return frame.map(|f| u16::from(f.code));
                    }
                    Ok(_) => {}
                    Err(_) => break,
                }
            }
            closed.store(true, Ordering::Relaxed);
            None
        })
        .await
        .expect("the flood ends in a close, in time");
        (code, limited, oks)
    };
    let (_sink, (code, limited, oks)) = tokio::join!(sending, reading);
    (code, limited, oks)
}

#[tokio::test]
async fn a_command_flood_gets_rate_limited_then_closed_with_4504() {
    let gw = Gateway::start().await;
    let mut good = bystander(&gw).await;
    let mut flooder = Client::connect(&gw).await;
    flooder.hello(None).await;

    let ((code, limited, oks), ()) =
        tokio::join!(flood(flooder, 500), still_served(&gw, &mut good, 1));
    let ws = &gw.node.config.websocket;
    assert_eq!(code, Some(4504), "{limited} rate_limited, {oks} ok");
    assert!(
        limited >= ws.max_bad_commands as usize,
        "{limited} rate_limited errs before the close"
    );
    // The burst went through before the limit bit.
    assert!(
        oks >= ws.commands_burst as usize - 1,
        "only {oks} commands answered ok"
    );
    gw.await_metric(
        r#"herald_connections_closed_total{reason="rate_limited"}"#,
        1.0,
    )
    .await;
    let counted = gw.metric("herald_commands_rate_limited_total").await;
    assert!(
        counted >= f64::from(ws.max_bad_commands),
        "herald_commands_rate_limited_total = {counted}"
    );
    still_served(&gw, &mut good, 2).await;
    gw.shutdown().await;
}

#[tokio::test]
async fn acks_are_not_rate_limited() {
    let gw = Gateway::start().await;
    let mut good = bystander(&gw).await;
    let mut acker = Client::subscriber(&gw.ws_url(), ROOM).await;
    still_served(&gw, &mut acker, 1).await;
    good.msg().await;

    // Five times the burst, as fast as the socket takes them.
    let ack = json!({"op": "ack", "topic": ROOM, "seq": 1}).to_string();
    for _ in 0..500 {
        acker
            .ws
            .feed(Message::text(ack.clone()))
            .await
            .expect("feed");
    }
    acker.ws.flush().await.expect("flush");

    // Still open, and the bucket is as full as before: a command is served,
    // and so are messages.
    acker.sub(2, "chat:after-acks").await;
    still_served(&gw, &mut acker, 2).await;
    good.msg().await;
    assert_eq!(gw.metric("herald_commands_rate_limited_total").await, 0.0);
    assert_eq!(
        gw.metric(r#"herald_connections_closed_total{reason="rate_limited"}"#)
            .await,
        0.0
    );
    gw.shutdown().await;
}

// ---------------------------------------------------------------------------
// Throwaway subscriptions and Redis

/// Runs `redis-cli --scan --pattern pattern`, then `PTTL` of every key found
/// (one pipelined `redis-cli`); (key, pttl in ms) pairs.
fn pttls(redis: &Redis, pattern: &str) -> Vec<(String, i64)> {
    let keys: Vec<String> = redis
        .cli(&["--scan", "--pattern", pattern])
        .lines()
        .map(str::to_owned)
        .collect();
    if keys.is_empty() {
        return Vec::new();
    }
    let mut cli = Command::new("redis-cli")
        .args(["-p", &redis.port.to_string()])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("redis-cli");
    {
        let mut stdin = cli.stdin.take().expect("stdin");
        for key in &keys {
            writeln!(stdin, "PTTL \"{key}\"").expect("write to redis-cli");
        }
    }
    let out = cli.wait_with_output().expect("redis-cli output");
    let ttls: Vec<i64> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| l.trim().parse().expect("an integer PTTL"))
        .collect();
    assert_eq!(ttls.len(), keys.len(), "one PTTL per key");
    keys.into_iter().zip(ttls).collect()
}

/// `sub` then `unsub` of `pairs` distinct topics `<ns>:t-<i>`, pipelined in
/// windows small enough for the outgoing queue; every answer must be `ok`.
async fn churn(client: &mut Client, ns: &str, pairs: usize) {
    const WINDOW: usize = 200;
    for start in (0..pairs).step_by(WINDOW) {
        let end = (start + WINDOW).min(pairs);
        for i in start..end {
            let topic = format!("{ns}:t-{i}");
            for message in [
                json!({"op": "sub", "id": 2 * i, "topic": topic}),
                json!({"op": "unsub", "id": 2 * i + 1, "topic": topic}),
            ] {
                client
                    .ws
                    .feed(Message::text(message.to_string()))
                    .await
                    .expect("feed");
            }
        }
        client.ws.flush().await.expect("flush");
        for _ in start..end {
            client.expect("ok").await;
            client.expect("ok").await;
        }
    }
}

#[tokio::test]
async fn thousands_of_throwaway_subscriptions_leave_nothing_beyond_the_history_age() {
    const HISTORY_TTL: Duration = Duration::from_secs(60);
    const SHORT_TTL: Duration = Duration::from_secs(1);
    let redis = Redis::start().await;
    let mut config = Gateway::config();
    config.broker = BrokerKind::Redis;
    config.redis.url = redis.url();
    // The flood is allowed here: what it leaves behind is the point (the
    // budget of distinct topics a minute that bounds it is `budgets`' story).
    config.websocket.commands_per_second = 100_000;
    config.websocket.commands_burst = 100_000;
    config.session.topics_per_minute = 0;
    for (ns, ttl) in [("flood", HISTORY_TTL), ("brief", SHORT_TTL)] {
        config.namespaces.insert(
            ns.to_owned(),
            router::NamespaceSettings {
                history_ttl: ttl,
                subscribe: router::Subscribe::Anyone,
                ..Default::default()
            },
        );
    }
    let gw = Gateway::with(config).await;
    let mut good = bystander(&gw).await;
    let mut churner = Client::connect(&gw).await;
    churner.hello(None).await;

    churn(&mut churner, "flood", 5_000).await;
    still_served(&gw, &mut good, 1).await;

    // Nobody published to these topics: every key they left expires within
    // the namespace's history age, none lives for days.
    let left = pttls(&redis, "herald:{flood:*");
    // One meta key per topic, none older than the churn.
    assert_eq!(left.len(), 5_000, "meta keys of 5,000 topics");
    let ttl_ms = HISTORY_TTL.as_millis() as i64;
    for (key, pttl) in &left {
        assert!(key.ends_with(":meta"), "unexpected key {key}");
        assert!(
            (0..=ttl_ms).contains(pttl),
            "{key} has PTTL {pttl} ms, over the history age of {ttl_ms} ms"
        );
    }

    // And the count is bounded by what expires: with a short history age
    // the keys are gone soon after.
    churn(&mut churner, "brief", 200).await;
    eventually(WAIT, || async {
        let left = pttls(&redis, "herald:{brief:*");
        if left.is_empty() {
            Ok(())
        } else {
            Err(format!(
                "{} keys of a 1 s namespace still there: {:?}",
                left.len(),
                &left[..left.len().min(3)]
            ))
        }
    })
    .await;
    still_served(&gw, &mut good, 2).await;
    // The churner itself was never limited.
    churner.sub(1, ROOM).await;
    gw.shutdown().await;
}

// ---------------------------------------------------------------------------
// Connections per address

/// A WebSocket connection to `gw` with the extra headers; on refusal, the
/// status and `Retry-After`.
async fn connect_with(url: &str, headers: &[(&str, &str)]) -> Result<Client, (u16, String)> {
    let mut request = url.into_client_request().expect("a request");
    for (name, value) in headers {
        request.headers_mut().insert(
            tungstenite::http::HeaderName::from_bytes(name.as_bytes()).expect("header name"),
            value.parse().expect("header value"),
        );
    }
    let attempt = timeout(WAIT, tokio_tungstenite::connect_async(request))
        .await
        .expect("an answer in time");
    match attempt {
        Ok((ws, _)) => Ok(Client { ws }),
        Err(tungstenite::Error::Http(response)) => Err((
            response.status().as_u16(),
            response
                .headers()
                .get("retry-after")
                .and_then(|v| v.to_str().ok())
                .unwrap_or("")
                .to_owned(),
        )),
        Err(e) => panic!("connect failed without an HTTP answer: {e}"),
    }
}

/// `n` connections with a session, each with the extra headers.
async fn admitted(url: &str, headers: &[(&str, &str)], n: usize) -> Vec<Client> {
    let mut clients = Vec::new();
    for _ in 0..n {
        let mut client = connect_with(url, headers)
            .await
            .unwrap_or_else(|(status, _)| panic!("admitted, not {status}"));
        client.hello(None).await;
        clients.push(client);
    }
    clients
}

/// The refusal of a connection over the per-address cap.
async fn refused(url: &str, headers: &[(&str, &str)]) {
    match connect_with(url, headers).await {
        Ok(_) => panic!("a connection over the per-address cap was admitted"),
        Err((status, retry_after)) => {
            assert_eq!(status, 503);
            assert!(
                retry_after.parse::<u64>().is_ok(),
                "Retry-After in seconds: {retry_after:?}"
            );
        }
    }
}

fn per_ip_config(trusted: &[&str]) -> gateway::Config {
    let mut config = Gateway::config();
    config.websocket.max_connections_per_ip = 3;
    config.http.trusted_proxies = trusted
        .iter()
        .map(|net| net.parse().expect("a network"))
        .collect();
    config
}

const PER_IP_REJECTED: &str = r#"herald_upgrades_rejected_total{reason="per_ip"}"#;

#[tokio::test]
async fn one_address_holds_at_most_max_connections_per_ip() {
    let gw = Gateway::with(per_ip_config(&[])).await;
    let mut good = bystander(&gw).await;
    let mut others = admitted(&gw.ws_url(), &[], 2).await;

    refused(&gw.ws_url(), &[]).await;
    assert_eq!(gw.metric(PER_IP_REJECTED).await, 1.0);
    still_served(&gw, &mut good, 1).await;

    // One leaves; its slot frees once its session has ended (no event to
    // await from outside), so retry briefly.
    let mut leaving = others.pop().expect("a client");
    leaving.ws.close(None).await.expect("send close");
    leaving.closed().await;
    let mut newcomer = eventually(WAIT, || async {
        match connect_with(&gw.ws_url(), &[]).await {
            Ok(client) => Ok(client),
            Err((503, _)) => Err("the freed slot is still taken (503)"),
            Err((status, _)) => panic!("a freed slot is reused; got {status}"),
        }
    })
    .await;
    newcomer.hello(None).await;
    still_served(&gw, &mut good, 2).await;
    gw.shutdown().await;
}

#[tokio::test]
async fn behind_a_trusted_proxy_each_forwarded_address_has_its_own_cap() {
    let gw = Gateway::with(per_ip_config(&["127.0.0.1/32"])).await;
    let mut good = bystander(&gw).await;

    // Four clients through the proxy (127.0.0.1), each from its own address.
    let mut clients = Vec::new();
    for n in 1..=4 {
        let ip = format!("198.51.100.{n}");
        clients.extend(admitted(&gw.ws_url(), &[("x-forwarded-for", &ip)], 1).await);
    }
    // The cap still holds per forwarded address, proxy hops skipped.
    let one = [("x-forwarded-for", "203.0.113.7, 127.0.0.1")];
    clients.extend(admitted(&gw.ws_url(), &one, 3).await);
    refused(&gw.ws_url(), &one).await;
    assert_eq!(gw.metric(PER_IP_REJECTED).await, 1.0);
    still_served(&gw, &mut good, 1).await;
    gw.shutdown().await;
}

#[tokio::test]
async fn a_forged_forwarded_for_from_an_untrusted_peer_is_ignored() {
    // 127.0.0.1 is no proxy of ours: whatever it writes, it is 127.0.0.1.
    let gw = Gateway::with(per_ip_config(&["10.0.0.0/8"])).await;
    let mut good = bystander(&gw).await;
    let mut clients = Vec::new();
    for n in 1..=2 {
        let ip = format!("198.51.100.{n}");
        clients.extend(admitted(&gw.ws_url(), &[("x-forwarded-for", &ip)], 1).await);
    }
    refused(&gw.ws_url(), &[("x-forwarded-for", "198.51.100.3")]).await;
    assert_eq!(gw.metric(PER_IP_REJECTED).await, 1.0);
    still_served(&gw, &mut good, 1).await;
    gw.shutdown().await;
}

// ---------------------------------------------------------------------------
// The HTTP API under abuse

/// The head of a publish whose body will be 100 bytes.
fn trickle_head(addr: SocketAddr) -> String {
    format!(
        "POST /v1/publish HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\n\
         Content-Length: 100\r\n\r\n"
    )
}

/// Sends a publish head, then its body one byte per `pace`; returns the
/// response (status line and all) and when it came, or panics if none comes
/// within `limit`.
async fn trickle(addr: SocketAddr, pace: Duration, limit: Duration) -> (String, Duration) {
    let started = Instant::now();
    let mut stream = timeout(WAIT, TcpStream::connect(addr))
        .await
        .expect("connect in time")
        .expect("connect");
    stream
        .write_all(trickle_head(addr).as_bytes())
        .await
        .expect("write the head");
    let mut answer = Vec::new();
    let mut chunk = [0u8; 1024];
    let done = timeout(limit, async {
        let mut sent = 0;
        loop {
            tokio::select! {
                read = stream.read(&mut chunk) => match read {
                    Ok(0) | Err(_) => return,
                    Ok(n) => answer.extend_from_slice(&chunk[..n]),
                },
                // The body, a byte at a time, never all of it.
                () = sleep(pace), if sent < 99 => {
                    if stream.write_all(b" ").await.is_err() {
                        // Refused already: read the rest.
                        sent = 99;
                    } else {
                        sent += 1;
                    }
                }
            }
        }
    })
    .await;
    assert!(
        done.is_ok() || !answer.is_empty(),
        "no answer to a trickling request within {limit:?}"
    );
    (
        String::from_utf8_lossy(&answer).into_owned(),
        started.elapsed(),
    )
}

/// Rejected API requests so far, by reason, read from the node (`/metrics`
/// takes an API slot of its own).
fn http_rejected(gw: &Gateway, reason: &str) -> u64 {
    gw.node
        .metrics
        .http_rejected
        .with_label_values(&[reason])
        .get()
}

#[tokio::test]
async fn publishes_that_trickle_in_get_408_while_health_and_publishing_go_on() {
    const REQUEST_TIMEOUT: Duration = Duration::from_secs(1);
    const TRICKLERS: usize = 50;
    let mut config = Gateway::config();
    config.http.request_timeout = REQUEST_TIMEOUT;
    let gw = Gateway::with(config).await;
    let mut good = bystander(&gw).await;

    let started = Instant::now();
    let tricklers = futures_util::future::join_all(
        (0..TRICKLERS).map(|_| trickle(gw.addr, Duration::from_millis(200), WAIT)),
    );
    let stop = AtomicBool::new(false);
    let others = async {
        // Meanwhile probes answer at once, and a backend publishes as ever.
        still_served(&gw, &mut good, 1).await;
        let mut probes = 0;
        while !stop.load(Ordering::Relaxed) {
            let (status, body) = testkit::http(gw.addr, "GET", "/healthz", &[], b"").await;
            assert_eq!(status, 200, "{body}");
            probes += 1;
            sleep(Duration::from_millis(50)).await;
        }
        probes
    };
    let tricklers = async {
        let answers = tricklers.await;
        stop.store(true, Ordering::Relaxed);
        answers
    };
    let (answers, probes) = tokio::join!(tricklers, others);
    assert!(probes > 0);
    for (answer, took) in &answers {
        assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
        assert!(
            answer.to_ascii_lowercase().contains("connection: close"),
            "{answer}"
        );
        assert!(*took >= REQUEST_TIMEOUT, "408 before the timeout: {took:?}");
    }
    // All of them within a bound near the timeout, not minutes.
    assert!(started.elapsed() < WAIT, "took {:?}", started.elapsed());
    assert_eq!(http_rejected(&gw, "timeout"), TRICKLERS as u64);
    gw.await_metric(
        r#"herald_http_requests_rejected_total{reason="timeout"}"#,
        TRICKLERS as f64,
    )
    .await;
    still_served(&gw, &mut good, 2).await;
    gw.shutdown().await;
}

/// Holds an API slot with a publish that trickles in, re-sending it if it
/// was refused (a slot taken by someone else at the time); stops when
/// dropped.
async fn hold_slot(addr: SocketAddr) {
    loop {
        let (answer, _) =
            trickle(addr, Duration::from_millis(200), Duration::from_secs(3600)).await;
        assert!(answer.starts_with("HTTP/1.1 503"), "{answer}");
    }
}

#[tokio::test]
async fn a_full_house_of_api_requests_answers_503_busy_but_health_still_answers() {
    const SLOTS: usize = 5;
    let mut config = Gateway::config();
    config.http.max_concurrent_requests = SLOTS;
    config.http.request_timeout = Duration::from_secs(60);
    let gw = Gateway::with(config).await;
    let mut good = bystander(&gw).await;

    let holders: Vec<_> = (0..SLOTS)
        .map(|_| tokio::spawn(hold_slot(gw.addr)))
        .collect();
    // The slots are taken when the holders' heads have been read: no event
    // to await from outside, so ask until the house is full (this asker is
    // the only other requester, so a 503 means the holders hold them all).
    eventually(WAIT, || async {
        let (status, body) = testkit::http(gw.addr, "GET", "/metrics", &[], b"").await;
        if status == 503 {
            assert_eq!(body, "busy\n");
            return Ok(());
        }
        assert_eq!(status, 200, "{body}");
        Err("the holders never took every slot")
    })
    .await;

    // A sixth API request, a proper publish, is refused at once.
    let before = http_rejected(&gw, "busy");
    let (status, headers, body) = testkit::http_with_headers(
        gw.addr,
        "POST",
        "/v1/publish",
        &[("content-type", "application/json")],
        json!({"topic": ROOM, "data": 1}).to_string().as_bytes(),
    )
    .await;
    assert_eq!((status, body.as_str()), (503, "busy\n"));
    assert!(headers.contains_key("retry-after"), "{headers:?}");
    assert_eq!(http_rejected(&gw, "busy"), before + 1);
    // Health probes take no slot.
    for path in ["/healthz", "/readyz"] {
        let (status, body) = testkit::http(gw.addr, "GET", path, &[], b"").await;
        assert_eq!(status, 200, "{path}: {body}");
    }

    // The holders leave; the slots come back.
    for holder in holders {
        holder.abort();
        let _ = holder.await;
    }
    eventually(WAIT, || async {
        let (status, _) = testkit::http(gw.addr, "GET", "/metrics", &[], b"").await;
        (status == 200)
            .then_some(())
            .ok_or("the slots never came back")
    })
    .await;
    still_served(&gw, &mut good, 1).await;
    gw.shutdown().await;
}

// ---------------------------------------------------------------------------
// A listener of its own for the API

/// A gateway with `http.api_listen`: (the client port, the API port, the
/// gateway's stop and task).
struct Split {
    addr: SocketAddr,
    api: SocketAddr,
    stop: tokio::sync::oneshot::Sender<()>,
    task: tokio::task::JoinHandle<()>,
}

impl Split {
    async fn start() -> Self {
        Self::with(Gateway::config()).await
    }

    async fn with(mut config: gateway::Config) -> Self {
        let http = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let api = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind the API");
        let (addr, api_addr) = (
            http.local_addr().expect("addr"),
            api.local_addr().expect("API addr"),
        );
        config.http.api_listen = Some(api_addr);
        let node = gateway::Node::start(config).await.expect("node");
        let (stop, stopped) = tokio::sync::oneshot::channel();
        let listeners = gateway::Listeners {
            http,
            api: Some(api),
            grpc: None,
        };
        let task = tokio::spawn(gateway::serve(node, listeners, async {
            let _ = stopped.await;
        }));
        Self {
            addr,
            api: api_addr,
            stop,
            task,
        }
    }

    async fn shutdown(self) {
        let _ = self.stop.send(());
        timeout(Duration::from_secs(30), self.task)
            .await
            .expect("gateway stops")
            .expect("gateway task");
    }
}

/// The status of a WebSocket upgrade request to `addr`.
async fn upgrade_status(addr: SocketAddr) -> u16 {
    let url = format!("ws://{addr}/ws");
    match timeout(WAIT, tokio_tungstenite::connect_async(url))
        .await
        .expect("an answer in time")
    {
        Ok(_) => 101,
        Err(tungstenite::Error::Http(response)) => response.status().as_u16(),
        Err(e) => panic!("no HTTP answer: {e}"),
    }
}

#[tokio::test]
async fn with_api_listen_the_api_is_served_only_on_its_own_port() {
    let gw = Split::start().await;
    let publish = |addr| async move {
        testkit::http(
            addr,
            "POST",
            "/v1/publish",
            &[("content-type", "application/json")],
            json!({"topic": ROOM, "data": "hi"}).to_string().as_bytes(),
        )
        .await
    };
    let mut good = Client::subscriber(&format!("ws://{}/ws", gw.addr), ROOM).await;

    // The client port: WebSockets and health only.
    assert_eq!(publish(gw.addr).await.0, 404);
    assert_eq!(
        testkit::http(gw.addr, "GET", "/metrics", &[], b"").await.0,
        404
    );
    assert_eq!(upgrade_status(gw.addr).await, 101);

    // The API port: the API, metrics and health, no WebSockets.
    let (status, body) = publish(gw.api).await;
    assert_eq!(status, 200, "{body}");
    let (_, _, data) = good.msg().await;
    assert_eq!(data, json!("hi"));
    let (status, body) = testkit::http(gw.api, "GET", "/metrics", &[], b"").await;
    assert_eq!(status, 200);
    assert!(body.contains("herald_connections"), "{body}");
    assert_eq!(upgrade_status(gw.api).await, 404);

    for addr in [gw.addr, gw.api] {
        for path in ["/healthz", "/readyz"] {
            let (status, body) = testkit::http(addr, "GET", path, &[], b"").await;
            assert_eq!(status, 200, "{addr}{path}: {body}");
        }
    }
    drop(good);
    gw.shutdown().await;
}

#[tokio::test]
async fn on_the_api_listener_a_head_that_trickles_in_gets_the_request_timeout() {
    // Far apart, so that which one ended the request is plain.
    const REQUEST_TIMEOUT: Duration = Duration::from_secs(1);
    let mut config = Gateway::config();
    config.http.request_timeout = REQUEST_TIMEOUT;
    config.websocket.handshake_timeout = Duration::from_secs(60);
    let gw = Split::with(config).await;

    let started = Instant::now();
    let mut stream = timeout(WAIT, TcpStream::connect(gw.api))
        .await
        .expect("connect in time")
        .expect("connect");
    let head = trickle_head(gw.api);
    let mut chunk = [0u8; 1024];
    let ended = timeout(WAIT, async {
        for byte in head.as_bytes() {
            tokio::select! {
                read = stream.read(&mut chunk) => return read.map(|n| chunk[..n].to_vec()),
                () = sleep(Duration::from_millis(100)) => {
                    if stream.write_all(&[*byte]).await.is_err() {
                        return Ok(Vec::new());
                    }
                }
            }
        }
        panic!("the whole head went in a byte at a time: pace too fast")
    })
    .await
    .expect("the connection ends within the request timeout, not the handshake's");
    let took = started.elapsed();
    // Dropped (or told 408), at the request timeout and not before.
    if let Ok(answer) = ended {
        let answer = String::from_utf8_lossy(&answer);
        assert!(
            answer.is_empty() || answer.starts_with("HTTP/1.1 408"),
            "{answer}"
        );
    }
    assert!(took >= REQUEST_TIMEOUT, "{took:?}");
    let (status, _) = testkit::http(gw.api, "GET", "/healthz", &[], b"").await;
    assert_eq!(status, 200);
    gw.shutdown().await;
}

// ---------------------------------------------------------------------------
// The real binary, configured through its environment

#[tokio::test]
async fn the_herald_binary_enforces_the_limits_its_environment_sets() {
    let redis = Redis::start().await;
    let api = SocketAddr::from(([127, 0, 0, 1], testkit::herald::free_port()));
    let api_listen = api.to_string();
    let herald = Herald::pod(
        HERALD,
        &redis.url(),
        &[
            ("HERALD_NAMESPACES__CHAT__PUBLISH", "authenticated"),
            ("HERALD_NAMESPACES__FLOOD__SUBSCRIBE", "anyone"),
            ("HERALD_NAMESPACES__FLOOD__HISTORY_TTL", "60s"),
            ("HERALD_WEBSOCKET__HELLO_TIMEOUT", "300ms"),
            ("HERALD_WEBSOCKET__MAX_CONNECTIONS_PER_IP", "2"),
            ("HERALD_WEBSOCKET__COMMANDS_PER_SECOND", "100000"),
            ("HERALD_WEBSOCKET__COMMANDS_BURST", "100000"),
            ("HERALD_HTTP__TRUSTED_PROXIES", "127.0.0.1"),
            ("HERALD_HTTP__REQUEST_TIMEOUT", "1s"),
            ("HERALD_HTTP__API_LISTEN", &api_listen),
        ],
    )
    .await;
    let url = herald.ws_url();
    let mut good = Client::subscriber(&url, ROOM).await;

    // The API only on its own port; health on both.
    let publish = json!({"topic": ROOM, "data": 0}).to_string();
    let on_clients = testkit::http(herald.addr, "POST", "/v1/publish", &[], publish.as_bytes());
    assert_eq!(on_clients.await.0, 404);
    assert_eq!(
        testkit::http(herald.addr, "GET", "/metrics", &[], b"")
            .await
            .0,
        404
    );
    assert_eq!(upgrade_status(api).await, 404);
    for addr in [herald.addr, api] {
        assert_eq!(
            testkit::http(addr, "GET", "/healthz", &[], b"").await.0,
            200
        );
    }

    // Never says hello: 4005. Forwarded from an address of its own, so that
    // it does not count against the loopback's cap below.
    let mut silent = connect_with(&url, &[("x-forwarded-for", "192.0.2.1")])
        .await
        .unwrap_or_else(|(status, _)| panic!("admitted, not {status}"));
    assert_eq!(silent.closed().await, Some(4005));

    // Two from the proxy's own address, then 503; forwarded ones apart.
    let _second = admitted(&url, &[], 1).await;
    refused(&url, &[]).await;
    let _forwarded = admitted(&url, &[("x-forwarded-for", "198.51.100.1")], 2).await;

    // A publish that trickles in: 408 after a second, not minutes.
    let (answer, took) = trickle(api, Duration::from_millis(200), WAIT).await;
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert!(took >= Duration::from_secs(1), "{took:?}");
    let (status, _) = testkit::http(herald.addr, "GET", "/healthz", &[], b"").await;
    assert_eq!(status, 200);

    // Throwaway subscriptions leave meta keys that expire with the history age.
    let mut churner = admitted(&url, &[("x-forwarded-for", "198.51.100.2")], 1)
        .await
        .remove(0);
    churn(&mut churner, "flood", 300).await;
    let left = pttls(&redis, "herald:{flood:*");
    assert_eq!(left.len(), 300, "meta keys of 300 topics");
    for (key, pttl) in &left {
        assert!((0..=60_000).contains(pttl), "{key} has PTTL {pttl} ms");
    }

    still_served(Addr(api), &mut good, 1).await;
    testkit::await_metric(
        api,
        r#"herald_connections_closed_total{reason="hello_timeout"}"#,
        1.0,
    )
    .await;
    testkit::await_metric(api, PER_IP_REJECTED, 1.0).await;
    testkit::await_metric(
        api,
        r#"herald_http_requests_rejected_total{reason="timeout"}"#,
        1.0,
    )
    .await;
}
