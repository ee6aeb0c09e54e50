//! Webhooks: events batched, signed and retried to a real HTTP receiver
//! (testkit's), from real `herald` processes. Occupied/vacated are told
//! exactly once per transition across two pods on one Redis, also when a
//! pod is killed with `kill -9` (by the pod that cleans up after it, within
//! the presence cleanup bound); the signature checks out with an HMAC
//! computed by Python; a receiver answering 500 for a while loses no event
//! (the same batch again, ids to de-duplicate by); a full queue drops and
//! counts without holding up delivery to clients.

use std::collections::HashSet;
use std::net::SocketAddr;
use std::time::Duration;

use serde_json::{Value, json};
use testkit::webhooks::Receiver;
use testkit::{Client, Herald, Redis, WAIT};

use crate::pod::HERALD;

const SECRET: &str = "webhook-tests-secret";

/// A pod's variables: anonymous clients subscribe and publish in `room`,
/// webhooks of `events` to `receiver`, sent quickly.
fn env<'a>(
    receiver: &'a str,
    events: &'a str,
    extra: &[(&'a str, &'a str)],
) -> Vec<(&'a str, &'a str)> {
    let mut env = vec![
        ("HERALD_NAMESPACES__ROOM__SUBSCRIBE", "anyone"),
        ("HERALD_NAMESPACES__ROOM__PUBLISH", "authenticated"),
        ("HERALD_WEBHOOKS__URL", receiver),
        ("HERALD_WEBHOOKS__SECRET", SECRET),
        ("HERALD_WEBHOOKS__EVENTS", events),
        ("HERALD_WEBHOOKS__BATCH_INTERVAL", "20ms"),
        ("HERALD_REDIS__COMMAND_TIMEOUT", "1s"),
        ("HERALD_LOG__LEVEL", "info"),
    ];
    env.extend_from_slice(extra);
    env
}

/// The events of `kind` about `topic`.
fn about<'a>(events: &'a [Value], kind: &str, topic: &str) -> Vec<&'a Value> {
    events
        .iter()
        .filter(|e| e["type"] == kind && e["topic"] == topic)
        .collect()
}

fn count(events: &[Value], kind: &str, topic: &str) -> usize {
    about(events, kind, topic).len()
}

async fn subscriber(url: &str, topic: &str) -> Client {
    Client::subscriber(url, topic).await
}

/// Long enough for a change that should not come to have come: a few
/// batch intervals and occupancy writes.
const QUIET: Duration = Duration::from_millis(500);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn occupied_and_vacated_are_told_once_across_pods_and_after_a_kill_9_by_the_cleaner() {
    let receiver = Receiver::start().await;
    let url = receiver.url();
    let redis = Redis::start().await;
    let events = "topic.occupied,topic.vacated";
    // pod_ttl 2s: a killed pod is cleaned within 2s + a beat (400ms) + the
    // cleanup.
    let extra = [("HERALD_PRESENCE__POD_TTL", "2s")];
    let a = Herald::pod(HERALD, &redis.url(), &env(&url, events, &extra)).await;
    let mut b = Herald::pod(HERALD, &redis.url(), &env(&url, events, &extra)).await;

    // room:1: a subscriber on a, then one on b; a's leaves, then b's.
    let mut on_a = subscriber(&a.ws_url(), "room:1").await;
    receiver
        .wait_for(WAIT, |e| count(e, "topic.occupied", "room:1") == 1)
        .await;
    let mut on_b = subscriber(&b.ws_url(), "room:1").await;
    // Each pod writes its occupancy in order: once a marker subscribed
    // after room:1 is told, b's part of room:1 is written.
    let _marker = subscriber(&b.ws_url(), "room:m1").await;
    receiver
        .wait_for(WAIT, |e| count(e, "topic.occupied", "room:m1") == 1)
        .await;
    on_a.ws.close(None).await.expect("close");
    on_a.closed().await;
    tokio::time::sleep(QUIET).await;
    let seen = receiver.events();
    assert_eq!(count(&seen, "topic.vacated", "room:1"), 0, "{seen:?}");
    on_b.ws.close(None).await.expect("close");
    on_b.closed().await;
    let seen = receiver
        .wait_for(WAIT, |e| count(e, "topic.vacated", "room:1") == 1)
        .await;
    tokio::time::sleep(QUIET).await;
    let seen2 = receiver.events();
    assert_eq!(count(&seen2, "topic.occupied", "room:1"), 1, "{seen:?}");
    assert_eq!(count(&seen2, "topic.vacated", "room:1"), 1, "{seen2:?}");

    // room:2 on both pods, room:3 on b only; b dies without a goodbye.
    let _on_a2 = subscriber(&a.ws_url(), "room:2").await;
    let _on_b2 = subscriber(&b.ws_url(), "room:2").await;
    let _on_b3 = subscriber(&b.ws_url(), "room:3").await;
    let _marker = subscriber(&b.ws_url(), "room:m2").await;
    receiver
        .wait_for(WAIT, |e| count(e, "topic.occupied", "room:m2") == 1)
        .await;
    b.kill9();
    let killed = tokio::time::Instant::now();
    // The bound: pod_ttl + a beat + the cleanup, generous for a loaded
    // machine.
    let seen = receiver
        .wait_for(Duration::from_secs(10), |e| {
            count(e, "topic.vacated", "room:3") == 1
        })
        .await;
    assert_eq!(count(&seen, "topic.vacated", "room:3"), 1, "{seen:?}");
    assert!(
        killed.elapsed() >= Duration::from_secs(1),
        "vacated before the dead pod's liveness could have expired"
    );
    tokio::time::sleep(QUIET).await;
    let seen = receiver.events();
    assert_eq!(count(&seen, "topic.occupied", "room:2"), 1, "{seen:?}");
    assert_eq!(count(&seen, "topic.vacated", "room:2"), 0, "{seen:?}");
    assert_eq!(count(&seen, "topic.vacated", "room:3"), 1, "{seen:?}");
    let ids: HashSet<&str> = seen.iter().filter_map(|e| e["id"].as_str()).collect();
    assert_eq!(ids.len(), seen.len(), "ids are unique: {seen:?}");
    drop(a);
}

/// `sha256=<hex>` of `body` under [`SECRET`], by Python's hmac module.
fn python_signature(body: &[u8]) -> String {
    let hex: String = body.iter().map(|b| format!("{b:02x}")).collect();
    let script = "import hashlib, hmac, sys\n\
                  print('sha256=' + hmac.new(sys.argv[1].encode(), bytes.fromhex(sys.argv[2]), hashlib.sha256).hexdigest())";
    let output = testkit::process::run(
        "python3",
        &["-c", script, SECRET, &hex],
        Duration::from_secs(20),
        "python3",
    );
    assert!(output.status.success(), "{output:?}");
    String::from_utf8_lossy(&output.stdout).trim().to_owned()
}

/// Publishes `n` messages to `topic` from `client`, each acknowledged.
async fn publish(client: &mut Client, topic: &str, n: u64) {
    for i in 1..=n {
        client
            .send(json!({"op": "pub", "id": 100 + i, "topic": topic, "data": {"n": i}}))
            .await;
        loop {
            let reply = client.recv().await;
            if reply["op"] == "ok" && reply["id"] == 100 + i {
                break;
            }
            assert_ne!(reply["op"], "err", "{reply}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn signed_batches_are_retried_while_the_backend_fails_and_no_event_is_lost() {
    let receiver = Receiver::start().await;
    let url = receiver.url();
    let pod = Herald::start(
        HERALD,
        &env(
            &url,
            "client.publish,connection.open",
            &[("HERALD_WEBHOOKS__BATCH_SIZE", "4")],
        ),
        &[],
    )
    .await;
    let mut client = Client::connect_url(&pod.ws_url()).await;
    client.hello(None).await;
    let first = receiver
        .wait_for(WAIT, |e| e.iter().any(|e| e["type"] == "connection.open"))
        .await;
    assert!(
        first[0]["client"].is_string() && first[0]["remote_addr"] == "127.0.0.1",
        "{first:?}"
    );
    // The backend is down: every batch is answered 500.
    receiver.fail(true);
    publish(&mut client, "room:p", 10).await;
    // Some tries fail (at least two of the same batch, so it was retried).
    testkit::eventually(WAIT, || async {
        let failed = receiver.posts().iter().filter(|p| !p.acknowledged).count();
        if failed >= 2 {
            Ok(())
        } else {
            Err(format!("{failed} failed posts"))
        }
    })
    .await;
    receiver.fail(false);
    let seen = receiver
        .wait_for(WAIT, |e| {
            let seqs: HashSet<u64> = e
                .iter()
                .filter(|e| e["type"] == "client.publish")
                .filter_map(|e| e["seq"].as_u64())
                .collect();
            seqs.len() == 10
        })
        .await;
    let published: Vec<&Value> = seen
        .iter()
        .filter(|e| e["type"] == "client.publish")
        .collect();
    // Every message, in order, each with its data; none twice once
    // acknowledged.
    let seqs: Vec<u64> = published.iter().filter_map(|e| e["seq"].as_u64()).collect();
    assert_eq!(seqs, (1..=10).collect::<Vec<_>>(), "{seen:?}");
    for event in &published {
        assert_eq!(event["data"]["n"], event["seq"], "{event}");
        assert_eq!(event["topic"], "room:p");
        assert!(
            event["epoch"].is_string() && event["time"].is_u64(),
            "{event}"
        );
    }
    let ids: HashSet<&str> = seen.iter().filter_map(|e| e["id"].as_str()).collect();
    assert_eq!(ids.len(), seen.len(), "ids are unique: {seen:?}");
    // A retried batch is the same body, so the same ids.
    let posts = receiver.posts();
    let failed = posts
        .iter()
        .find(|p| !p.acknowledged)
        .expect("a failed post");
    assert!(
        posts
            .iter()
            .any(|p| p.acknowledged && p.body == failed.body),
        "the failed batch was sent again as it was"
    );
    // Every POST is signed: checked by Python's HMAC, not the product's.
    for post in &posts {
        assert_eq!(
            post.headers["x-herald-signature"],
            python_signature(&post.body)
        );
        assert_eq!(post.headers["content-type"], "application/json");
        assert!(
            post.headers["user-agent"].starts_with("herald/"),
            "{:?}",
            post.headers
        );
    }
}

/// The value of the sample of `name` whose labels contain `labels`.
async fn sample(addr: SocketAddr, name: &str, labels: &str) -> f64 {
    let (_, body) = testkit::http(addr, "GET", "/metrics", &[], b"").await;
    body.lines()
        .filter(|l| l.starts_with(name) && l.contains(labels))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_queue_drops_and_counts_without_holding_up_delivery() {
    let receiver = Receiver::start().await;
    receiver.fail(true);
    let url = receiver.url();
    let pod = Herald::start(
        HERALD,
        &env(
            &url,
            "client.publish",
            &[
                ("HERALD_WEBHOOKS__QUEUE", "3"),
                ("HERALD_WEBHOOKS__BATCH_SIZE", "1"),
                ("HERALD_WEBHOOKS__RETRY_FOR", "1h"),
            ],
        ),
        &[],
    )
    .await;
    let mut reader = subscriber(&pod.ws_url(), "room:q").await;
    let mut writer = Client::connect_url(&pod.ws_url()).await;
    writer.hello(None).await;
    publish(&mut writer, "room:q", 50).await;
    // Every message reaches its subscriber while the backend is down.
    for seq in 1..=50 {
        let (topic, got, _) = reader.msg().await;
        assert_eq!((topic.as_str(), got), ("room:q", seq));
    }
    let dropped = sample(
        pod.addr,
        "herald_webhook_events_total",
        r#"result="dropped_full",type="client.publish""#,
    )
    .await;
    // One batch retried, `queue` held: the rest dropped.
    assert!(dropped >= 45.0, "dropped {dropped}");
    assert_eq!(
        sample(pod.addr, "herald_webhook_queue_events", "").await,
        3.0
    );
}

/// `[webhooks]` from `HERALD_*` variables, over the required ones.
fn load(vars: &[(&str, &str)]) -> Result<gateway::config::Config, gateway::config::ConfigError> {
    let mut all: Vec<(String, String)> = vec![
        (
            "HERALD_WEBHOOKS__URL".into(),
            "http://127.0.0.1:9/events".into(),
        ),
        ("HERALD_WEBHOOKS__SECRET".into(), "s".into()),
    ];
    for (k, v) in vars {
        all.retain(|(key, _)| key != k);
        all.push(((*k).into(), (*v).into()));
    }
    gateway::config::Config::load(None, all)
}

#[track_caller]
fn refused(vars: &[(&str, &str)], key: &str) {
    match load(vars) {
        Ok(_) => panic!("expected a refusal naming `{key}`"),
        Err(e) => assert!(e.to_string().contains(key), "the error names `{key}`: {e}"),
    }
}

#[test]
fn webhooks_settings_are_checked_at_start_naming_the_key() {
    let config = load(&[]).expect("url and secret are enough");
    let webhooks = &config.webhooks;
    assert_eq!(
        webhooks.events,
        [
            "topic.occupied",
            "topic.vacated",
            "presence.join",
            "presence.leave"
        ]
    );
    assert_eq!((webhooks.batch_size, webhooks.queue), (100, 10_000));
    assert_eq!(webhooks.retry_for, Duration::from_secs(60));
    refused(&[("HERALD_WEBHOOKS__SECRET", "")], "webhooks.secret");
    refused(&[("HERALD_WEBHOOKS__URL", "ftp://x/y")], "webhooks.url");
    refused(
        &[("HERALD_WEBHOOKS__EVENTS", "topic.occupied,room.burned")],
        "webhooks.events",
    );
    refused(
        &[("HERALD_WEBHOOKS__BATCH_SIZE", "0")],
        "webhooks.batch_size",
    );
    refused(&[("HERALD_WEBHOOKS__QUEUE", "0")], "webhooks.queue");
    refused(&[("HERALD_WEBHOOKS__TIMEOUT", "0s")], "webhooks.timeout");
    refused(
        &[("HERALD_WEBHOOKS__SECRET_FILE", "/nonexistent/secret")],
        "webhooks.secret",
    );
    // The secret from a file, without its trailing newline.
    let dir = std::env::temp_dir().join(format!("herald-webhooks-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let file = dir.join("secret");
    std::fs::write(&file, "from-a-file\n").expect("write");
    let path = file.to_str().expect("utf-8");
    let config = load(&[
        ("HERALD_WEBHOOKS__SECRET", ""),
        ("HERALD_WEBHOOKS__SECRET_FILE", path),
    ])
    .expect("a secret file");
    assert_eq!(config.webhooks.secret().expect("read"), b"from-a-file");
    let _ = std::fs::remove_dir_all(&dir);
    // Off without a URL: nothing else is required.
    assert!(
        !gateway::config::Config::load(None, Vec::new())
            .expect("defaults")
            .webhooks
            .enabled()
    );
}

/// The `presence.join`s (`true`) and `presence.leave`s of `user` in
/// `topic`, in the order received.
fn membership(events: &[Value], topic: &str, user: &str) -> Vec<bool> {
    events
        .iter()
        .filter(|e| e["topic"] == topic && e["user"] == user)
        .filter_map(|e| match e["type"].as_str() {
            Some("presence.join") => Some(true),
            Some("presence.leave") => Some(false),
            _ => None,
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_on_two_pods_joins_and_leaves_once_and_a_killed_pods_leave_is_told() {
    use crate::presence::{SECRET as TOKEN_SECRET, connect};
    let receiver = Receiver::start().await;
    let url = receiver.url();
    let redis = Redis::start().await;
    let extra = [
        ("HERALD_AUTH__HMAC_SECRET", TOKEN_SECRET),
        ("HERALD_AUTH__ALLOW_ANONYMOUS", "true"),
        ("HERALD_NAMESPACES__ROOM__PRESENCE", "true"),
        ("HERALD_PRESENCE__DIFF_INTERVAL", "100ms"),
        ("HERALD_PRESENCE__POD_TTL", "2s"),
    ];
    let env = env(&url, "presence.join,presence.leave", &extra);
    let a = Herald::pod(HERALD, &redis.url(), &env).await;
    let mut b = Herald::pod(HERALD, &redis.url(), &env).await;
    // Alice on a, then on b too; a's connection goes, then b's.
    let (mut alice_a, _) = connect(&a.ws_url(), Some("alice")).await;
    alice_a.sub(1, "room:1").await;
    let seen = receiver
        .wait_for(WAIT, |e| membership(e, "room:1", "alice") == [true])
        .await;
    let join = seen
        .iter()
        .find(|e| e["type"] == "presence.join")
        .expect("a join");
    assert_eq!(join["info"], json!({"name": "ALICE"}), "{join}");
    let (mut alice_b, _) = connect(&b.ws_url(), Some("alice")).await;
    alice_b.sub(1, "room:1").await;
    // Bob, after alice on b: once his join is told, b wrote alice too.
    let (mut bob, _) = connect(&b.ws_url(), Some("bob")).await;
    bob.sub(1, "room:1").await;
    receiver
        .wait_for(WAIT, |e| membership(e, "room:1", "bob") == [true])
        .await;
    alice_a.ws.close(None).await.expect("close");
    alice_a.closed().await;
    alice_b.ws.close(None).await.expect("close");
    alice_b.closed().await;
    let seen = receiver
        .wait_for(WAIT, |e| membership(e, "room:1", "alice") == [true, false])
        .await;
    assert_eq!(
        membership(&seen, "room:1", "alice"),
        [true, false],
        "{seen:?}"
    );
    // b dies with bob on it: a's cleanup tells his leave, once.
    b.kill9();
    let seen = receiver
        .wait_for(Duration::from_secs(10), |e| {
            membership(e, "room:1", "bob") == [true, false]
        })
        .await;
    assert_eq!(
        membership(&seen, "room:1", "bob"),
        [true, false],
        "{seen:?}"
    );
    tokio::time::sleep(QUIET).await;
    let seen = receiver.events();
    assert_eq!(
        membership(&seen, "room:1", "alice"),
        [true, false],
        "{seen:?}"
    );
    assert_eq!(
        membership(&seen, "room:1", "bob"),
        [true, false],
        "{seen:?}"
    );
    drop((a, bob));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_pod_tells_a_connections_open_join_leave_and_close() {
    use crate::presence::{SECRET as TOKEN_SECRET, connect};
    let receiver = Receiver::start().await;
    let url = receiver.url();
    let extra = [
        ("HERALD_AUTH__HMAC_SECRET", TOKEN_SECRET),
        ("HERALD_NAMESPACES__ROOM__PRESENCE", "true"),
        ("HERALD_PRESENCE__DIFF_INTERVAL", "100ms"),
    ];
    let events = "presence.join,presence.leave,connection.open,connection.close";
    let pod = Herald::start(HERALD, &env(&url, events, &extra), &[]).await;
    let (mut alice, _) = connect(&pod.ws_url(), Some("alice")).await;
    alice.sub(1, "room:1").await;
    receiver
        .wait_for(WAIT, |e| membership(e, "room:1", "alice") == [true])
        .await;
    alice.ws.close(None).await.expect("close");
    alice.closed().await;
    let seen = receiver
        .wait_for(WAIT, |e| {
            e.iter().any(|e| e["type"] == "connection.close")
                && membership(e, "room:1", "alice") == [true, false]
        })
        .await;
    // The leave is written at the next presence interval: after the
    // close, or before.
    let kinds: Vec<&str> = seen.iter().filter_map(|e| e["type"].as_str()).collect();
    assert_eq!(kinds[..2], ["connection.open", "presence.join"], "{seen:?}");
    assert_eq!(kinds.len(), 4, "{seen:?}");
    let open = &seen[0];
    let close = seen
        .iter()
        .find(|e| e["type"] == "connection.close")
        .expect("a close");
    assert_eq!(open["user"], "alice");
    assert_eq!(close["user"], "alice");
    assert_eq!(open["client"], close["client"]);
    assert_eq!(
        (&close["reason"], &close["code"]),
        (&json!("client_closed"), &json!(1000)),
        "{close}"
    );
    assert!(
        open.get("session").is_none(),
        "never the session id: {open}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_pod_tells_occupied_at_the_first_subscriber_and_vacated_after_the_last() {
    let receiver = Receiver::start().await;
    let url = receiver.url();
    let pod = Herald::start(HERALD, &env(&url, "topic.occupied,topic.vacated", &[]), &[]).await;
    let mut first = subscriber(&pod.ws_url(), "room:1").await;
    let mut second = subscriber(&pod.ws_url(), "room:1").await;
    receiver
        .wait_for(WAIT, |e| count(e, "topic.occupied", "room:1") == 1)
        .await;
    first.ws.close(None).await.expect("close");
    first.closed().await;
    // A marker after the first left: the pod tells in order.
    let _marker = subscriber(&pod.ws_url(), "room:m").await;
    let seen = receiver
        .wait_for(WAIT, |e| count(e, "topic.occupied", "room:m") == 1)
        .await;
    assert_eq!(count(&seen, "topic.vacated", "room:1"), 0, "{seen:?}");
    second.ws.close(None).await.expect("close");
    second.closed().await;
    let seen = receiver
        .wait_for(WAIT, |e| count(e, "topic.vacated", "room:1") == 1)
        .await;
    let kinds: Vec<&str> = about(&seen, "topic.occupied", "room:1")
        .into_iter()
        .chain(about(&seen, "topic.vacated", "room:1"))
        .filter_map(|e| e["type"].as_str())
        .collect();
    assert_eq!(kinds, ["topic.occupied", "topic.vacated"], "{seen:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_that_drains_sends_its_last_events_before_it_exits() {
    let receiver = Receiver::start().await;
    let url = receiver.url();
    let extra = [("HERALD_SHUTDOWN__DRAIN_TIMEOUT", "1s")];
    let mut pod = Herald::start(HERALD, &env(&url, "connection.close", &extra), &[]).await;
    let mut client = subscriber(&pod.ws_url(), "room:1").await;
    pod.sigterm();
    // The client leaves when the draining pod advises it to.
    client.expect("reconnect").await;
    client.ws.close(None).await.expect("close");
    client.closed().await;
    assert!(pod.wait_exit(WAIT).await.is_some(), "the pod exits");
    // No waiting here: it was sent before the pod exited.
    let seen = receiver.events();
    assert_eq!(
        seen.iter()
            .filter(|e| e["type"] == "connection.close")
            .count(),
        1,
        "{seen:?}"
    );
}
