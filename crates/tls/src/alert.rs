//! TLS failures in Go's words, as etcd logs them: an alert the other side
//! sent is `remote error: tls: <Go's name of the alert>` (Go's
//! crypto/tls/alert.go, wrapped in a `net.OpError` "remote error"), so that a
//! member refused by its peers logs `remote error: tls: bad certificate`
//! as an etcd member does (etcd's e2e tests wait for that line).

use rustls::{AlertDescription, CertificateError};

/// Go's text of a TLS alert: `tls: bad certificate`; an alert Go has no
/// name for is `tls: alert(<code>)`.
pub fn go_alert_text(alert: AlertDescription) -> String {
    use AlertDescription as A;
    let name = match alert {
        A::CloseNotify => "close notify",
        A::UnexpectedMessage => "unexpected message",
        A::BadRecordMac => "bad record MAC",
        A::DecryptionFailed => "decryption failed",
        A::RecordOverflow => "record overflow",
        A::DecompressionFailure => "decompression failure",
        A::HandshakeFailure => "handshake failure",
        A::BadCertificate => "bad certificate",
        A::UnsupportedCertificate => "unsupported certificate",
        A::CertificateRevoked => "revoked certificate",
        A::CertificateExpired => "expired certificate",
        A::CertificateUnknown => "unknown certificate",
        A::IllegalParameter => "illegal parameter",
        A::UnknownCA => "unknown certificate authority",
        A::AccessDenied => "access denied",
        A::DecodeError => "error decoding message",
        A::DecryptError => "error decrypting message",
        A::ProtocolVersion => "protocol version not supported",
        A::InsufficientSecurity => "insufficient security level",
        A::InternalError => "internal error",
        A::InappropriateFallback => "inappropriate fallback",
        A::UserCanceled => "user canceled",
        A::NoRenegotiation => "no renegotiation",
        A::MissingExtension => "missing extension",
        A::UnsupportedExtension => "unsupported extension",
        A::CertificateUnobtainable => "certificate unobtainable",
        A::UnrecognisedName => "unrecognized name",
        A::BadCertificateStatusResponse => "bad certificate status response",
        A::BadCertificateHashValue => "bad certificate hash value",
        A::UnknownPSKIdentity => "unknown PSK identity",
        A::CertificateRequired => "certificate required",
        A::NoApplicationProtocol => "no application protocol",
        A::EncryptedClientHelloRequired => "encrypted client hello required",
        other => return format!("tls: alert({})", u8::from(other)),
    };
    format!("tls: {name}")
}

/// A rustls error as Go's crypto/tls would word it where the two differ
/// in ways etcd's users (and tests) look for: a received alert, and the
/// common certificate verification failures; anything else in rustls's
/// words.
pub fn go_error_text(error: &rustls::Error) -> String {
    match error {
        rustls::Error::AlertReceived(alert) => format!("remote error: {}", go_alert_text(*alert)),
        rustls::Error::InvalidCertificate(reason) => match go_x509_text(reason) {
            Some(x509) => format!("tls: failed to verify certificate: {x509}"),
            None => error.to_string(),
        },
        other => other.to_string(),
    }
}

/// Go's x509 wording of a certificate verification failure, where it has
/// a fixed one.
fn go_x509_text(reason: &CertificateError) -> Option<&'static str> {
    use CertificateError as C;
    Some(match reason {
        C::UnknownIssuer => "x509: certificate signed by unknown authority",
        C::Expired | C::ExpiredContext { .. } | C::NotValidYet | C::NotValidYetContext { .. } => {
            "x509: certificate has expired or is not yet valid"
        }
        C::InvalidPurpose | C::InvalidPurposeContext { .. } => {
            "x509: certificate specifies an incompatible key usage"
        }
        _ => return None,
    })
}

/// [`go_error_text`] of the first rustls error in `error`'s chain of
/// sources (an I/O error from tokio-rustls, a tonic transport error), so
/// that a failed dial reads as Go's would; without one, `error` as it
/// displays, with its sources.
pub fn go_error_chain_text(error: &(dyn std::error::Error + 'static)) -> String {
    let mut current = Some(error);
    while let Some(e) = current {
        if let Some(tls) = e.downcast_ref::<rustls::Error>() {
            return go_error_text(tls);
        }
        // an io::Error shows its inner error as itself, not as a source
        if let Some(inner) = e
            .downcast_ref::<std::io::Error>()
            .and_then(|io| io.get_ref())
            .and_then(|inner| inner.downcast_ref::<rustls::Error>())
        {
            return go_error_text(inner);
        }
        current = e.source();
    }
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(e) = source {
        let more = e.to_string();
        if !text.contains(&more) {
            text.push_str(": ");
            text.push_str(&more);
        }
        source = e.source();
    }
    text
}
