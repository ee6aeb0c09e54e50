//! Continuity under Redis faults, against the real `herald` binary and a
//! real `redis-server`: a pod's pub/sub that catches up late sends nobody a
//! message twice; a resume or a `sub` that meets the pod's broken Redis
//! connections waits for new ones instead of sending the client away; a
//! `reset` carries the session into the new epoch; and when
//! Redis goes back in time (restarted from an older dump) every client that
//! saw the lost seqs is told (`reset`, `recovered: false`), none is handed a
//! seq again in the epoch it already had it in, and the stream goes on in a
//! new epoch; a `reset` the client never read is told again, even across a
//! resume that Redis interrupted.

use std::net::SocketAddr;

use serde_json::{Value, json};
use testkit::{Client, Herald, Redis, WAIT, eventually};

use crate::pod::{HERALD, hello};

/// Publishes over HTTP, retrying while the pod reconnects to Redis; the seq.
async fn publish(addr: SocketAddr, data: Value) -> u64 {
    let body = json!({"topic": "news", "data": data}).to_string();
    let answer = eventually(WAIT, || async {
        let (status, body) = testkit::http(addr, "POST", "/v1/publish", &[], body.as_bytes()).await;
        if status == 200 {
            Ok(body)
        } else {
            Err(format!("publish answered {status}: {body}"))
        }
    })
    .await;
    let answer: Value = serde_json::from_str(&answer).unwrap_or(Value::Null);
    answer["seq"].as_u64().expect("seq")
}

/// Receives `msg`s `from..=to` in order.
async fn receive(client: &mut Client, from: u64, to: u64) {
    for seq in from..=to {
        assert_eq!(client.msg().await.1, seq);
    }
}

/// Waits until the store holds session `id` acked at `seq` on `news`.
async fn saved(redis: &Redis, id: &str, seq: u64) {
    let key = format!("herald:session:{id}");
    let line = format!("\n{seq} ");
    eventually(WAIT, || async { redis.cli(&["GET", &key]).contains(&line) }).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_restarted_from_an_older_dump_resets_live_and_resumed_clients_into_a_new_epoch() {
    let mut redis = Redis::start().await;
    let pod = Herald::pod(
        HERALD,
        &redis.url(),
        &[
            ("HERALD_REDIS__COMMAND_TIMEOUT", "500ms"),
            ("HERALD_SESSION__FLUSH_INTERVAL", "50ms"),
        ],
    )
    .await;
    // One client stays connected throughout; another acks, leaves, resumes.
    let mut live = Client::connect_url(&pod.ws_url()).await;
    live.hello(None).await;
    let epoch = live.sub(1, "news").await["epoch"]
        .as_str()
        .expect("epoch")
        .to_owned();
    let mut resuming = Client::connect_url(&pod.ws_url()).await;
    let session = hello(&mut resuming).await;
    resuming.sub(1, "news").await;

    for n in 1..=10 {
        publish(pod.addr, json!(n)).await;
    }
    receive(&mut resuming, 1, 10).await;
    resuming
        .send(json!({"op": "ack", "topic": "news", "seq": 10, "epoch": epoch}))
        .await;
    saved(&redis, &session, 10).await;
    redis.save();
    for n in 11..=20 {
        publish(pod.addr, json!(n)).await;
    }
    receive(&mut resuming, 11, 20).await;
    resuming
        .send(json!({"op": "ack", "topic": "news", "seq": 20, "epoch": epoch}))
        .await;
    saved(&redis, &session, 20).await;
    receive(&mut live, 1, 20).await;
    drop(resuming);

    // Redis comes back with seq 10 and the session acked at 10.
    redis.restart_from_save().await;

    // The live client is told; the seqs it gets next are of a new epoch.
    let reset = live.expect("reset").await;
    let new_epoch = reset["epoch"].as_str().expect("epoch").to_owned();
    assert_ne!(new_epoch, epoch);
    let told = reset["seq"].as_u64().expect("seq");
    let mut last = told;
    for n in 1..=5 {
        last = publish(pod.addr, json!(format!("after {n}"))).await;
    }
    assert_eq!(last, told + 5);
    receive(&mut live, told + 1, last).await;

    // The resumed session (acked at 10 in the old epoch, as Redis now says)
    // is reset too: it is not handed the new seqs 11 to 15 as if they were
    // the ones it already had. It is reset to where the new epoch began, and
    // gets all of the new epoch from history: nothing skipped.
    let mut resumed = Client::connect_url(&pod.ws_url()).await;
    assert_eq!(resumed.hello(Some(&session)).await["resumed"], true);
    let reset = resumed.expect("reset").await;
    assert_eq!(reset["epoch"], new_epoch);
    assert_eq!(reset["seq"], told);
    for n in 1..=5 {
        let (_, seq, data) = resumed.msg().await;
        assert_eq!((seq, data), (told + n, json!(format!("after {n}"))));
    }
    let next = publish(pod.addr, json!("next")).await;
    assert_eq!(resumed.msg().await.1, next);

    // A client that saw seq 20 of the old epoch cannot recover it.
    let mut other = Client::connect_url(&pod.ws_url()).await;
    other.hello(None).await;
    other
        .send(json!({"op": "sub", "id": 1, "topic": "news", "since": 20, "epoch": epoch}))
        .await;
    let ok = other.expect("ok").await;
    assert_eq!(ok["recovered"], false);
    assert_eq!(ok["epoch"], new_epoch);
}

async fn pod(redis: &Redis) -> Herald {
    Herald::pod(
        HERALD,
        &redis.url(),
        &[
            ("HERALD_REDIS__COMMAND_TIMEOUT", "500ms"),
            ("HERALD_SESSION__FLUSH_INTERVAL", "50ms"),
        ],
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replay_is_not_sent_again_when_the_pods_pubsub_catches_up_late() {
    let redis = Redis::start().await;
    let pod = pod(&redis).await;
    let mut first = Client::subscriber(&pod.ws_url(), "news").await;
    for n in 1..=3 {
        publish(pod.addr, json!(n)).await;
    }
    receive(&mut first, 1, 3).await;
    // The pod's pub/sub connection goes, and cannot come back for now.
    assert_eq!(
        redis
            .cli(&["ACL", "SETUSER", "default", "-subscribe"])
            .trim(),
        "OK"
    );
    redis.cli(&["CLIENT", "KILL", "TYPE", "pubsub"]);
    for n in 4..=6 {
        publish(pod.addr, json!(n)).await;
    }
    // A second client replays 4 to 6 from history (the topic is watched on
    // this pod already: no pub/sub needed) and goes live.
    let mut second = Client::connect_url(&pod.ws_url()).await;
    second.hello(None).await;
    second
        .send(json!({"op": "sub", "id": 1, "topic": "news", "since": 3}))
        .await;
    assert_eq!(second.expect("ok").await["recovered"], true);
    receive(&mut second, 4, 6).await;
    // The pub/sub comes back and fills 4 to 6: for the first client only.
    assert_eq!(
        redis
            .cli(&["ACL", "SETUSER", "default", "+subscribe"])
            .trim(),
        "OK"
    );
    receive(&mut first, 4, 6).await;
    publish(pod.addr, json!(7)).await;
    receive(&mut first, 7, 7).await;
    assert_eq!(
        second.msg().await.1,
        7,
        "nothing of the replay a second time"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resume_that_meets_the_pods_broken_redis_connection_is_served_on_a_new_one() {
    let redis = Redis::start().await;
    let pod = pod(&redis).await;
    let mut client = Client::connect_url(&pod.ws_url()).await;
    let session = hello(&mut client).await;
    client.sub(1, "news").await;
    let first = publish(pod.addr, json!(1)).await;
    receive(&mut client, first, first).await;
    drop(client);
    saved(&redis, &session, 0).await;
    // Redis drops the pod's command connection (its pub/sub stays): the
    // pod has not noticed, and the resume's claim is the first command to
    // meet the dead socket.
    let killed = redis.cli(&["CLIENT", "KILL", "TYPE", "normal"]);
    assert_ne!(killed.trim(), "0", "the pod's command connection: {killed}");
    let mut resumed = Client::connect_url(&pod.ws_url()).await;
    let welcome = resumed.hello(Some(&session)).await;
    assert_eq!(welcome["resumed"], true, "{welcome}");
    // Nothing acked: seq 1 comes again, then what follows.
    receive(&mut resumed, first, first).await;
    let next = publish(pod.addr, json!(2)).await;
    receive(&mut resumed, next, next).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sub_while_the_pods_pubsub_reconnects_waits_for_it() {
    let redis = Redis::start().await;
    let pod = pod(&redis).await;
    let mut client = Client::connect_url(&pod.ws_url()).await;
    client.hello(None).await;
    // The pod's pub/sub connection goes; Redis itself is fine. The pod
    // reconnects within a tick or two: a topic new to it waits for that.
    redis.cli(&["CLIENT", "KILL", "TYPE", "pubsub"]);
    eventually(WAIT, || async {
        testkit::metric(pod.addr, "herald_redis_pubsub_up").await == 0.0
    })
    .await;
    let ok = client.sub(1, "news").await;
    assert!(ok["epoch"].is_string(), "{ok}");
    let seq = publish(pod.addr, json!("after")).await;
    receive(&mut client, seq, seq).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_reset_a_resume_continues_in_the_new_epoch() {
    let mut redis = Redis::start().await;
    let pod = pod(&redis).await;
    let mut client = Client::connect_url(&pod.ws_url()).await;
    let session = hello(&mut client).await;
    let old = client.sub(1, "news").await["epoch"].clone();
    for n in 1..=2 {
        publish(pod.addr, json!(n)).await;
    }
    receive(&mut client, 1, 2).await;
    // Redis loses everything: the topic starts a new epoch, the client is told.
    redis.restart_empty().await;
    let reset = client.expect("reset").await;
    let epoch = reset["epoch"].clone();
    assert_ne!(epoch, old);
    let from = reset["seq"].as_u64().expect("seq");
    let last = publish(pod.addr, json!("a")).await;
    receive(&mut client, from + 1, last).await;
    client
        .send(json!({"op": "ack", "topic": "news", "seq": last, "epoch": epoch}))
        .await;
    saved(&redis, &session, last).await;
    drop(client);
    let missed = publish(pod.addr, json!("b")).await;
    // The resume replays what it missed in the new epoch: no second reset.
    let mut resumed = Client::connect_url(&pod.ws_url()).await;
    assert_eq!(resumed.hello(Some(&session)).await["resumed"], true);
    let next = resumed.recv().await;
    assert_eq!(next["op"], "msg", "a replay, not {next}");
    assert_eq!(next["seq"], missed);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reset_is_stored_at_once_and_told_again_on_a_resume_until_acked_in_its_epoch() {
    let mut redis = Redis::start().await;
    // No periodic flush within the test: only what is saved at once is.
    let env = [
        ("HERALD_REDIS__COMMAND_TIMEOUT", "500ms"),
        ("HERALD_SESSION__FLUSH_INTERVAL", "1h"),
    ];
    let mut a = Herald::pod(HERALD, &redis.url(), &env).await;
    let b = Herald::pod(HERALD, &redis.url(), &env).await;
    let mut client = Client::connect_url(&a.ws_url()).await;
    let session = hello(&mut client).await;
    client.sub(1, "news").await;
    publish(a.addr, json!(1)).await;
    receive(&mut client, 1, 1).await;
    redis.restart_empty().await;
    let reset = client.expect("reset").await;
    let epoch = reset["epoch"].as_str().expect("epoch").to_owned();
    let told = reset["seq"].clone();
    // The session, with the new epoch, is in the store before any flush.
    eventually(WAIT, || async {
        let stored = redis.cli(&["GET", &format!("herald:session:{session}")]);
        if stored.contains(&epoch) {
            Ok(())
        } else {
            Err(format!("stored: {stored:?}, not epoch {epoch}"))
        }
    })
    .await;
    // Pod b has found its connection to Redis broken by the restart, and
    // made a new one.
    b.reconnected_to_redis().await;
    a.kill9();
    let mut resumed = Client::connect_url(&b.ws_url()).await;
    assert_eq!(resumed.hello(Some(&session)).await["resumed"], true);
    // The client never acked in the new epoch, so the resume tells it again,
    // at the same place: a client that read it carries on.
    let again = resumed.expect("reset").await;
    assert_eq!((&again["epoch"], &again["seq"]), (&json!(epoch), &told));
    let missed = publish(b.addr, json!("after")).await;
    let next = resumed.recv().await;
    assert_eq!(next["op"], "msg", "{next}");
    assert_eq!(next["seq"], missed);
    // Acked in the new epoch (and saved as the connection ends), a resume
    // tells it no more.
    resumed
        .send(json!({"op": "ack", "topic": "news", "seq": missed, "epoch": epoch}))
        .await;
    drop(resumed);
    eventually(WAIT, || async {
        let stored = redis.cli(&["GET", &format!("herald:session:{session}")]);
        stored.contains(&format!("\n{missed} {epoch} news\n"))
    })
    .await;
    let mut last = Client::connect_url(&b.ws_url()).await;
    assert_eq!(last.hello(Some(&session)).await["resumed"], true);
    let seq = publish(b.addr, json!("last")).await;
    let next = last.recv().await;
    assert_eq!(
        (&next["op"], &next["seq"]),
        (&json!("msg"), &json!(seq)),
        "no reset: {next}"
    );
}

/// The chaos story's failure (seed 11): a pod told a live client `reset` as
/// Redis came back from an older dump, the client lost its connection before
/// reading it, and its next resume met a Redis error on the next pod, which
/// closed it (4003) and saved the session. That save must keep the reset
/// as told: saved as read, the resume after it went on in the new epoch
/// without a `reset`, handing the client the new epoch's seqs as the
/// continuation of the old one's, and its acks (of the old epoch) never
/// counted again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reset_the_client_never_read_is_told_again_after_a_resume_that_redis_interrupted() {
    let mut redis = Redis::start().await;
    let env = [
        ("HERALD_REDIS__COMMAND_TIMEOUT", "500ms"),
        ("HERALD_SESSION__FLUSH_INTERVAL", "1h"),
    ];
    let a = Herald::pod(HERALD, &redis.url(), &env).await;
    let b = Herald::pod(HERALD, &redis.url(), &env).await;
    let key = |session: &str| format!("herald:session:{session}");
    let mut client = Client::connect_url(&a.ws_url()).await;
    let session = hello(&mut client).await;
    client.sub(1, "news").await;
    publish(a.addr, json!(1)).await;
    receive(&mut client, 1, 1).await;
    redis.restart_empty().await;
    let reset = client.expect("reset").await;
    let epoch = reset["epoch"].as_str().expect("epoch").to_owned();
    let told = reset["seq"].as_u64().expect("seq");
    // Stored as told; the client goes without acking in the new epoch, as
    // one that never read the reset.
    let told_line = format!("\n{told} {epoch} news told\n");
    eventually(WAIT, || async {
        redis.cli(&["GET", &key(&session)]).contains(&told_line)
    })
    .await;
    drop(client);
    testkit::await_metric(a.addr, "herald_connections", 0.0).await;
    b.reconnected_to_redis().await;

    // Redis refuses the topic's keys (not the sessions'): the resume on b
    // is claimed, then cannot restore the subscription, and is sent away.
    let only_sessions = ["~herald:session:*", "~herald:pods", "~herald:revoked:*"];
    let mut acl = vec!["ACL", "SETUSER", "default", "resetkeys"];
    acl.extend(only_sessions);
    assert_eq!(redis.cli(&acl).trim(), "OK");
    let mut interrupted = Client::connect_url(&b.ws_url()).await;
    assert_eq!(interrupted.hello(Some(&session)).await["resumed"], true);
    assert_eq!(interrupted.closed().await, Some(4003));
    drop(interrupted);
    // Its session saved as it ended, before it was counted.
    testkit::await_metric(
        b.addr,
        "herald_connections_closed_total{reason=\"unavailable\"}",
        1.0,
    )
    .await;
    assert_eq!(
        redis.cli(&["ACL", "SETUSER", "default", "allkeys"]).trim(),
        "OK"
    );

    // The next resume, on a, tells the reset again before anything else.
    let mut resumed = Client::connect_url(&a.ws_url()).await;
    assert_eq!(resumed.hello(Some(&session)).await["resumed"], true);
    let missed = publish(a.addr, json!("after")).await;
    let first = resumed.recv().await;
    assert_eq!(first["op"], "reset", "the reset again, not {first}");
    assert_eq!(
        (&first["epoch"], &first["seq"]),
        (&json!(epoch), &json!(told))
    );
    receive(&mut resumed, told + 1, missed).await;
}
