//! Herald as a distributed system: real `herald` processes sharing a real
//! `redis-server`. Pods share topics, seqs, history and sessions; a client
//! may lose its pod and carry on at another; Redis may blink, restart empty
//! or cut a pod's pub/sub connection, and nothing is lost silently.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::Duration;

use futures_util::StreamExt;
use serde_json::{Value, json};
use testkit::Herald;
use testkit::Redis;
use testkit::follower::{Crowd, Follow, Service};
use testkit::{Client, WAIT, eventually};
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_tungstenite::tungstenite::Message;

use crate::pod::{HERALD, publish, saved};

async fn pod(redis: &Redis, extra: &[(&str, &str)]) -> Herald {
    let mut env = vec![
        ("HERALD_REDIS__COMMAND_TIMEOUT", "500ms"),
        ("HERALD_LOG__LEVEL", "info"),
    ];
    env.extend_from_slice(extra);
    Herald::pod(HERALD, &redis.url(), &env).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn subscribers_on_two_pods_get_the_same_stream_from_publishers_on_both() {
    const PER_PUBLISHER: u64 = 60;
    let redis = Redis::start().await;
    let (a, b) = (pod(&redis, &[]).await, pod(&redis, &[]).await);
    let mut subscribers = Vec::new();
    for url in [a.ws_url(), b.ws_url()] {
        for _ in 0..4 {
            subscribers.push(Client::subscriber(&url, "news").await);
        }
    }
    // On each pod, one publisher over HTTP and one over gRPC, all at once.
    let mut publishers = Vec::new();
    for (p, pod) in [&a, &b].into_iter().enumerate() {
        let addr = pod.addr;
        publishers.push(tokio::spawn(async move {
            for i in 0..PER_PUBLISHER {
                let (status, _) = publish(addr, "news", json!({"http": p, "i": i}), None).await;
                assert_eq!(status, 200);
            }
        }));
        let grpc = pod.grpc_addr;
        publishers.push(tokio::spawn(async move {
            let mut client = testkit::grpc_client(grpc).await;
            for i in 0..PER_PUBLISHER {
                let request = proto::v1::PublishRequest {
                    topic: "news".into(),
                    data: json!({"grpc": p, "i": i}).to_string().into_bytes(),
                    idempotency_key: None,
                    binary: false,
                };
                let answer = tokio::time::timeout(WAIT, client.publish(request)).await;
                answer.expect("in time").expect("published over gRPC");
            }
        }));
    }
    let total = 4 * PER_PUBLISHER;
    let readers: Vec<_> = subscribers
        .into_iter()
        .map(|mut client| {
            tokio::spawn(async move {
                let mut stream = BTreeMap::new();
                for expected in 1..=total {
                    let (_, seq, data) = client.msg().await;
                    assert_eq!(seq, expected, "in order, once");
                    stream.insert(seq, data);
                }
                stream
            })
        })
        .collect();
    for publisher in publishers {
        publisher.await.expect("publisher");
    }
    let mut streams = Vec::new();
    for reader in readers {
        streams.push(reader.await.expect("a complete stream"));
    }
    assert!(
        streams.windows(2).all(|w| w[0] == w[1]),
        "every subscriber saw the same stream"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_of_a_killed_pod_resume_at_another_and_miss_nothing() {
    const TOTAL: u64 = 300;
    const CLIENTS: usize = 12;
    let redis = Redis::start().await;
    let mut a = pod(&redis, &[]).await;
    let b = pod(&redis, &[]).await;
    // Clients of pod A that ack everything and, when A dies, come back at B:
    // half resuming their sessions, half with a new one and `since`.
    let service = Service::new([a.addr]);
    let (_, last) = watch::channel(Some(TOTAL));
    // Every client is subscribed before the publisher starts.
    let follows = (0..CLIENTS).map(|i| Follow {
        resume: i % 2 == 0,
        ..Follow::new(&service, "feed", &last)
    });
    let clients = Crowd::subscribed(follows, WAIT).await;
    let (third, third_published) = tokio::sync::oneshot::channel();
    let publisher = {
        let addr = b.addr;
        tokio::spawn(async move {
            let mut third = Some(third);
            for i in 1..=TOTAL {
                let (status, _) = publish(addr, "feed", json!(i), None).await;
                assert_eq!(status, 200);
                if i == TOTAL / 3 {
                    third.take().map(|t| t.send(()));
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
    };
    // Kill pod A a third of the way through; its endpoint gives way to B's.
    tokio::time::timeout(WAIT, third_published)
        .await
        .expect("publisher progresses")
        .expect("publisher");
    a.kill9();
    service.remove(a.addr);
    service.add(b.addr);
    publisher.await.expect("publisher");
    for seen in clients.finish(Duration::from_secs(60)).await {
        assert_eq!(seen.processed, (1..=TOTAL).collect::<Vec<_>>(), "{seen:?}");
        assert_eq!(seen.resumes, 1, "one move, to B: {seen:?}");
        assert_eq!(seen.failed_resumes, 0, "{seen:?}");
        assert!(seen.problems.is_empty(), "{seen:?}");
        eprintln!("redelivered after the move: {}", seen.wire_duplicates);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cut_pubsub_connection_is_refilled_from_history() {
    const TOTAL: u64 = 300;
    let redis = Redis::start().await;
    // History deep enough for everything published while the pod is cut off.
    let a = pod(
        &redis,
        &[("HERALD_NAMESPACES__DEFAULT__HISTORY_SIZE", "1000")],
    )
    .await;
    let mut client = Client::subscriber(&a.ws_url(), "news").await;
    let publisher = {
        let addr = a.addr;
        tokio::spawn(async move {
            for i in 1..=TOTAL {
                assert_eq!(publish(addr, "news", json!(i), None).await.0, 200);
            }
        })
    };
    for seq in 1..=TOTAL {
        if seq == 100 {
            let killed = redis.cli(&["CLIENT", "KILL", "TYPE", "pubsub"]);
            assert_eq!(killed.trim(), "1", "one pub/sub connection killed");
        }
        let (_, got, data) = client.msg().await;
        assert_eq!((got, data), (seq, json!(seq)));
    }
    publisher.await.expect("publisher");
    let (_, metrics) = testkit::http(a.addr, "GET", "/metrics", &[], b"").await;
    assert!(
        metrics
            .lines()
            .any(|l| l.starts_with("herald_redis_pubsub_reconnects_total ") && !l.ends_with(" 0")),
        "the reconnect is counted:\n{metrics}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_restarted_empty_is_a_reset_not_a_silent_new_series() {
    let mut redis = Redis::start().await;
    let a = pod(&redis, &[]).await;
    let mut client = Client::subscriber(&a.ws_url(), "news").await;
    for i in 1..=3 {
        assert_eq!(publish(a.addr, "news", json!(i), None).await.0, 200);
        assert_eq!(client.msg().await.1, i);
    }
    let mut late = Client::connect_url(&a.ws_url()).await;
    late.hello(None).await;
    let epoch = late.sub(1, "news").await["epoch"]
        .as_str()
        .expect("epoch")
        .to_owned();

    redis.restart_empty().await;
    // Publishing works again once the pod has reconnected.
    eventually(WAIT, || async {
        let (status, _) = publish(a.addr, "news", json!("after"), None).await;
        assert!(status == 200 || status == 503, "publish: {status}");
        (status == 200)
            .then_some(())
            .ok_or("publishing never recovered")
    })
    .await;
    // The subscriber is told before anything of the new series arrives.
    let reset = client.recv().await;
    assert_eq!(reset["op"], "reset", "{reset}");
    assert_ne!(reset["epoch"], epoch.as_str());

    // A client that comes back with the old epoch is not recovered either.
    let mut back = Client::connect_url(&a.ws_url()).await;
    back.hello(None).await;
    back.send(json!({"op": "sub", "id": 1, "topic": "news", "since": 3, "epoch": epoch}))
        .await;
    assert_eq!(back.expect("ok").await["recovered"], false);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn while_redis_is_unreachable_clients_stay_and_publishes_fail_fast() {
    let redis = Redis::start().await;
    let a = pod(
        &redis,
        &[
            ("HERALD_NAMESPACES__CHAT__PUBLISH", "authenticated"),
            ("HERALD_WEBSOCKET__PING_INTERVAL", "300ms"),
            ("HERALD_WEBSOCKET__PONG_TIMEOUT", "300ms"),
        ],
    )
    .await;
    let mut client = Client::subscriber(&a.ws_url(), "chat:room").await;
    assert_eq!(publish(a.addr, "chat:room", json!(1), None).await.0, 200);
    assert_eq!(client.msg().await.1, 1);

    redis.freeze();
    let started = Instant::now();
    let (status, body) = publish(a.addr, "chat:room", json!(2), None).await;
    assert_eq!(
        (status, body["code"].as_str()),
        (503, Some("unavailable")),
        "{body}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "failed fast: {:?}",
        started.elapsed()
    );
    // Over WebSocket too; and the client, answering pings, stays connected.
    client
        .send(json!({"op": "pub", "id": 9, "topic": "chat:room", "data": 2}))
        .await;
    let err = client.expect("err").await;
    assert_eq!(
        (err["id"].as_u64(), err["code"].as_str()),
        (Some(9), Some("unavailable"))
    );
    // Redis stays away a while; the client keeps reading (and so answers
    // the server's pings) and gets nothing but pings.
    let away = Instant::now() + Duration::from_secs(2);
    while let Ok(frame) = tokio::time::timeout_at(away, client.ws.next()).await {
        match frame {
            Some(Ok(Message::Ping(_) | Message::Pong(_))) => {}
            other => panic!("while Redis is away: {other:?}"),
        }
    }
    redis.thaw();

    eventually(WAIT, || async {
        publish(a.addr, "chat:room", json!(2), None).await.0 == 200
    })
    .await;
    assert_eq!(
        client.msg().await.1,
        2,
        "the same connection, the same series"
    );
    let (_, metrics) = testkit::http(a.addr, "GET", "/metrics", &[], b"").await;
    assert!(metrics.contains("herald_redis_errors_total"), "{metrics}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retried_publish_on_the_other_pod_delivers_once() {
    let redis = Redis::start().await;
    let (a, b) = (pod(&redis, &[]).await, pod(&redis, &[]).await);
    let mut client = Client::subscriber(&a.ws_url(), "orders").await;
    let (status, first) = publish(a.addr, "orders", json!({"id": 7}), Some("order-7")).await;
    assert_eq!(status, 200);
    let (status, again) = publish(b.addr, "orders", json!({"id": 7}), Some("order-7")).await;
    assert_eq!(status, 200);
    assert_eq!(first, again, "the retry answers the first publish's seq");
    let (_, next) = publish(b.addr, "orders", json!({"id": 8}), None).await;
    assert_eq!(client.msg().await.1, first["seq"].as_u64().expect("seq"));
    assert_eq!(
        client.msg().await.1,
        next["seq"].as_u64().expect("seq"),
        "no second delivery"
    );
}

/// A client with a session on `pod`, subscribed to `news`, that has
/// received (not acked) messages 1 to `count`.
async fn subscribed_with(count: u64, pod: &Herald) -> (Client, String) {
    let mut client = Client::connect_url(&pod.ws_url()).await;
    let session = client.hello(None).await["session"]
        .as_str()
        .expect("session")
        .to_owned();
    client.sub(1, "news").await;
    for n in 1..=count {
        assert_eq!(publish(pod.addr, "news", json!(n), None).await.0, 200);
        assert_eq!(client.msg().await.1, n);
    }
    (client, session)
}

/// Drops `client`, and waits until its pod at `addr` has no connection
/// left: a connection that ends saves its session first.
async fn leave(client: Client, addr: SocketAddr) {
    drop(client);
    no_connections(addr).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resume_while_redis_is_away_is_refused_with_4003_and_the_session_survives() {
    let redis = Redis::start().await;
    let a = pod(&redis, &[("HERALD_SESSION__FLUSH_INTERVAL", "50ms")]).await;
    let (mut client, session) = subscribed_with(2, &a).await;
    client
        .send(json!({"op": "ack", "topic": "news", "seq": 1}))
        .await;
    // The ack is in the shared store once the connection has ended.
    leave(client, a.addr).await;

    redis.freeze();
    let mut early = Client::connect_url(&a.ws_url()).await;
    early.send(json!({"op": "hello", "resume": session})).await;
    assert_eq!(early.closed().await, Some(4003), "come back later");
    redis.thaw();

    // Once the pod reaches Redis again (a publish goes through), the resume
    // works: the refused attempt did not start a fresh session, and the
    // unacked message comes again.
    eventually(WAIT, || async {
        publish(a.addr, "other", json!(0), None).await.0 == 200
    })
    .await;
    let mut client = Client::connect_url(&a.ws_url()).await;
    assert_eq!(client.hello(Some(&session)).await["resumed"], true);
    assert_eq!(client.msg().await.1, 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resume_that_loses_redis_while_restoring_topics_is_refused_and_keeps_them_all() {
    let redis = Redis::start().await;
    let a = pod(&redis, &[("HERALD_SESSION__FLUSH_INTERVAL", "50ms")]).await;
    let (mut client, session) = subscribed_with(1, &a).await;
    client.sub(2, "sport").await;
    assert_eq!(publish(a.addr, "sport", json!(1), None).await.0, 200);
    assert_eq!(client.msg().await.0, "sport");
    leave(client, a.addr).await;

    // Redis still hands out the session, but refuses the script that
    // restores a topic: the resume fails between the two.
    assert_eq!(
        redis
            .cli(&["ACL", "SETUSER", "default", "-evalsha", "-eval"])
            .trim(),
        "OK"
    );
    let mut early = Client::connect_url(&a.ws_url()).await;
    early.send(json!({"op": "hello", "resume": session})).await;
    assert_eq!(early.closed().await, Some(4003), "come back later");
    drop(early);
    assert_eq!(
        redis.cli(&["ACL", "SETUSER", "default", "+@all"]).trim(),
        "OK"
    );

    // Neither topic was dropped from the session: both come back, with
    // what was never acked.
    let mut client = Client::connect_url(&a.ws_url()).await;
    assert_eq!(client.hello(Some(&session)).await["resumed"], true);
    let mut replayed = [client.msg().await, client.msg().await];
    replayed.sort_by(|x, y| x.0.cmp(&y.0));
    let replayed: Vec<(&str, u64)> = replayed.iter().map(|m| (m.0.as_str(), m.1)).collect();
    assert_eq!(replayed, [("news", 1), ("sport", 1)]);
}

/// Waits until the pod at `addr` has no WebSocket connection left (each
/// has saved its session by then).
async fn no_connections(addr: SocketAddr) {
    eventually(WAIT, || async {
        let open = testkit::metric(addr, "herald_connections").await;
        if open == 0.0 {
            Ok(())
        } else {
            Err(format!("{open} connections of {addr} never ended"))
        }
    })
    .await;
}

/// Two pods, a and b, and a session that a client resumed on pod b and
/// acked there up to seq 2, while its first connection, to pod a, stays
/// open: as far as pod a can tell (a half-open connection, say), the client
/// is still there. Returns the pods, that connection and the session.
async fn moved_while_open(redis: &Redis) -> (Herald, Herald, Client, String) {
    let flush = [("HERALD_SESSION__FLUSH_INTERVAL", "50ms")];
    let (a, b) = (pod(redis, &flush).await, pod(redis, &flush).await);
    let (old, session) = subscribed_with(2, &a).await;
    // Pod a saves the open connection's session at a flush, with nothing to
    // show for it outside; and a resume at pod b that came too early would
    // claim a snapshot without the subscription, and keep it. So this one
    // wait reads the store.
    saved(redis, &session, "news").await;
    let mut client = Client::connect_url(&b.ws_url()).await;
    assert_eq!(client.hello(Some(&session)).await["resumed"], true);
    assert_eq!(client.msg().await.1, 1);
    assert_eq!(client.msg().await.1, 2);
    client
        .send(json!({"op": "ack", "topic": "news", "seq": 2}))
        .await;
    leave(client, b.addr).await;
    (a, b, old, session)
}

/// Resumes `session` on `pod`: what was acked on pod b (up to seq 2) does
/// not come again, the next message does.
async fn resumes_after_seq_2(pod: &Herald, session: &str) {
    let mut client = Client::connect_url(&pod.ws_url()).await;
    assert_eq!(client.hello(Some(session)).await["resumed"], true);
    assert_eq!(publish(pod.addr, "news", json!(3), None).await.0, 200);
    assert_eq!(
        client.msg().await.1,
        3,
        "nothing acked on pod b comes again"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_resumed_on_another_pod_cannot_save_over_the_newer_session() {
    let redis = Redis::start().await;
    let (a, b, old, session) = moved_while_open(&redis).await;

    // At last pod a sees its connection end, and would save what it holds.
    drop(old);
    no_connections(a.addr).await;

    resumes_after_seq_2(&b, &session).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resume_on_the_pod_of_a_superseded_connection_takes_the_stored_session() {
    let redis = Redis::start().await;
    let (a, _b, _old, session) = moved_while_open(&redis).await;

    // Back on pod a, whose open connection still holds the older acks.
    resumes_after_seq_2(&a, &session).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acks_sent_after_a_reconnect_advice_still_count() {
    let redis = Redis::start().await;
    let (mut a, b) = (pod(&redis, &[]).await, pod(&redis, &[]).await);
    let (mut client, session) = subscribed_with(3, &a).await;
    // Pod a drains; the client acks what it has only after the advice.
    a.sigterm();
    let advice = client.expect("reconnect").await;
    assert_eq!(advice["reason"], "draining");
    client
        .send(json!({"op": "ack", "topic": "news", "seq": 3}))
        .await;
    assert_eq!(client.closed().await, Some(1012));
    assert!(a.wait_exit(WAIT).await.is_some_and(|s| s.success()));

    let mut client = Client::connect_url(&b.ws_url()).await;
    assert_eq!(client.hello(Some(&session)).await["resumed"], true);
    assert_eq!(publish(b.addr, "news", json!(4), None).await.0, 200);
    assert_eq!(client.msg().await.1, 4, "nothing acked is replayed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subscription_that_cannot_come_back_for_good_is_refused_and_the_rest_resumes() {
    let redis = Redis::start().await;
    let a = pod(
        &redis,
        &[("HERALD_NAMESPACES__CHAT__PUBLISH", "authenticated")],
    )
    .await;
    // Pod b has no `chat` namespace: a resumed `chat:` subscription cannot
    // come back there, whatever the client does.
    let b = pod(&redis, &[]).await;
    let (mut client, session) = subscribed_with(1, &a).await;
    client.sub(2, "chat:room").await;
    client
        .send(json!({"op": "ack", "topic": "news", "seq": 1}))
        .await;
    leave(client, a.addr).await;

    let mut client = Client::connect_url(&b.ws_url()).await;
    assert_eq!(client.hello(Some(&session)).await["resumed"], true);
    let err = client.expect("err").await;
    assert_eq!(err["code"], "unknown_namespace", "{err}");
    assert_eq!(publish(b.addr, "news", json!(2), None).await.0, 200);
    assert_eq!(client.msg().await.1, 2, "news resumed after seq 1");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_through_redis_reaches_the_other_pod_in_its_order() {
    const PER_TOPIC: u64 = 100;
    let redis = Redis::start().await;
    let (a, b) = (pod(&redis, &[]).await, pod(&redis, &[]).await);
    let topics = ["t0", "t1", "t2"];
    let mut subscribers = Vec::new();
    for topic in topics {
        subscribers.push(Client::subscriber(&b.ws_url(), topic).await);
    }
    // Interleaved over the topics, in two batches at once: one pipeline
    // carries items of several topics, and the topics' orders hold.
    let batch = |half: u64| {
        let items: Vec<Value> = (half * PER_TOPIC / 2..(half + 1) * PER_TOPIC / 2)
            .flat_map(|i| topics.map(|t| json!({"topic": t, "data": {"i": i}})))
            .collect();
        json!({ "items": items }).to_string()
    };
    let (first, second) = (batch(0), batch(1));
    let (status, answer) =
        testkit::http(a.addr, "POST", "/v1/publish/batch", &[], first.as_bytes()).await;
    assert_eq!(status, 200, "{answer}");
    let (status, answer) =
        testkit::http(a.addr, "POST", "/v1/publish/batch", &[], second.as_bytes()).await;
    assert_eq!(status, 200, "{answer}");
    let answer: Value = serde_json::from_str(&answer).expect("JSON");
    let last: Vec<&Value> = answer["results"]
        .as_array()
        .expect("results")
        .iter()
        .rev()
        .take(3)
        .collect();
    assert!(last.iter().all(|r| r["seq"] == PER_TOPIC), "{answer}");
    for (topic, subscriber) in topics.iter().zip(&mut subscribers) {
        for i in 0..PER_TOPIC {
            assert_eq!(
                subscriber.msg().await,
                (topic.to_string(), i + 1, json!({"i": i}))
            );
        }
    }
}
