//! One token verification, as a client's `hello` costs it: signature and
//! claims, per algorithm, with the keys of `src/auth/testdata/`.
//!
//! `cargo bench -p gateway --bench auth`. With a key from the config the
//! verification never waits, so each iteration drives it to completion on a
//! current-thread runtime (its `block_on` costs well under a microsecond).

#![allow(clippy::unwrap_used, clippy::expect_used)] // a test: a failed expectation is the failure

use std::hint::black_box;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use criterion::{Criterion, criterion_group, criterion_main};
use gateway::auth::{AuthConfig, Verifier};
use jsonwebtoken::{Algorithm, EncodingKey, Header, encode};
use serde_json::json;

const SECRET: &str = "a bench secret of at least thirty-two bytes";

fn token(alg: Algorithm, key: &EncodingKey) -> String {
    let exp = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("after 1970")
        + Duration::from_secs(3600);
    let claims = json!({
        "sub": "user-1234",
        "exp": exp.as_secs(),
        "iat": exp.as_secs() - 3600,
        "subscribe": ["prices:*", "news"],
        "publish": ["chat:lobby"],
    });
    encode(&Header::new(alg), &claims, key).expect("a token")
}

fn verify(c: &mut Criterion) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    let cases = [
        (
            "HS256",
            AuthConfig {
                hmac_secret: SECRET.to_owned(),
                ..AuthConfig::default()
            },
            token(
                Algorithm::HS256,
                &EncodingKey::from_secret(SECRET.as_bytes()).expect("a secret"),
            ),
        ),
        (
            "RS256_2048",
            public_key(include_str!("../src/auth/testdata/rsa.pub.pem")),
            token(
                Algorithm::RS256,
                &EncodingKey::from_rsa_pem(include_bytes!("../src/auth/testdata/rsa.key.pem"))
                    .expect("an RSA key"),
            ),
        ),
        (
            "ES256",
            public_key(include_str!("../src/auth/testdata/ec.pub.pem")),
            token(
                Algorithm::ES256,
                &EncodingKey::from_ec_pem(include_bytes!("../src/auth/testdata/ec.key.pem"))
                    .expect("an EC key"),
            ),
        ),
        (
            "EdDSA",
            public_key(include_str!("../src/auth/testdata/ed25519.pub.pem")),
            token(
                Algorithm::EdDSA,
                &EncodingKey::from_ed_pem(include_bytes!("../src/auth/testdata/ed25519.key.pem"))
                    .expect("an Ed25519 key"),
            ),
        ),
    ];
    let mut group = c.benchmark_group("verify");
    for (name, config, token) in cases {
        let verifier: Verifier = runtime
            .block_on(Verifier::new(&config))
            .expect("a valid config")
            .expect("a key");
        runtime
            .block_on(verifier.verify(&token))
            .expect("the token verifies");
        group.bench_function(name, |b| {
            b.iter(|| runtime.block_on(verifier.verify(black_box(&token))))
        });
    }
    group.finish();
}

fn public_key(pem: &str) -> AuthConfig {
    AuthConfig {
        public_key: pem.to_owned(),
        ..AuthConfig::default()
    }
}

criterion_group!(benches, verify);
criterion_main!(benches);
