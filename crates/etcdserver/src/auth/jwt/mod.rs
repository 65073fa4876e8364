//! etcd's JWT token provider (`--auth-token jwt,pub-key=<file>,priv-key=<file>,
//! sign-method=<alg>,ttl=<duration>`): server/auth/jwt.go and options.go of
//! etcd 3.5.16, which sign and check with golang-jwt v4.4.2.
//!
//! A token is a JWS in compact serialization: `base64url(header)`, `.`,
//! `base64url(claims)`, `.`, `base64url(signature)`. The header is
//! `{"alg":…,"typ":"JWT"}` and the claims `exp` (unix seconds), `revision`
//! (the auth revision at sign time) and `username`, written as Go's
//! encoding/json writes a map (keys sorted, `<>&` escaped), so a token is
//! etcd's byte for byte up to the signature. ES* signatures are JOSE's
//! fixed-width `r || s`, not DER.
//!
//! A token is checked by its signature alone, with the configured method (a
//! token whose `alg` is another one, `none` included, is refused), then by
//! golang-jwt's MapClaims rules: `exp` must be in the future and `iat`,
//! `nbf` not, each only when present. Nothing is kept per token: tokens
//! survive restarts and stay valid until they expire, on every member that
//! has the key.
//!
//! Keys are read as golang-jwt's Parse*FromPEM read them: the first PEM
//! block of the file whatever its label; RSA private keys in PKCS#1 or
//! PKCS#8, EC private keys (P-256, P-384, P-521) in SEC1 or PKCS#8, public
//! keys as a SubjectPublicKeyInfo or inside an X.509 certificate; for HS*
//! the raw bytes of priv-key are the secret. A public key alone makes a
//! verify-only member: it checks tokens but Authenticate on it fails with
//! VERIFY_ONLY_KEY. With both keys the private one signs and checks, and
//! the public one is only compared with it, as loosely as etcd compares.
//!
//! Where we knowingly differ from etcd: RSA goes through ring, which signs
//! with keys of 2048 to 4096 bits and checks with 2048 to 8192 (etcd takes
//! any size); a PS* token must carry a salt as long as its hash (etcd signs
//! so, but its checker takes any salt); an EC key on a curve other than
//! these three (P-224) refuses to start where etcd starts and then cannot
//! sign.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use api::rpctypes::{self, EtcdError};
use base64::alphabet;
use base64::engine::general_purpose::{GeneralPurpose, GeneralPurposeConfig};
use base64::engine::DecodePaddingMode;
use base64::Engine as _;
use p256::ecdsa::signature::{Signer as _, Verifier as _};
use ring::hmac;
use ring::rand::SystemRandom;
use ring::signature::{self as ring_signature, RsaKeyPair};
use serde_json::{Map, Value};
use tonic::Code;
use x509_parser::prelude::{FromDer, SubjectPublicKeyInfo, X509Certificate};

const OPT_SIGN_METHOD: &str = "sign-method";
const OPT_PUBLIC_KEY: &str = "pub-key";
const OPT_PRIVATE_KEY: &str = "priv-key";
const OPT_TTL: &str = "ttl";
const KNOWN_OPTIONS: [&str; 4] = [OPT_SIGN_METHOD, OPT_PUBLIC_KEY, OPT_PRIVATE_KEY, OPT_TTL];

const NANOS_PER_SECOND: i64 = 1_000_000_000;
/// etcd's DefaultTTL, when `ttl=` is absent or empty.
const DEFAULT_TTL_NANOS: i64 = 5 * 60 * NANOS_PER_SECOND;

/// Longest token looked at. etcd's own are under 1 KiB (a 4096-bit RSA
/// signature is 683 characters); this only keeps a client from making us
/// decode and parse megabytes for nothing.
const MAX_TOKEN_LEN: usize = 64 * 1024;

const OID_RSA_ENCRYPTION: &str = "1.2.840.113549.1.1.1";
const OID_EC_PUBLIC_KEY: &str = "1.2.840.10045.2.1";

// The start failures etcd names with a fixed text (auth/store.go, golang-jwt).
const ERR_INVALID_AUTH_METHOD: &str = "auth: invalid auth signature method";
const ERR_MISSING_KEY: &str = "auth: missing key data";
const ERR_KEY_MISMATCH: &str = "auth: public and private keys don't match";
const ERR_KEY_MUST_BE_PEM: &str = "invalid key: Key must be a PEM encoded PKCS1 or PKCS8 key";
const ERR_NOT_RSA_PRIVATE_KEY: &str = "key is not a valid RSA private key";
const ERR_NOT_RSA_PUBLIC_KEY: &str = "key is not a valid RSA public key";
const ERR_NOT_EC_PRIVATE_KEY: &str = "key is not a valid ECDSA private key";
const ERR_NOT_EC_PUBLIC_KEY: &str = "key is not a valid ECDSA public key";

/// golang-jwt's ErrInvalidKey: what signing answers when an ES* method has
/// a key on another curve (etcd starts with it, then cannot sign).
const INVALID_KEY: EtcdError = EtcdError {
    code: Code::Unknown,
    message: "key is invalid",
};
/// ring refusing to sign with a key it accepted; not expected to happen.
const SIGNING_FAILED: EtcdError = EtcdError {
    code: Code::Unknown,
    message: "auth: failed to sign the token",
};

/// Go's base64.RawURLEncoding as golang-jwt decodes: no padding, and
/// non-zero trailing bits tolerated.
const SEGMENT: GeneralPurpose = GeneralPurpose::new(
    &alphabet::URL_SAFE,
    GeneralPurposeConfig::new()
        .with_encode_padding(false)
        .with_decode_padding_mode(DecodePaddingMode::RequireNone)
        .with_decode_allow_trailing_bits(true),
);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Family {
    Hmac,
    RsaPkcs1,
    RsaPss,
    Ecdsa,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Hash {
    Sha256,
    Sha384,
    Sha512,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct SignMethod {
    alg: &'static str,
    family: Family,
    hash: Hash,
}

const fn method(alg: &'static str, family: Family, hash: Hash) -> SignMethod {
    SignMethod { alg, family, hash }
}

/// The methods etcd can use: golang-jwt's registry less EdDSA and none.
const SIGN_METHODS: [SignMethod; 12] = [
    method("HS256", Family::Hmac, Hash::Sha256),
    method("HS384", Family::Hmac, Hash::Sha384),
    method("HS512", Family::Hmac, Hash::Sha512),
    method("RS256", Family::RsaPkcs1, Hash::Sha256),
    method("RS384", Family::RsaPkcs1, Hash::Sha384),
    method("RS512", Family::RsaPkcs1, Hash::Sha512),
    method("PS256", Family::RsaPss, Hash::Sha256),
    method("PS384", Family::RsaPss, Hash::Sha384),
    method("PS512", Family::RsaPss, Hash::Sha512),
    method("ES256", Family::Ecdsa, Hash::Sha256),
    method("ES384", Family::Ecdsa, Hash::Sha384),
    method("ES512", Family::Ecdsa, Hash::Sha512),
];

/// Methods golang-jwt knows but etcd's options.go has no key for: they pass
/// the method lookup and fail at the key, with the Go type in the message.
fn go_type_of_keyless_method(name: &str) -> Option<&'static str> {
    match name {
        "EdDSA" => Some("*jwt.SigningMethodEd25519"),
        "none" => Some("*jwt.signingMethodNone"),
        _ => None,
    }
}

impl SignMethod {
    /// The curve an ES* method signs on.
    fn curve(self) -> Curve {
        match self.hash {
            Hash::Sha256 => Curve::P256,
            Hash::Sha384 => Curve::P384,
            Hash::Sha512 => Curve::P521,
        }
    }

    fn hmac_algorithm(self) -> hmac::Algorithm {
        match self.hash {
            Hash::Sha256 => hmac::HMAC_SHA256,
            Hash::Sha384 => hmac::HMAC_SHA384,
            Hash::Sha512 => hmac::HMAC_SHA512,
        }
    }

    fn rsa_padding(self) -> &'static dyn ring_signature::RsaEncoding {
        match (self.family, self.hash) {
            (Family::RsaPss, Hash::Sha256) => &ring_signature::RSA_PSS_SHA256,
            (Family::RsaPss, Hash::Sha384) => &ring_signature::RSA_PSS_SHA384,
            (Family::RsaPss, Hash::Sha512) => &ring_signature::RSA_PSS_SHA512,
            (_, Hash::Sha256) => &ring_signature::RSA_PKCS1_SHA256,
            (_, Hash::Sha384) => &ring_signature::RSA_PKCS1_SHA384,
            (_, Hash::Sha512) => &ring_signature::RSA_PKCS1_SHA512,
        }
    }

    fn rsa_verification(self) -> &'static ring_signature::RsaParameters {
        match (self.family, self.hash) {
            (Family::RsaPss, Hash::Sha256) => &ring_signature::RSA_PSS_2048_8192_SHA256,
            (Family::RsaPss, Hash::Sha384) => &ring_signature::RSA_PSS_2048_8192_SHA384,
            (Family::RsaPss, Hash::Sha512) => &ring_signature::RSA_PSS_2048_8192_SHA512,
            (_, Hash::Sha256) => &ring_signature::RSA_PKCS1_2048_8192_SHA256,
            (_, Hash::Sha384) => &ring_signature::RSA_PKCS1_2048_8192_SHA384,
            (_, Hash::Sha512) => &ring_signature::RSA_PKCS1_2048_8192_SHA512,
        }
    }
}

/// The JWT token provider of one member.
pub struct JwtTokens {
    method: SignMethod,
    key: Key,
    /// Go's time.Duration: it may be zero or negative (tokens born expired).
    ttl_nanos: i64,
    rng: SystemRandom,
}

impl JwtTokens {
    /// `opts`: the key=value options after `jwt` in --auth-token.
    /// Err(reason) for a start failure: etcd's own error text where it has
    /// a fixed one ("auth: missing key data", "auth: public and private
    /// keys don't match", "unsupported signing method: …"), else what Go
    /// logs as "problem loading JWT options" before answering "auth:
    /// invalid auth options".
    pub fn new(opts: &BTreeMap<String, String>) -> Result<JwtTokens, String> {
        // jwtOptions.Parse, in its order: ttl, the two files, the method.
        let option = |name: &str| {
            opts.get(name)
                .map(String::as_str)
                .filter(|value| !value.is_empty())
        };
        let ttl_nanos = match option(OPT_TTL) {
            None => DEFAULT_TTL_NANOS,
            Some(ttl) => go_duration_nanos(ttl)?,
        };
        // An empty file counts as no file (options.go tests len(key) > 0).
        let public_pem = option(OPT_PUBLIC_KEY)
            .map(read_key_file)
            .transpose()?
            .filter(|pem| !pem.is_empty());
        let private_pem = option(OPT_PRIVATE_KEY)
            .map(read_key_file)
            .transpose()?
            .filter(|pem| !pem.is_empty());
        let name = option(OPT_SIGN_METHOD).unwrap_or_default();
        let method = SIGN_METHODS
            .iter()
            .copied()
            .find(|method| method.alg == name);
        let keyless_method = go_type_of_keyless_method(name);
        if method.is_none() && keyless_method.is_none() {
            return Err(format!("{ERR_INVALID_AUTH_METHOD} {name:?}"));
        }

        let unknown: Vec<&str> = opts
            .keys()
            .map(String::as_str)
            .filter(|key| !KNOWN_OPTIONS.contains(key))
            .collect();
        if !unknown.is_empty() {
            tracing::warn!(keys = ?unknown, "unknown JWT options");
        }

        let Some(method) = method else {
            return Err(format!(
                "unsupported signing method: {}",
                keyless_method.unwrap_or(name)
            ));
        };
        let (private_pem, public_pem) = (private_pem.as_deref(), public_pem.as_deref());
        let key = match method.family {
            Family::Hmac => match private_pem {
                Some(secret) => Key::Hmac(hmac::Key::new(method.hmac_algorithm(), secret)),
                None => return Err(ERR_MISSING_KEY.into()),
            },
            Family::RsaPkcs1 | Family::RsaPss => rsa_key(private_pem, public_pem)?,
            Family::Ecdsa => ec_key(private_pem, public_pem)?,
        };
        Ok(JwtTokens {
            method,
            key,
            ttl_nanos,
            rng: SystemRandom::new(),
        })
    }

    /// A signed token for `username` at auth `revision`, expiring after the ttl.
    pub fn assign(&self, username: &str, revision: u64) -> Result<String, EtcdError> {
        self.assign_at(username, revision, unix_nanos_now())
    }

    /// The (username, revision) a valid, unexpired token carries.
    pub fn info(&self, token: &str) -> Option<(String, u64)> {
        let now_seconds = unix_nanos_now().div_euclid(i128::from(NANOS_PER_SECOND));
        self.info_at(token, i64::try_from(now_seconds).unwrap_or(i64::MAX))
    }

    /// The lifetime of the tokens (for logs).
    pub fn ttl(&self) -> Duration {
        Duration::from_nanos(u64::try_from(self.ttl_nanos).unwrap_or(0))
    }

    /// `now_nanos`: the unix time in nanoseconds.
    fn assign_at(
        &self,
        username: &str,
        revision: u64,
        now_nanos: i128,
    ) -> Result<String, EtcdError> {
        // etcd: time.Now().Add(ttl).Unix()
        let expiry =
            (now_nanos + i128::from(self.ttl_nanos)).div_euclid(i128::from(NANOS_PER_SECOND));
        let header = format!("{{\"alg\":\"{}\",\"typ\":\"JWT\"}}", self.method.alg);
        let claims = format!(
            "{{\"exp\":{expiry},\"revision\":{revision},\"username\":{}}}",
            go_json_string(username)
        );
        let mut token = format!("{}.{}", SEGMENT.encode(header), SEGMENT.encode(claims));
        let signature = self.sign(token.as_bytes())?;
        token.push('.');
        token.push_str(&SEGMENT.encode(signature));
        Ok(token)
    }

    /// `now_seconds`: the unix time in whole seconds.
    fn info_at(&self, token: &str, now_seconds: i64) -> Option<(String, u64)> {
        let claims = self.verified_claims(token, now_seconds)?;
        let username = claims.get("username")?.as_str()?.to_owned();
        // The revision went through Go's float64 (JSON numbers decode so).
        let revision = go_uint64(claims.get("revision")?.as_f64()?);
        Some((username, revision))
    }

    /// golang-jwt's Parse with etcd's key function: the claims of a token
    /// signed with our method and key whose time claims hold at `now_seconds`.
    fn verified_claims(&self, token: &str, now_seconds: i64) -> Option<Map<String, Value>> {
        if token.len() > MAX_TOKEN_LEN {
            return None;
        }
        let mut segments = token.split('.');
        let (header, claims, signature) = (segments.next()?, segments.next()?, segments.next()?);
        if segments.next().is_some() {
            return None;
        }
        let header_json: Map<String, Value> =
            serde_json::from_slice(&SEGMENT.decode(header).ok()?).ok()?;
        if header_json.get("alg")?.as_str()? != self.method.alg {
            return None;
        }
        let claims_json = SEGMENT.decode(claims).ok()?;
        // Go's json.Decoder: the first value counts, what follows is ignored.
        let claims_json: Map<String, Value> = serde_json::Deserializer::from_slice(&claims_json)
            .into_iter()
            .next()?
            .ok()?;
        if !claims_are_current(&claims_json, now_seconds) {
            return None;
        }
        let signing_input = &token[..header.len() + 1 + claims.len()];
        let signature = SEGMENT.decode(signature).ok()?;
        self.verify(signing_input.as_bytes(), &signature)
            .then_some(claims_json)
    }

    fn sign(&self, message: &[u8]) -> Result<Vec<u8>, EtcdError> {
        match &self.key {
            Key::Hmac(secret) => Ok(hmac::sign(secret, message).as_ref().to_vec()),
            Key::Rsa {
                private: Some(private),
                ..
            } => {
                let mut signature = vec![0; private.public().modulus_len()];
                private
                    .sign(
                        self.method.rsa_padding(),
                        &self.rng,
                        message,
                        &mut signature,
                    )
                    .map_err(|_| SIGNING_FAILED)?;
                Ok(signature)
            }
            Key::Ec {
                private: Some(private),
                ..
            } => {
                if private.curve() != self.method.curve() {
                    return Err(INVALID_KEY);
                }
                Ok(private.sign(message))
            }
            Key::Rsa { private: None, .. } | Key::Ec { private: None, .. } => {
                Err(rpctypes::VERIFY_ONLY_KEY)
            }
        }
    }

    fn verify(&self, message: &[u8], signature: &[u8]) -> bool {
        match &self.key {
            Key::Hmac(secret) => hmac::verify(secret, message, signature).is_ok(),
            Key::Rsa {
                public_pkcs1_der, ..
            } => ring_signature::UnparsedPublicKey::new(
                self.method.rsa_verification(),
                public_pkcs1_der,
            )
            .verify(message, signature)
            .is_ok(),
            // A key on another curve than the method's never verifies (in
            // etcd, a signature of the method's width almost never can).
            Key::Ec { public, .. } => {
                public.curve() == self.method.curve() && public.verify(message, signature)
            }
        }
    }
}

/// golang-jwt's MapClaims.Valid at `now` (unix seconds): `exp` after now,
/// `iat` and `nbf` not after it, each checked only when present and not 0;
/// one present that is not a number fails.
fn claims_are_current(claims: &Map<String, Value>, now: i64) -> bool {
    let holds = |name: &str, test: fn(i64, i64) -> bool| match claims.get(name) {
        None => true,
        Some(value) => match value.as_f64() {
            None => false,
            Some(0.0) => true,
            Some(seconds) => test(now, go_numeric_date(seconds)),
        },
    };
    holds("exp", |now, exp| now < exp)
        && holds("iat", |now, iat| now >= iat)
        && holds("nbf", |now, nbf| now >= nbf)
}

mod go;
pub use go::go_duration_nanos;
mod keys;
#[cfg(test)]
mod tests;

use go::*;
use keys::*;
