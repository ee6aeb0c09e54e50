//! Token auth: turns the JWT a client presents (`hello.token`) into verified
//! [`Claims`].
//!
//! - [`AuthConfig`]: `[auth]`, the keys and the claim checks.
//! - [`Verifier`]: built once per pod; verifies a token's signature with our
//!   key (an HMAC secret, a PEM public key, or a JWKS URL's keys) and its
//!   claims (`exp`, `nbf`, `iat`, `iss`, `aud`, `sub`).
//! - `key`: loading keys, and which algorithms each one accepts.
//! - `jwks`: fetching a JWKS and keeping it fresh.
//! - [`Claims`] and [`Grants`]: who the client is and which topics it may use.
//! - [`Refused`]: why a token was refused, as a metric label and a message.
//!
//! A token's way: [`Verifier::verify`] refuses it unread if it is longer than
//! [`MAX_TOKEN_BYTES`]; reads `alg` and `kid` from its header to pick our
//! key; jsonwebtoken checks that `alg` is one the key accepts, then the
//! signature, then `exp`/`nbf`/`iss`/`aud`; `Payload` checks the rest and
//! yields the claims.

mod claims;
#[cfg(any(test, fuzzing))]
pub mod fuzzing;
mod jwks;
mod key;
mod refused;
#[cfg(test)]
mod tests;

use std::borrow::Cow;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use jsonwebtoken::{Algorithm, AlgorithmFamily};
use serde::Deserialize;
use tokio_util::sync::{CancellationToken, DropGuard};

pub use claims::{Claims, Grants, Vouched};
pub use refused::Refused;

use claims::Payload;
use jwks::Jwks;
use key::{Key, Rules};

/// Clock skew allowed on `exp`, `nbf` and `iat`, between the issuer's clock
/// and ours.
pub const DEFAULT_LEEWAY: Duration = Duration::from_secs(5);
/// How often the JWKS is fetched again in the background.
pub const DEFAULT_JWKS_REFRESH_INTERVAL: Duration = Duration::from_secs(5 * 60);
/// At most one fetch of the JWKS for a token with an unknown `kid` per this.
pub const DEFAULT_JWKS_MIN_REFETCH: Duration = Duration::from_secs(5);
/// Longest token accepted, in bytes (8 KiB); longer is refused before any parsing.
pub const MAX_TOKEN_BYTES: usize = 8 * 1024;

/// Most leeway allowed: more would accept tokens long expired.
const MAX_LEEWAY: Duration = Duration::from_secs(10 * 60);
/// Shortest HMAC secret, in bytes: as long as the HS256 hash (RFC 7518 3.2).
const MIN_HMAC_SECRET_BYTES: usize = 32;

/// `[auth]`: how client tokens are verified. Auth is on when a key is set
/// (`hmac_secret`, `public_key` or `jwks_url`; any of them, or several).
///
/// Which key checks a token: an HS256/384/512 token the HMAC secret; any
/// other token with a `kid` the JWKS key of that `kid`; any other token
/// without `kid` the `public_key` (or, with only a JWKS, the JWKS's only key).
/// The algorithm must be one that key accepts, whatever the token says.
#[derive(Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AuthConfig {
    /// HMAC secret, its bytes as written (at least 32); empty: none. It
    /// verifies HS256, HS384 and HS512 alike: the three are one family over
    /// one secret, so there is no `hmac_algorithm` to choose, and what the
    /// secret rules out (every RS, PS, ES and EdDSA token) stays ruled out.
    pub hmac_secret: String,
    /// A public key in PEM (`PUBLIC KEY`, or `RSA PUBLIC KEY`), its type read
    /// from the PEM: RSA (2048 to 8192 bits) verifies RS256/384/512 and
    /// PS256/384/512; EC P-256 ES256; EC P-384 ES384; Ed25519 EdDSA. Empty: none.
    pub public_key: String,
    /// A JWKS document, `http://` or `https://` (system root certificates);
    /// empty: none. RSA, EC and OKP keys, for their `alg`, or without one
    /// RS256, ES256/ES384 (by curve), EdDSA; `oct` keys are refused.
    pub jwks_url: String,
    /// Empty: `iss` is not checked; else `iss` is required and must equal it.
    pub issuer: String,
    /// Empty: `aud` is not checked (a token carrying one is accepted); else
    /// `aud` is required and must contain it.
    pub audience: String,
    /// Clock skew allowed on `exp`, `nbf` and `iat`, in whole seconds
    /// (rounded up); at most 10m.
    #[serde(with = "humantime_serde")]
    pub leeway: Duration,
    /// With a key set, whether a client without a token is let in anyway.
    pub allow_anonymous: bool,
    /// How often the JWKS is fetched again in the background.
    #[serde(with = "humantime_serde")]
    pub jwks_refresh_interval: Duration,
    /// At most one fetch of the JWKS for tokens with an unknown `kid` per
    /// this; the others are refused meanwhile (`unknown_key`).
    #[serde(with = "humantime_serde")]
    pub jwks_min_refetch: Duration,
}

impl Default for AuthConfig {
    fn default() -> Self {
        Self {
            hmac_secret: String::new(),
            public_key: String::new(),
            jwks_url: String::new(),
            issuer: String::new(),
            audience: String::new(),
            leeway: DEFAULT_LEEWAY,
            allow_anonymous: false,
            jwks_refresh_interval: DEFAULT_JWKS_REFRESH_INTERVAL,
            jwks_min_refetch: DEFAULT_JWKS_MIN_REFETCH,
        }
    }
}

impl fmt::Debug for AuthConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let secret = if self.hmac_secret.is_empty() {
            ""
        } else {
            "<redacted>"
        };
        f.debug_struct("AuthConfig")
            .field("hmac_secret", &secret)
            .field("public_key", &pem_summary(&self.public_key))
            .field("jwks_url", &self.jwks_url)
            .field("issuer", &self.issuer)
            .field("audience", &self.audience)
            .field("leeway", &self.leeway)
            .field("allow_anonymous", &self.allow_anonymous)
            .field("jwks_refresh_interval", &self.jwks_refresh_interval)
            .field("jwks_min_refetch", &self.jwks_min_refetch)
            .finish()
    }
}

/// A PEM in one short line: not secret, but long.
fn pem_summary(pem: &str) -> String {
    if pem.trim().is_empty() {
        String::new()
    } else {
        format!("<PEM, {} bytes>", pem.len())
    }
}

impl AuthConfig {
    /// Whether any key is configured (then tokens are required unless
    /// `allow_anonymous`).
    pub fn enabled(&self) -> bool {
        !self.hmac_secret.is_empty() || self.has_public_key() || !self.jwks_url.is_empty()
    }

    fn has_public_key(&self) -> bool {
        !self.public_key.trim().is_empty()
    }

    /// Validation before any port is bound; `Err((key, reason))` names the
    /// config key, e.g. `("auth.public_key", "not a PEM RSA, EC or Ed25519
    /// public key")`.
    pub fn validate(&self) -> Result<(), (&'static str, String)> {
        if !self.hmac_secret.is_empty() && self.hmac_secret.len() < MIN_HMAC_SECRET_BYTES {
            return Err((
                "auth.hmac_secret",
                format!("must be at least {MIN_HMAC_SECRET_BYTES} bytes (RFC 7518 3.2)"),
            ));
        }
        if self.has_public_key() {
            Key::from_pem(&self.public_key, &Rules::default())
                .map_err(|e| ("auth.public_key", e.to_string()))?;
        }
        if !self.jwks_url.is_empty() {
            jwks::parse_url(&self.jwks_url).map_err(|e| ("auth.jwks_url", e.to_owned()))?;
            for (key, interval) in [
                ("auth.jwks_refresh_interval", self.jwks_refresh_interval),
                ("auth.jwks_min_refetch", self.jwks_min_refetch),
            ] {
                if interval.is_zero() {
                    return Err((key, "must be longer than 0s".to_owned()));
                }
            }
        }
        if self.leeway > MAX_LEEWAY {
            return Err(("auth.leeway", "must be at most 10m".to_owned()));
        }
        Ok(())
    }

    /// What is allowed but risky in this configuration, each said as a
    /// warning at start (the binary logs them):
    /// - a public key or JWKS without `audience`: the issuer's tokens for
    ///   any other service are accepted here too (an HMAC secret is
    ///   Herald's alone, so its tokens are minted for Herald);
    /// - the same without `issuer`: any issuer the key signs for is;
    /// - a JWKS fetched over plain `http://`: whoever is on the path can
    ///   swap the keys, and so mint any token.
    pub fn cautions(&self) -> Vec<&'static str> {
        let mut cautions = Vec::new();
        let public = self.has_public_key() || !self.jwks_url.is_empty();
        if public && self.audience.is_empty() {
            cautions.push(
                "auth.audience is not set: tokens its issuer made for any other audience are \
                 accepted (set auth.audience; see docs/security.md)",
            );
        }
        if public && self.issuer.is_empty() {
            cautions.push(
                "auth.issuer is not set: tokens from any issuer the key signs for are accepted \
                 (set auth.issuer; see docs/security.md)",
            );
        }
        if self.jwks_url.starts_with("http://") {
            cautions.push(
                "auth.jwks_url is plain http: anyone on the path to it can replace the keys \
                 and so mint tokens (use https)",
            );
        }
        cautions
    }

    fn rules(&self) -> Rules {
        let set = |s: &str| (!s.is_empty()).then(|| s.to_owned());
        Rules {
            issuer: set(&self.issuer),
            audience: set(&self.audience),
            leeway: self.leeway.as_secs() + u64::from(self.leeway.subsec_nanos() > 0),
        }
    }
}

/// Why a [`Verifier`] could not be built: the config is wrong.
#[derive(Debug, thiserror::Error)]
pub enum AuthError {
    /// A config key's value cannot be used (the key material, a URL, ...).
    #[error("{key}: {reason}")]
    Invalid { key: &'static str, reason: String },
    /// `auth.jwks_url` is https, but no root certificate could be loaded.
    #[error("auth.jwks_url: no root certificates for https: {0}")]
    Roots(std::io::Error),
}

/// Verifies tokens. Cheap to clone (an `Arc` inside); built once per pod.
#[derive(Clone)]
pub struct Verifier {
    inner: Arc<Inner>,
}

struct Inner {
    hmac: Option<Key>,
    public: Option<Key>,
    jwks: Option<Arc<Jwks>>,
    /// In seconds, for `iat`.
    leeway: u64,
    /// Stops the JWKS refresh task when the last clone is dropped.
    _refresh: Option<DropGuard>,
}

impl fmt::Debug for Verifier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Verifier")
            .field("hmac", &self.inner.hmac)
            .field("public", &self.inner.public)
            .field("jwks", &self.inner.jwks)
            .finish()
    }
}

impl Verifier {
    /// `None` when no key is configured.
    ///
    /// With `jwks_url`, fetches it once; if that fails, logs a warning and
    /// starts with no keys (tokens are refused, `no_keys`, until a fetch
    /// succeeds): the pod still starts. Spawns the refresh task, which stops
    /// when the last clone of the verifier is dropped.
    pub async fn new(config: &AuthConfig) -> Result<Option<Verifier>, AuthError> {
        let invalid = |key, reason: String| AuthError::Invalid { key, reason };
        config
            .validate()
            .map_err(|(key, reason)| invalid(key, reason))?;
        if !config.enabled() {
            return Ok(None);
        }
        let rules = config.rules();
        let hmac = match config.hmac_secret.as_bytes() {
            [] => None,
            secret => Some(
                Key::hmac(secret, &rules)
                    .map_err(|e| invalid("auth.hmac_secret", e.to_string()))?,
            ),
        };
        let public = match config.has_public_key() {
            false => None,
            true => Some(
                Key::from_pem(&config.public_key, &rules)
                    .map_err(|e| invalid("auth.public_key", e.to_string()))?,
            ),
        };
        let (jwks, refresh) = match config.jwks_url.as_str() {
            "" => (None, None),
            url => {
                let url = jwks::parse_url(url).map_err(|e| invalid("auth.jwks_url", e.into()))?;
                let jwks = Arc::new(Jwks::new(url, rules.clone(), config.jwks_min_refetch)?);
                // A failure is logged; the pod starts without keys.
                jwks.refresh().await;
                let stop = CancellationToken::new();
                jwks.spawn_refresh(config.jwks_refresh_interval, stop.clone());
                (Some(jwks), Some(stop.drop_guard()))
            }
        };
        Ok(Some(Verifier {
            inner: Arc::new(Inner {
                hmac,
                public,
                jwks,
                leeway: rules.leeway,
                _refresh: refresh,
            }),
        }))
    }

    /// Verifies signature and claims.
    ///
    /// The algorithm comes from our key, never from the token: `alg: none`,
    /// an HS token against an RSA key, an RS token against an HMAC secret
    /// are all refused (`algorithm`). An unknown `kid` with a JWKS fetches
    /// it again, at most once per `jwks_min_refetch` (callers waiting on it
    /// share that fetch); a JWKS server that is down leaves the last good
    /// keys in use.
    pub async fn verify(&self, token: &str) -> Result<Claims, Refused> {
        if token.len() > MAX_TOKEN_BYTES {
            return Err(Refused::Oversize);
        }
        let header = peek_header(token)?;
        let inner = &*self.inner;
        let from_jwks;
        let key = if header.alg.family() == AlgorithmFamily::Hmac {
            inner.hmac.as_ref().ok_or(Refused::Algorithm)?
        } else if let Some(jwks) = &inner.jwks
            && (header.kid.is_some() || inner.public.is_none())
        {
            // Boxed: a refetch (an HTTP request) is rare, and would
            // otherwise make every caller's future that much larger.
            from_jwks = Box::pin(jwks.key(header.kid.as_deref())).await?;
            &*from_jwks
        } else {
            inner.public.as_ref().ok_or(Refused::Algorithm)?
        };
        let payload: Payload = jsonwebtoken::decode(token, &key.decoding, &key.validation)?.claims;
        payload.into_claims(jsonwebtoken::get_current_timestamp(), inner.leeway)
    }
}

/// What picks the key: the token's `alg` and `kid`.
struct Header {
    alg: Algorithm,
    kid: Option<String>,
}

/// Reads `alg` and `kid` from a token's header, unverified: they only pick
/// our key, which then decides what it accepts.
fn peek_header(token: &str) -> Result<Header, Refused> {
    #[derive(Deserialize)]
    struct Raw<'a> {
        #[serde(borrow)]
        alg: Cow<'a, str>,
        #[serde(default, borrow)]
        kid: Option<Cow<'a, str>>,
    }
    let (encoded, _) = token.split_once('.').ok_or(Refused::Malformed)?;
    let json = URL_SAFE_NO_PAD
        .decode(encoded)
        .map_err(|_| Refused::Malformed)?;
    let raw: Raw<'_> = serde_json::from_slice(&json).map_err(|_| Refused::Malformed)?;
    // `none`, or anything else we do not know.
    let alg = raw.alg.parse().map_err(|_| Refused::Algorithm)?;
    Ok(Header {
        alg,
        kid: raw.kid.map(Cow::into_owned),
    })
}
