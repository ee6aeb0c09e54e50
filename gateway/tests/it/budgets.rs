//! Budgets across a client's connections (issue #21, findings 4 and 5).
//!
//! A client limited per connection only can open more of them: so the pod
//! keeps budgets per principal, a user (its token's `sub`) wherever it
//! connects from, or an anonymous address. Anonymous clients of one address
//! share its subscriptions (`session.max_subscriptions_per_ip`) and the
//! distinct topics they may hold (`session.anonymous_max_topics`); one user's
//! connections from several addresses share its own
//! (`session.max_subscriptions_per_user`); and every principal may touch only
//! so many distinct topics a minute (`session.topics_per_minute`), which is
//! what makes Redis keys. Each refusal is an `err` about the topic and a
//! count in `herald_limit_refusals_total{limit}`; what a connection held is
//! given back when it ends.
//!
//! "An address" is a prefix: `websocket.ipv4_prefix` (32) and
//! `websocket.ipv6_prefix` (64), for the connection cap and the budgets
//! alike. Clients come from several loopback addresses (127.0.0.0/8 is all
//! this host's); IPv6 ones through a trusted proxy's `X-Forwarded-For`.

use std::net::{IpAddr, Ipv4Addr};
use std::time::Duration;

use gateway::Config;
use router::{NamespaceSettings, Subscribe};
use serde_json::{Value, json};
use testkit::raw::{CLOSE, RawClient};
use testkit::{Client, Gateway, Herald, Redis};

use crate::pod::HERALD;

/// The HMAC secret tokens are signed with (at least 32 bytes).
const SECRET: &str = "herald-budget-tests-hmac-secret-0123456789";

fn limit(name: &str) -> String {
    format!(r#"herald_limit_refusals_total{{limit="{name}"}}"#)
}

/// 127.0.0.`n`: a client address of its own on this host.
fn loopback(n: u8) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(127, 0, 0, n))
}

/// A client of `url` from `from`, with a session (as user `token`'s, or
/// anonymous).
async fn client_from(url: &str, from: IpAddr, token: Option<&str>) -> Client {
    let mut client = Client::connect_from(url, from, &[])
        .await
        .unwrap_or_else(|status| panic!("admitted from {from}, not {status}"));
    match token {
        Some(token) => client.send(json!({"op": "hello", "token": token})).await,
        None => client.send(json!({"op": "hello"})).await,
    }
    client.expect("welcome").await;
    client
}

/// Sends `op` (`sub`, `unsub`, `pub`) for `topic` with `id`; the answer.
async fn command(client: &mut Client, op: &str, id: u64, topic: &str) -> Value {
    let mut command = json!({"op": op, "id": id, "topic": topic});
    if op == "pub" {
        command["data"] = json!(id);
    }
    client.send(command).await;
    let answer = client.recv().await;
    assert_eq!(answer["id"], id, "the answer to {op} {topic}: {answer}");
    answer
}

/// `op` of `topic` is answered `ok`.
async fn accepted(client: &mut Client, op: &str, id: u64, topic: &str) {
    let answer = command(client, op, id, topic).await;
    assert_eq!(answer["op"], "ok", "{op} {topic}: {answer}");
}

/// `op` of `topic` is refused with `code`, about that topic.
async fn refused(client: &mut Client, op: &str, id: u64, topic: &str, code: &str) {
    let answer = command(client, op, id, topic).await;
    assert_eq!(
        (&answer["op"], &answer["code"], &answer["topic"]),
        (&json!("err"), &json!(code), &json!(topic)),
        "{op} {topic}: {answer}"
    );
}

/// Closes `client` and waits until the pod has ended its connection (its
/// slot and budgets given back).
async fn leave(gw: &Gateway, mut client: Client, left: f64) {
    client.ws.close(None).await.expect("send close");
    client.closed().await;
    gw.await_metric("herald_connections", left).await;
}

/// The test config with `chat` (publish: authenticated) and `news` (anyone
/// may subscribe).
fn config() -> Config {
    let mut config = Gateway::config();
    config.namespaces.insert(
        "news".to_owned(),
        NamespaceSettings {
            subscribe: Subscribe::Anyone,
            ..Default::default()
        },
    );
    config
}

#[tokio::test]
async fn anonymous_clients_of_one_address_share_its_subscription_budget() {
    let mut config = config();
    config.session.max_subscriptions_per_ip = 3;
    let gw = Gateway::with(config).await;
    let url = gw.ws_url();
    let mut one = client_from(&url, loopback(1), None).await;
    let mut two = client_from(&url, loopback(1), None).await;
    let mut three = client_from(&url, loopback(1), None).await;

    // Three subscriptions from one address, one per connection (to one
    // topic: it is the subscriptions that count here)...
    for client in [&mut one, &mut two, &mut three] {
        accepted(client, "sub", 1, "chat:a").await;
    }
    // ...and a fourth is refused, whichever connection asks.
    refused(&mut three, "sub", 2, "chat:b", "too_many_subscriptions").await;
    assert_eq!(gw.metric(&limit("subscriptions_per_ip")).await, 1.0);

    // Another address has a budget of its own.
    let mut other = client_from(&url, loopback(2), None).await;
    accepted(&mut other, "sub", 1, "chat:b").await;

    // An unsubscribe gives one back, to any connection of the address.
    accepted(&mut one, "unsub", 3, "chat:a").await;
    accepted(&mut three, "sub", 4, "chat:b").await;
    refused(&mut one, "sub", 5, "chat:c", "too_many_subscriptions").await;

    // So does a connection's end, for all it held.
    leave(&gw, two, 3.0).await;
    accepted(&mut one, "sub", 6, "chat:c").await;
    assert_eq!(gw.metric(&limit("subscriptions_per_ip")).await, 2.0);
    // The other limits were not what refused.
    assert_eq!(gw.metric(&limit("anonymous_topics")).await, 0.0);
    assert_eq!(gw.metric(&limit("topics_per_minute")).await, 0.0);
    gw.shutdown().await;
}

#[tokio::test]
async fn a_resumed_session_s_subscriptions_count_against_its_address() {
    let mut config = config();
    config.session.max_subscriptions_per_ip = 2;
    let gw = Gateway::with(config).await;
    let url = gw.ws_url();
    let mut first = Client::connect_from(&url, loopback(6), &[])
        .await
        .expect("admitted");
    let session = first.hello(None).await["session"]
        .as_str()
        .expect("a session id")
        .to_owned();
    accepted(&mut first, "sub", 1, "chat:a").await;
    accepted(&mut first, "sub", 2, "chat:b").await;
    leave(&gw, first, 0.0).await;

    // The session comes back with its two subscriptions: the address's
    // budget holds them again, and a second connection gets none.
    let mut resumed = Client::connect_from(&url, loopback(6), &[])
        .await
        .expect("admitted");
    let welcome = resumed.hello(Some(&session)).await;
    assert_eq!(welcome["resumed"], true, "{welcome}");
    let mut other = client_from(&url, loopback(6), None).await;
    refused(&mut other, "sub", 1, "chat:c", "too_many_subscriptions").await;
    accepted(&mut resumed, "unsub", 1, "chat:a").await;
    accepted(&mut other, "sub", 2, "chat:c").await;
    gw.shutdown().await;
}

/// An HS256 token for `sub`, valid for ten minutes, signed with [`SECRET`]
/// by Python's own `hmac` (an implementation other than ours).
fn token(sub: &str) -> String {
    const MINT: &str = r#"
import base64, hashlib, hmac, json, sys, time
part = lambda d: base64.urlsafe_b64encode(json.dumps(d).encode()).rstrip(b"=")
signed = part({"alg": "HS256", "typ": "JWT"}) + b"." + part({"sub": sys.argv[2], "exp": int(time.time()) + 600})
mac = hmac.new(sys.argv[1].encode(), signed, hashlib.sha256).digest()
print((signed + b"." + base64.urlsafe_b64encode(mac).rstrip(b"=")).decode())
"#;
    let output = testkit::process::run(
        "python3",
        &["-c", MINT, SECRET, sub],
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

#[tokio::test]
async fn a_user_s_subscriptions_are_budgeted_across_its_connections_wherever_they_come_from() {
    let mut config = config();
    config.auth.hmac_secret = SECRET.to_owned();
    config.auth.allow_anonymous = true;
    config.session.max_subscriptions_per_user = 2;
    // Far below the user's: a user is not budgeted by its address.
    config.session.max_subscriptions_per_ip = 1;
    let gw = Gateway::with(config).await;
    let url = gw.ws_url();
    let (alice, bob) = (token("alice"), token("bob"));

    // Alice from two addresses: two subscriptions, then no more.
    let mut home = client_from(&url, loopback(2), Some(&alice)).await;
    let mut work = client_from(&url, loopback(3), Some(&alice)).await;
    accepted(&mut home, "sub", 1, "chat:a").await;
    accepted(&mut home, "sub", 2, "chat:b").await;
    refused(&mut work, "sub", 1, "chat:c", "too_many_subscriptions").await;
    assert_eq!(gw.metric(&limit("subscriptions_per_user")).await, 1.0);

    // Bob, from alice's address, has his own budget; and anonymous clients
    // there have the address's.
    let mut bobs = client_from(&url, loopback(3), Some(&bob)).await;
    accepted(&mut bobs, "sub", 1, "chat:c").await;
    let mut anonymous = client_from(&url, loopback(2), None).await;
    accepted(&mut anonymous, "sub", 1, "news:x").await;
    refused(&mut anonymous, "sub", 2, "news:y", "too_many_subscriptions").await;
    assert_eq!(gw.metric(&limit("subscriptions_per_ip")).await, 1.0);

    // One of alice's subscriptions ends: the other connection may use it.
    accepted(&mut home, "unsub", 3, "chat:a").await;
    accepted(&mut work, "sub", 2, "chat:c").await;
    assert_eq!(gw.metric(&limit("subscriptions_per_user")).await, 1.0);
    gw.shutdown().await;
}

#[tokio::test]
async fn a_client_refused_at_hello_gets_no_ledger_and_a_principal_s_goes_with_its_last_connection()
{
    const PRINCIPALS: &str = "herald_budget_principals";
    let mut config = config();
    config.auth.hmac_secret = SECRET.to_owned();
    // Long enough to look while the refused connection waits for the
    // client's close.
    config.websocket.close_timeout = Duration::from_secs(5);
    let gw = Gateway::with(config).await;
    let url = gw.ws_url();

    // A bad token: `err`, then the close, which this client does not answer.
    let mut refused = RawClient::connect(gw.addr).await;
    refused
        .send_text(&json!({"op": "hello", "token": "not.a.token"}).to_string())
        .await;
    assert_eq!(refused.read_frame().await.json()["code"], "unauthorized");
    assert_eq!(refused.read_frame().await.close_code(), 4502);
    // The session has done all it does for this client (the close frame is
    // queued after it): no ledger.
    assert_eq!(gw.metric(PRINCIPALS).await, 0.0);
    refused
        .send_frame(true, CLOSE, &4502u16.to_be_bytes(), true)
        .await;
    refused.expect_tcp_end().await;

    // Two users, one of them on two connections: two ledgers...
    let (alice, bob) = (token("alice"), token("bob"));
    let a1 = client_from(&url, loopback(2), Some(&alice)).await;
    let a2 = client_from(&url, loopback(3), Some(&alice)).await;
    let b = client_from(&url, loopback(2), Some(&bob)).await;
    assert_eq!(gw.metric(PRINCIPALS).await, 2.0);
    // ...and alice's lasts as long as one of her connections.
    leave(&gw, a1, 2.0).await;
    assert_eq!(gw.metric(PRINCIPALS).await, 2.0);
    leave(&gw, a2, 1.0).await;
    assert_eq!(gw.metric(PRINCIPALS).await, 1.0);
    leave(&gw, b, 0.0).await;
    assert_eq!(gw.metric(PRINCIPALS).await, 0.0);
    gw.shutdown().await;
}

#[tokio::test]
async fn anonymous_clients_of_one_address_hold_subscriptions_to_at_most_anonymous_max_topics() {
    let mut config = config();
    config.session.anonymous_max_topics = 2;
    let gw = Gateway::with(config).await;
    let url = gw.ws_url();
    let mut one = client_from(&url, loopback(4), None).await;
    let mut two = client_from(&url, loopback(4), None).await;

    accepted(&mut one, "sub", 1, "chat:a").await;
    accepted(&mut two, "sub", 1, "chat:b").await;
    // A third topic for the address is refused...
    refused(&mut one, "sub", 2, "chat:c", "too_many_subscriptions").await;
    assert_eq!(gw.metric(&limit("anonymous_topics")).await, 1.0);
    // ...a topic it holds already is not.
    accepted(&mut two, "sub", 2, "chat:a").await;

    // A topic counts until no connection of the address holds it.
    accepted(&mut one, "unsub", 3, "chat:a").await;
    refused(&mut one, "sub", 4, "chat:c", "too_many_subscriptions").await;
    accepted(&mut two, "unsub", 3, "chat:a").await;
    accepted(&mut one, "sub", 5, "chat:c").await;

    // Another address holds topics of its own.
    let mut other = client_from(&url, loopback(5), None).await;
    accepted(&mut other, "sub", 1, "chat:d").await;
    assert_eq!(gw.metric(&limit("anonymous_topics")).await, 2.0);
    gw.shutdown().await;
}

/// The topics that have keys in `redis` under namespace `ns`.
fn topics_with_keys(redis: &Redis, ns: &str) -> Vec<String> {
    let keys = redis.cli(&["--scan", "--pattern", &format!("herald:{{{ns}:*")]);
    let mut topics: Vec<String> = keys
        .lines()
        .filter_map(|key| Some(key.split_once('{')?.1.split_once('}')?.0.to_owned()))
        .collect();
    topics.sort();
    topics.dedup();
    topics
}

#[tokio::test]
async fn distinct_topics_per_minute_are_budgeted_per_address_and_a_refused_one_makes_no_keys() {
    let redis = Redis::start().await;
    let herald = Herald::pod(
        HERALD,
        &redis.url(),
        &[
            ("HERALD_NAMESPACES__CHAT__PUBLISH", "authenticated"),
            ("HERALD_SESSION__TOPICS_PER_MINUTE", "4"),
        ],
    )
    .await;
    let url = herald.ws_url();
    let mut reader = client_from(&url, loopback(1), None).await;
    let mut writer = client_from(&url, loopback(1), None).await;

    // Four distinct topics from one address, subscribed or published to...
    accepted(&mut reader, "sub", 1, "chat:t1").await;
    accepted(&mut reader, "sub", 2, "chat:t2").await;
    accepted(&mut writer, "pub", 1, "chat:t3").await;
    accepted(&mut writer, "pub", 2, "chat:t4").await;
    // ...and a fifth is refused, sub or pub, with a wait-and-retry code.
    refused(&mut reader, "sub", 3, "chat:t5", "rate_limited").await;
    refused(&mut writer, "pub", 3, "chat:t6", "rate_limited").await;
    // Topics it touched this minute cost nothing more.
    accepted(&mut writer, "pub", 4, "chat:t1").await;
    reader.expect("msg").await;
    accepted(&mut writer, "sub", 5, "chat:t3").await;

    // Another address has a minute of its own.
    let mut other = client_from(&url, loopback(2), None).await;
    accepted(&mut other, "sub", 1, "chat:t5").await;

    assert_eq!(
        testkit::metric(herald.addr, &limit("topics_per_minute")).await,
        2.0
    );
    // Redis holds keys of the topics admitted, none of the refused `t6`.
    assert_eq!(
        topics_with_keys(&redis, "chat"),
        ["chat:t1", "chat:t2", "chat:t3", "chat:t4", "chat:t5"]
    );
}

#[tokio::test]
async fn with_an_ipv4_prefix_of_24_the_addresses_of_a_network_are_one_address() {
    let herald = Herald::start(
        HERALD,
        &[
            ("HERALD_NAMESPACES__NEWS__SUBSCRIBE", "anyone"),
            ("HERALD_WEBSOCKET__IPV4_PREFIX", "24"),
            ("HERALD_WEBSOCKET__MAX_CONNECTIONS_PER_IP", "2"),
            ("HERALD_SESSION__MAX_SUBSCRIPTIONS_PER_IP", "1"),
        ],
        &[],
    )
    .await;
    let url = herald.ws_url();

    // 127.0.0.2 and .3 are one /24: two connections, then 503...
    let mut two = client_from(&url, loopback(2), None).await;
    let mut three = client_from(&url, loopback(3), None).await;
    assert_eq!(
        Client::connect_from(&url, loopback(4), &[]).await.err(),
        Some(503),
        "a third connection from 127.0.0.0/24"
    );
    let per_ip = r#"herald_upgrades_rejected_total{reason="per_ip"}"#;
    assert_eq!(testkit::metric(herald.addr, per_ip).await, 1.0);
    // ...and one subscription between them.
    accepted(&mut two, "sub", 1, "news:a").await;
    refused(&mut three, "sub", 1, "news:b", "too_many_subscriptions").await;

    // 127.0.1.1 is another network.
    let mut elsewhere = client_from(&url, "127.0.1.1".parse().unwrap(), None).await;
    accepted(&mut elsewhere, "sub", 1, "news:b").await;
    assert_eq!(
        testkit::metric(herald.addr, &limit("subscriptions_per_ip")).await,
        1.0
    );
}

#[tokio::test]
async fn the_ipv6_addresses_of_one_64_are_one_address_behind_a_trusted_proxy() {
    let herald = Herald::start(
        HERALD,
        &[
            ("HERALD_NAMESPACES__NEWS__SUBSCRIBE", "anyone"),
            ("HERALD_HTTP__TRUSTED_PROXIES", "127.0.0.1"),
            ("HERALD_WEBSOCKET__MAX_CONNECTIONS_PER_IP", "2"),
            ("HERALD_SESSION__MAX_SUBSCRIPTIONS_PER_IP", "1"),
        ],
        &[],
    )
    .await;
    let url = herald.ws_url();
    let via_proxy = |client| via_proxy(&url, client);

    // Two addresses of one /64 (the default prefix): two connections, then 503.
    let mut first = via_proxy("2001:db8:1:2::1").await.expect("admitted");
    let mut second = via_proxy("2001:db8:1:2:ffff:ffff:ffff:2")
        .await
        .expect("admitted");
    assert_eq!(via_proxy("2001:db8:1:2::3").await.err(), Some(503));
    let per_ip = r#"herald_upgrades_rejected_total{reason="per_ip"}"#;
    assert_eq!(testkit::metric(herald.addr, per_ip).await, 1.0);
    // One subscription between them.
    accepted(&mut first, "sub", 1, "news:a").await;
    refused(&mut second, "sub", 1, "news:b", "too_many_subscriptions").await;

    // The next /64 is another client.
    let mut next = via_proxy("2001:db8:1:3::1").await.expect("admitted");
    accepted(&mut next, "sub", 1, "news:b").await;
}

/// A client with a session, from `client` as the trusted proxy at 127.0.0.1
/// forwards it; a refusal's HTTP status.
async fn via_proxy(url: &str, client: &str) -> Result<Client, u16> {
    let forwarded = [("x-forwarded-for", client)];
    let mut client = Client::connect_from(url, loopback(1), &forwarded).await?;
    client.send(json!({"op": "hello"})).await;
    client.expect("welcome").await;
    Ok(client)
}

#[test]
fn prefixes_out_of_range_are_refused_naming_their_key() {
    let load = |var: &str, value: &str| {
        Config::load(None, [(var.to_owned(), value.to_owned())]).map(|c| c.websocket)
    };
    for (var, value, key) in [
        (
            "HERALD_WEBSOCKET__IPV4_PREFIX",
            "33",
            "websocket.ipv4_prefix",
        ),
        (
            "HERALD_WEBSOCKET__IPV6_PREFIX",
            "129",
            "websocket.ipv6_prefix",
        ),
    ] {
        match load(var, value) {
            Ok(ws) => panic!("{var}={value} was taken: {ws:?}"),
            Err(e) => assert!(e.to_string().contains(key), "names `{key}`: {e}"),
        }
    }
    let ws = load("HERALD_WEBSOCKET__IPV6_PREFIX", "48").expect("a /48 is fine");
    assert_eq!((ws.ipv4_prefix, ws.ipv6_prefix), (32, 48));
}
