//! The certificates oxcd makes itself (auto-TLS), signed with ECDSA P-521
//! and SHA-512 as Go's `x509.CreateCertificate` makes etcd's: rcgen on ring
//! cannot sign with P-521, so the DER is written here, field by field in
//! Go's order and encodings:
//! - names: one RDN per attribute, Organization before Common Name, each a
//!   PrintableString when it can be, else a UTF8String;
//! - validity: UTCTime for years 1950 to 2049, GeneralizedTime otherwise;
//! - extensions: key usage (critical), extended key usage, basic
//!   constraints (critical), subject alternative names (DNS names first,
//!   then IP addresses); no key identifiers (Go makes one only for a CA).

use p521::elliptic_curve::rand_core::{OsRng, RngCore};
use p521::pkcs8::EncodePublicKey;

use crate::TlsError;

const ECDSA_WITH_SHA512: &[u8] = &[0x2a, 0x86, 0x48, 0xce, 0x3d, 0x04, 0x03, 0x04];
const SECP521R1: &[u8] = &[0x2b, 0x81, 0x04, 0x00, 0x23];
const ORGANIZATION: &[u8] = &[0x55, 0x04, 0x0a];
const COMMON_NAME: &[u8] = &[0x55, 0x04, 0x03];
const KEY_USAGE: &[u8] = &[0x55, 0x1d, 0x0f];
const EXT_KEY_USAGE: &[u8] = &[0x55, 0x1d, 0x25];
const BASIC_CONSTRAINTS: &[u8] = &[0x55, 0x1d, 0x13];
const SUBJECT_ALT_NAME: &[u8] = &[0x55, 0x1d, 0x11];
const SERVER_AUTH: &[u8] = &[0x2b, 0x06, 0x01, 0x05, 0x05, 0x07, 0x03, 0x01];
const CLIENT_AUTH: &[u8] = &[0x2b, 0x06, 0x01, 0x05, 0x05, 0x07, 0x03, 0x02];

/// An X.509 name: Go's `pkix.Name` with the two fields etcd uses.
#[derive(Clone, Debug, Default)]
pub(crate) struct Name {
    pub organization: Option<String>,
    pub common_name: Option<String>,
}

/// What a certificate is for (its extended key usages).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Purpose {
    ServerAuth,
    #[cfg_attr(not(test), allow(dead_code))] // etcd's certificates are for servers
    ClientAuth,
}

/// A certificate to sign: Go's `x509.Certificate` template, as much of it
/// as oxcd fills.
pub(crate) struct Template<'a> {
    pub subject: Name,
    pub not_before: time::OffsetDateTime,
    pub not_after: time::OffsetDateTime,
    /// A CA (key usage cert and CRL signing) or a leaf (digital signature
    /// and key encipherment).
    pub is_ca: bool,
    pub purposes: &'a [Purpose],
    /// IP addresses become IP SANs, anything else DNS SANs.
    pub hosts: &'a [String],
}

/// The DER certificate of `public` for `template`, signed by `issuer`'s key
/// under `issuer`'s name (self-signed: the subject's own).
pub(crate) fn sign_p521(
    template: &Template<'_>,
    public: &p521::PublicKey,
    issuer: (&Name, &p521::SecretKey),
) -> Result<Vec<u8>, TlsError> {
    let (issuer_name, issuer_key) = issuer;
    let spki = public
        .to_public_key_der()
        .map_err(|e| TlsError::Config(format!("cannot encode the public key: {e}")))?;
    let algorithm = seq(&[tlv(0x06, ECDSA_WITH_SHA512)]);
    let tbs = seq(&[
        tlv(0xa0, &tlv(0x02, &[2])),
        tlv(0x02, &unsigned(&random_serial())),
        algorithm.clone(),
        name(issuer_name),
        seq(&[time(template.not_before)?, time(template.not_after)?]),
        name(&template.subject),
        spki.as_bytes().to_vec(),
        tlv(0xa3, &seq(&extensions(template)?)),
    ]);
    let signer = p521::ecdsa::SigningKey::from_bytes(&issuer_key.to_bytes())
        .map_err(|e| TlsError::Config(format!("not an ECDSA P-521 key: {e}")))?;
    let signature: p521::ecdsa::Signature = p521::ecdsa::signature::Signer::try_sign(&signer, &tbs)
        .map_err(|e| TlsError::Config(format!("cannot sign the certificate: {e}")))?;
    let mut bits = vec![0u8];
    bits.extend_from_slice(signature.to_der().as_bytes());
    Ok(seq(&[tbs, algorithm, tlv(0x03, &bits)]))
}

/// The SEC1 DER of a P-521 key as Go's `MarshalECPrivateKey` writes it,
/// naming its curve (RustCrypto's leaves the curve out, which Go, and so
/// etcd, cannot load).
pub(crate) fn sec1_p521(key: &p521::SecretKey) -> Vec<u8> {
    let point = key.public_key().to_sec1_bytes();
    let mut bits = vec![0u8];
    bits.extend_from_slice(&point);
    seq(&[
        tlv(0x02, &[1]),
        tlv(0x04, &key.to_bytes()),
        tlv(0xa0, &tlv(0x06, SECP521R1)),
        tlv(0xa1, &tlv(0x03, &bits)),
    ])
}

/// Go's: a random 128-bit serial number.
fn random_serial() -> [u8; 16] {
    let mut serial = [0u8; 16];
    OsRng.fill_bytes(&mut serial);
    if serial.iter().all(|b| *b == 0) {
        serial[15] = 1; // a serial number is positive
    }
    serial
}

fn extensions(template: &Template<'_>) -> Result<Vec<Vec<u8>>, TlsError> {
    // bits from the left: digitalSignature 0, keyEncipherment 2,
    // keyCertSign 5, cRLSign 6
    let usage: u8 = if template.is_ca {
        0b1000_0110
    } else {
        0b1010_0000
    };
    let mut extensions = vec![extension(
        KEY_USAGE,
        true,
        &tlv(0x03, &[usage.trailing_zeros() as u8, usage]),
    )];
    if !template.purposes.is_empty() {
        let purposes: Vec<Vec<u8>> = template
            .purposes
            .iter()
            .map(|p| match p {
                Purpose::ServerAuth => tlv(0x06, SERVER_AUTH),
                Purpose::ClientAuth => tlv(0x06, CLIENT_AUTH),
            })
            .collect();
        extensions.push(extension(EXT_KEY_USAGE, false, &seq(&purposes)));
    }
    let constraints = match template.is_ca {
        true => seq(&[tlv(0x01, &[0xff])]),
        false => seq(&[]),
    };
    extensions.push(extension(BASIC_CONSTRAINTS, true, &constraints));
    let mut dns = Vec::new();
    let mut ips = Vec::new();
    for host in template.hosts {
        match host.trim_matches(['[', ']']).parse::<std::net::IpAddr>() {
            Ok(std::net::IpAddr::V4(ip)) => ips.push(tlv(0x87, &ip.octets())),
            Ok(std::net::IpAddr::V6(ip)) => ips.push(tlv(0x87, &ip.octets())),
            Err(_) if host.is_ascii() && !host.is_empty() => dns.push(tlv(0x82, host.as_bytes())),
            Err(_) => return Err(TlsError::Config(format!("host {host:?}: not a DNS name"))),
        }
    }
    if !dns.is_empty() || !ips.is_empty() {
        dns.extend(ips);
        // critical only when the subject is empty (RFC 5280 4.2.1.6)
        let empty =
            template.subject.organization.is_none() && template.subject.common_name.is_none();
        extensions.push(extension(SUBJECT_ALT_NAME, empty, &seq(&dns)));
    }
    Ok(extensions)
}

fn extension(oid: &[u8], critical: bool, value: &[u8]) -> Vec<u8> {
    let mut parts = vec![tlv(0x06, oid)];
    if critical {
        parts.push(tlv(0x01, &[0xff]));
    }
    parts.push(tlv(0x04, value));
    seq(&parts)
}

fn name(name: &Name) -> Vec<u8> {
    let attribute = |oid: &[u8], value: &str| {
        let tag = if value.bytes().all(printable) {
            0x13
        } else {
            0x0c
        };
        tlv(0x31, &seq(&[tlv(0x06, oid), tlv(tag, value.as_bytes())]))
    };
    let mut rdns = Vec::new();
    if let Some(o) = &name.organization {
        rdns.push(attribute(ORGANIZATION, o));
    }
    if let Some(cn) = &name.common_name {
        rdns.push(attribute(COMMON_NAME, cn));
    }
    seq(&rdns)
}

/// ASN.1 PrintableString's alphabet.
fn printable(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b" '()+,-./:=?".contains(&b)
}

fn time(at: time::OffsetDateTime) -> Result<Vec<u8>, TlsError> {
    let at = at.to_offset(time::UtcOffset::UTC);
    let (year, month, day) = (at.year(), u8::from(at.month()), at.day());
    let (hour, minute, second) = (at.hour(), at.minute(), at.second());
    if !(0..=9999).contains(&year) {
        return Err(TlsError::Config(format!("year {year} out of range")));
    }
    let (tag, text) = if (1950..2050).contains(&year) {
        let yy = year % 100;
        (
            0x17,
            format!("{yy:02}{month:02}{day:02}{hour:02}{minute:02}{second:02}Z"),
        )
    } else {
        (
            0x18,
            format!("{year:04}{month:02}{day:02}{hour:02}{minute:02}{second:02}Z"),
        )
    };
    Ok(tlv(tag, text.as_bytes()))
}

/// A DER INTEGER's content for an unsigned big-endian number.
fn unsigned(bytes: &[u8]) -> Vec<u8> {
    let start = bytes
        .iter()
        .position(|b| *b != 0)
        .unwrap_or(bytes.len() - 1);
    let mut content = Vec::with_capacity(bytes.len() + 1);
    if bytes[start] & 0x80 != 0 {
        content.push(0);
    }
    content.extend_from_slice(&bytes[start..]);
    content
}

fn seq(parts: &[Vec<u8>]) -> Vec<u8> {
    tlv(0x30, &parts.concat())
}

/// Tag, DER length, content.
fn tlv(tag: u8, content: &[u8]) -> Vec<u8> {
    let mut out = vec![tag];
    let len = content.len();
    if len < 0x80 {
        out.push(len as u8);
    } else {
        let bytes = len.to_be_bytes();
        let skip = bytes.iter().take_while(|b| **b == 0).count();
        out.push(0x80 | (bytes.len() - skip) as u8);
        out.extend_from_slice(&bytes[skip..]);
    }
    out.extend_from_slice(content);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn der_lengths_and_integers_are_minimal() {
        assert_eq!(tlv(0x04, &[7; 3]), vec![0x04, 3, 7, 7, 7]);
        assert_eq!(&tlv(0x04, &[0; 200])[..3], &[0x04, 0x81, 200]);
        assert_eq!(&tlv(0x04, &[0; 300])[..4], &[0x04, 0x82, 0x01, 0x2c]);
        assert_eq!(unsigned(&[0, 0, 0x7f]), vec![0x7f]);
        assert_eq!(unsigned(&[0, 0x80, 1]), vec![0, 0x80, 1]);
        assert_eq!(unsigned(&[0, 0]), vec![0]);
    }

    #[test]
    fn times_are_utc_until_2049_then_generalized() {
        let at = |y: i32| {
            time::Date::from_calendar_date(y, time::Month::March, 4)
                .unwrap()
                .with_hms(5, 6, 7)
                .unwrap()
                .assume_utc()
        };
        assert_eq!(time(at(2049)).unwrap(), tlv(0x17, b"490304050607Z"));
        assert_eq!(time(at(2050)).unwrap(), tlv(0x18, b"20500304050607Z"));
    }
}
