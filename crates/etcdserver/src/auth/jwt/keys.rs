//! Keys as golang-jwt reads them: PEM blocks, RSA (PKCS#1, PKCS#8), EC
//! (SEC1, PKCS#8; P-256, P-384, P-521), public keys and certificates.

use super::*;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Curve {
    P256,
    P384,
    P521,
}

impl Curve {
    pub(super) fn from_oid(oid: &str) -> Result<Curve, String> {
        match oid {
            "1.2.840.10045.3.1.7" => Ok(Curve::P256),
            "1.3.132.0.34" => Ok(Curve::P384),
            "1.3.132.0.35" => Ok(Curve::P521),
            other => Err(format!("x509: unsupported elliptic curve {other}")),
        }
    }
}

pub(super) enum EcSigningKey {
    P256(p256::ecdsa::SigningKey),
    P384(p384::ecdsa::SigningKey),
    P521(p521::ecdsa::SigningKey),
}

#[derive(Clone)]
pub(super) enum EcVerifyingKey {
    P256(p256::ecdsa::VerifyingKey),
    P384(p384::ecdsa::VerifyingKey),
    P521(p521::ecdsa::VerifyingKey),
}

impl EcSigningKey {
    pub(super) fn from_sec1_der(curve: Curve, der: &[u8]) -> Result<EcSigningKey, String> {
        let invalid =
            |e: p256::elliptic_curve::Error| format!("x509: failed to parse EC private key: {e}");
        Ok(match curve {
            Curve::P256 => {
                EcSigningKey::P256(p256::SecretKey::from_sec1_der(der).map_err(invalid)?.into())
            }
            Curve::P384 => {
                EcSigningKey::P384(p384::SecretKey::from_sec1_der(der).map_err(invalid)?.into())
            }
            Curve::P521 => {
                let secret = p521::SecretKey::from_sec1_der(der).map_err(invalid)?;
                EcSigningKey::P521(
                    p521::ecdsa::SigningKey::from_bytes(&secret.to_bytes())
                        .map_err(|e| e.to_string())?,
                )
            }
        })
    }

    pub(super) fn from_pkcs8_der(curve: Curve, der: &[u8]) -> Result<EcSigningKey, String> {
        use p256::pkcs8::DecodePrivateKey as _;
        let invalid = |e: p256::pkcs8::Error| format!("x509: failed to parse EC private key: {e}");
        Ok(match curve {
            Curve::P256 => EcSigningKey::P256(
                p256::SecretKey::from_pkcs8_der(der)
                    .map_err(invalid)?
                    .into(),
            ),
            Curve::P384 => EcSigningKey::P384(
                p384::SecretKey::from_pkcs8_der(der)
                    .map_err(invalid)?
                    .into(),
            ),
            Curve::P521 => {
                let secret = p521::SecretKey::from_pkcs8_der(der).map_err(invalid)?;
                EcSigningKey::P521(
                    p521::ecdsa::SigningKey::from_bytes(&secret.to_bytes())
                        .map_err(|e| e.to_string())?,
                )
            }
        })
    }

    pub(super) fn curve(&self) -> Curve {
        match self {
            EcSigningKey::P256(_) => Curve::P256,
            EcSigningKey::P384(_) => Curve::P384,
            EcSigningKey::P521(_) => Curve::P521,
        }
    }

    pub(super) fn verifying_key(&self) -> EcVerifyingKey {
        match self {
            EcSigningKey::P256(key) => EcVerifyingKey::P256(*key.verifying_key()),
            EcSigningKey::P384(key) => EcVerifyingKey::P384(*key.verifying_key()),
            EcSigningKey::P521(key) => EcVerifyingKey::P521(p521::ecdsa::VerifyingKey::from(key)),
        }
    }

    /// ECDSA over the curve's own hash (SHA-256, -384, -512), as `r || s`.
    pub(super) fn sign(&self, message: &[u8]) -> Vec<u8> {
        match self {
            EcSigningKey::P256(key) => {
                let signature: p256::ecdsa::Signature = key.sign(message);
                signature.to_bytes().to_vec()
            }
            EcSigningKey::P384(key) => {
                let signature: p384::ecdsa::Signature = key.sign(message);
                signature.to_bytes().to_vec()
            }
            EcSigningKey::P521(key) => {
                let signature: p521::ecdsa::Signature = key.sign(message);
                signature.to_bytes().to_vec()
            }
        }
    }
}

impl EcVerifyingKey {
    pub(super) fn from_sec1_bytes(curve: Curve, point: &[u8]) -> Result<EcVerifyingKey, String> {
        let invalid =
            |e: p256::ecdsa::Error| format!("x509: invalid elliptic curve public key: {e}");
        Ok(match curve {
            Curve::P256 => EcVerifyingKey::P256(
                p256::ecdsa::VerifyingKey::from_sec1_bytes(point).map_err(invalid)?,
            ),
            Curve::P384 => EcVerifyingKey::P384(
                p384::ecdsa::VerifyingKey::from_sec1_bytes(point).map_err(invalid)?,
            ),
            Curve::P521 => EcVerifyingKey::P521(
                p521::ecdsa::VerifyingKey::from_sec1_bytes(point).map_err(invalid)?,
            ),
        })
    }

    pub(super) fn curve(&self) -> Curve {
        match self {
            EcVerifyingKey::P256(_) => Curve::P256,
            EcVerifyingKey::P384(_) => Curve::P384,
            EcVerifyingKey::P521(_) => Curve::P521,
        }
    }

    /// The point's X and Y as big-endian integers without leading zeros.
    pub(super) fn coordinates(&self) -> (Vec<u8>, Vec<u8>) {
        let uncompressed = match self {
            EcVerifyingKey::P256(key) => key.to_encoded_point(false).as_bytes().to_vec(),
            EcVerifyingKey::P384(key) => key.to_encoded_point(false).as_bytes().to_vec(),
            EcVerifyingKey::P521(key) => key.to_encoded_point(false).as_bytes().to_vec(),
        };
        // 0x04 || X || Y, X and Y of the same width.
        let (x, y) = uncompressed[1..].split_at((uncompressed.len() - 1) / 2);
        (
            strip_leading_zeros(x).to_vec(),
            strip_leading_zeros(y).to_vec(),
        )
    }

    /// `signature` is `r || s` of the curve's width (golang-jwt checks the
    /// length against the method, which signs on this curve).
    pub(super) fn verify(&self, message: &[u8], signature: &[u8]) -> bool {
        match self {
            EcVerifyingKey::P256(key) => p256::ecdsa::Signature::from_slice(signature)
                .is_ok_and(|signature| key.verify(message, &signature).is_ok()),
            EcVerifyingKey::P384(key) => p384::ecdsa::Signature::from_slice(signature)
                .is_ok_and(|signature| key.verify(message, &signature).is_ok()),
            EcVerifyingKey::P521(key) => p521::ecdsa::Signature::from_slice(signature)
                .is_ok_and(|signature| key.verify(message, &signature).is_ok()),
        }
    }
}

/// An RSA public key: its PKCS#1 encoding (what ring checks with) and its
/// modulus and exponent (what etcd compares).
pub(super) struct RsaPublicKey {
    pkcs1_der: Vec<u8>,
    modulus: Vec<u8>,
    exponent: Vec<u8>,
}

impl RsaPublicKey {
    pub(super) fn of(private: &RsaKeyPair) -> RsaPublicKey {
        let components = ring_signature::RsaPublicKeyComponents::<Vec<u8>>::from(private.public());
        RsaPublicKey {
            pkcs1_der: private.public().as_ref().to_vec(),
            modulus: strip_leading_zeros(&components.n).to_vec(),
            exponent: strip_leading_zeros(&components.e).to_vec(),
        }
    }

    pub(super) fn modulus_bits(&self) -> usize {
        match self.modulus.first() {
            None => 0,
            Some(top) => self.modulus.len() * 8 - top.leading_zeros() as usize,
        }
    }
}

pub(super) enum Key {
    Hmac(hmac::Key),
    /// `private` is None on a verify-only member.
    Rsa {
        private: Option<RsaKeyPair>,
        public_pkcs1_der: Vec<u8>,
    },
    Ec {
        private: Option<EcSigningKey>,
        public: EcVerifyingKey,
    },
}

pub(super) fn read_key_file(path: &str) -> Result<Vec<u8>, String> {
    std::fs::read(path).map_err(|err| format!("open {path}: {err}"))
}

/// Go's pem.Decode as golang-jwt uses it: the first PEM block of the file,
/// whatever its label.
pub(super) fn pem_contents(data: &[u8]) -> Result<Vec<u8>, String> {
    pem::parse(data)
        .map(pem::Pem::into_contents)
        .map_err(|_| ERR_KEY_MUST_BE_PEM.to_string())
}

/// golang-jwt's Parse{RSA,EC}PublicKeyFromPEM: a SubjectPublicKeyInfo, else
/// the key of an X.509 certificate.
pub(super) fn with_public_key_info<T>(
    pem: &[u8],
    use_key: impl FnOnce(&SubjectPublicKeyInfo<'_>) -> Result<T, String>,
) -> Result<T, String> {
    let der = pem_contents(pem)?;
    match SubjectPublicKeyInfo::from_der(&der) {
        Ok(([], info)) => use_key(&info),
        _ => match X509Certificate::from_der(&der) {
            Ok((_, certificate)) => use_key(certificate.public_key()),
            Err(err) => Err(format!("x509: failed to parse public key: {err}")),
        },
    }
}

/// options.go's rsaKey.
pub(super) fn rsa_key(
    private_pem: Option<&[u8]>,
    public_pem: Option<&[u8]>,
) -> Result<Key, String> {
    let private = private_pem.map(parse_rsa_private_key).transpose()?;
    let public = public_pem.map(parse_rsa_public_key).transpose()?;
    match (private, public) {
        (None, None) => Err(ERR_MISSING_KEY.into()),
        (None, Some(public)) => {
            let bits = public.modulus_bits();
            if !(2048..=8192).contains(&bits) {
                return Err(format!(
                    "RSA public key of {bits} bits: 2048 to 8192 are supported"
                ));
            }
            Ok(Key::Rsa {
                private: None,
                public_pkcs1_der: public.pkcs1_der,
            })
        }
        (Some(private), public) => {
            let own = RsaPublicKey::of(&private);
            // etcd's test, `&&` and all: only a key differing in both refuses.
            if public.is_some_and(|public| {
                public.exponent != own.exponent && public.modulus != own.modulus
            }) {
                return Err(ERR_KEY_MISMATCH.into());
            }
            Ok(Key::Rsa {
                private: Some(private),
                public_pkcs1_der: own.pkcs1_der,
            })
        }
    }
}

pub(super) fn parse_rsa_private_key(pem: &[u8]) -> Result<RsaKeyPair, String> {
    let der = pem_contents(pem)?;
    let rejected = |err: ring::error::KeyRejected| {
        format!("RSA private key refused: {err} (keys of 2048 to 4096 bits are supported)")
    };
    match pkcs8::PrivateKeyInfo::try_from(der.as_slice()) {
        Ok(info) if info.algorithm.oid.to_string() == OID_RSA_ENCRYPTION => {
            RsaKeyPair::from_pkcs8(&der).map_err(rejected)
        }
        Ok(_) => Err(ERR_NOT_RSA_PRIVATE_KEY.into()),
        // Not PKCS#8: PKCS#1's RSAPrivateKey, or nothing.
        Err(_) => RsaKeyPair::from_der(&der).map_err(rejected),
    }
}

pub(super) fn parse_rsa_public_key(pem: &[u8]) -> Result<RsaPublicKey, String> {
    with_public_key_info(pem, |info| {
        if info.algorithm.algorithm.to_id_string() != OID_RSA_ENCRYPTION {
            return Err(ERR_NOT_RSA_PUBLIC_KEY.into());
        }
        match info.parsed() {
            Ok(x509_parser::public_key::PublicKey::RSA(key)) => Ok(RsaPublicKey {
                pkcs1_der: info.subject_public_key.data.to_vec(),
                modulus: strip_leading_zeros(key.modulus).to_vec(),
                exponent: strip_leading_zeros(key.exponent).to_vec(),
            }),
            _ => Err("x509: invalid RSA public key".into()),
        }
    })
}

/// options.go's ecKey.
pub(super) fn ec_key(private_pem: Option<&[u8]>, public_pem: Option<&[u8]>) -> Result<Key, String> {
    let private = private_pem.map(parse_ec_private_key).transpose()?;
    let public = public_pem.map(parse_ec_public_key).transpose()?;
    match (private, public) {
        (None, None) => Err(ERR_MISSING_KEY.into()),
        (None, Some(public)) => Ok(Key::Ec {
            private: None,
            public,
        }),
        (Some(private), public) => {
            let own = private.verifying_key();
            // etcd's test, `&&` and all: only a key on another curve with
            // both coordinates different refuses.
            if let Some(public) = public {
                let ((x, y), (own_x, own_y)) = (public.coordinates(), own.coordinates());
                if public.curve() != own.curve() && x != own_x && y != own_y {
                    return Err(ERR_KEY_MISMATCH.into());
                }
            }
            Ok(Key::Ec {
                private: Some(private),
                public: own,
            })
        }
    }
}

/// golang-jwt's ParseECPrivateKeyFromPEM: SEC1 (whose curve must be
/// named), else PKCS#8.
pub(super) fn parse_ec_private_key(pem: &[u8]) -> Result<EcSigningKey, String> {
    let der = pem_contents(pem)?;
    if let Ok(key) = sec1::EcPrivateKey::try_from(der.as_slice()) {
        let curve = key
            .parameters
            .and_then(|parameters| parameters.named_curve())
            .ok_or("x509: unknown elliptic curve")?;
        return EcSigningKey::from_sec1_der(Curve::from_oid(&curve.to_string())?, &der);
    }
    let info = pkcs8::PrivateKeyInfo::try_from(der.as_slice())
        .map_err(|err| format!("x509: failed to parse private key: {err}"))?;
    if info.algorithm.oid.to_string() != OID_EC_PUBLIC_KEY {
        return Err(ERR_NOT_EC_PRIVATE_KEY.into());
    }
    let curve = info
        .algorithm
        .parameters_oid()
        .map_err(|_| "x509: unknown elliptic curve".to_string())?;
    EcSigningKey::from_pkcs8_der(Curve::from_oid(&curve.to_string())?, &der)
}

pub(super) fn parse_ec_public_key(pem: &[u8]) -> Result<EcVerifyingKey, String> {
    with_public_key_info(pem, |info| {
        if info.algorithm.algorithm.to_id_string() != OID_EC_PUBLIC_KEY {
            return Err(ERR_NOT_EC_PUBLIC_KEY.into());
        }
        let curve = info
            .algorithm
            .parameters
            .as_ref()
            .and_then(|parameters| parameters.as_oid().ok())
            .ok_or("x509: unknown elliptic curve")?;
        let curve = Curve::from_oid(&curve.to_id_string())?;
        EcVerifyingKey::from_sec1_bytes(curve, &info.subject_public_key.data)
    })
}

pub(super) fn strip_leading_zeros(bytes: &[u8]) -> &[u8] {
    let zeros = bytes.iter().take_while(|&&byte| byte == 0).count();
    &bytes[zeros..]
}

pub(super) fn unix_nanos_now() -> i128 {
    match SystemTime::now().duration_since(UNIX_EPOCH) {
        Ok(since) => since.as_nanos() as i128,
        Err(before) => -(before.duration().as_nanos() as i128),
    }
}
