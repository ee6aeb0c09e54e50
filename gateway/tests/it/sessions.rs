//! A session's stored copy is what its live connection holds, whatever
//! happens meanwhile: a quiet client keeps its session past the resume
//! window, a takeover that waits in vain for a stuck connection keeps what
//! the new connection does, a save Redis refused is made again, and a
//! resume cut short mid-restore leaves every subscription stored. Each
//! story ends the same way: the pod dies (or the connections end) and a
//! resume gets exactly what was not acked, and every subscription.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::Duration;

use serde_json::{Value, json};
use testkit::{Client, Gateway, Herald, Redis, WAIT, eventually, metric};

use crate::pod::{HERALD, hello, saved};

async fn pod(redis: &Redis, extra: &[(&str, &str)]) -> Herald {
    let mut env = vec![("HERALD_REDIS__COMMAND_TIMEOUT", "500ms")];
    env.extend_from_slice(extra);
    Herald::pod(HERALD, &redis.url(), &env).await
}

/// Publishes over HTTP, which must succeed.
async fn publish(addr: SocketAddr, topic: &str, data: Value) {
    let body = json!({"topic": topic, "data": data}).to_string();
    let (status, answer) = testkit::http(addr, "POST", "/v1/publish", &[], body.as_bytes()).await;
    assert_eq!(status, 200, "publish: {answer}");
}

/// Waits until the pod at `addr` has `count` WebSocket connections (a
/// connection that ends saves its session first).
async fn connections(addr: SocketAddr, count: f64) {
    eventually(WAIT, || async {
        let open = metric(addr, "herald_connections").await;
        if open == count {
            Ok(())
        } else {
            Err(format!("{open} connections of {addr}, not {count}"))
        }
    })
    .await;
}

/// The reply to command `id`, past any `msg` or `reset` before it.
async fn reply(client: &mut Client, id: u64) -> Value {
    loop {
        let message = client.recv().await;
        if message["id"] == id {
            return message;
        }
        assert!(
            message["op"] == "msg" || message["op"] == "reset",
            "waiting for the reply to {id}: {message}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_quiet_session_outlives_the_resume_window_while_its_client_is_connected() {
    let redis = Redis::start().await;
    let window = [("HERALD_SESSION__RESUME_WINDOW", "1s")];
    let (mut a, b) = (pod(&redis, &window).await, pod(&redis, &window).await);
    let mut client = Client::connect_url(&a.ws_url()).await;
    let session = hello(&mut client).await;
    client.sub(1, "news").await;
    publish(a.addr, "news", json!(1)).await;
    assert_eq!(client.msg().await.1, 1);
    saved(&redis, &session, "news").await;

    // The client stays connected and says nothing for more than twice the
    // window (the passing of time is what this test is about); then its
    // pod dies.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    a.kill9();

    let mut client = Client::connect_url(&b.ws_url()).await;
    let welcome = client.hello(Some(&session)).await;
    assert_eq!(welcome["resumed"], true, "{welcome}");
    assert_eq!(client.msg().await.1, 1, "what was not acked comes again");
    publish(b.addr, "news", json!(2)).await;
    assert_eq!(client.msg().await.1, 2);
}

/// The pods' write timeout in the takeover stories: longer than a takeover
/// waits (2 s), within a story's wait.
const STUCK: Duration = Duration::from_secs(5);

/// On the pod at `url`/`addr`: a client resumes its session while the old
/// connection's writer is stuck (its client stopped reading while a lot was
/// published) until the write timeout ([`STUCK`]), longer than a takeover
/// waits (2 s), and the store has no copy of the session (`no_copy` sees to it).
/// The old connection ends and saves first; then the new one subscribes to
/// another topic, and ends: a resume gets the new connection's
/// subscriptions.
async fn a_takeover_outlasted_by_a_stuck_connection_keeps_the_new_subscriptions(
    url: &str,
    addr: SocketAddr,
    no_copy: impl FnOnce(&str),
) {
    let mut old = Client::with_receive_buffer(url, 4096).await;
    let session = hello(&mut old).await;
    old.sub(1, "bulk").await;
    // 6 MB: more than the kernel buffers on loopback (tcp_wmem max 4 MB)
    // plus the queue.
    let pad = "x".repeat(48 * 1024);
    for n in 1..=120 {
        publish(addr, "bulk", json!({"n": n, "pad": pad})).await;
    }
    no_copy(&session);

    let mut new = Client::connect_url(url).await;
    let welcome = new.hello(Some(&session)).await;
    assert_eq!(welcome["resumed"], true, "{welcome}");
    // The old connection's write times out; it ends and saves (or tries to).
    connections(addr, 1.0).await;
    drop(old);
    new.send(json!({"op": "sub", "id": 2, "topic": "news"}))
        .await;
    let answer = reply(&mut new, 2).await;
    assert_eq!(answer["op"], "ok", "{answer}");
    drop(new);
    connections(addr, 0.0).await;

    let mut back = Client::connect_url(url).await;
    let welcome = back.hello(Some(&session)).await;
    assert_eq!(welcome["resumed"], true, "{welcome}");
    back.send(json!({"op": "unsub", "id": 3, "topic": "news"}))
        .await;
    let answer = reply(&mut back, 3).await;
    assert_eq!(answer["op"], "ok", "news is still subscribed: {answer}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_takeover_keeps_the_new_subscriptions_in_a_pod_local_store() {
    let mut config = Gateway::config();
    config.websocket.write_timeout = STUCK;
    let gw = Gateway::with(config).await;
    // The memory store keeps a session only once its connection ended.
    let no_copy = |_: &str| {};
    a_takeover_outlasted_by_a_stuck_connection_keeps_the_new_subscriptions(
        &gw.ws_url(),
        gw.addr,
        no_copy,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_takeover_keeps_the_new_subscriptions_of_a_session_redis_lost() {
    let redis = Redis::start().await;
    // Flushed at the pod's start only, so that no flush writes the session
    // back once Redis lost it (a failover to a replica that never had it).
    let a = pod(
        &redis,
        &[
            ("HERALD_SESSION__FLUSH_INTERVAL", "1h"),
            ("HERALD_WEBSOCKET__WRITE_TIMEOUT", "5s"),
        ],
    )
    .await;
    let no_copy = |session: &str| {
        let key = format!("herald:session:{session}");
        assert_eq!(redis.cli(&["DEL", &key]).trim(), "1");
    };
    a_takeover_outlasted_by_a_stuck_connection_keeps_the_new_subscriptions(
        &a.ws_url(),
        a.addr,
        no_copy,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ack_whose_save_redis_refused_is_saved_once_redis_is_back() {
    let redis = Redis::start().await;
    let (mut a, b) = (pod(&redis, &[]).await, pod(&redis, &[]).await);
    let mut client = Client::connect_url(&a.ws_url()).await;
    let session = hello(&mut client).await;
    client.sub(1, "news").await;
    for n in 1..=3 {
        publish(a.addr, "news", json!(n)).await;
        assert_eq!(client.msg().await.1, n);
    }
    saved(&redis, &session, "news").await;

    // Redis refuses scripts for a moment: the flush that carries the ack
    // fails (the session was saved and unchanged before it, so every failed
    // save is one of the ack).
    let refuse = ["ACL", "SETUSER", "default", "-evalsha", "-eval"];
    assert_eq!(redis.cli(&refuse).trim(), "OK");
    client
        .send(json!({"op": "ack", "topic": "news", "seq": 2}))
        .await;
    eventually(WAIT, || async {
        metric(a.addr, "herald_redis_errors_total{op=\"session_save\"}").await >= 1.0
    })
    .await;
    assert_eq!(
        redis.cli(&["ACL", "SETUSER", "default", "+@all"]).trim(),
        "OK"
    );
    saved(&redis, &session, "\n2 ").await;
    a.kill9();

    let mut client = Client::connect_url(&b.ws_url()).await;
    let welcome = client.hello(Some(&session)).await;
    assert_eq!(welcome["resumed"], true, "{welcome}");
    assert_eq!(client.msg().await.1, 3, "nothing acked comes again");
    publish(b.addr, "news", json!(4)).await;
    assert_eq!(client.msg().await.1, 4);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flush_in_the_middle_of_a_restore_stores_every_subscription() {
    const TOPICS: u64 = 20;
    const EACH: u64 = 10;
    let redis = Redis::start().await;
    let (a, mut b) = (pod(&redis, &[]).await, pod(&redis, &[]).await);
    let mut client = Client::connect_url(&a.ws_url()).await;
    let session = hello(&mut client).await;
    for t in 0..TOPICS {
        client.sub(t + 1, &format!("t{t}")).await;
    }
    // 6.4 MB in all, received and not acked.
    let pad = "x".repeat(32 * 1024);
    for t in 0..TOPICS {
        for n in 1..=EACH {
            publish(a.addr, &format!("t{t}"), json!({"n": n, "pad": pad})).await;
        }
        for n in 1..=EACH {
            assert_eq!(client.msg().await.1, n);
        }
    }
    drop(client);
    connections(a.addr, 0.0).await;

    // The client resumes on pod b and reads nothing after its welcome: the
    // replay fills its socket, and the restore waits for room, topic by
    // topic, while pod b flushes the session.
    let mut slow = Client::with_receive_buffer(&b.ws_url(), 4096).await;
    let welcome = slow.hello(Some(&session)).await;
    assert_eq!(welcome["resumed"], true, "{welcome}");
    eventually(WAIT, || async {
        metric(
            b.addr,
            "herald_redis_command_seconds_count{op=\"session_save\"}",
        )
        .await
            >= 1.0
    })
    .await;
    b.kill9();

    // At pod a, every topic comes back with everything in it.
    let mut client = Client::connect_url(&a.ws_url()).await;
    let welcome = client.hello(Some(&session)).await;
    assert_eq!(welcome["resumed"], true, "{welcome}");
    // A command's answer comes after everything the restore replayed.
    client
        .send(json!({"op": "sub", "id": 99, "topic": "last"}))
        .await;
    let mut got: BTreeMap<String, Vec<u64>> = BTreeMap::new();
    loop {
        let message = client.recv().await;
        if message["id"] == 99 {
            break;
        }
        assert_eq!(message["op"], "msg", "{message}");
        let topic = message["topic"].as_str().expect("topic").to_owned();
        got.entry(topic)
            .or_default()
            .push(message["seq"].as_u64().expect("seq"));
    }
    let everything: Vec<u64> = (1..=EACH).collect();
    let expected: BTreeMap<String, Vec<u64>> = (0..TOPICS)
        .map(|t| (format!("t{t}"), everything.clone()))
        .collect();
    assert_eq!(got, expected);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_whose_resume_redis_forgot_keeps_saving_its_session() {
    let mut redis = Redis::start().await;
    let (a, mut b) = (pod(&redis, &[]).await, pod(&redis, &[]).await);
    let mut client = Client::connect_url(&a.ws_url()).await;
    let session = hello(&mut client).await;
    client.sub(1, "news").await;
    drop(client);
    connections(a.addr, 0.0).await;
    redis.save();

    // The client resumes on pod b, and subscribes to more; then Redis
    // comes back from the dump taken before: the resume never happened
    // there, and the stored session names the first connection its owner.
    let mut client = Client::connect_url(&b.ws_url()).await;
    let welcome = client.hello(Some(&session)).await;
    assert_eq!(welcome["resumed"], true, "{welcome}");
    client.sub(2, "sport").await;
    redis.restart_from_save().await;
    saved(&redis, &session, "news").await;
    // b's pub/sub connection comes back (a watch meanwhile is refused).
    eventually(WAIT, || async {
        metric(b.addr, "herald_redis_pubsub_reconnects_total").await >= 1.0
            && metric(b.addr, "herald_redis_pubsub_up").await == 1.0
    })
    .await;
    // The connection that serves the session still saves it, whole.
    // (The first call after the restart may meet the broken connection
    // and answer `unavailable`: a client tries again.)
    for id in 3.. {
        client
            .send(json!({"op": "sub", "id": id, "topic": "weather"}))
            .await;
        let answer = reply(&mut client, id).await;
        if answer["op"] == "ok" {
            break;
        }
        assert_eq!(answer["code"], "unavailable", "{answer}");
        assert!(id < 10, "{answer}");
    }
    saved(&redis, &session, "sport").await;
    saved(&redis, &session, "weather").await;
    a.reconnected_to_redis().await;
    b.kill9();

    let mut client = Client::connect_url(&a.ws_url()).await;
    let welcome = client.hello(Some(&session)).await;
    assert_eq!(welcome["resumed"], true, "{welcome}");
    // Every subscription is back (`sport`'s epoch began after the dump, so
    // Redis lost it: a `reset` says so).
    for (n, topic) in ["news", "sport", "weather"].into_iter().enumerate() {
        publish(a.addr, topic, json!(n)).await;
        let message = loop {
            let message = client.recv().await;
            if message["op"] != "reset" {
                break message;
            }
        };
        assert_eq!(message["op"], "msg", "{message}");
        assert_eq!(
            (&message["topic"], &message["data"]),
            (&json!(topic), &json!(n))
        );
    }
}
