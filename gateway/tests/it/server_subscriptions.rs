//! Server-side subscriptions (issue #23): a backend subscribes or
//! unsubscribes every live connection of a user, on every pod
//! (`POST /v1/subscribe`, `POST /v1/unsubscribe`, gRPC twins); the client
//! hears `ok` / `unsubscribed` with `reason: "server"`, replay from `since`
//! included, and the session keeps the subscription as the server's, so a
//! resume restores it without the token granting it. A token's `topics`
//! are subscribed at a fresh `hello` (`reason: "token"`) and restored with
//! the session on a resume.

use std::net::SocketAddr;
use std::time::Duration;

use gateway::Config;
use router::{NamespaceSettings, Subscribe};
use serde_json::{Value, json};
use testkit::{Client, Gateway, Herald, Redis};

use crate::pod::{HERALD, publish};

/// The HMAC secret tokens are signed with (at least 32 bytes).
const SECRET: &str = "herald-server-subscription-tests-secret-0123";

/// An HS256 token for `sub` with `extra` claims, signed with [`SECRET`].
fn token(sub: &str, extra: Value) -> String {
    token_signed(SECRET, sub, extra)
}

/// An HS256 token for `sub` with `extra` claims, valid for ten minutes,
/// signed with `secret` by Python's own `hmac`.
pub(crate) fn token_signed(secret: &str, sub: &str, extra: Value) -> String {
    const MINT: &str = r#"
import base64, hashlib, hmac, json, sys, time
part = lambda d: base64.urlsafe_b64encode(json.dumps(d).encode()).rstrip(b"=")
claims = dict(json.loads(sys.argv[3]), sub=sys.argv[2], exp=int(time.time()) + 600)
signed = part({"alg": "HS256", "typ": "JWT"}) + b"." + part(claims)
mac = hmac.new(sys.argv[1].encode(), signed, hashlib.sha256).digest()
print((signed + b"." + base64.urlsafe_b64encode(mac).rstrip(b"=")).decode())
"#;
    let extra = extra.to_string();
    let output = testkit::process::run(
        "python3",
        &["-c", MINT, secret, sub, &extra],
        Duration::from_secs(30),
        "python3 on PATH",
    );
    assert!(
        output.status.success(),
        "{}",
        testkit::process::show(&output)
    );
    String::from_utf8(output.stdout)
        .expect("UTF-8")
        .trim()
        .to_owned()
}

/// Tokens checked with [`SECRET`]; a namespace `vip` whose topics need a
/// grant, and `notes`, a user's own.
fn config() -> Config {
    let mut config = Gateway::config();
    config.auth.hmac_secret = SECRET.to_owned();
    config.namespaces.insert(
        "vip".to_owned(),
        NamespaceSettings {
            subscribe: Subscribe::Granted,
            ..Default::default()
        },
    );
    config.namespaces.insert(
        "notes".to_owned(),
        NamespaceSettings {
            subscribe: Subscribe::Granted,
            personal: true,
            ..Default::default()
        },
    );
    config
}

/// A client of `url` with a session as `token`'s user: its `welcome`.
async fn login(url: &str, token: &str, resume: Option<&str>) -> (Client, Value) {
    let mut client = Client::connect_url(url).await;
    let mut hello = json!({"op": "hello", "token": token});
    if let Some(session) = resume {
        hello["resume"] = json!(session);
    }
    client.send(hello).await;
    let welcome = client.expect("welcome").await;
    (client, welcome)
}

/// `POST <path>` with `body`: the status and the answer.
async fn post(addr: SocketAddr, path: &str, body: Value) -> (u16, Value) {
    let body = body.to_string();
    let (status, answer) = testkit::http(addr, "POST", path, &[], body.as_bytes()).await;
    let answer = serde_json::from_str(&answer).unwrap_or_else(|_| panic!("JSON: {answer}"));
    (status, answer)
}

/// Proves that nothing of `topic` came before a message of `marker` (which
/// the client is subscribed to): publishes to both, in that order, on `addr`.
async fn nothing_of(client: &mut Client, addr: SocketAddr, topic: &str, marker: &str) {
    publish(addr, topic, json!("not for you"), None).await;
    publish(addr, marker, json!("marker"), None).await;
    let (got, _, data) = client.msg().await;
    assert_eq!((got.as_str(), data), (marker, json!("marker")));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backend_subscribes_and_unsubscribes_a_user_connected_to_both_pods() {
    let redis = Redis::start().await;
    let env = [
        ("HERALD_REDIS__COMMAND_TIMEOUT", "2s"),
        ("HERALD_AUTH__HMAC_SECRET", SECRET),
    ];
    let (a, b) = (
        Herald::pod(HERALD, &redis.url(), &env).await,
        Herald::pod(HERALD, &redis.url(), &env).await,
    );
    let alice = token("alice", json!({}));
    let (mut on_a, _) = login(&a.ws_url(), &alice, None).await;
    let (mut on_b, _) = login(&b.ws_url(), &alice, None).await;
    let (mut bob, _) = login(&a.ws_url(), &token("bob", json!({})), None).await;
    for (id, client) in [&mut on_a, &mut on_b, &mut bob].into_iter().enumerate() {
        client.sub(id as u64 + 1, "marker").await;
    }
    publish(a.addr, "news", json!("before"), None).await;

    let (status, answer) = post(
        a.addr,
        "/v1/subscribe",
        json!({"user": "alice", "topic": "news"}),
    )
    .await;
    assert_eq!((status, answer), (200, json!({})));
    for client in [&mut on_a, &mut on_b] {
        let ok = client.expect("ok").await;
        assert_eq!(ok["topic"], "news");
        assert_eq!(ok["reason"], "server");
        assert_eq!(
            ok["seq"], 1,
            "where the topic stands: no replay without since"
        );
        assert!(ok.get("id").is_none(), "not an answer to a command: {ok}");
    }
    let (status, _) = publish(b.addr, "news", json!("live"), None).await;
    assert_eq!(status, 200);
    for client in [&mut on_a, &mut on_b] {
        assert_eq!(client.msg().await, ("news".to_owned(), 2, json!("live")));
    }
    nothing_of(&mut bob, a.addr, "news", "marker").await;
    for client in [&mut on_a, &mut on_b] {
        assert_eq!(client.msg().await.1, 3, "news 3, before the marker");
        assert_eq!(client.msg().await.0, "marker");
    }
    // Already subscribed: nothing happens.
    post(
        b.addr,
        "/v1/subscribe",
        json!({"user": "alice", "topic": "news"}),
    )
    .await;

    let (status, _) = post(
        b.addr,
        "/v1/unsubscribe",
        json!({"user": "alice", "topic": "news"}),
    )
    .await;
    assert_eq!(status, 200);
    for client in [&mut on_a, &mut on_b] {
        let gone = client.expect("unsubscribed").await;
        assert_eq!(
            gone,
            json!({"op": "unsubscribed", "topic": "news", "reason": "server"})
        );
        nothing_of(client, a.addr, "news", "marker").await;
    }
}

#[tokio::test]
async fn a_server_subscription_replays_from_since_and_survives_a_resume_without_a_grant() {
    let gw = Gateway::with(config()).await;
    for i in 1..=5 {
        gw.publish("vip:launch", json!(i)).await;
    }
    let alice = token("alice", json!({}));
    let (mut client, welcome) = login(&gw.ws_url(), &alice, None).await;
    let session = welcome["session"].as_str().expect("session").to_owned();
    // The client itself may not.
    client
        .send(json!({"op": "sub", "id": 1, "topic": "vip:launch"}))
        .await;
    assert_eq!(client.expect("err").await["code"], "forbidden");

    let asked = json!({"user": "alice", "topic": "vip:launch", "since": 2});
    let (status, _) = post(gw.addr, "/v1/subscribe", asked).await;
    assert_eq!(status, 200);
    let ok = client.expect("ok").await;
    assert_eq!(
        (ok["reason"].as_str(), ok["recovered"].as_bool()),
        (Some("server"), Some(true))
    );
    for seq in 3..=5 {
        assert_eq!(client.msg().await.1, seq, "replayed after since");
    }
    client
        .send(json!({"op": "ack", "topic": "vip:launch", "seq": 5}))
        .await;
    client.send(json!({"op": "ping", "id": 2})).await;
    client.expect("ok").await;
    drop(client); // no close frame: the session stays for its window

    gw.publish("vip:launch", json!(6)).await;
    let (mut back, welcome) = login(&gw.ws_url(), &alice, Some(&session)).await;
    assert_eq!(welcome["resumed"], true, "{welcome}");
    // Restored, not refused for want of a grant: the missed message comes.
    assert_eq!(back.msg().await, ("vip:launch".to_owned(), 6, json!(6)));
    // And again: restored, it is still the server's.
    back.send(json!({"op": "ack", "topic": "vip:launch", "seq": 6}))
        .await;
    back.send(json!({"op": "ping", "id": 3})).await;
    back.expect("ok").await;
    drop(back);
    gw.publish("vip:launch", json!(7)).await;
    let (mut again, welcome) = login(&gw.ws_url(), &alice, Some(&session)).await;
    assert_eq!(welcome["resumed"], true, "{welcome}");
    assert_eq!(again.msg().await, ("vip:launch".to_owned(), 7, json!(7)));
    let applied = gw
        .metric(r#"herald_server_subscriptions_applied_total{command="subscribe",outcome="done"}"#)
        .await;
    assert_eq!(applied, 1.0);
    gw.shutdown().await;
}

#[tokio::test]
async fn a_tokens_topics_are_subscribed_at_hello_and_restored_on_resume() {
    let gw = Gateway::with(config()).await;
    let alice = token("alice", json!({"topics": ["notes:alice", "news"]}));
    let (mut client, welcome) = login(&gw.ws_url(), &alice, None).await;
    let session = welcome["session"].as_str().expect("session").to_owned();
    let mut topics = Vec::new();
    for _ in 0..2 {
        let ok = client.expect("ok").await;
        assert_eq!(ok["reason"], "token", "{ok}");
        topics.push(ok["topic"].as_str().expect("topic").to_owned());
    }
    topics.sort();
    assert_eq!(topics, ["news", "notes:alice"]);
    gw.publish("notes:alice", json!("hi")).await;
    assert_eq!(client.msg().await.0, "notes:alice");
    // The client may leave one of them; the session goes on without it.
    client
        .send(json!({"op": "ack", "topic": "notes:alice", "seq": 1}))
        .await;
    client
        .send(json!({"op": "unsub", "id": 1, "topic": "news"}))
        .await;
    client.expect("ok").await;
    drop(client);

    gw.publish("notes:alice", json!("while away")).await;
    let (mut back, welcome) = login(&gw.ws_url(), &alice, Some(&session)).await;
    assert_eq!(welcome["resumed"], true);
    // Restored with the session (no second `ok`), and not re-added.
    assert_eq!(
        back.msg().await,
        ("notes:alice".to_owned(), 2, json!("while away"))
    );
    gw.publish("news", json!("not re-added")).await;
    gw.publish("notes:alice", json!("after")).await;
    assert_eq!(
        back.msg().await,
        ("notes:alice".to_owned(), 3, json!("after"))
    );

    // A token whose topics cannot be: refused at hello, naming the topic.
    for (topics, named) in [
        (json!(["nope:x"]), "nope:x"),
        (json!(["bad topic"]), "bad topic"),
    ] {
        let bad = token("carol", json!({ "topics": topics }));
        let mut client = Client::connect(&gw).await;
        client.send(json!({"op": "hello", "token": bad})).await;
        let err = client.expect("err").await;
        assert_eq!(err["code"], "unauthorized");
        assert!(
            err["message"].as_str().expect("message").contains(named),
            "{err}"
        );
        assert_eq!(client.closed().await, Some(4502));
    }
    gw.shutdown().await;
}

#[tokio::test]
async fn bad_requests_are_refused_and_a_user_without_a_connection_is_no_error() {
    let gw = Gateway::with(config()).await;
    for (path, body, code) in [
        (
            "/v1/subscribe",
            json!({"user": "a", "topic": "nope:x"}),
            "unknown_namespace",
        ),
        (
            "/v1/unsubscribe",
            json!({"user": "a", "topic": "nope:x"}),
            "unknown_namespace",
        ),
        (
            "/v1/subscribe",
            json!({"user": "a", "topic": "bad topic"}),
            "bad_topic",
        ),
        ("/v1/subscribe", json!({"topic": "news"}), "missing_field"),
        (
            "/v1/subscribe",
            json!({"user": "", "topic": "news"}),
            "malformed",
        ),
    ] {
        let (status, answer) = post(gw.addr, path, body.clone()).await;
        assert_eq!(
            (status, answer["code"].as_str()),
            (400, Some(code)),
            "{path} {body}"
        );
    }
    let (status, answer) = post(
        gw.addr,
        "/v1/subscribe",
        json!({"user": "ghost", "topic": "news"}),
    )
    .await;
    assert_eq!((status, answer), (200, json!({})));
    let refused = gw
        .metric(r#"herald_server_subscriptions_total{command="subscribe",outcome="refused"}"#)
        .await;
    assert_eq!(refused, 4.0);

    let mut grpc = testkit::grpc_client(gw.grpc_addr).await;
    let unknown = proto::v1::SubscribeRequest {
        user: "a".into(),
        topic: "nope:x".into(),
        since: None,
        epoch: None,
    };
    let refused = grpc.subscribe(unknown).await.expect_err("refused");
    assert_eq!(refused.code(), tonic::Code::InvalidArgument);
    // Over gRPC, to a connected user: the same as over HTTP.
    let alice = token("alice", json!({}));
    let (mut client, _) = login(&gw.ws_url(), &alice, None).await;
    let subscribe = proto::v1::SubscribeRequest {
        user: "alice".into(),
        topic: "vip:g".into(),
        since: None,
        epoch: None,
    };
    grpc.subscribe(subscribe).await.expect("subscribed");
    assert_eq!(client.expect("ok").await["reason"], "server");
    let unsubscribe = proto::v1::UnsubscribeRequest {
        user: "alice".into(),
        topic: "vip:g".into(),
    };
    grpc.unsubscribe(unsubscribe).await.expect("unsubscribed");
    assert_eq!(client.expect("unsubscribed").await["topic"], "vip:g");
    gw.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_subscription_is_restored_by_a_resume_on_another_pod() {
    let redis = Redis::start().await;
    let env = [
        ("HERALD_REDIS__COMMAND_TIMEOUT", "2s"),
        ("HERALD_AUTH__HMAC_SECRET", SECRET),
        ("HERALD_NAMESPACES__VIP__SUBSCRIBE", "granted"),
    ];
    let (a, b) = (
        Herald::pod(HERALD, &redis.url(), &env).await,
        Herald::pod(HERALD, &redis.url(), &env).await,
    );
    let alice = token("alice", json!({}));
    let (mut client, welcome) = login(&a.ws_url(), &alice, None).await;
    let session = welcome["session"].as_str().expect("session").to_owned();
    let asked = json!({"user": "alice", "topic": "vip:room"});
    let (status, _) = post(b.addr, "/v1/subscribe", asked).await;
    assert_eq!(status, 200);
    assert_eq!(client.expect("ok").await["reason"], "server");
    // Its `ok` waited for the session to be saved with it: the stored
    // session has it, marked as the server's.
    crate::pod::saved(&redis, &session, "vip:room server").await;
    drop(client);
    publish(a.addr, "vip:room", json!("while away"), None).await;
    let (mut back, welcome) = login(&b.ws_url(), &alice, Some(&session)).await;
    assert_eq!(welcome["resumed"], true, "{welcome}");
    assert_eq!(
        back.msg().await,
        ("vip:room".to_owned(), 1, json!("while away"))
    );
}

#[tokio::test]
async fn the_subscription_limits_hold_for_a_server_subscription() {
    let mut config = config();
    config.session.max_subscriptions = 1;
    let gw = Gateway::with(config).await;
    let (mut client, _) = login(&gw.ws_url(), &token("alice", json!({})), None).await;
    client.sub(1, "news").await;
    let asked = json!({"user": "alice", "topic": "vip:more"});
    let (status, _) = post(gw.addr, "/v1/subscribe", asked).await;
    assert_eq!(
        status, 200,
        "the backend's request was carried out; the limit is the client's"
    );
    let refused = client.expect("err").await;
    assert_eq!(refused["code"], "too_many_subscriptions");
    assert_eq!(refused["topic"], "vip:more");
    assert!(refused.get("id").is_none(), "{refused}");
    gw.await_metric(
        r#"herald_server_subscriptions_applied_total{command="subscribe",outcome="refused"}"#,
        1.0,
    )
    .await;
    // And an unsubscribe of a topic it does not have changes nothing.
    let asked = json!({"user": "alice", "topic": "vip:more"});
    post(gw.addr, "/v1/unsubscribe", asked).await;
    gw.await_metric(
        r#"herald_server_subscriptions_applied_total{command="unsubscribe",outcome="unchanged"}"#,
        1.0,
    )
    .await;
    gw.shutdown().await;
}

#[tokio::test]
async fn on_the_embedded_broker_every_connection_of_the_user_is_reached() {
    let gw = Gateway::with(config()).await;
    let alice = token("alice", json!({}));
    let (mut first, _) = login(&gw.ws_url(), &alice, None).await;
    let (mut second, _) = login(&gw.ws_url(), &alice, None).await;
    let (mut bob, _) = login(&gw.ws_url(), &token("bob", json!({})), None).await;
    bob.sub(1, "marker").await;
    let (status, _) = post(
        gw.addr,
        "/v1/subscribe",
        json!({"user": "alice", "topic": "news"}),
    )
    .await;
    assert_eq!(status, 200);
    for client in [&mut first, &mut second] {
        assert_eq!(client.expect("ok").await["reason"], "server");
    }
    gw.publish("news", json!("both")).await;
    for client in [&mut first, &mut second] {
        assert_eq!(client.msg().await, ("news".to_owned(), 1, json!("both")));
    }
    nothing_of(&mut bob, gw.addr, "news", "marker").await;
    gw.shutdown().await;
}
