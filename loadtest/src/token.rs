//! Client tokens, minted here as a backend would: HS256 over a secret the
//! pods are given (`auth.hmac_secret`), so that a scenario can give each of
//! thousands of clients a user of its own (`sub`) and an `info` claim
//! without a key pair or a process per token.

use jsonwebtoken::{Algorithm, EncodingKey, Header};
use serde::Serialize;

use crate::Error;

/// How long a minted token stays valid: longer than any bounded run.
const VALID_FOR_S: u64 = 3600;

/// A secret for one run: the pods verify with it, the tool mints with it.
/// At least the 32 bytes `auth.hmac_secret` asks for.
pub fn secret() -> String {
    format!(
        "herald-loadtest-secret-{:016x}{:016x}",
        rand::random::<u64>(),
        rand::random::<u64>()
    )
}

#[derive(Serialize)]
struct Claims<'a> {
    sub: &'a str,
    exp: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    info: Option<&'a serde_json::Value>,
}

/// An HS256 token for `user`, with `info` as its `info` claim.
pub fn mint(secret: &str, user: &str, info: Option<&serde_json::Value>) -> Result<String, Error> {
    let claims = Claims {
        sub: user,
        exp: crate::latency::now_micros() / 1_000_000 + VALID_FOR_S,
        info,
    };
    let failed = |e: jsonwebtoken::errors::Error| Error::Options(format!("minting a token: {e}"));
    // The pure-Rust backend, as the gateway installs it (a no-op if one is).
    let _ = jsonwebtoken::crypto::rust_crypto::DEFAULT_PROVIDER.install_default();
    let key = EncodingKey::from_secret(secret.as_bytes()).map_err(failed)?;
    jsonwebtoken::encode(&Header::new(Algorithm::HS256), &claims, &key).map_err(failed)
}

#[cfg(test)]
mod tests {
    use jsonwebtoken::{DecodingKey, Validation, decode};

    use super::*;

    #[test]
    fn a_minted_token_verifies_with_the_secret_and_carries_its_claims() {
        let secret = secret();
        assert!(secret.len() >= 32);
        let info = serde_json::json!({"name": "member-00042"});
        let token = mint(&secret, "m00042", Some(&info)).expect("minted");
        let read = decode::<serde_json::Value>(
            &token,
            &DecodingKey::from_secret(secret.as_bytes()).expect("a key"),
            &Validation::new(Algorithm::HS256),
        )
        .expect("verifies");
        assert_eq!(read.claims["sub"], "m00042");
        assert_eq!(read.claims["info"], info);
    }
}
