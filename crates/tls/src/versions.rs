//! TLS versions and cipher suites by etcd's names (client/pkg/tlsutil).

use std::fmt;

use rustls::crypto::ring::cipher_suite as ring;
use rustls::SupportedCipherSuite;

use crate::TlsError;

/// `--tls-min-version` / `--tls-max-version` values.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum TlsVersion {
    Tls12,
    Tls13,
}

impl TlsVersion {
    pub(crate) fn rustls(self) -> &'static rustls::SupportedProtocolVersion {
        match self {
            TlsVersion::Tls12 => &rustls::version::TLS12,
            TlsVersion::Tls13 => &rustls::version::TLS13,
        }
    }
}

impl fmt::Display for TlsVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            TlsVersion::Tls12 => "TLS1.2",
            TlsVersion::Tls13 => "TLS1.3",
        })
    }
}

/// etcd's tlsutil.GetTLSVersion.
pub fn parse_version(name: &str) -> Result<TlsVersion, TlsError> {
    match name {
        "TLS1.2" => Ok(TlsVersion::Tls12),
        "TLS1.3" => Ok(TlsVersion::Tls13),
        other => Err(TlsError::Config(format!(
            "unexpected TLS version {other:?} (must be one of: TLS1.2, TLS1.3)"
        ))),
    }
}

/// Go's TLS 1.3 suites: always on, so naming them changes nothing.
const TLS13: [&str; 3] = [
    "TLS_AES_128_GCM_SHA256",
    "TLS_AES_256_GCM_SHA384",
    "TLS_CHACHA20_POLY1305_SHA256",
];

/// The rest of Go's `tls.CipherSuites()` and `tls.InsecureCipherSuites()`
/// (what etcd accepts): CBC, RC4, 3DES and RSA key exchange, which rustls
/// does not implement.
const WITHOUT_RUSTLS: [&str; 17] = [
    "TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA",
    "TLS_ECDHE_ECDSA_WITH_AES_256_CBC_SHA",
    "TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA",
    "TLS_ECDHE_RSA_WITH_AES_256_CBC_SHA",
    "TLS_RSA_WITH_RC4_128_SHA",
    "TLS_RSA_WITH_3DES_EDE_CBC_SHA",
    "TLS_RSA_WITH_AES_128_CBC_SHA",
    "TLS_RSA_WITH_AES_256_CBC_SHA",
    "TLS_RSA_WITH_AES_128_CBC_SHA256",
    "TLS_RSA_WITH_AES_128_GCM_SHA256",
    "TLS_RSA_WITH_AES_256_GCM_SHA384",
    "TLS_ECDHE_ECDSA_WITH_RC4_128_SHA",
    "TLS_ECDHE_RSA_WITH_RC4_128_SHA",
    "TLS_ECDHE_RSA_WITH_3DES_EDE_CBC_SHA",
    "TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA256",
    "TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA256",
    "TLS_ECDHE_RSA_WITH_AES_256_CBC_SHA384",
];

/// A `--cipher-suites` name: the TLS 1.2 suite it enables (None for a TLS
/// 1.3 name, always enabled). A name Go does not know is refused with
/// etcd's message; one Go knows but rustls does not implement is refused at
/// start too, rather than silently ignored.
pub fn cipher_suite(name: &str) -> Result<Option<SupportedCipherSuite>, TlsError> {
    let suite = match name {
        "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256" => ring::TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256,
        "TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384" => ring::TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384,
        "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256" => {
            ring::TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256
        }
        "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256" => ring::TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256,
        "TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384" => ring::TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384,
        "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256" => {
            ring::TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256
        }
        _ if TLS13.contains(&name) => return Ok(None),
        _ if WITHOUT_RUSTLS.contains(&name) => {
            return Err(TlsError::Config(format!(
                "TLS cipher suite {name:?} is not supported by oxcd (rustls implements no CBC, \
                 RC4, 3DES or RSA key exchange suite)"
            )))
        }
        _ => {
            return Err(TlsError::Config(format!(
                "unexpected TLS cipher suite {name:?}"
            )))
        }
    };
    Ok(Some(suite))
}
