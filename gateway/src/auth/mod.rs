//! Client tokens (JWT): placeholder with the agreed surface; replaced by the
//! verifier module.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use serde::Deserialize;

/// Longest token accepted, in bytes.
pub const MAX_TOKEN_BYTES: usize = 8 * 1024;
/// Clock skew allowed for `exp` and `nbf`.
pub const DEFAULT_LEEWAY: Duration = Duration::from_secs(5);

#[derive(Clone, Deserialize, Default)]
#[serde(default, deny_unknown_fields)]
pub struct AuthConfig {
    pub hmac_secret: String,
    pub public_key: String,
    pub jwks_url: String,
    pub issuer: String,
    pub audience: String,
    #[serde(with = "humantime_serde")]
    pub leeway: Duration,
    pub allow_anonymous: bool,
    #[serde(with = "humantime_serde")]
    pub jwks_refresh_interval: Duration,
    #[serde(with = "humantime_serde")]
    pub jwks_min_refetch: Duration,
}

impl std::fmt::Debug for AuthConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AuthConfig").finish_non_exhaustive()
    }
}

impl AuthConfig {
    pub fn enabled(&self) -> bool {
        !self.hmac_secret.is_empty() || !self.public_key.is_empty() || !self.jwks_url.is_empty()
    }
    pub fn validate(&self) -> Result<(), (&'static str, String)> {
        Ok(())
    }
}

#[derive(Debug, thiserror::Error)]
#[error("auth: {0}")]
pub struct AuthError(String);

#[derive(Debug, Clone)]
pub struct Verifier {
    secret: Arc<str>,
}

impl Verifier {
    pub async fn new(config: &AuthConfig) -> Result<Option<Verifier>, AuthError> {
        Ok(config.enabled().then(|| Verifier {
            secret: Arc::from(config.hmac_secret.as_str()),
        }))
    }

    pub async fn verify(&self, token: &str) -> Result<Claims, Refused> {
        let _ = &self.secret;
        if token.len() > MAX_TOKEN_BYTES {
            return Err(Refused::Oversize);
        }
        // Placeholder: `user:<id>` tokens, for wiring only.
        let user = token.strip_prefix("user:").ok_or(Refused::Malformed)?;
        Ok(Claims {
            user: Arc::from(user),
            expires: None,
            subscribe: Grants(vec!["*".into()]),
            publish: Grants(vec!["*".into()]),
        })
    }
}

#[derive(Debug, Clone)]
pub struct Claims {
    pub user: Arc<str>,
    pub expires: Option<SystemTime>,
    pub subscribe: Grants,
    pub publish: Grants,
}

#[derive(Debug, Clone, Default)]
pub struct Grants(Vec<String>);

impl Grants {
    pub fn allows(&self, topic: &str) -> bool {
        self.0.iter().any(|g| match g.strip_suffix('*') {
            Some(prefix) => topic.starts_with(prefix),
            None => g == topic,
        })
    }
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

#[derive(Debug, Clone, thiserror::Error)]
pub enum Refused {
    #[error("malformed token")]
    Malformed,
    #[error("token too large")]
    Oversize,
    #[error("token expired")]
    Expired,
}

impl Refused {
    pub fn reason(&self) -> &'static str {
        match self {
            Refused::Malformed => "malformed",
            Refused::Oversize => "oversize",
            Refused::Expired => "expired",
        }
    }
    pub fn is_expired(&self) -> bool {
        matches!(self, Refused::Expired)
    }
}
