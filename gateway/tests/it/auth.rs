//! Client authentication, with tokens minted by an implementation other than
//! ours: PyJWT (tests/python/mint.py), and keys made by Python's
//! `cryptography` or OpenSSL (src/auth/testdata). A token Herald accepts is
//! welcomed with its `expires`; every way a token can be wrong is refused with
//! its `err` code and close code, and counted in
//! `herald_auth_failures_total{reason}`; an expiring token closes the
//! connection unless refreshed; namespaces admit by token; a session stays
//! its user's; a JWKS rotates; a backend's disconnect reaches every pod.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use gateway::Config;
use router::{NamespaceSettings, Publish, Subscribe};
use serde_json::{Value, json};
use testkit::Herald;
use testkit::Redis;
use testkit::{Client, Gateway};

use crate::pod::HERALD;

/// The HMAC secret of the pods under test (at least 32 bytes).
const SECRET: &str = "herald-auth-tests-hmac-secret-0123456789";
const ISSUER: &str = "https://issuer.test";
const AUDIENCE: &str = "herald";
/// Longest one run of mint.py may take (it starts Python and imports
/// `cryptography`; an RSA keygen takes a moment).
const MINT_WAIT: Duration = Duration::from_secs(30);

// ---------------------------------------------------------------- minting

fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("after 1970")
        .as_secs()
}

fn testdata(name: &str) -> String {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("src/auth/testdata")
        .join(name)
        .to_str()
        .expect("a UTF-8 path")
        .to_owned()
}

fn pem(name: &str) -> String {
    std::fs::read_to_string(testdata(name)).expect("a test key")
}

/// Runs mint.py with `spec` (an object or a list of them); its output lines.
async fn mint_lines(spec: Value) -> Vec<String> {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/python/mint.py");
    let run = tokio::task::spawn_blocking(move || {
        Command::new("python3")
            .arg(script)
            .arg(spec.to_string())
            .stdin(Stdio::null())
            .output()
    });
    let output = tokio::time::timeout(MINT_WAIT, run)
        .await
        .expect("mint.py in time")
        .expect("mint.py task")
        .expect(
            "python3 with PyJWT and cryptography (scripts/test.sh installs them in \
             target/venv and puts its bin/ first on PATH)",
        );
    assert!(
        output.status.success(),
        "mint.py failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout)
        .expect("UTF-8")
        .lines()
        .map(str::to_owned)
        .collect()
}

async fn mint(spec: Value) -> String {
    mint_lines(spec).await.remove(0)
}

/// The claims every pod here checks: `sub`, `exp` (`exp_in` seconds from
/// now), `iss`, `aud`; plus `extra`.
fn claims(sub: &str, exp_in: i64, extra: Value) -> Value {
    let mut claims = json!({
        "sub": sub,
        "exp": now() as i64 + exp_in,
        "iss": ISSUER,
        "aud": AUDIENCE,
    });
    if let (Some(claims), Some(extra)) = (claims.as_object_mut(), extra.as_object()) {
        claims.extend(extra.clone());
    }
    claims
}

/// The variables of a pod that checks tokens as [`hmac_config`] does (key,
/// issuer, audience), and `extra`.
fn hmac_env(extra: &[(&'static str, &'static str)]) -> Vec<(&'static str, &'static str)> {
    let mut env = vec![
        ("HERALD_AUTH__HMAC_SECRET", SECRET),
        ("HERALD_AUTH__ISSUER", ISSUER),
        ("HERALD_AUTH__AUDIENCE", AUDIENCE),
    ];
    env.extend_from_slice(extra);
    env
}

/// An HS256 token over [`SECRET`].
fn hs256(claims: Value) -> Value {
    json!({"alg": "HS256", "secret": SECRET, "claims": claims})
}

/// A token for `sub`, valid for ten minutes, with `extra` claims.
async fn token_for(sub: &str, extra: Value) -> String {
    mint(hs256(claims(sub, 600, extra))).await
}

/// A directory of its own under the system's temp dir, removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new(name: &str) -> Self {
        let path = std::env::temp_dir().join(format!(
            "herald-auth-{}-{name}-{}",
            std::process::id(),
            now()
        ));
        std::fs::create_dir_all(&path).expect("a temp dir");
        Self(path)
    }

    fn path(&self) -> &str {
        self.0.to_str().expect("a UTF-8 path")
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A fresh key pair (`rsa` or `ec`) in `dir`: the paths of its private and
/// public PEM.
async fn keygen(dir: &TempDir, kind: &str, name: &str) -> (String, String) {
    let public = mint(json!({"op": "keygen", "kind": kind, "dir": dir.path(), "name": name})).await;
    (public.replace(".pub.pem", ".key.pem"), public)
}

// ---------------------------------------------------------------- pods

/// The test config, with auth on: `keys` set on it, issuer and audience
/// checked, no leeway (so that expiry is quick to see), and namespaces:
/// `chat` (the default test one: authenticated), `news` (anyone),
/// `prices` and `orders` (granted), `user` (personal).
fn keyed(keys: impl FnOnce(&mut gateway::auth::AuthConfig)) -> Config {
    let mut config = Gateway::config();
    config.auth.issuer = ISSUER.to_owned();
    config.auth.audience = AUDIENCE.to_owned();
    config.auth.leeway = Duration::ZERO;
    keys(&mut config.auth);
    let ns = |subscribe, publish, personal| NamespaceSettings {
        subscribe,
        publish,
        personal,
        ..Default::default()
    };
    for (name, settings) in [
        ("news", ns(Subscribe::Anyone, Publish::Nobody, false)),
        ("prices", ns(Subscribe::Granted, Publish::Granted, false)),
        ("orders", ns(Subscribe::Granted, Publish::Nobody, false)),
        ("user", ns(Subscribe::Authenticated, Publish::Nobody, true)),
        (
            "inbox",
            ns(Subscribe::Authenticated, Publish::Authenticated, true),
        ),
    ] {
        config.namespaces.insert(name.to_owned(), settings);
    }
    config
}

fn hmac_config() -> Config {
    keyed(|auth| auth.hmac_secret = SECRET.to_owned())
}

async fn hmac_gateway() -> Gateway {
    Gateway::with(hmac_config()).await
}

// ---------------------------------------------------------------- client

/// `hello` with `token` (and `resume`); the first answer.
async fn hello(client: &mut Client, token: Option<&str>, resume: Option<&str>) -> Value {
    let mut hello = json!({"op": "hello"});
    if let Some(token) = token {
        hello["token"] = json!(token);
    }
    if let Some(session) = resume {
        hello["resume"] = json!(session);
    }
    client.send(hello).await;
    client.recv().await
}

/// A client welcomed with `token`: (client, welcome).
async fn welcomed(url: &str, token: &str) -> (Client, Value) {
    let mut client = Client::connect_url(url).await;
    let welcome = hello(&mut client, Some(token), None).await;
    assert_eq!(welcome["op"], "welcome", "{welcome}");
    (client, welcome)
}

/// `sub`; the answer (`ok` or `err`).
async fn sub(client: &mut Client, id: u64, topic: &str) -> Value {
    client
        .send(json!({"op": "sub", "id": id, "topic": topic}))
        .await;
    let answer = client.recv().await;
    assert_eq!(answer["id"], id, "{answer}");
    answer
}

/// `pub`; the answer (`ok` or `err`), and the topics of any `msg` that came
/// first (a subscriber may get its own message before the `ok`).
async fn publish(client: &mut Client, id: u64, topic: &str) -> (Value, Vec<String>) {
    client
        .send(json!({"op": "pub", "id": id, "topic": topic, "data": {"n": id}}))
        .await;
    let mut msgs = Vec::new();
    loop {
        let answer = client.recv().await;
        if answer["op"] == "msg" {
            msgs.push(answer["topic"].as_str().expect("topic").to_owned());
            continue;
        }
        assert_eq!(answer["id"], id, "{answer}");
        return (answer, msgs);
    }
}

fn assert_err(answer: &Value, code: &str) {
    assert_eq!(answer["op"], "err", "expected err {code}, got {answer}");
    assert_eq!(answer["code"], code, "{answer}");
}

/// `hello` with `token` on a pod of `config` is refused with `code`, the
/// connection closed with `close`, and the refusal counted under `reason`.
async fn assert_refused(config: Config, token: Option<&str>, code: &str, close: u16, reason: &str) {
    let gateway = Gateway::with(config).await;
    let mut client = Client::connect(&gateway).await;
    let answer = hello(&mut client, token, None).await;
    assert_err(&answer, code);
    assert_eq!(
        client.closed().await,
        Some(close),
        "close code after {answer}"
    );
    let metric = format!("herald_auth_failures_total{{reason=\"{reason}\"}}");
    assert_eq!(gateway.metric(&metric).await, 1.0, "{metric}");
    gateway.shutdown().await;
}

// ---------------------------------------------------------------- accepted

#[tokio::test]
async fn hs256_and_rs256_tokens_are_welcomed_with_their_expiry_and_may_subscribe() {
    let gateway = Gateway::with(keyed(|auth| {
        auth.hmac_secret = SECRET.to_owned();
        auth.public_key = pem("rsa.pub.pem");
    }))
    .await;
    let claims = claims("alice", 600, json!({}));
    let exp = claims["exp"].clone();
    let tokens = mint_lines(json!([
        hs256(claims.clone()),
        {"alg": "RS256", "key_file": testdata("rsa.key.pem"), "claims": claims},
    ]))
    .await;
    for token in &tokens {
        let (mut client, welcome) = welcomed(&gateway.ws_url(), token).await;
        assert_eq!(welcome["expires"], exp, "{welcome}");
        assert_eq!(welcome["resumed"], false, "{welcome}");
        assert_eq!(sub(&mut client, 1, "chat:room").await["op"], "ok");
    }
    gateway.shutdown().await;
}

#[tokio::test]
async fn an_es256_token_is_welcomed_with_its_expiry_and_may_subscribe() {
    let gateway = Gateway::with(keyed(|auth| auth.public_key = pem("ec.pub.pem"))).await;
    let claims = claims("alice", 600, json!({}));
    let token =
        mint(json!({"alg": "ES256", "key_file": testdata("ec.key.pem"), "claims": claims})).await;
    let (mut client, welcome) = welcomed(&gateway.ws_url(), &token).await;
    assert_eq!(welcome["expires"], claims["exp"], "{welcome}");
    assert_eq!(sub(&mut client, 1, "chat:room").await["op"], "ok");
    gateway.shutdown().await;
}

// ---------------------------------------------------------------- refused

#[tokio::test]
async fn a_token_signed_with_another_secret_is_refused_with_4502() {
    let token = mint(json!({
        "alg": "HS256",
        "secret": "another-secret-another-secret-another-secret",
        "claims": claims("alice", 600, json!({})),
    }))
    .await;
    assert_refused(
        hmac_config(),
        Some(&token),
        "unauthorized",
        4502,
        "signature",
    )
    .await;
}

#[tokio::test]
async fn a_token_signed_with_another_rsa_key_is_refused_with_4502() {
    let dir = TempDir::new("other-rsa");
    let (key, _) = keygen(&dir, "rsa", "other").await;
    let token =
        mint(json!({"alg": "RS256", "key_file": key, "claims": claims("alice", 600, json!({}))}))
            .await;
    let config = keyed(|auth| auth.public_key = pem("rsa.pub.pem"));
    assert_refused(config, Some(&token), "unauthorized", 4502, "signature").await;
}

#[tokio::test]
async fn an_unsigned_alg_none_token_is_refused_with_4502() {
    let token = mint(json!({"alg": "none", "claims": claims("alice", 600, json!({}))})).await;
    assert_refused(
        hmac_config(),
        Some(&token),
        "unauthorized",
        4502,
        "algorithm",
    )
    .await;
}

#[tokio::test]
async fn an_hs256_token_keyed_with_our_rsa_public_key_is_refused_with_4502() {
    // Algorithm confusion: the public key is public, so an HMAC over its PEM
    // bytes is something anyone can make.
    let token = mint(json!({
        "alg": "HS256",
        "secret_file": testdata("rsa.pub.pem"),
        "claims": claims("alice", 600, json!({})),
    }))
    .await;
    let config = keyed(|auth| auth.public_key = pem("rsa.pub.pem"));
    assert_refused(config, Some(&token), "unauthorized", 4502, "algorithm").await;
}

#[tokio::test]
async fn an_expired_token_is_refused_with_token_expired_and_4004() {
    let token = mint(hs256(claims("alice", -60, json!({})))).await;
    assert_refused(
        hmac_config(),
        Some(&token),
        "token_expired",
        4004,
        "expired",
    )
    .await;
}

#[tokio::test]
async fn a_token_not_valid_yet_is_refused_with_4502() {
    let token = mint(hs256(claims("alice", 600, json!({"nbf": now() + 300})))).await;
    assert_refused(
        hmac_config(),
        Some(&token),
        "unauthorized",
        4502,
        "not_yet_valid",
    )
    .await;
}

#[tokio::test]
async fn a_token_from_another_issuer_is_refused_with_4502() {
    let token = mint(hs256(claims(
        "alice",
        600,
        json!({"iss": "https://evil.test"}),
    )))
    .await;
    assert_refused(hmac_config(), Some(&token), "unauthorized", 4502, "issuer").await;
}

#[tokio::test]
async fn a_token_for_another_audience_is_refused_with_4502() {
    let token = mint(hs256(claims(
        "alice",
        600,
        json!({"aud": "another-service"}),
    )))
    .await;
    assert_refused(
        hmac_config(),
        Some(&token),
        "unauthorized",
        4502,
        "audience",
    )
    .await;
}

/// Issue #21: without `auth.audience`, a public key accepts what its issuer
/// signed for any other service, silently. It is allowed (a key of
/// Herald's own needs no audience), and said at start, with the issuer too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_public_key_without_audience_or_issuer_is_warned_of_at_start() {
    let key = pem("rsa.pub.pem");
    let env = [
        ("HERALD_AUTH__PUBLIC_KEY", key.as_str()),
        ("HERALD_NAMESPACES__CHAT__SUBSCRIBE", "authenticated"),
    ];
    let open = Herald::start(HERALD, &env, &[]).await;
    let log = open.log();
    assert!(log.contains("auth.audience is not set"), "{log}");
    assert!(log.contains("auth.issuer is not set"), "{log}");
    let mut other = claims("alice", 600, json!({"aud": "billing"}));
    other["iss"] = json!("https://elsewhere.test");
    let token =
        mint(json!({"alg": "RS256", "key_file": testdata("rsa.key.pem"), "claims": other})).await;
    let (_, welcome) = welcome_on(&open.ws_url(), &token, None).await;
    assert_eq!(welcome["resumed"], false, "accepted, as warned: {welcome}");

    // Both set: no warning, and that token is refused.
    let env = [
        ("HERALD_AUTH__PUBLIC_KEY", key.as_str()),
        ("HERALD_AUTH__AUDIENCE", AUDIENCE),
        ("HERALD_AUTH__ISSUER", ISSUER),
    ];
    let checked = Herald::start(HERALD, &env, &[]).await;
    let log = checked.log();
    assert!(!log.contains("is not set"), "{log}");
    let mut client = Client::connect_url(&checked.ws_url()).await;
    assert_err(
        &hello(&mut client, Some(&token), None).await,
        "unauthorized",
    );
}

#[tokio::test]
async fn a_token_over_8_kib_is_refused_unread_with_4502() {
    let padding = "x".repeat(9 * 1024);
    let token = mint(hs256(claims("alice", 600, json!({"padding": padding})))).await;
    assert!(token.len() > 8 * 1024);
    assert_refused(
        hmac_config(),
        Some(&token),
        "unauthorized",
        4502,
        "oversize",
    )
    .await;
}

#[tokio::test]
async fn a_hello_without_a_token_is_refused_with_4502() {
    assert_refused(hmac_config(), None, "unauthorized", 4502, "missing").await;
}

#[tokio::test]
async fn a_token_that_is_not_a_jwt_is_refused_with_4502() {
    assert_refused(
        hmac_config(),
        Some("garbage!!not-a-jwt"),
        "unauthorized",
        4502,
        "malformed",
    )
    .await;
}

// ---------------------------------------------------------------- expiry

#[tokio::test]
async fn a_token_that_expires_without_refresh_closes_the_connection_with_4004() {
    let gateway = hmac_gateway().await;
    let token = mint(hs256(claims("alice", 2, json!({})))).await;
    let (mut client, welcome) = welcomed(&gateway.ws_url(), &token).await;
    let exp = welcome["expires"].as_u64().expect("expires");
    // A timed wait by nature: the event is the clock passing `exp`.
    assert_eq!(client.closed().await, Some(4004));
    assert!(now() >= exp, "closed at {} before exp {exp}", now());
    gateway
        .await_metric("herald_auth_failures_total{reason=\"expired\"}", 1.0)
        .await;
    gateway.shutdown().await;
}

#[tokio::test]
async fn a_refreshed_token_keeps_the_connection_open_past_the_first_expiry() {
    let gateway = hmac_gateway().await;
    let first = claims("alice", 2, json!({}));
    let later = claims("alice", 600, json!({}));
    let tokens = mint_lines(json!([
        hs256(first.clone()),
        hs256(later.clone()),
        hs256(claims("mallory", 600, json!({}))),
    ]))
    .await;
    let (mut client, _) = welcomed(&gateway.ws_url(), &tokens[0]).await;
    assert_eq!(sub(&mut client, 1, "chat:room").await["op"], "ok");

    client
        .send(json!({"op": "refresh", "id": 2, "token": tokens[1]}))
        .await;
    let ok = client.expect("ok").await;
    assert_eq!(ok["id"], 2, "{ok}");
    assert_eq!(ok["expires"], later["exp"], "{ok}");

    // Another user's token is no refresh; the connection stays.
    client
        .send(json!({"op": "refresh", "id": 3, "token": tokens[2]}))
        .await;
    let answer = client.recv().await;
    assert_err(&answer, "unauthorized");
    assert_eq!(answer["id"], 3, "{answer}");

    // A timed wait by nature: past the first token's exp (whole seconds).
    let first_exp = first["exp"].as_u64().expect("exp");
    while now() <= first_exp {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let seq = gateway.publish("chat:room", json!("still here")).await;
    let (topic, got, data) = client.msg().await;
    assert_eq!(
        (topic.as_str(), got, data),
        ("chat:room", seq, json!("still here"))
    );
    gateway.shutdown().await;
}

/// Issue #21: an `exp` of i64::MAX, a common "never expires", overflowed the
/// clock: the connection's task panicked at `hello`, and after a `refresh`
/// the panic left its session registered for the life of the pod.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_that_never_expires_is_welcomed_refreshed_and_its_connection_released() {
    let env = hmac_env(&[("HERALD_NAMESPACES__CHAT__SUBSCRIBE", "authenticated")]);
    let pod = Herald::start(HERALD, &env, &[]).await;
    let never = json!({"exp": i64::MAX});
    let tokens = mint_lines(json!([
        hs256(claims("alice", 600, json!({}))),
        hs256(claims("alice", 600, never.clone())),
        hs256(claims("bob", 600, never)),
    ]))
    .await;

    let (mut alice, _) = welcome_on(&pod.ws_url(), &tokens[0], None).await;
    assert_eq!(sub(&mut alice, 1, "chat:room").await["op"], "ok");
    alice
        .send(json!({"op": "refresh", "id": 2, "token": tokens[1]}))
        .await;
    let ok = alice.expect("ok").await;
    assert_eq!(ok["expires"], i64::MAX, "{ok}");
    let (_bob, welcome) = welcome_on(&pod.ws_url(), &tokens[2], None).await;
    assert_eq!(welcome["expires"], i64::MAX, "{welcome}");
    // Both connections still serve.
    let body = json!({"topic": "chat:room", "data": 1}).to_string();
    let (status, _) = testkit::http(pod.addr, "POST", "/v1/publish", &[], body.as_bytes()).await;
    assert_eq!(status, 200);
    assert_eq!(alice.msg().await.1, 1);

    drop(alice);
    testkit::eventually(testkit::WAIT, || async {
        let status = testkit::http(pod.addr, "GET", "/v1/admin/status", &[], b"")
            .await
            .1;
        let status: Value = serde_json::from_str(&status).expect("status JSON");
        (status["sessions"] == 1 && status["subscriptions"] == 0)
            .then_some(())
            .ok_or(format!("{status}"))
    })
    .await;
    assert_eq!(
        testkit::metric(pod.addr, "herald_connection_panics_total").await,
        0.0
    );
}

// ---------------------------------------------------------------- namespaces

/// Issue #21: `chat*` granted `chatops:deploy-keys`. A prefix stays within
/// its namespace; only `*` alone crosses them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prefix_grant_stays_within_its_namespace() {
    let env = hmac_env(&[
        ("HERALD_NAMESPACES__CHAT__SUBSCRIBE", "granted"),
        ("HERALD_NAMESPACES__CHATOPS__SUBSCRIBE", "granted"),
    ]);
    let pod = Herald::start(HERALD, &env, &[]).await;
    let tokens = mint_lines(json!([
        hs256(claims("alice", 600, json!({"subscribe": ["chat*"]}))),
        hs256(claims("bob", 600, json!({"subscribe": ["chat:*"]}))),
        hs256(claims("root", 600, json!({"subscribe": ["*"]}))),
    ]))
    .await;
    let (mut alice, _) = welcome_on(&pod.ws_url(), &tokens[0], None).await;
    assert_err(
        &sub(&mut alice, 1, "chatops:deploy-keys").await,
        "forbidden",
    );
    assert_err(&sub(&mut alice, 2, "chat:lobby").await, "forbidden");
    let (mut bob, _) = welcome_on(&pod.ws_url(), &tokens[1], None).await;
    assert_eq!(sub(&mut bob, 1, "chat:lobby").await["op"], "ok");
    assert_err(&sub(&mut bob, 2, "chatops:deploy-keys").await, "forbidden");
    let (mut root, _) = welcome_on(&pod.ws_url(), &tokens[2], None).await;
    assert_eq!(sub(&mut root, 1, "chatops:deploy-keys").await["op"], "ok");
}

#[tokio::test]
async fn a_granted_namespace_admits_only_the_topics_the_token_lists() {
    let gateway = hmac_gateway().await;
    let token = token_for(
        "alice",
        json!({"subscribe": ["prices:*"], "publish": ["prices:eur"]}),
    )
    .await;
    let (mut client, _) = welcomed(&gateway.ws_url(), &token).await;
    assert_eq!(sub(&mut client, 1, "prices:eur").await["op"], "ok");
    assert_err(&sub(&mut client, 2, "orders:x").await, "forbidden");
    let (ok, mut msgs) = publish(&mut client, 3, "prices:eur").await;
    assert_eq!(ok["op"], "ok", "{ok}");
    if msgs.is_empty() {
        msgs.push(client.msg().await.0);
    }
    assert_eq!(msgs, ["prices:eur"]);
    assert_err(&publish(&mut client, 4, "prices:usd").await.0, "forbidden");

    // Without grants, the granted namespaces stay shut.
    let plain = token_for("bob", json!({})).await;
    let (mut bob, _) = welcomed(&gateway.ws_url(), &plain).await;
    assert_err(&sub(&mut bob, 1, "prices:eur").await, "forbidden");
    assert_err(&publish(&mut bob, 2, "prices:eur").await.0, "forbidden");
    gateway.shutdown().await;
}

#[tokio::test]
async fn a_personal_topic_is_only_for_its_user() {
    let gateway = hmac_gateway().await;
    let token = token_for("alice", json!({})).await;
    let (mut alice, _) = welcomed(&gateway.ws_url(), &token).await;
    assert_eq!(sub(&mut alice, 1, "user:alice").await["op"], "ok");
    assert_err(&sub(&mut alice, 2, "user:bob").await, "forbidden");
    // Where clients may publish, a personal topic is still its user's alone.
    assert_eq!(publish(&mut alice, 3, "inbox:alice").await.0["op"], "ok");
    assert_err(&publish(&mut alice, 4, "inbox:bob").await.0, "forbidden");
    gateway.shutdown().await;
}

#[tokio::test]
async fn a_refresh_that_grants_less_leaves_those_topics_and_keeps_the_connection() {
    let gateway = hmac_gateway().await;
    let topics: Vec<String> = (0..15).map(|i| format!("prices:t{i}")).collect();
    let tokens = mint_lines(json!([
        hs256(claims("alice", 600, json!({"subscribe": ["prices:*"]}))),
        hs256(claims("alice", 900, json!({"subscribe": ["prices:t0"]}))),
    ]))
    .await;
    let (mut alice, _) = welcomed(&gateway.ws_url(), &tokens[0]).await;
    for (id, topic) in topics.iter().enumerate() {
        assert_eq!(sub(&mut alice, id as u64 + 1, topic).await["op"], "ok");
    }
    alice
        .send(json!({"op": "refresh", "id": 100, "token": tokens[1]}))
        .await;
    // Fourteen topics lost, each said once (its `err` names it); more than
    // max_bad_commands, and still no close: the client did nothing wrong.
    let mut lost = Vec::new();
    loop {
        let answer = alice.recv().await;
        if answer["op"] == "ok" {
            assert_eq!(answer["id"], 100, "{answer}");
            break;
        }
        assert_err(&answer, "forbidden");
        lost.push(answer["topic"].as_str().expect("the topic").to_owned());
    }
    lost.sort();
    let mut expected = topics[1..].to_vec();
    expected.sort();
    assert_eq!(lost, expected);
    gateway.publish("prices:t0", json!(1)).await;
    gateway.publish("prices:t1", json!(2)).await;
    let (topic, _, _) = alice.msg().await;
    assert_eq!(
        topic, "prices:t0",
        "only the topic still granted is delivered"
    );
    gateway.shutdown().await;
}

#[tokio::test]
async fn an_anonymous_client_gets_only_the_namespaces_open_to_anyone() {
    let mut config = hmac_config();
    config.auth.allow_anonymous = true;
    let gateway = Gateway::with(config).await;
    let mut client = Client::connect(&gateway).await;
    let welcome = hello(&mut client, None, None).await;
    assert_eq!(welcome["op"], "welcome", "{welcome}");
    assert!(welcome.get("expires").is_none(), "{welcome}");
    assert_eq!(sub(&mut client, 1, "news:x").await["op"], "ok");
    for (id, topic) in [(2, "chat:x"), (3, "prices:eur"), (4, "user:anonymous")] {
        assert_err(&sub(&mut client, id, topic).await, "forbidden");
    }
    assert_err(&publish(&mut client, 5, "chat:x").await.0, "forbidden");
    gateway.shutdown().await;
}

// ---------------------------------------------------------------- sessions

#[tokio::test]
async fn another_users_token_cannot_resume_a_session_nor_disturb_its_connection() {
    let gateway = hmac_gateway().await;
    let tokens = mint_lines(json!([
        hs256(claims("alice", 600, json!({}))),
        hs256(claims("bob", 600, json!({}))),
    ]))
    .await;
    let (mut alice, welcome) = welcomed(&gateway.ws_url(), &tokens[0]).await;
    let session = welcome["session"].as_str().expect("session").to_owned();
    assert_eq!(sub(&mut alice, 1, "chat:room").await["op"], "ok");

    let mut bob = Client::connect(&gateway).await;
    let stolen = hello(&mut bob, Some(&tokens[1]), Some(&session)).await;
    assert_eq!(stolen["op"], "welcome", "{stolen}");
    assert_eq!(stolen["resumed"], false, "{stolen}");
    assert_eq!(stolen["reason"], "other_user", "{stolen}");
    assert_ne!(stolen["session"], session.as_str(), "{stolen}");

    // Without a token at all: refused outright on this pod.
    let mut nobody = Client::connect(&gateway).await;
    assert_err(
        &hello(&mut nobody, None, Some(&session)).await,
        "unauthorized",
    );
    assert_eq!(nobody.closed().await, Some(4502));

    // Alice's connection is untouched and still receives.
    let seq = gateway.publish("chat:room", json!("for alice")).await;
    assert_eq!(alice.msg().await.1, seq);
    alice
        .send(json!({"op": "ack", "topic": "chat:room", "seq": seq}))
        .await;
    // A round trip after it: the ack has been read before the takeover.
    assert_eq!(sub(&mut alice, 2, "chat:sync").await["op"], "ok");

    // Alice herself resumes (taking the session over from her old connection).
    let mut again = Client::connect(&gateway).await;
    let resumed = hello(&mut again, Some(&tokens[0]), Some(&session)).await;
    assert_eq!(resumed["resumed"], true, "{resumed}");
    assert_eq!(resumed["session"], session.as_str(), "{resumed}");
    assert_eq!(alice.closed().await, Some(4501));
    let seq = gateway.publish("chat:room", json!("again")).await;
    assert_eq!(again.msg().await.1, seq);
    gateway.shutdown().await;
}

#[tokio::test]
async fn a_resume_with_a_token_that_grants_less_names_each_topic_it_leaves() {
    let gateway = hmac_gateway().await;
    let tokens = mint_lines(json!([
        hs256(claims("alice", 600, json!({"subscribe": ["prices:*"]}))),
        hs256(claims("alice", 600, json!({"subscribe": ["prices:eur"]}))),
    ]))
    .await;
    let (mut alice, welcome) = welcomed(&gateway.ws_url(), &tokens[0]).await;
    let session = welcome["session"].as_str().expect("session").to_owned();
    for (id, topic) in [(1, "prices:eur"), (2, "prices:usd"), (3, "prices:gbp")] {
        assert_eq!(sub(&mut alice, id, topic).await["op"], "ok");
    }
    drop(alice);

    let mut again = Client::connect(&gateway).await;
    let resumed = hello(&mut again, Some(&tokens[1]), Some(&session)).await;
    assert_eq!(resumed["resumed"], true, "{resumed}");
    // Each topic the token no longer grants: an `err` without an `id` (no
    // command of the client's caused it), naming the topic.
    let mut left = Vec::new();
    for _ in 0..2 {
        let err = again.recv().await;
        assert_err(&err, "forbidden");
        assert!(err.get("id").is_none(), "{err}");
        left.push(err["topic"].as_str().expect("the topic").to_owned());
    }
    left.sort();
    assert_eq!(left, ["prices:gbp", "prices:usd"]);
    // The one still granted is back.
    let seq = gateway.publish("prices:eur", json!(1)).await;
    assert_eq!(again.msg().await, ("prices:eur".to_owned(), seq, json!(1)));
    gateway.shutdown().await;
}

#[tokio::test]
async fn an_anonymous_hello_cannot_resume_a_users_session() {
    let mut config = hmac_config();
    config.auth.allow_anonymous = true;
    let gateway = Gateway::with(config).await;
    let token = token_for("alice", json!({})).await;
    let (mut alice, welcome) = welcomed(&gateway.ws_url(), &token).await;
    let session = welcome["session"].as_str().expect("session").to_owned();
    assert_eq!(sub(&mut alice, 1, "news:x").await["op"], "ok");

    let mut anonymous = Client::connect(&gateway).await;
    let stolen = hello(&mut anonymous, None, Some(&session)).await;
    assert_eq!(stolen["resumed"], false, "{stolen}");
    assert_eq!(stolen["reason"], "other_user", "{stolen}");

    let seq = gateway.publish("news:x", json!(1)).await;
    assert_eq!(alice.msg().await.1, seq);
    gateway.shutdown().await;
}

// ---------------------------------------------------------------- JWKS

/// A JWKS document served over HTTP on a loopback port; replace it to rotate.
struct JwksServer {
    addr: SocketAddr,
    document: Arc<Mutex<String>>,
    fetches: Arc<AtomicUsize>,
}

impl JwksServer {
    async fn start(document: String) -> Self {
        use http_body_util::Full;
        use hyper::body::Bytes;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        let document = Arc::new(Mutex::new(document));
        let fetches = Arc::new(AtomicUsize::new(0));
        let (doc, count) = (document.clone(), fetches.clone());
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let (doc, count) = (doc.clone(), count.clone());
                let service = hyper::service::service_fn(move |_req| {
                    count.fetch_add(1, Ordering::SeqCst);
                    let body = doc.lock().expect("document").clone();
                    async move {
                        Ok::<_, Infallible>(
                            hyper::Response::builder()
                                .header("content-type", "application/json")
                                .body(Full::new(Bytes::from(body)))
                                .expect("a response"),
                        )
                    }
                });
                tokio::spawn(
                    hyper::server::conn::http1::Builder::new()
                        .serve_connection(hyper_util::rt::TokioIo::new(stream), service),
                );
            }
        });
        Self {
            addr,
            document,
            fetches,
        }
    }

    fn url(&self) -> String {
        format!("http://{}/.well-known/jwks.json", self.addr)
    }

    fn serve(&self, document: String) {
        *self.document.lock().expect("document") = document;
    }

    fn fetches(&self) -> usize {
        self.fetches.load(Ordering::SeqCst)
    }
}

fn jwks(keys: &[&str]) -> String {
    let keys: Vec<Value> = keys
        .iter()
        .map(|k| serde_json::from_str(k).expect("a JWK"))
        .collect();
    json!({ "keys": keys }).to_string()
}

#[tokio::test]
async fn a_jwks_rotation_is_picked_up_at_the_first_token_with_the_new_kid() {
    let dir = TempDir::new("jwks");
    let (key_a, pub_a) = keygen(&dir, "rsa", "a").await;
    let (key_b, pub_b) = keygen(&dir, "rsa", "b").await;
    let minted = mint_lines(json!([
        {"op": "jwk", "pub_file": pub_a, "kid": "a", "alg": "RS256"},
        {"op": "jwk", "pub_file": pub_b, "kid": "b", "alg": "RS256"},
        {"alg": "RS256", "key_file": key_a, "headers": {"kid": "a"},
         "claims": claims("alice", 600, json!({}))},
        {"alg": "RS256", "key_file": key_b, "headers": {"kid": "b"},
         "claims": claims("alice", 600, json!({}))},
    ]))
    .await;
    let (jwk_a, jwk_b, token_a, token_b) = (&minted[0], &minted[1], &minted[2], &minted[3]);

    let server = JwksServer::start(jwks(&[jwk_a])).await;
    let gateway = Gateway::with(keyed(|auth| {
        auth.jwks_url = server.url();
        // Only a token with an unknown kid may bring the rotation in.
        auth.jwks_refresh_interval = Duration::from_secs(3600);
        auth.jwks_min_refetch = Duration::from_millis(50);
    }))
    .await;
    assert_eq!(server.fetches(), 1, "fetched once at start");
    let (mut client, _) = welcomed(&gateway.ws_url(), token_a).await;
    assert_eq!(sub(&mut client, 1, "chat:room").await["op"], "ok");

    server.serve(jwks(&[jwk_b]));
    let (mut client, _) = welcomed(&gateway.ws_url(), token_b).await;
    assert_eq!(sub(&mut client, 1, "chat:room").await["op"], "ok");
    assert_eq!(server.fetches(), 2, "fetched again for kid b");

    // Let the refetch limit pass, so that kid a is looked for again, and
    // really is gone.
    tokio::time::sleep(Duration::from_millis(100)).await;
    let mut client = Client::connect(&gateway).await;
    assert_err(
        &hello(&mut client, Some(token_a), None).await,
        "unauthorized",
    );
    assert_eq!(client.closed().await, Some(4502));
    assert_eq!(
        gateway
            .metric("herald_auth_failures_total{reason=\"unknown_key\"}")
            .await,
        1.0
    );
    gateway.shutdown().await;
}

// ---------------------------------------------------------------- disconnect

/// The next answer on `client`, which must be a `welcome`.
/// `POST /v1/disconnect` of `user` at `addr` (a pod without API keys).
async fn disconnect(addr: SocketAddr, user: &str) {
    let (status, body) = testkit::http(
        addr,
        "POST",
        "/v1/disconnect",
        &[("content-type", "application/json")],
        json!({"user": user}).to_string().as_bytes(),
    )
    .await;
    assert_eq!(status, 200, "{body}");
}

async fn welcome_on(url: &str, token: &str, resume: Option<&str>) -> (Client, Value) {
    let mut client = Client::connect_url(url).await;
    let welcome = hello(&mut client, Some(token), resume).await;
    assert_eq!(welcome["op"], "welcome", "{welcome}");
    (client, welcome)
}

#[tokio::test]
async fn a_backend_disconnect_closes_the_users_connections_on_every_pod_with_4503() {
    let redis = Redis::start().await;
    let env = hmac_env(&[("HERALD_NAMESPACES__CHAT__SUBSCRIBE", "authenticated")]);
    let a = Herald::pod(HERALD, &redis.url(), &env).await;
    let b = Herald::pod(HERALD, &redis.url(), &env).await;
    let tokens = mint_lines(json!([
        hs256(claims("alice", 600, json!({}))),
        hs256(claims("bob", 600, json!({}))),
    ]))
    .await;
    let (alice, bob) = (&tokens[0], &tokens[1]);

    let (mut alice_a, welcome) = welcome_on(&a.ws_url(), alice, None).await;
    let session = welcome["session"].as_str().expect("session").to_owned();
    assert_eq!(sub(&mut alice_a, 1, "chat:room").await["op"], "ok");
    let (mut alice_b, _) = welcome_on(&b.ws_url(), alice, None).await;
    assert_eq!(sub(&mut alice_b, 1, "chat:room").await["op"], "ok");
    let (mut bob_b, _) = welcome_on(&b.ws_url(), bob, None).await;
    assert_eq!(sub(&mut bob_b, 1, "chat:room").await["op"], "ok");

    disconnect(a.addr, "alice").await;
    assert_eq!(alice_a.closed().await, Some(4503));
    assert_eq!(alice_b.closed().await, Some(4503));

    // Bob, on the pod that got the disconnect over Redis, is untouched.
    assert_eq!(sub(&mut bob_b, 2, "chat:other").await["op"], "ok");

    // Alice's session is gone, on either pod.
    for pod in [&a, &b] {
        let (_, welcome) = welcome_on(&pod.ws_url(), alice, Some(&session)).await;
        assert_eq!(welcome["resumed"], false, "{welcome}");
        assert_eq!(welcome["reason"], "not_found", "{welcome}");
    }
}

/// Issue #21: two resumes of one session that raced were both served, the
/// second registration hiding the first, which then outlived a disconnect.
/// The race is forced: the connection they take over is stuck writing (its
/// client reads nothing), so both wait out the takeover's 2 s together, and
/// both claim the session from Redis.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_racing_resumes_of_one_session_leave_one_connection_and_a_disconnect_reaches_it() {
    let redis = Redis::start().await;
    let env = hmac_env(&[
        ("HERALD_NAMESPACES__CHAT__SUBSCRIBE", "authenticated"),
        ("HERALD_REDIS__COMMAND_TIMEOUT", "5s"),
    ]);
    let pod = Herald::pod(HERALD, &redis.url(), &env).await;
    let alice = token_for("alice", json!({})).await;

    let mut stuck = Client::with_receive_buffer(&pod.ws_url(), 4096).await;
    let welcome = hello(&mut stuck, Some(&alice), None).await;
    let session = welcome["session"].as_str().expect("session").to_owned();
    assert_eq!(sub(&mut stuck, 1, "chat:bulk").await["op"], "ok");
    // More than the kernel's buffers and the queue: its writer blocks.
    let pad = "x".repeat(48 * 1024);
    for n in 1..=120 {
        let body = json!({"topic": "chat:bulk", "data": {"n": n, "pad": pad}}).to_string();
        let (status, answer) =
            testkit::http(pod.addr, "POST", "/v1/publish", &[], body.as_bytes()).await;
        assert_eq!(status, 200, "{answer}");
    }

    let mut first = Client::connect_url(&pod.ws_url()).await;
    let mut second = Client::connect_url(&pod.ws_url()).await;
    let resume = json!({"op": "hello", "token": alice, "resume": session});
    first.send(resume.clone()).await;
    second.send(resume).await;
    for client in [&mut first, &mut second] {
        let welcome = client.recv().await;
        assert_eq!(welcome["resumed"], true, "{welcome}");
    }

    // One of them was taken over by the other as it registered.
    let ((taken, first_closed), mut serving) = tokio::select! {
        code = first.closed() => ((code, true), second),
        code = second.closed() => ((code, false), first),
    };
    assert_eq!(taken, Some(4501), "first closed: {first_closed}");
    disconnect(pod.addr, "alice").await;
    assert_eq!(serving.closed().await, Some(4503));
    drop(stuck);
}

#[tokio::test]
async fn a_grpc_disconnect_closes_the_users_connections_with_4503_and_needs_the_api_key() {
    let mut config = hmac_config();
    config.http.api_keys = vec!["backend-key".to_owned()];
    let gateway = Gateway::with(config).await;
    let tokens = mint_lines(json!([
        hs256(claims("alice", 600, json!({}))),
        hs256(claims("bob", 600, json!({}))),
    ]))
    .await;
    let (mut alice, welcome) = welcomed(&gateway.ws_url(), &tokens[0]).await;
    let session = welcome["session"].as_str().expect("session").to_owned();
    let (mut bob, _) = welcomed(&gateway.ws_url(), &tokens[1]).await;
    assert_eq!(sub(&mut bob, 1, "news:x").await["op"], "ok");
    let mut grpc = testkit::grpc_client(gateway.grpc_addr).await;

    let refused = grpc
        .disconnect(proto::v1::DisconnectRequest {
            user: "alice".to_owned(),
        })
        .await
        .expect_err("no API key");
    assert_eq!(refused.code(), tonic::Code::Unauthenticated);

    let mut request = tonic::Request::new(proto::v1::DisconnectRequest {
        user: "alice".to_owned(),
    });
    request.metadata_mut().insert(
        "authorization",
        "Bearer backend-key".parse().expect("metadata"),
    );
    grpc.disconnect(request).await.expect("disconnect");
    assert_eq!(alice.closed().await, Some(4503));
    // Bob is untouched, and alice's session is gone with her access.
    let (status, body) = testkit::http(
        gateway.addr,
        "POST",
        "/v1/publish",
        &[("authorization", "Bearer backend-key")],
        json!({"topic": "news:x", "data": "still here"})
            .to_string()
            .as_bytes(),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(bob.msg().await.0, "news:x");
    let mut again = Client::connect(&gateway).await;
    let welcome = hello(&mut again, Some(&tokens[0]), Some(&session)).await;
    assert_eq!(welcome["resumed"], false, "{welcome}");
    gateway.shutdown().await;
}
