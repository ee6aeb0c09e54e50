//! Why a token was refused, and how jsonwebtoken's errors map onto that.

use jsonwebtoken::errors::{Error, ErrorKind};

use super::MAX_TOKEN_BYTES;

/// Why a token was refused.
///
/// [`reason`](Refused::reason) is a short fixed label for the metric
/// `herald_auth_failures_total{reason}`; [`is_expired`](Refused::is_expired)
/// picks the one refusal a client can fix by fetching a new token
/// (`token_expired`; every other one is `unauthorized`). `Display` is a short
/// message safe to send to the client: it never holds key material.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Refused {
    /// The `info` claim is longer than `presence.max_info_bytes` (its
    /// compact JSON text).
    #[error("token claims are invalid: `info` is longer than {0} bytes (presence.max_info_bytes)")]
    InfoTooLong(usize),
    /// Not a JWS compact token: parts, base64url or JSON.
    #[error("token is not a well-formed JWT")]
    Malformed,
    /// Longer than [`MAX_TOKEN_BYTES`]; refused before any parsing.
    #[error("token is longer than {MAX_TOKEN_BYTES} bytes")]
    Oversize,
    /// The signature does not verify with the key the token names.
    #[error("token signature does not verify")]
    Signature,
    /// The token's `alg` is not one its key verifies (or not one at all:
    /// `none`).
    #[error("token algorithm is not accepted")]
    Algorithm,
    /// `exp` has passed (beyond the leeway), on a token whose signature
    /// verified.
    #[error("token has expired")]
    Expired,
    /// `nbf` or `iat` is still ahead (beyond the leeway).
    #[error("token is not valid yet")]
    NotYetValid,
    /// `iss` is missing or not the configured issuer.
    #[error("token issuer is not accepted")]
    Issuer,
    /// `aud` is missing or does not hold the configured audience.
    #[error("token audience is not accepted")]
    Audience,
    /// A claim is missing, of the wrong type or out of bounds.
    #[error("token claims are invalid: {0}")]
    Claims(&'static str),
    /// The token's `kid` is not in the JWKS, even after fetching it again.
    #[error("token is signed with an unknown key")]
    UnknownKey,
    /// The JWKS has not been fetched yet: no key to verify with.
    #[error("no keys to verify tokens with yet")]
    NoKeys,
}

impl Refused {
    /// The label for `herald_auth_failures_total{reason}`: one of a fixed set.
    pub fn reason(&self) -> &'static str {
        match self {
            Refused::Malformed => "malformed",
            Refused::Oversize => "oversize",
            Refused::Signature => "signature",
            Refused::Algorithm => "algorithm",
            Refused::Expired => "expired",
            Refused::NotYetValid => "not_yet_valid",
            Refused::Issuer => "issuer",
            Refused::Audience => "audience",
            Refused::Claims(_) | Refused::InfoTooLong(_) => "claims",
            Refused::UnknownKey => "unknown_key",
            Refused::NoKeys => "no_keys",
        }
    }

    /// Whether the token was genuine but has expired (client error
    /// `token_expired`): jsonwebtoken checks the signature before the
    /// claims, so a forged token never gets this far.
    pub fn is_expired(&self) -> bool {
        *self == Refused::Expired
    }
}

impl From<Error> for Refused {
    fn from(error: Error) -> Self {
        match error.kind() {
            ErrorKind::InvalidToken
            | ErrorKind::Base64(_)
            | ErrorKind::Json(_)
            | ErrorKind::Utf8(_) => Refused::Malformed,
            ErrorKind::InvalidSignature => Refused::Signature,
            ErrorKind::InvalidAlgorithm
            | ErrorKind::InvalidAlgorithmName
            | ErrorKind::UnsupportedAlgorithm
            | ErrorKind::MissingAlgorithm => Refused::Algorithm,
            ErrorKind::ExpiredSignature => Refused::Expired,
            ErrorKind::ImmatureSignature => Refused::NotYetValid,
            ErrorKind::InvalidIssuer => Refused::Issuer,
            ErrorKind::InvalidAudience => Refused::Audience,
            ErrorKind::MissingRequiredClaim(claim) | ErrorKind::InvalidClaimFormat(claim) => {
                match claim.as_str() {
                    "iss" => Refused::Issuer,
                    "aud" => Refused::Audience,
                    "exp" => Refused::Claims("`exp` is required, a number"),
                    "sub" => Refused::Claims("`sub` is required, a string"),
                    "nbf" => Refused::Claims("`nbf` must be a number"),
                    _ => Refused::Claims("a registered claim is invalid"),
                }
            }
            ErrorKind::InvalidSubject => Refused::Claims("`sub` is not accepted"),
            // Anything else is about the key, not the token (the keys were
            // checked when loaded, so this should not happen): our config
            // or the JWKS is wrong. Refused all the same, and said loudly.
            kind => {
                tracing::warn!(error = ?kind, "a token could not be checked with its key");
                Refused::Signature
            }
        }
    }
}
