//! The keys tokens are verified with: each one a [`DecodingKey`] and the
//! [`Validation`] that fixes which algorithms it accepts.
//!
//! The algorithm comes from the key (its type, or a JWK's `alg`), never from
//! the token: a token naming any other algorithm is refused before any
//! signature is checked, so `alg: none`, an HS token against an RSA key or an
//! RS token against an HMAC secret cannot get through.

use std::fmt;

use jsonwebtoken::jwk::{AlgorithmParameters, EllipticCurve, Jwk, KeyOperations, PublicKeyUse};
use jsonwebtoken::{Algorithm, DecodingKey, Validation};

/// Algorithms an HMAC secret verifies: one family over the same secret, so
/// the token choosing among them cannot step outside it.
pub(super) const HMAC_ALGORITHMS: &[Algorithm] =
    &[Algorithm::HS256, Algorithm::HS384, Algorithm::HS512];

/// Algorithms an RSA key from `auth.public_key` verifies. A JWK without
/// `alg` gets [`KeyType::default_algorithm`] only.
const RSA_ALGORITHMS: &[Algorithm] = &[
    Algorithm::RS256,
    Algorithm::RS384,
    Algorithm::RS512,
    Algorithm::PS256,
    Algorithm::PS384,
    Algorithm::PS512,
];

/// Smallest RSA modulus accepted, in bytes (2048 bits, the NIST floor).
const MIN_RSA_BYTES: usize = 256;
/// Largest RSA modulus accepted, in bytes (8192 bits, the most the verifier takes).
const MAX_RSA_BYTES: usize = 1024;

/// Why a key (from the config or from a JWKS) cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(super) enum KeyError {
    #[error("not a PEM RSA, EC or Ed25519 public key")]
    NotAPublicKey,
    #[error("RSA keys must be 2048 to 8192 bits")]
    RsaSize,
    #[error("EC keys must be on P-256 or P-384")]
    Curve,
    #[error("symmetric (`oct`) keys are not taken from a JWKS")]
    Symmetric,
    #[error("`alg` does not fit a {0} key")]
    AlgorithmMismatch(&'static str),
    #[error("not a signature key (`use` or `key_ops`)")]
    NotForSignatures,
    #[error("key type not supported (RSA, EC P-256/P-384, OKP Ed25519)")]
    Unsupported,
    #[error("invalid key material")]
    Invalid,
    #[error("the HMAC secret is empty")]
    EmptySecret,
}

/// The kinds of public key tokens can be signed with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum KeyType {
    Rsa,
    P256,
    P384,
    Ed25519,
}

impl KeyType {
    /// Every algorithm a key of this type can verify.
    fn algorithms(self) -> &'static [Algorithm] {
        match self {
            KeyType::Rsa => RSA_ALGORITHMS,
            KeyType::P256 => &[Algorithm::ES256],
            KeyType::P384 => &[Algorithm::ES384],
            KeyType::Ed25519 => &[Algorithm::EdDSA],
        }
    }

    /// The one algorithm a JWK without `alg` is taken to be for.
    fn default_algorithm(self) -> Algorithm {
        match self {
            KeyType::Rsa => Algorithm::RS256,
            KeyType::P256 => Algorithm::ES256,
            KeyType::P384 => Algorithm::ES384,
            KeyType::Ed25519 => Algorithm::EdDSA,
        }
    }

    fn name(self) -> &'static str {
        match self {
            KeyType::Rsa => "RSA",
            KeyType::P256 => "P-256",
            KeyType::P384 => "P-384",
            KeyType::Ed25519 => "Ed25519",
        }
    }
}

/// The claim checks every key shares; each key gets its own [`Validation`]
/// built from them, with its own algorithms.
#[derive(Debug, Clone, Default)]
pub(super) struct Rules {
    /// `iss` must be present and equal this.
    pub issuer: Option<String>,
    /// `aud` must be present and contain this; `None`: `aud` is not checked.
    pub audience: Option<String>,
    /// Clock skew allowed on `exp`, `nbf` and `iat`, in whole seconds.
    pub leeway: u64,
}

impl Rules {
    fn validation(&self, algorithms: &[Algorithm]) -> Validation {
        let mut validation = Validation::new(algorithms[0]);
        validation.algorithms = algorithms.to_vec();
        validation.leeway = self.leeway;
        validation.validate_exp = true;
        validation.validate_nbf = true;
        let mut required = vec!["exp", "sub"];
        if let Some(issuer) = &self.issuer {
            validation.set_issuer(&[issuer]);
            required.push("iss");
        }
        match &self.audience {
            Some(audience) => {
                validation.set_audience(&[audience]);
                required.push("aud");
            }
            // Without this, jsonwebtoken refuses every token that has `aud`.
            None => validation.validate_aud = false,
        }
        validation.set_required_spec_claims(&required);
        validation
    }
}

/// One key and the algorithms (and claim checks) that go with it.
pub(super) struct Key {
    pub decoding: DecodingKey,
    pub validation: Validation,
}

impl fmt::Debug for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The key material stays out of logs, HMAC secrets above all.
        f.debug_struct("Key")
            .field("algorithms", &self.validation.algorithms)
            .finish_non_exhaustive()
    }
}

impl Key {
    fn new(decoding: DecodingKey, algorithms: &[Algorithm], rules: &Rules) -> Self {
        install_crypto();
        Key {
            decoding,
            validation: rules.validation(algorithms),
        }
    }

    /// An HMAC secret, its bytes as written; verifies HS256, HS384 and HS512.
    pub fn hmac(secret: &[u8], rules: &Rules) -> Result<Self, KeyError> {
        let decoding = DecodingKey::from_secret(secret).map_err(|_| KeyError::EmptySecret)?;
        Ok(Key::new(decoding, HMAC_ALGORITHMS, rules))
    }

    /// A public key in PEM (`PUBLIC KEY` or `RSA PUBLIC KEY`), its type read
    /// from the PEM: RSA verifies RS256/384/512 and PS256/384/512, an EC key
    /// ES256 (P-256) or ES384 (P-384), an Ed25519 key EdDSA.
    pub fn from_pem(pem: &str, rules: &Rules) -> Result<Self, KeyError> {
        // A private key or a certificate is refused rather than guessed at:
        // jsonwebtoken would take the first bit string it finds in either.
        if !matches!(pem_label(pem), Some("PUBLIC KEY" | "RSA PUBLIC KEY")) {
            return Err(KeyError::NotAPublicKey);
        }
        let bytes = pem.as_bytes();
        let decoding = DecodingKey::from_rsa_pem(bytes)
            .or_else(|_| DecodingKey::from_ec_pem(bytes))
            .or_else(|_| DecodingKey::from_ed_pem(bytes))
            .map_err(|_| KeyError::NotAPublicKey)?;
        let key_type = checked_type(&decoding)?;
        Ok(Key::new(decoding, key_type.algorithms(), rules))
    }

    /// A key from a JWKS: RSA, EC (P-256, P-384) or OKP (Ed25519), for one
    /// algorithm: its `alg`, which must fit the key type, or without `alg`
    /// the type's own (RS256, ES256, ES384, EdDSA). `oct` keys are refused:
    /// a public document must not hand out HMAC secrets.
    pub fn from_jwk(jwk: &Jwk, rules: &Rules) -> Result<Self, KeyError> {
        if jwk
            .common
            .public_key_use
            .as_ref()
            .is_some_and(|u| *u != PublicKeyUse::Signature)
            || jwk
                .common
                .key_operations
                .as_ref()
                .is_some_and(|ops| !ops.contains(&KeyOperations::Verify))
        {
            return Err(KeyError::NotForSignatures);
        }
        let (decoding, curve) = match &jwk.algorithm {
            AlgorithmParameters::OctetKey(_) => return Err(KeyError::Symmetric),
            AlgorithmParameters::RSA(rsa) => {
                (DecodingKey::from_rsa_components(&rsa.n, &rsa.e), None)
            }
            AlgorithmParameters::EllipticCurve(ec) => (
                DecodingKey::from_ec_components(&ec.x, &ec.y),
                Some(&ec.curve),
            ),
            AlgorithmParameters::OctetKeyPair(okp) if okp.curve == EllipticCurve::Ed25519 => {
                (DecodingKey::from_ed_components(&okp.x), None)
            }
            _ => return Err(KeyError::Unsupported),
        };
        let decoding = decoding.map_err(|_| KeyError::Invalid)?;
        let key_type = checked_type(&decoding)?;
        // `crv` must name the curve the coordinates are on.
        match (curve, key_type) {
            (None, _)
            | (Some(EllipticCurve::P256), KeyType::P256)
            | (Some(EllipticCurve::P384), KeyType::P384) => {}
            _ => return Err(KeyError::Curve),
        }
        let algorithm = match jwk.common.key_algorithm {
            None => key_type.default_algorithm(),
            Some(alg) => Algorithm::try_from(alg)
                .ok()
                .filter(|alg| key_type.algorithms().contains(alg))
                .ok_or(KeyError::AlgorithmMismatch(key_type.name()))?,
        };
        Ok(Key::new(decoding, &[algorithm], rules))
    }
}

/// Checks key material as the verifier will use it, so that a bad key fails
/// when it is loaded rather than as a bad signature on every token; and
/// tells its type.
fn checked_type(decoding: &DecodingKey) -> Result<KeyType, KeyError> {
    install_crypto();
    // Parses an RSA key's DER (and checks its size and exponent), checks the
    // lengths of EC points and Ed25519 keys (32 bytes), and names the curve.
    // The Ed25519 check matters: jsonwebtoken's verifier slices `[..32]`,
    // which would panic on a shorter key.
    let jwk = Jwk::from_decoding_key(decoding, None).map_err(|_| KeyError::Invalid)?;
    let key_type = match &jwk.algorithm {
        AlgorithmParameters::RSA(rsa) => {
            // Unpadded base64url: 4 characters carry 3 bytes. A JWK's `n`
            // has no leading zero bytes (RFC 7518 6.3.1.1).
            let modulus_bytes = rsa.n.trim_end_matches('=').len() * 3 / 4;
            if !(MIN_RSA_BYTES..=MAX_RSA_BYTES).contains(&modulus_bytes) {
                return Err(KeyError::RsaSize);
            }
            KeyType::Rsa
        }
        AlgorithmParameters::EllipticCurve(ec) => match ec.curve {
            EllipticCurve::P256 => KeyType::P256,
            EllipticCurve::P384 => KeyType::P384,
            _ => return Err(KeyError::Curve),
        },
        AlgorithmParameters::OctetKeyPair(okp) if okp.curve == EllipticCurve::Ed25519 => {
            KeyType::Ed25519
        }
        _ => return Err(KeyError::Unsupported),
    };
    // Building a verifier decodes an EC point or an Ed25519 key: a point
    // off the curve fails here. An empty signature never verifies, so only
    // an error says something.
    jsonwebtoken::crypto::verify("", b"", decoding, key_type.default_algorithm())
        .map_err(|_| KeyError::Invalid)?;
    Ok(key_type)
}

/// Names jsonwebtoken's crypto backend before any key is used. Only
/// `rust_crypto` is compiled in, which jsonwebtoken would pick by itself; but
/// should a second backend ever be enabled (by another crate's features), it
/// would panic on first use instead.
fn install_crypto() {
    // Err: a provider is installed already, this one or another by choice.
    let _ = jsonwebtoken::crypto::rust_crypto::DEFAULT_PROVIDER.install_default();
}

/// The label of the first PEM block in `text` (`PUBLIC KEY`, ...).
fn pem_label(text: &str) -> Option<&str> {
    let (_, rest) = text.split_once("-----BEGIN ")?;
    let (label, _) = rest.split_once("-----")?;
    Some(label)
}
