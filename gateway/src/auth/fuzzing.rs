//! What the `claims` fuzz target in `gateway/fuzz/` checks: a token's claims,
//! whatever they say, are refused or taken without a panic, and what a
//! connection makes of taken ones holds for any of them: its expiry on the
//! pod's clock (an `exp` near `i64::MAX` once overflowed it, issue #21) and
//! its grants (checked against a model of the documented pattern language).
//! Here, like `session::fuzzing`, so that the checked-in seeds replay in
//! `cargo test`; it exists only in tests and under `cfg(fuzzing)`.

use std::sync::OnceLock;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use jsonwebtoken::{Algorithm, EncodingKey};
use serde_json::Value;

use super::claims::Payload;
use super::{AuthConfig, Claims, Verifier};

/// The pod's clock, in Unix seconds, picked by the first byte: the edges too.
const NOWS: [u64; 4] = [0, 1_700_000_000, i64::MAX as u64, u64::MAX];
/// The leeway, in seconds, picked by the first byte.
const LEEWAYS: [u64; 4] = [0, 5, 600, u64::MAX];
const SECRET: &str = "the-claims-fuzz-targets-hmac-secret-0123";

/// Checks `data` as a token's claims (after a first byte that picks the
/// clock and the leeway): as our checks read them at that clock, and as the
/// whole verification of an HS256 token over them reads them now.
pub fn claims(data: &[u8]) {
    let [pick, payload @ ..] = data else {
        return;
    };
    let now = NOWS[usize::from(pick & 3)];
    let leeway = LEEWAYS[usize::from((pick >> 2) & 3)];
    if let Ok(raw) = serde_json::from_slice::<Payload>(payload)
        && let Ok(claims) = raw.into_claims(now, leeway)
    {
        check(&claims, payload, now, leeway);
    }
    let Some(token) = signed(payload) else {
        return;
    };
    let (runtime, verifier) = verifier();
    if let Ok(claims) = runtime.block_on(verifier.verify(&token)) {
        check(&claims, payload, jsonwebtoken::get_current_timestamp(), 5);
    }
}

/// What a connection does with taken claims: no panic, and the answers the
/// model gives.
fn check(claims: &Claims, payload: &[u8], now: u64, leeway: u64) {
    let pod_now = tokio::time::Instant::now();
    let leeway = Duration::from_secs(leeway.min(u64::from(u32::MAX)));
    if let Some(system_now) = UNIX_EPOCH.checked_add(Duration::from_secs(now))
        && let Some(deadline) = claims.deadline(leeway, system_now, pod_now)
    {
        assert!(deadline >= pod_now, "a deadline before now");
    }
    if let Some(expires) = claims.expires {
        // `welcome.expires`.
        let _ = expires.duration_since(UNIX_EPOCH);
        assert!(expires >= SystemTime::UNIX_EPOCH);
    }
    let Ok(Value::Object(raw)) = serde_json::from_slice::<Value>(payload) else {
        return;
    };
    for (claim, grants) in [
        ("subscribe", &claims.subscribe),
        ("publish", &claims.publish),
    ] {
        let patterns: Vec<&str> = raw
            .get(claim)
            .and_then(Value::as_array)
            .map(|a| a.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        for topic in topics(&patterns) {
            let expected = patterns.iter().any(|p| covers(p, &topic));
            assert_eq!(
                grants.allows(&topic),
                expected,
                "{claim} {patterns:?} on {topic}"
            );
        }
    }
}

/// The documented pattern language, written apart from [`super::Grants`]:
/// `*` alone is every topic; `<p>*` a topic of `<p>`'s namespace whose name
/// starts with the rest of `<p>`; anything else, that topic.
fn covers(pattern: &str, topic: &str) -> bool {
    // The default namespace is written without a `:`: a pattern that names
    // an empty one (`:*`) is of no namespace a topic can be in.
    let split = |s: &str| -> (Option<String>, String) {
        match s.split_once(':') {
            Some((ns, name)) => (Some(ns.to_owned()), name.to_owned()),
            None => (None, s.to_owned()),
        }
    };
    match pattern.strip_suffix('*') {
        Some("") => true,
        Some(prefix) => {
            let (pattern_ns, start) = split(prefix);
            let (topic_ns, name) = split(topic);
            pattern_ns == topic_ns && name.starts_with(&start)
        }
        None => pattern == topic,
    }
}

/// Topics to ask about: fixed ones across namespaces, and each pattern's
/// neighbours.
fn topics(patterns: &[&str]) -> Vec<String> {
    let mut topics: Vec<String> = ["news", "chat", "chat:lobby", "chatops:deploy-keys", "a:b"]
        .map(str::to_owned)
        .to_vec();
    for pattern in patterns.iter().take(16) {
        let stem = pattern.trim_end_matches('*');
        topics.extend([
            stem.to_owned(),
            format!("{stem}x"),
            format!("{stem}:x"),
            format!("{stem}ops:x"),
            format!("ns:{stem}"),
        ]);
    }
    topics
}

/// An HS256 token over `payload` as it is (not re-encoded), or `None` for a
/// payload that is not text.
fn signed(payload: &[u8]) -> Option<String> {
    use base64::Engine as _;
    let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
    std::str::from_utf8(payload).ok()?;
    let message = format!(
        "{}.{}",
        b64.encode(br#"{"alg":"HS256","typ":"JWT"}"#),
        b64.encode(payload)
    );
    let key = EncodingKey::from_secret(SECRET.as_bytes()).ok()?;
    let signature = jsonwebtoken::crypto::sign(message.as_bytes(), &key, Algorithm::HS256).ok()?;
    Some(format!("{message}.{signature}"))
}

/// One runtime and one verifier for every input.
fn verifier() -> &'static (tokio::runtime::Runtime, Verifier) {
    static ONE: OnceLock<(tokio::runtime::Runtime, Verifier)> = OnceLock::new();
    ONE.get_or_init(|| {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap_or_else(|e| panic!("a runtime: {e}"));
        let config = AuthConfig {
            hmac_secret: SECRET.to_owned(),
            ..AuthConfig::default()
        };
        let verifier = runtime
            .block_on(Verifier::new(&config))
            .unwrap_or_else(|e| panic!("a verifier: {e}"))
            .unwrap_or_else(|| panic!("a key is configured"));
        (runtime, verifier)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_claims_seeds_pass_the_fuzz_checks() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/seeds/claims");
        let mut count = 0;
        for entry in std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{dir:?}: {e}")) {
            let path = entry.unwrap_or_else(|e| panic!("{e}")).path();
            let data = std::fs::read(&path).unwrap_or_else(|e| panic!("{path:?}: {e}"));
            let run = std::panic::catch_unwind(|| claims(&data));
            assert!(run.is_ok(), "{path:?} fails the `claims` checks");
            count += 1;
        }
        assert!(count >= 8, "{count} seeds");
    }
}
