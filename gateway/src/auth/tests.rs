//! Tokens minted here with keys from `testdata/` (made with `openssl
//! genpkey`: RSA 2048, EC P-256 and P-384, Ed25519), checked by a verifier
//! built as the gateway builds it.

use std::sync::{Arc, Mutex};
use std::time::{Duration, UNIX_EPOCH};

use jsonwebtoken::jwk::Jwk;
use jsonwebtoken::{Algorithm, EncodingKey, get_current_timestamp};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::{JoinHandle, JoinSet};
use tokio::time::timeout;

use super::key::{Key, KeyError, Rules};
use super::*;

const SECRET: &str = "a test secret of at least thirty-two bytes";
const RSA_PRIVATE: &str = include_str!("testdata/rsa.key.pem");
const RSA_PUBLIC: &str = include_str!("testdata/rsa.pub.pem");
/// The same key, PKCS#1 (`RSA PUBLIC KEY`).
const RSA_PKCS1_PUBLIC: &str = include_str!("testdata/rsa.pkcs1.pub.pem");
const EC_PRIVATE: &str = include_str!("testdata/ec.key.pem");
const EC_PUBLIC: &str = include_str!("testdata/ec.pub.pem");
const EC384_PRIVATE: &str = include_str!("testdata/ec384.key.pem");
const EC384_PUBLIC: &str = include_str!("testdata/ec384.pub.pem");
const ED_PRIVATE: &str = include_str!("testdata/ed25519.key.pem");
const ED_PUBLIC: &str = include_str!("testdata/ed25519.pub.pem");

/// Bound on every wait for something to happen.
const WAIT: Duration = Duration::from_secs(5);

fn now() -> u64 {
    get_current_timestamp()
}

/// A token's claims: alice, for ten minutes, plus `extra`.
fn claims(extra: Value) -> Value {
    let mut claims = json!({"sub": "alice", "exp": now() + 600});
    if let (Some(claims), Value::Object(extra)) = (claims.as_object_mut(), extra) {
        claims.extend(extra);
    }
    claims
}

fn mint(alg: Algorithm, key: &EncodingKey, kid: Option<&str>, claims: &Value) -> String {
    let mut header = jsonwebtoken::Header::new(alg);
    header.kid = kid.map(str::to_owned);
    jsonwebtoken::encode(&header, claims, key).unwrap()
}

fn hs256(claims: &Value) -> String {
    mint(Algorithm::HS256, &secret(SECRET.as_bytes()), None, claims)
}

fn secret(bytes: &[u8]) -> EncodingKey {
    EncodingKey::from_secret(bytes).unwrap()
}

fn rsa() -> EncodingKey {
    EncodingKey::from_rsa_pem(RSA_PRIVATE.as_bytes()).unwrap()
}

fn ec() -> EncodingKey {
    EncodingKey::from_ec_pem(EC_PRIVATE.as_bytes()).unwrap()
}

fn ec384() -> EncodingKey {
    EncodingKey::from_ec_pem(EC384_PRIVATE.as_bytes()).unwrap()
}

fn ed() -> EncodingKey {
    EncodingKey::from_ed_pem(ED_PRIVATE.as_bytes()).unwrap()
}

fn b64(json: &Value) -> String {
    URL_SAFE_NO_PAD.encode(json.to_string())
}

fn hmac_config() -> AuthConfig {
    AuthConfig {
        hmac_secret: SECRET.to_owned(),
        ..AuthConfig::default()
    }
}

fn public_key_config(pem: &str) -> AuthConfig {
    AuthConfig {
        public_key: pem.to_owned(),
        ..AuthConfig::default()
    }
}

async fn verifier(config: &AuthConfig) -> Verifier {
    Verifier::new(config)
        .await
        .unwrap()
        .expect("a key is configured")
}

// --- Signatures and algorithms ---

#[tokio::test]
async fn an_hs256_token_gives_its_user_expiry_and_grants() {
    let exp = now() + 600;
    let token = hs256(&json!({
        "sub": "alice",
        "exp": exp,
        "subscribe": ["prices:*", "news"],
        "publish": ["chat:lobby"],
    }));
    let claims = verifier(&hmac_config()).await.verify(&token).await.unwrap();
    assert_eq!(&*claims.user, "alice");
    assert_eq!(claims.expires, Some(UNIX_EPOCH + Duration::from_secs(exp)));
    assert!(claims.subscribe.allows("prices:btc") && claims.subscribe.allows("news"));
    assert!(!claims.subscribe.allows("chat:lobby"));
    assert!(claims.publish.allows("chat:lobby") && !claims.publish.allows("news"));
}

#[tokio::test]
async fn an_hmac_secret_takes_hs384_and_hs512_too() {
    let verifier = verifier(&hmac_config()).await;
    let key = secret(SECRET.as_bytes());
    for alg in [Algorithm::HS384, Algorithm::HS512] {
        let token = mint(alg, &key, None, &claims(json!({})));
        assert!(verifier.verify(&token).await.is_ok(), "{alg:?}");
    }
}

#[tokio::test]
async fn an_rsa_public_key_takes_rs256_and_ps256() {
    let verifier = verifier(&public_key_config(RSA_PUBLIC)).await;
    for alg in [Algorithm::RS256, Algorithm::PS256, Algorithm::RS512] {
        let token = mint(alg, &rsa(), None, &claims(json!({})));
        assert_eq!(
            &*verifier.verify(&token).await.unwrap().user,
            "alice",
            "{alg:?}"
        );
    }
}

#[tokio::test]
async fn an_ec_public_key_takes_es256_and_a_p384_key_es384() {
    let p256 = verifier(&public_key_config(EC_PUBLIC)).await;
    let token = mint(Algorithm::ES256, &ec(), None, &claims(json!({})));
    assert!(p256.verify(&token).await.is_ok());
    let p384 = verifier(&public_key_config(EC384_PUBLIC)).await;
    let token384 = mint(Algorithm::ES384, &ec384(), None, &claims(json!({})));
    assert!(p384.verify(&token384).await.is_ok());
    // The curve fixes the algorithm.
    assert_eq!(p256.verify(&token384).await, Err(Refused::Algorithm));
}

#[tokio::test]
async fn an_ed25519_public_key_takes_eddsa() {
    let verifier = verifier(&public_key_config(ED_PUBLIC)).await;
    let token = mint(Algorithm::EdDSA, &ed(), None, &claims(json!({})));
    assert!(verifier.verify(&token).await.is_ok());
}

#[tokio::test]
async fn a_token_signed_with_another_key_or_altered_is_refused_as_signature() {
    let verifier = verifier(&hmac_config()).await;
    let other = secret(b"another secret, also thirty-two bytes long");
    let forged = mint(Algorithm::HS256, &other, None, &claims(json!({})));
    assert_eq!(verifier.verify(&forged).await, Err(Refused::Signature));

    let rsa_verifier = self::verifier(&public_key_config(RSA_PUBLIC)).await;
    let token = mint(Algorithm::RS256, &rsa(), None, &claims(json!({})));
    let mut parts: Vec<&str> = token.split('.').collect();
    let bob = b64(&claims(json!({"sub": "bob"})));
    parts[1] = &bob;
    let altered = parts.join(".");
    assert_eq!(rsa_verifier.verify(&altered).await, Err(Refused::Signature));
}

#[tokio::test]
async fn alg_none_is_refused_as_algorithm() {
    let token = format!(
        "{}.{}.",
        b64(&json!({"alg": "none", "typ": "JWT"})),
        b64(&claims(json!({})))
    );
    for config in [hmac_config(), public_key_config(RSA_PUBLIC)] {
        let refused = verifier(&config).await.verify(&token).await.unwrap_err();
        assert_eq!(refused, Refused::Algorithm);
        assert_eq!(refused.reason(), "algorithm");
        assert!(!refused.is_expired());
    }
}

#[tokio::test]
async fn an_hs256_token_signed_with_the_rsa_public_key_as_secret_is_refused() {
    // The classic confusion: the public PEM used as an HMAC secret.
    let key = secret(RSA_PUBLIC.as_bytes());
    let token = mint(Algorithm::HS256, &key, None, &claims(json!({})));
    let verifier = verifier(&public_key_config(RSA_PUBLIC)).await;
    assert_eq!(verifier.verify(&token).await, Err(Refused::Algorithm));
}

#[tokio::test]
async fn a_token_outside_its_keys_family_is_refused_as_algorithm() {
    let rs256 = mint(Algorithm::RS256, &rsa(), None, &claims(json!({})));
    let es256 = mint(Algorithm::ES256, &ec(), None, &claims(json!({})));
    let hmac = verifier(&hmac_config()).await;
    assert_eq!(hmac.verify(&rs256).await, Err(Refused::Algorithm));
    let rsa_key = verifier(&public_key_config(RSA_PUBLIC)).await;
    assert_eq!(rsa_key.verify(&es256).await, Err(Refused::Algorithm));
}

#[tokio::test]
async fn an_hmac_secret_and_a_public_key_each_check_their_own_tokens() {
    let config = AuthConfig {
        public_key: ED_PUBLIC.to_owned(),
        ..hmac_config()
    };
    let verifier = verifier(&config).await;
    assert!(verifier.verify(&hs256(&claims(json!({})))).await.is_ok());
    let eddsa = mint(Algorithm::EdDSA, &ed(), None, &claims(json!({})));
    assert!(verifier.verify(&eddsa).await.is_ok());
}

#[tokio::test]
async fn tokens_that_are_not_jwts_are_malformed() {
    let verifier = verifier(&hmac_config()).await;
    let header = b64(&json!({"alg": "HS256"}));
    // Signed right, so that only the payload is wrong (the signature is
    // checked before the payload is read).
    let signed = |payload: &str| {
        let message = format!("{header}.{payload}");
        let key = secret(SECRET.as_bytes());
        let signature = jsonwebtoken::crypto::sign(message.as_bytes(), &key, Algorithm::HS256);
        format!("{message}.{}", signature.unwrap())
    };
    for token in [
        String::new(),
        "abc".to_owned(),
        "a.b.c".to_owned(),
        "!!!.e30.".to_owned(),
        header.clone(),
        format!("{header}.e30"),
        signed("not base64!"),
        signed(&URL_SAFE_NO_PAD.encode("not json")),
    ] {
        let refused = verifier.verify(&token).await.unwrap_err();
        assert_eq!(
            (refused, refused.reason()),
            (Refused::Malformed, "malformed"),
            "{token}"
        );
    }
}

#[tokio::test]
async fn a_token_over_8_kib_is_refused_before_parsing() {
    let verifier = verifier(&hmac_config()).await;
    let huge = "a".repeat(MAX_TOKEN_BYTES + 1);
    let refused = verifier.verify(&huge).await.unwrap_err();
    assert_eq!(refused, Refused::Oversize);
    assert_eq!(refused.reason(), "oversize");
    // At the limit it is parsed (and is no JWT).
    let at_limit = "a".repeat(MAX_TOKEN_BYTES);
    assert_eq!(verifier.verify(&at_limit).await, Err(Refused::Malformed));
}

// --- Time ---

#[tokio::test]
async fn an_expired_token_is_expired_and_only_that_is() {
    let verifier = verifier(&hmac_config()).await;
    let token = hs256(&json!({"sub": "alice", "exp": now() - 60}));
    let refused = verifier.verify(&token).await.unwrap_err();
    assert!(refused.is_expired());
    assert_eq!(refused.reason(), "expired");
    // Expired and forged: the signature is checked first.
    let other = secret(b"another secret, also thirty-two bytes long");
    let forged = mint(
        Algorithm::HS256,
        &other,
        None,
        &json!({"sub": "a", "exp": now() - 60}),
    );
    let refused = verifier.verify(&forged).await.unwrap_err();
    assert_eq!(refused, Refused::Signature);
    assert!(!refused.is_expired());
}

#[tokio::test]
async fn expiry_within_the_leeway_is_accepted() {
    let verifier = verifier(&hmac_config()).await;
    let token = hs256(&json!({"sub": "alice", "exp": now() - 2}));
    assert!(verifier.verify(&token).await.is_ok());
}

#[tokio::test]
async fn a_token_whose_nbf_or_iat_is_ahead_is_not_yet_valid() {
    let verifier = verifier(&hmac_config()).await;
    for claim in ["nbf", "iat"] {
        let ahead = hs256(&claims(json!({claim: now() + 120})));
        let refused = verifier.verify(&ahead).await.unwrap_err();
        assert_eq!(refused, Refused::NotYetValid, "{claim}");
        assert_eq!(refused.reason(), "not_yet_valid");
        let within_leeway = hs256(&claims(json!({claim: now() + 2})));
        assert!(verifier.verify(&within_leeway).await.is_ok(), "{claim}");
    }
}

#[tokio::test]
async fn exp_is_required_and_may_be_fractional() {
    let verifier = verifier(&hmac_config()).await;
    let no_exp = hs256(&json!({"sub": "alice"}));
    assert_eq!(
        verifier.verify(&no_exp).await.unwrap_err().reason(),
        "claims"
    );
    let fractional = hs256(&json!({"sub": "alice", "exp": now() as f64 + 600.4}));
    assert!(verifier.verify(&fractional).await.is_ok());
}

// --- Issuer, audience, subject ---

#[tokio::test]
async fn with_an_issuer_configured_iss_is_required_and_must_match() {
    let config = AuthConfig {
        issuer: "https://issuer.test".to_owned(),
        ..hmac_config()
    };
    let verifier = verifier(&config).await;
    let right = hs256(&claims(json!({"iss": "https://issuer.test"})));
    assert!(verifier.verify(&right).await.is_ok());
    let wrong = hs256(&claims(json!({"iss": "https://other.test"})));
    assert_eq!(verifier.verify(&wrong).await, Err(Refused::Issuer));
    let missing = hs256(&claims(json!({})));
    assert_eq!(verifier.verify(&missing).await, Err(Refused::Issuer));
}

#[tokio::test]
async fn with_an_audience_configured_aud_is_required_and_must_hold_it() {
    let config = AuthConfig {
        audience: "herald".to_owned(),
        ..hmac_config()
    };
    let verifier = verifier(&config).await;
    for aud in [json!("herald"), json!(["other", "herald"])] {
        let right = hs256(&claims(json!({"aud": aud})));
        assert!(verifier.verify(&right).await.is_ok());
    }
    let wrong = hs256(&claims(json!({"aud": "other"})));
    assert_eq!(verifier.verify(&wrong).await, Err(Refused::Audience));
    let missing = hs256(&claims(json!({})));
    assert_eq!(
        verifier.verify(&missing).await.unwrap_err().reason(),
        "audience"
    );
}

#[tokio::test]
async fn without_an_audience_configured_a_token_with_aud_is_accepted() {
    let verifier = verifier(&hmac_config()).await;
    let token = hs256(&claims(json!({"aud": "anyone"})));
    assert!(verifier.verify(&token).await.is_ok());
}

#[tokio::test]
async fn sub_is_required_a_string_of_1_to_256_bytes() {
    let verifier = verifier(&hmac_config()).await;
    let exp = now() + 600;
    for claims in [
        json!({"exp": exp}),
        json!({"sub": "", "exp": exp}),
        json!({"sub": 42, "exp": exp}),
        json!({"sub": "x".repeat(257), "exp": exp}),
    ] {
        let refused = verifier.verify(&hs256(&claims)).await.unwrap_err();
        assert_eq!(refused.reason(), "claims", "{claims}");
    }
    let longest = hs256(&json!({"sub": "x".repeat(256), "exp": exp}));
    assert!(verifier.verify(&longest).await.is_ok());
}

// --- Grants ---

fn grants(patterns: &[&str]) -> Grants {
    Grants::parse(patterns.iter().map(|p| (*p).to_owned()).collect()).unwrap()
}

#[test]
fn a_grant_is_an_exact_topic_or_a_prefix_ending_in_a_star() {
    let g = grants(&["news", "prices:*"]);
    assert!(g.allows("news"));
    assert!(!g.allows("news2") && !g.allows("new"));
    assert!(g.allows("prices:btc") && g.allows("prices:"));
    // The prefix is matched up to the `*` only, from the start.
    assert!(!g.allows("prices") && !g.allows("xprices:btc") && !g.allows("chat:prices:btc"));
    assert!(!g.is_empty());
}

#[test]
fn a_prefix_grant_never_crosses_a_namespaces_border() {
    // Issue #21: `chat*` granted `chatops:deploy-keys`.
    let g = grants(&["chat*"]);
    assert!(g.allows("chat") && g.allows("chat-2"));
    assert!(!g.allows("chatops:deploy-keys") && !g.allows("chat:lobby"));
    let g = grants(&["chat:room-*"]);
    assert!(g.allows("chat:room-1") && !g.allows("chat:lobby"));
    assert!(!g.allows("chat") && !g.allows("chatops:room-1"));
    let g = grants(&["chat:*"]);
    assert!(g.allows("chat:lobby") && !g.allows("chatops:lobby"));
}

#[test]
fn a_lone_star_grants_every_topic_and_nothing_grants_nothing() {
    assert!(grants(&["*"]).allows("anything:at-all"));
    let none = grants(&[]);
    assert!(none.is_empty() && !none.allows("news"));
    assert!(Grants::default().is_empty());
}

#[test]
fn a_star_anywhere_but_the_end_or_an_oversized_grant_is_refused() {
    let parse = |patterns: Vec<String>| Grants::parse(patterns).is_err();
    assert!(parse(vec!["pri*es".to_owned()]));
    assert!(parse(vec!["**".to_owned()]));
    assert!(parse(vec![String::new()]));
    assert!(parse(vec!["x".repeat(257)]));
    assert!(!parse(vec!["x".repeat(256)]));
    assert!(parse((0..257).map(|i| format!("t{i}")).collect()));
    assert!(!parse((0..256).map(|i| format!("t{i}")).collect()));
}

#[tokio::test]
async fn grants_of_the_wrong_shape_refuse_the_token() {
    let verifier = verifier(&hmac_config()).await;
    let many: Vec<String> = (0..257).map(|i| format!("t{i}")).collect();
    for extra in [
        json!({"subscribe": "news"}),
        json!({"publish": [1, 2]}),
        json!({"subscribe": ["a*b"]}),
        json!({"publish": many}),
    ] {
        let refused = verifier.verify(&hs256(&claims(extra.clone()))).await;
        assert_eq!(refused.unwrap_err().reason(), "claims", "{extra}");
    }
    let none = verifier.verify(&hs256(&claims(json!({})))).await.unwrap();
    assert!(none.subscribe.is_empty() && none.publish.is_empty());
}

// --- Config ---

#[tokio::test]
async fn without_a_key_there_is_no_verifier() {
    let config = AuthConfig::default();
    assert!(!config.enabled());
    assert_eq!(config.leeway, DEFAULT_LEEWAY);
    assert!(Verifier::new(&config).await.unwrap().is_none());
}

#[test]
fn the_config_reads_durations_and_refuses_unknown_keys() {
    let config: AuthConfig = serde_json::from_value(json!({
        "hmac_secret": SECRET,
        "leeway": "2s",
        "jwks_min_refetch": "1m",
    }))
    .unwrap();
    assert!(config.enabled());
    assert_eq!(config.leeway, Duration::from_secs(2));
    assert_eq!(config.jwks_min_refetch, Duration::from_secs(60));
    assert_eq!(config.jwks_refresh_interval, DEFAULT_JWKS_REFRESH_INTERVAL);
    let unknown = serde_json::from_value::<AuthConfig>(json!({"hmac_algorithm": "HS256"}));
    assert!(unknown.is_err());
}

#[tokio::test]
async fn debug_output_never_shows_the_secret() {
    let config = hmac_config();
    let printed = format!("{config:?}");
    assert!(
        !printed.contains(SECRET) && printed.contains("<redacted>"),
        "{printed}"
    );
    let printed = format!("{:?}", verifier(&config).await);
    assert!(
        !printed.contains(SECRET) && !printed.contains("thirty"),
        "{printed}"
    );
}

#[test]
fn bad_key_material_and_urls_are_named_by_their_config_key() {
    let check = |config: AuthConfig| config.validate().unwrap_err();
    let not_a_key = (
        "auth.public_key",
        "not a PEM RSA, EC or Ed25519 public key".to_owned(),
    );
    assert_eq!(check(public_key_config("garbage")), not_a_key);
    // A private key where the public one belongs.
    assert_eq!(check(public_key_config(RSA_PRIVATE)), not_a_key);
    assert_eq!(check(public_key_config(ED_PRIVATE)), not_a_key);
    let mut truncated = RSA_PUBLIC.lines().collect::<Vec<_>>();
    truncated.remove(3);
    assert_eq!(
        check(public_key_config(&truncated.join("\n"))).0,
        "auth.public_key"
    );
    let short = AuthConfig {
        hmac_secret: "short".to_owned(),
        ..AuthConfig::default()
    };
    assert_eq!(check(short).0, "auth.hmac_secret");
    for url in ["ftp://jwks.test/keys", "/keys", "http://"] {
        let config = AuthConfig {
            jwks_url: url.to_owned(),
            ..AuthConfig::default()
        };
        assert_eq!(check(config).0, "auth.jwks_url", "{url}");
    }
    let zero = AuthConfig {
        jwks_url: "http://127.0.0.1:1/keys".to_owned(),
        jwks_min_refetch: Duration::ZERO,
        ..AuthConfig::default()
    };
    assert_eq!(check(zero).0, "auth.jwks_min_refetch");
    let lenient = AuthConfig {
        leeway: Duration::from_secs(3600),
        ..hmac_config()
    };
    assert_eq!(check(lenient).0, "auth.leeway");
    for pem in [
        RSA_PUBLIC,
        RSA_PKCS1_PUBLIC,
        EC_PUBLIC,
        EC384_PUBLIC,
        ED_PUBLIC,
    ] {
        assert_eq!(public_key_config(pem).validate(), Ok(()));
    }
}

// --- JWKs ---

/// A JWK for `key`'s public half, with `kid`, for `alg`.
fn jwk(key: &EncodingKey, alg: Algorithm, kid: &str) -> Value {
    let mut jwk = Jwk::from_encoding_key(key, alg).unwrap();
    jwk.common.key_id = Some(kid.to_owned());
    serde_json::to_value(jwk).unwrap()
}

fn without_alg(mut jwk: Value) -> Value {
    jwk.as_object_mut().unwrap().remove("alg");
    jwk
}

fn from_jwk(jwk: Value) -> Result<Key, KeyError> {
    Key::from_jwk(&serde_json::from_value(jwk).unwrap(), &Rules::default())
}

fn algorithms(jwk: Value) -> Vec<Algorithm> {
    from_jwk(jwk).unwrap().validation.algorithms
}

#[test]
fn a_jwk_without_alg_gets_the_one_algorithm_of_its_key_type() {
    use Algorithm::*;
    assert_eq!(algorithms(without_alg(jwk(&rsa(), RS256, "r"))), [RS256]);
    assert_eq!(algorithms(without_alg(jwk(&ec(), ES256, "e"))), [ES256]);
    assert_eq!(algorithms(without_alg(jwk(&ec384(), ES384, "e"))), [ES384]);
    assert_eq!(algorithms(without_alg(jwk(&ed(), EdDSA, "d"))), [EdDSA]);
    assert_eq!(algorithms(jwk(&rsa(), PS384, "r")), [PS384]);
}

#[test]
fn a_jwk_whose_alg_does_not_fit_its_key_is_refused() {
    let mut rsa_as_es256 = jwk(&rsa(), Algorithm::RS256, "r");
    rsa_as_es256["alg"] = json!("ES256");
    assert_eq!(
        from_jwk(rsa_as_es256).unwrap_err(),
        KeyError::AlgorithmMismatch("RSA")
    );
    let mut p256_as_es384 = jwk(&ec(), Algorithm::ES256, "e");
    p256_as_es384["alg"] = json!("ES384");
    assert!(from_jwk(p256_as_es384).is_err());
    let mut rsa_as_hs256 = jwk(&rsa(), Algorithm::RS256, "r");
    rsa_as_hs256["alg"] = json!("HS256");
    assert!(from_jwk(rsa_as_hs256).is_err());
}

#[test]
fn symmetric_encryption_and_broken_jwks_are_refused() {
    let oct = json!({"kty": "oct", "k": URL_SAFE_NO_PAD.encode(SECRET), "alg": "HS256"});
    assert_eq!(from_jwk(oct).unwrap_err(), KeyError::Symmetric);
    let mut encryption = jwk(&rsa(), Algorithm::RS256, "r");
    encryption["use"] = json!("enc");
    assert_eq!(
        from_jwk(encryption).unwrap_err(),
        KeyError::NotForSignatures
    );
    // A short Ed25519 key would panic jsonwebtoken's verifier.
    let short = json!({"kty": "OKP", "crv": "Ed25519", "x": URL_SAFE_NO_PAD.encode([1u8; 16])});
    assert!(from_jwk(short).is_err());
    // A point off the curve.
    let mut off_curve = jwk(&ec(), Algorithm::ES256, "e");
    off_curve["y"] = json!(URL_SAFE_NO_PAD.encode([7u8; 32]));
    assert_eq!(from_jwk(off_curve).unwrap_err(), KeyError::Invalid);
    // `crv` must name the curve of the coordinates.
    let mut wrong_crv = jwk(&ec(), Algorithm::ES256, "e");
    wrong_crv["crv"] = json!("P-384");
    assert!(from_jwk(wrong_crv).is_err());
    let small_rsa = json!({"kty": "RSA", "n": URL_SAFE_NO_PAD.encode([0xc5u8; 128]), "e": "AQAB"});
    assert_eq!(from_jwk(small_rsa).unwrap_err(), KeyError::RsaSize);
}

/// A JWKS endpoint on 127.0.0.1: serves `document`, counts requests.
struct JwksServer {
    url: String,
    document: Arc<Mutex<String>>,
    requests: watch::Receiver<usize>,
    task: JoinHandle<()>,
}

impl JwksServer {
    async fn start(document: Value) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!(
            "http://{}/.well-known/jwks.json",
            listener.local_addr().unwrap()
        );
        let document = Arc::new(Mutex::new(document.to_string()));
        let (count, requests) = watch::channel(0);
        let served = Arc::clone(&document);
        let task = tokio::spawn(async move {
            loop {
                let (mut stream, _) = listener.accept().await.unwrap();
                let mut head = Vec::new();
                let mut chunk = [0u8; 1024];
                while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                    match stream.read(&mut chunk).await {
                        Ok(0) | Err(_) => break,
                        Ok(n) => head.extend_from_slice(&chunk[..n]),
                    }
                }
                // Counted before the answer, so that a caller that has its
                // answer sees the count.
                count.send_modify(|n| *n += 1);
                let body = served.lock().unwrap().clone();
                let response = format!(
                    "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n\
                     content-length: {}\r\nconnection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = stream.write_all(response.as_bytes()).await;
                let _ = stream.shutdown().await;
            }
        });
        JwksServer {
            url,
            document,
            requests,
            task,
        }
    }

    fn serve(&self, document: Value) {
        *self.document.lock().unwrap() = document.to_string();
    }

    fn requests(&self) -> usize {
        *self.requests.borrow()
    }

    /// Closes the listening socket: fetches fail from now on.
    async fn stop(self) {
        self.task.abort();
        let _ = self.task.await;
    }
}

fn jwks_config(url: &str) -> AuthConfig {
    AuthConfig {
        jwks_url: url.to_owned(),
        // Only the fetches a test causes.
        jwks_refresh_interval: Duration::from_secs(3600),
        jwks_min_refetch: Duration::from_secs(3600),
        ..AuthConfig::default()
    }
}

#[tokio::test]
async fn a_rotated_jwks_key_is_fetched_once_and_kept_while_the_server_is_down() {
    let server = JwksServer::start(json!({"keys": [jwk(&rsa(), Algorithm::RS256, "a")]})).await;
    let verifier = verifier(&jwks_config(&server.url)).await;
    assert_eq!(server.requests(), 1, "fetched at start");
    let token_a = mint(Algorithm::RS256, &rsa(), Some("a"), &claims(json!({})));
    assert_eq!(&*verifier.verify(&token_a).await.unwrap().user, "alice");

    // The issuer rotates to key b; many clients bring b-tokens at once.
    server.serve(json!({"keys": [jwk(&ec(), Algorithm::ES256, "b")]}));
    let token_b = mint(Algorithm::ES256, &ec(), Some("b"), &claims(json!({})));
    let mut clients = JoinSet::new();
    for _ in 0..8 {
        let (verifier, token) = (verifier.clone(), token_b.clone());
        clients.spawn(async move { verifier.verify(&token).await });
    }
    while let Some(verified) = timeout(WAIT, clients.join_next()).await.unwrap() {
        assert!(verified.unwrap().is_ok());
    }
    assert_eq!(server.requests(), 2, "one fetch for all of them");

    // Another unknown kid within jwks_min_refetch: refused, nothing fetched.
    let token_c = mint(Algorithm::ES256, &ec(), Some("c"), &claims(json!({})));
    let refused = verifier.verify(&token_c).await.unwrap_err();
    assert_eq!(
        (refused, refused.reason()),
        (Refused::UnknownKey, "unknown_key")
    );
    assert_eq!(verifier.verify(&token_a).await, Err(Refused::UnknownKey));
    assert_eq!(server.requests(), 2);

    // The JWKS server goes down: the keys we have still verify.
    server.stop().await;
    assert!(verifier.verify(&token_b).await.is_ok());
}

#[tokio::test]
async fn a_jwks_document_without_usable_keys_keeps_the_keys_we_have() {
    let server = JwksServer::start(json!({"keys": [jwk(&ed(), Algorithm::EdDSA, "a")]})).await;
    let verifier = verifier(&jwks_config(&server.url)).await;
    server.serve(json!({"keys": [{"kty": "oct", "kid": "b", "k": "c2VjcmV0"}]}));
    let token_b = hs256(&claims(json!({})));
    // An HS token never reaches the JWKS: no HMAC secret is configured.
    assert_eq!(verifier.verify(&token_b).await, Err(Refused::Algorithm));
    let unknown = mint(Algorithm::EdDSA, &ed(), Some("b"), &claims(json!({})));
    assert_eq!(verifier.verify(&unknown).await, Err(Refused::UnknownKey));
    assert_eq!(server.requests(), 2, "the document was fetched again");
    let token_a = mint(Algorithm::EdDSA, &ed(), Some("a"), &claims(json!({})));
    assert!(verifier.verify(&token_a).await.is_ok());
}

#[tokio::test]
async fn a_token_without_kid_takes_the_only_key_of_a_jwks() {
    let server = JwksServer::start(json!({"keys": [jwk(&ed(), Algorithm::EdDSA, "a")]})).await;
    let verifier = verifier(&jwks_config(&server.url)).await;
    let token = mint(Algorithm::EdDSA, &ed(), None, &claims(json!({})));
    assert!(verifier.verify(&token).await.is_ok());
}

#[tokio::test]
async fn a_pod_starts_without_its_jwks_and_refuses_tokens_meanwhile() {
    // A port nobody listens on (a free port, bound and let go, may be
    // taken meanwhile by another test's server).
    let verifier = verifier(&jwks_config("http://127.0.0.1:1/jwks.json")).await;
    let token = mint(Algorithm::RS256, &rsa(), Some("a"), &claims(json!({})));
    let refused = verifier.verify(&token).await.unwrap_err();
    assert_eq!((refused, refused.reason()), (Refused::NoKeys, "no_keys"));
}

#[tokio::test]
async fn an_https_jwks_url_gets_a_tls_client_without_panicking() {
    let config = jwks_config("https://127.0.0.1:1/jwks.json");
    match Verifier::new(&config).await {
        // The fetch failed (nothing listens there); the pod starts.
        Ok(Some(_)) => {}
        // A machine without root certificates.
        Err(AuthError::Roots(_)) => {}
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn the_jwks_is_refreshed_in_the_background_until_the_verifier_is_dropped() {
    let server = JwksServer::start(json!({"keys": [jwk(&ed(), Algorithm::EdDSA, "a")]})).await;
    let config = AuthConfig {
        jwks_refresh_interval: Duration::from_millis(20),
        ..jwks_config(&server.url)
    };
    let verifier = verifier(&config).await;
    let mut requests = server.requests.clone();
    timeout(WAIT, requests.wait_for(|n| *n >= 3))
        .await
        .expect("refreshed twice")
        .unwrap();
    let jwks = Arc::downgrade(verifier.inner.jwks.as_ref().unwrap());
    drop(verifier);
    // The refresh task held the last reference; it lets go as it stops.
    timeout(WAIT, async {
        while jwks.strong_count() > 0 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await
    .expect("the refresh task stopped");
}
