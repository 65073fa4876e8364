//! ECDSA on NIST P-521, which ring (and so rustls's ring provider) can
//! neither sign nor verify, but which etcd uses: its auto-TLS key
//! (`<data-dir>/fixtures/{client,peer}/key.pem`, a SEC1 "EC PRIVATE KEY")
//! is P-521, and users' own certificates and CAs may be. A member that
//! replaces etcd keeps its data dir, so these must load and verify.
//!
//! [`with_p521`] extends a ring provider with RustCrypto's `p521`, leaving
//! every other key and algorithm to ring:
//! - its key provider loads a P-521 key (PKCS#8 or SEC1) into a signer of
//!   `ecdsa_secp521r1_sha512` (DER signatures); any other key goes to ring;
//! - its signature verification algorithms add P-521 with SHA-512 (TLS 1.3's
//!   only P-521 scheme, and what Go signs P-521 certificates with), and with
//!   SHA-384 and SHA-256 (certificates signed so, and TLS 1.2, where Go signs
//!   with any ECDSA scheme the peer offers whatever its curve).

use std::sync::{Arc, OnceLock};

use p521::ecdsa::signature::hazmat::PrehashVerifier;
use p521::ecdsa::signature::Signer as _;
use p521::pkcs8::DecodePrivateKey;
use rustls::crypto::{CryptoProvider, KeyProvider, WebPkiSupportedAlgorithms};
use rustls::pki_types::{
    alg_id, AlgorithmIdentifier, InvalidSignature, PrivateKeyDer, SignatureVerificationAlgorithm,
    SubjectPublicKeyInfoDer,
};
use rustls::sign::{public_key_to_spki, Signer, SigningKey};
use rustls::{Error, SignatureAlgorithm, SignatureScheme};
use sha2::Digest;

/// `provider` (ring's) with P-521 keys and signatures added.
pub(crate) fn with_p521(mut provider: CryptoProvider) -> CryptoProvider {
    provider.key_provider = &KEYS_WITH_P521;
    provider.signature_verification_algorithms =
        verification_algorithms(provider.signature_verification_algorithms);
    provider
}

/// The key provider: P-521 keys here, all others to ring.
#[derive(Debug)]
struct KeysWithP521;

static KEYS_WITH_P521: KeysWithP521 = KeysWithP521;

impl KeyProvider for KeysWithP521 {
    fn load_private_key(&self, key: PrivateKeyDer<'static>) -> Result<Arc<dyn SigningKey>, Error> {
        match p521_secret_key(&key) {
            Some(secret) => Ok(Arc::new(P521SigningKey::new(&secret)?)),
            None => rustls::crypto::ring::sign::any_supported_type(&key),
        }
    }
}

/// The P-521 secret key of a PKCS#8 or SEC1 document; None for any other
/// key (another curve or algorithm, PKCS#1).
pub(crate) fn p521_secret_key(key: &PrivateKeyDer<'_>) -> Option<p521::SecretKey> {
    match key {
        PrivateKeyDer::Pkcs8(der) => p521::SecretKey::from_pkcs8_der(der.secret_pkcs8_der()).ok(),
        PrivateKeyDer::Sec1(der) => p521::SecretKey::from_sec1_der(der.secret_sec1_der()).ok(),
        _ => None,
    }
}

/// A P-521 key that signs TLS handshakes with `ecdsa_secp521r1_sha512`.
struct P521SigningKey {
    key: Arc<p521::ecdsa::SigningKey>,
    spki: SubjectPublicKeyInfoDer<'static>,
}

impl P521SigningKey {
    fn new(secret: &p521::SecretKey) -> Result<P521SigningKey, Error> {
        let key = p521::ecdsa::SigningKey::from_bytes(&secret.to_bytes())
            .map_err(|e| Error::General(format!("not an ECDSA P-521 key: {e}")))?;
        let point = secret.public_key().to_sec1_bytes();
        Ok(P521SigningKey {
            key: Arc::new(key),
            spki: public_key_to_spki(&alg_id::ECDSA_P521, point),
        })
    }
}

/// Never shows the key.
impl std::fmt::Debug for P521SigningKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("P521SigningKey")
    }
}

impl SigningKey for P521SigningKey {
    fn choose_scheme(&self, offered: &[SignatureScheme]) -> Option<Box<dyn Signer>> {
        offered
            .contains(&SignatureScheme::ECDSA_NISTP521_SHA512)
            .then(|| Box::new(P521Signer(self.key.clone())) as Box<dyn Signer>)
    }

    fn public_key(&self) -> Option<SubjectPublicKeyInfoDer<'_>> {
        Some(self.spki.clone())
    }

    fn algorithm(&self) -> SignatureAlgorithm {
        SignatureAlgorithm::ECDSA
    }
}

struct P521Signer(Arc<p521::ecdsa::SigningKey>);

impl std::fmt::Debug for P521Signer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("P521Signer")
    }
}

impl Signer for P521Signer {
    fn sign(&self, message: &[u8]) -> Result<Vec<u8>, Error> {
        let signature: p521::ecdsa::Signature = self
            .0
            .try_sign(message)
            .map_err(|e| Error::General(format!("ECDSA P-521 signing failed: {e}")))?;
        Ok(signature.to_der().as_bytes().to_vec())
    }

    fn scheme(&self) -> SignatureScheme {
        SignatureScheme::ECDSA_NISTP521_SHA512
    }
}

/// An ECDSA signature by a P-521 key over a digest of the message.
#[derive(Debug)]
struct P521Verify {
    hash: Hash,
}

#[derive(Debug, Clone, Copy)]
enum Hash {
    Sha256,
    Sha384,
    Sha512,
}

static P521_SHA256: P521Verify = P521Verify { hash: Hash::Sha256 };
static P521_SHA384: P521Verify = P521Verify { hash: Hash::Sha384 };
static P521_SHA512: P521Verify = P521Verify { hash: Hash::Sha512 };
static ONLY_P521_SHA512: [&dyn SignatureVerificationAlgorithm; 1] = [&P521_SHA512];

impl SignatureVerificationAlgorithm for P521Verify {
    fn verify_signature(
        &self,
        public_key: &[u8],
        message: &[u8],
        signature: &[u8],
    ) -> Result<(), InvalidSignature> {
        let key =
            p521::ecdsa::VerifyingKey::from_sec1_bytes(public_key).map_err(|_| InvalidSignature)?;
        let signature =
            p521::ecdsa::Signature::from_der(signature).map_err(|_| InvalidSignature)?;
        // The digest as an integer (FIPS 186: a hash shorter than the order
        // is taken whole): left-padded with zeros to SHA-512's length, as
        // the ecdsa crate refuses a digest under half the field's size.
        let mut digest = [0u8; 64];
        match self.hash {
            Hash::Sha256 => digest[32..].copy_from_slice(&sha2::Sha256::digest(message)),
            Hash::Sha384 => digest[16..].copy_from_slice(&sha2::Sha384::digest(message)),
            Hash::Sha512 => digest.copy_from_slice(&sha2::Sha512::digest(message)),
        }
        key.verify_prehash(&digest, &signature)
            .map_err(|_| InvalidSignature)
    }

    fn public_key_alg_id(&self) -> AlgorithmIdentifier {
        alg_id::ECDSA_P521
    }

    fn signature_alg_id(&self) -> AlgorithmIdentifier {
        match self.hash {
            Hash::Sha256 => alg_id::ECDSA_SHA256,
            Hash::Sha384 => alg_id::ECDSA_SHA384,
            Hash::Sha512 => alg_id::ECDSA_SHA512,
        }
    }
}

/// ring's algorithms and the P-521 ones: all of them for certificate
/// chains; for handshake signatures, `ecdsa_secp521r1_sha512`, and the
/// P-256 and P-384 schemes also with a P-521 key (TLS 1.2 does not tie the
/// curve to the scheme; TLS 1.3 takes only a scheme's first algorithm, the
/// one of its own curve). Built once (rustls wants them `'static`), from
/// ring's, the only provider [`with_p521`] is given.
fn verification_algorithms(ring: WebPkiSupportedAlgorithms) -> WebPkiSupportedAlgorithms {
    static EXTENDED: OnceLock<WebPkiSupportedAlgorithms> = OnceLock::new();
    *EXTENDED.get_or_init(|| {
        type Algorithms = &'static [&'static dyn SignatureVerificationAlgorithm];
        let mut all: Vec<&'static dyn SignatureVerificationAlgorithm> = ring.all.to_vec();
        all.extend([
            &P521_SHA512 as &dyn SignatureVerificationAlgorithm,
            &P521_SHA384,
            &P521_SHA256,
        ]);
        let mut mapping: Vec<(SignatureScheme, Algorithms)> = Vec::new();
        for (scheme, algorithms) in ring.mapping {
            let also: Option<&'static dyn SignatureVerificationAlgorithm> = match scheme {
                SignatureScheme::ECDSA_NISTP384_SHA384 => Some(&P521_SHA384),
                SignatureScheme::ECDSA_NISTP256_SHA256 => Some(&P521_SHA256),
                _ => None,
            };
            let algorithms: Algorithms = match also {
                Some(p521) => {
                    let mut extended = algorithms.to_vec();
                    extended.push(p521);
                    Vec::leak(extended)
                }
                None => algorithms,
            };
            mapping.push((*scheme, algorithms));
        }
        // after the other ECDSA schemes: the order is the one offered
        let at = mapping
            .iter()
            .rposition(|(s, _)| {
                matches!(
                    s,
                    SignatureScheme::ECDSA_NISTP256_SHA256 | SignatureScheme::ECDSA_NISTP384_SHA384
                )
            })
            .map_or(0, |i| i + 1);
        mapping.insert(
            at,
            (SignatureScheme::ECDSA_NISTP521_SHA512, &ONLY_P521_SHA512),
        );
        WebPkiSupportedAlgorithms {
            all: Vec::leak(all),
            mapping: Vec::leak(mapping),
        }
    })
}
