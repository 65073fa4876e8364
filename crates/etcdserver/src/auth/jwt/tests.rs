use super::*;
use p256::elliptic_curve::rand_core::OsRng;
use p256::elliptic_curve::sec1::ToEncodedPoint as _;
use p256::pkcs8::{EncodePrivateKey as _, EncodePublicKey as _, LineEnding};
use sec1::der::Encode as _;

/// A 2048-bit RSA key made for these tests (`openssl genpkey`), PKCS#8.
const RSA_PKCS8: &str = "\
-----BEGIN PRIVATE KEY-----\n\
MIIEvAIBADANBgkqhkiG9w0BAQEFAASCBKYwggSiAgEAAoIBAQDGS6ugzOnwlkE6\n\
ortw1jBzrWOL9T5rEN7uW/n6+WG6e1hhCZoFpL/AUWvwxp94AdDUTvQT4DBarEKH\n\
IoQJ2LkkCSgoUVx23Ca7j90Sc7e7Ww2XFTTiTdch0fktS8RSkKKPn+/9WYpP8O1/\n\
d8zMJ5YE6SBQWRyxBKysZ7O4wHwhm3EEU+7f9jtpkkj0DbwC0TxHVLra8+Hd8Mtu\n\
n+qsfJ3QnQfBt/T5Mimw3/6SRp7342u30f0fL6fwxtNLJ9qIltgmCNe3cD/wgTRa\n\
XUM/EzhSr0zAucvpisZHxuqF/PuibIsHqc2zO56qhOTboGGpe8kQrEoC3F8hqLFl\n\
eVDkRPS3AgMBAAECggEAB/ED4J6+8mmyFxJpW1gt/JQBxpsocsqW2F5KoVMs0iEa\n\
ewMSw2MZDYS1Q/alxafySxkWYVgQglvKa6BllVdeos4oaOTz77awE8GWjaSgw8TJ\n\
GIyQNPf/w6pQcRCgaNtuBz5/3VpMAG5FCgksOd45UzJa9Ed9WgGL63kDvkRx3uP0\n\
DwjrcYgcRWkWwW/908Syuj0jbAzGq0TsSoM+LDe6dkAJ/05nT/6JDils0vpe+hfg\n\
vFdtgu+tjRMyY/DjbMCC/aVabTJ//LC1BiDyXMw4Mw3i5dWkrJ/Kq+lLJW6kbgIq\n\
B0nSUyMTM+b8rv9PRTL5dWqrHFdIgAkQd0KS8/EAAQKBgQDrXpOuSn3LxGgyI47V\n\
lxw4ZcU0aSYgKZLMqcsneqfY4kZ7JjfCKahLs5nhZ9CtE4nzB4NEykWkGkHFuxY3\n\
XEgxBIY1ejhb/6c6a+q1wF8Lm2KWN+uytnbn9l1o4SMEH4vtX4NkVdcxtzBfpw6n\n\
gI5UqdvZtPd44ZRag0412SiAAQKBgQDXrTLHNG7U7zlrKhdSxjwFnEIMqyK89BDK\n\
Ft86wvmBsrokX2EfInWK0g0OfwFtEUNIShLY349CQLI7W9wejxXIJdVWXge42AJy\n\
/Wfn50VXYK3dHvVCI33L4VBedctqNyGi6YOQWc86IujIgcDomj2hXDPwbvP3zuo4\n\
Sl2bzlF0twKBgAbTxnrexEld2BvkNidx66qjIRZFGosCSbTQFAmAIFBFOAAoeqOS\n\
K8SOYB9OsJnkoDLBfAhJyb1Z2aCPrbRLY/iwBeiVM/9PKh2itbsx6k/e4Pw0gQy9\n\
CDPwTINXTHm5JIjtJVWKu+RASRHtOZqYOwivqKXm/uqtuGzrtCARvYABAoGAeNyw\n\
Vf3GFkGxFaLSyyoXvLUiNmM45laHihhjJFTa6Zm0wmlIzd/Lqu2nL3Zw4CQKZlpM\n\
UYiGiYQj3SvPILjiZfT9ppavESDLzpC/R6/MpfihtgaBPn0RI82x8h1kzrLygI8H\n\
kT8i59tkQ+iiqDa3TtOSr6wdv8MOclkKOCPYdeUCgYAvG5AKpO/zouxmS1PlkY8Z\n\
GxpQioa6Ln3GnYgzVHHLa5KHPvVm/EjAi0BdiCCmWDjTRZhP69+FgzPcZVIgSdCF\n\
UdaS268ajRpk1uZEXU2GgR7V80oEBUfEIph8EpTSWti6CGTeGD1pcI86OX3Cz5bd\n\
kAvssn2SP+YlkW15VUX98A==\n\
-----END PRIVATE KEY-----\n";

/// 2023-11-14T22:13:20.4Z, in nanoseconds.
const T0: i128 = 1_700_000_000_400_000_000;
const T0_SECONDS: i64 = 1_700_000_000;

struct EcFiles {
    sec1: String,
    /// SEC1 without the curve's name (as RustCrypto writes it).
    sec1_unnamed: String,
    pkcs8: String,
    public: String,
}

/// Key files of every kind etcd reads, in a temporary directory.
struct Fixture {
    dir: tempfile::TempDir,
    secret: String,
    rsa_pkcs1: String,
    rsa_pkcs8: String,
    rsa_public: String,
    rsa_certificate: String,
    /// P-256, P-384, P-521.
    ec: Vec<EcFiles>,
    ec_certificate: String,
}

impl Fixture {
    fn new() -> Fixture {
        let dir = tempfile::tempdir().unwrap();
        let write = |name: &str, contents: &[u8]| {
            let path = dir.path().join(name);
            std::fs::write(&path, contents).unwrap();
            path.to_str().unwrap().to_owned()
        };
        let pkcs8_der = pem::parse(RSA_PKCS8).unwrap().into_contents();
        let pkcs1_der = pkcs8::PrivateKeyInfo::try_from(pkcs8_der.as_slice())
            .unwrap()
            .private_key
            .to_vec();
        let rsa_pkcs1_pem = pem::encode(&pem::Pem::new("RSA PRIVATE KEY", pkcs1_der));
        let rsa = rcgen::KeyPair::from_pem(RSA_PKCS8).unwrap();
        let rsa_certificate = rcgen::CertificateParams::new(vec!["rsa".into()])
            .unwrap()
            .self_signed(&rsa)
            .unwrap();
        macro_rules! ec_files {
            ($curve:ident, $name:ident) => {{
                let secret = $curve::SecretKey::random(&mut OsRng);
                let name = stringify!($curve);
                // As openssl writes it: with the curve's name, which Go requires.
                let sec1_der = sec1::EcPrivateKey {
                    private_key: &secret.to_bytes(),
                    parameters: Some(sec1::EcParameters::NamedCurve(
                        <$curve::$name as pkcs8::AssociatedOid>::OID,
                    )),
                    public_key: Some(secret.public_key().to_encoded_point(false).as_bytes()),
                }
                .to_der()
                .unwrap();
                EcFiles {
                    sec1: write(
                        &format!("{name}.sec1"),
                        pem::encode(&pem::Pem::new("EC PRIVATE KEY", sec1_der)).as_bytes(),
                    ),
                    sec1_unnamed: write(
                        &format!("{name}.sec1-unnamed"),
                        secret.to_sec1_pem(LineEnding::LF).unwrap().as_bytes(),
                    ),
                    pkcs8: write(
                        &format!("{name}.pkcs8"),
                        secret.to_pkcs8_pem(LineEnding::LF).unwrap().as_bytes(),
                    ),
                    public: write(
                        &format!("{name}.pub"),
                        secret
                            .public_key()
                            .to_public_key_pem(LineEnding::LF)
                            .unwrap()
                            .as_bytes(),
                    ),
                }
            }};
        }
        let ec = vec![
            ec_files!(p256, NistP256),
            ec_files!(p384, NistP384),
            ec_files!(p521, NistP521),
        ];
        let ec_key =
            rcgen::KeyPair::from_pem(&std::fs::read_to_string(&ec[0].pkcs8).unwrap()).unwrap();
        let ec_certificate = rcgen::CertificateParams::new(vec!["ec".into()])
            .unwrap()
            .self_signed(&ec_key)
            .unwrap();
        Fixture {
            secret: write("secret", b"any file: its raw bytes are the HMAC secret\n"),
            rsa_pkcs1: write("rsa.pkcs1", rsa_pkcs1_pem.as_bytes()),
            rsa_pkcs8: write("rsa.pkcs8", RSA_PKCS8.as_bytes()),
            rsa_public: write("rsa.pub", rsa.public_key_pem().as_bytes()),
            rsa_certificate: write("rsa.crt", rsa_certificate.pem().as_bytes()),
            ec_certificate: write("ec.crt", ec_certificate.pem().as_bytes()),
            ec,
            dir,
        }
    }

    fn write(&self, name: &str, contents: &[u8]) -> String {
        let path = self.dir.path().join(name);
        std::fs::write(&path, contents).unwrap();
        path.to_str().unwrap().to_owned()
    }

    fn ec_files(&self, curve: Curve) -> &EcFiles {
        &self.ec[curve as usize]
    }

    /// The private key file and (but for HS*) the public one `method` signs with.
    fn keys(&self, method: SignMethod) -> (&str, Option<&str>) {
        match method.family {
            Family::Hmac => (&self.secret, None),
            Family::RsaPkcs1 | Family::RsaPss => (&self.rsa_pkcs1, Some(&self.rsa_public)),
            Family::Ecdsa => {
                let files = self.ec_files(method.curve());
                (&files.sec1, Some(&files.public))
            }
        }
    }
}

fn options(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(key, value)| (key.to_string(), value.to_string()))
        .collect()
}

fn member(alg: &str, private: Option<&str>, public: Option<&str>) -> Result<JwtTokens, String> {
    let mut opts = options(&[(OPT_SIGN_METHOD, alg)]);
    opts.extend(private.map(|path| (OPT_PRIVATE_KEY.to_string(), path.to_string())));
    opts.extend(public.map(|path| (OPT_PUBLIC_KEY.to_string(), path.to_string())));
    JwtTokens::new(&opts)
}

fn method_named(alg: &str) -> SignMethod {
    SIGN_METHODS
        .into_iter()
        .find(|method| method.alg == alg)
        .unwrap()
}

/// A token with this header and claims JSON, signed with HS256 and `secret`.
fn hs256_token(secret: &[u8], header: &str, claims: &str) -> String {
    let input = format!("{}.{}", SEGMENT.encode(header), SEGMENT.encode(claims));
    let signature = hmac::sign(&hmac::Key::new(hmac::HMAC_SHA256, secret), input.as_bytes());
    format!("{input}.{}", SEGMENT.encode(signature))
}

fn some(username: &str, revision: u64) -> Option<(String, u64)> {
    Some((username.to_owned(), revision))
}

#[test]
fn every_sign_method_round_trips_and_a_public_key_alone_only_verifies() {
    // etcd's TestJWTInfo, over all twelve methods.
    let fixture = Fixture::new();
    for method in SIGN_METHODS {
        let (private, public) = fixture.keys(method);
        let signer = member(method.alg, Some(private), public).unwrap();
        let token = signer.assign("abc", 123).unwrap();
        assert_eq!(signer.info(&token), some("abc", 123), "{}", method.alg);
        assert_eq!(signer.info("aaa"), None);
        if let Some(public) = public {
            let verifier = member(method.alg, None, Some(public)).unwrap();
            assert_eq!(verifier.info(&token), some("abc", 123), "{}", method.alg);
            assert_eq!(verifier.assign("abc", 123), Err(rpctypes::VERIFY_ONLY_KEY));
        }
    }
}

#[test]
fn public_key_may_be_a_certificate() {
    // etcd's own test passes server.crt as pub-key.
    let fixture = Fixture::new();
    let cases = [
        ("RS256", &fixture.rsa_pkcs8, &fixture.rsa_certificate),
        ("PS384", &fixture.rsa_pkcs8, &fixture.rsa_certificate),
        (
            "ES256",
            &fixture.ec_files(Curve::P256).pkcs8,
            &fixture.ec_certificate,
        ),
    ];
    for (alg, private, certificate) in cases {
        let token = member(alg, Some(private), None)
            .unwrap()
            .assign("u", 9)
            .unwrap();
        let verifier = member(alg, None, Some(certificate)).unwrap();
        assert_eq!(verifier.info(&token), some("u", 9), "{alg}");
        assert!(member(alg, Some(private), Some(certificate)).is_ok());
    }
}

#[test]
fn private_keys_in_pkcs1_pkcs8_and_sec1_are_the_same_key() {
    let fixture = Fixture::new();
    let mut pairs = vec![("RS512", &fixture.rsa_pkcs1, &fixture.rsa_pkcs8)];
    for (alg, curve) in [
        ("ES256", Curve::P256),
        ("ES384", Curve::P384),
        ("ES512", Curve::P521),
    ] {
        pairs.push((
            alg,
            &fixture.ec_files(curve).sec1,
            &fixture.ec_files(curve).pkcs8,
        ));
    }
    for (alg, one, other) in pairs {
        let (one, other) = (
            member(alg, Some(one), None).unwrap(),
            member(alg, Some(other), None).unwrap(),
        );
        assert_eq!(
            other.info(&one.assign("u", 1).unwrap()),
            some("u", 1),
            "{alg}"
        );
        assert_eq!(
            one.info(&other.assign("u", 2).unwrap()),
            some("u", 2),
            "{alg}"
        );
    }
}

#[test]
fn token_expires_after_the_ttl() {
    let fixture = Fixture::new();
    let with_ttl = |ttl: &str| {
        JwtTokens::new(&options(&[
            (OPT_SIGN_METHOD, "HS256"),
            (OPT_PRIVATE_KEY, &fixture.secret),
            (OPT_TTL, ttl),
        ]))
        .unwrap()
    };
    // exp = floor(now + ttl); valid while now (in whole seconds) < exp.
    let tokens = with_ttl("90s");
    let token = tokens.assign_at("u", 3, T0).unwrap();
    assert_eq!(tokens.info_at(&token, T0_SECONDS), some("u", 3));
    assert_eq!(tokens.info_at(&token, T0_SECONDS + 89), some("u", 3));
    assert_eq!(tokens.info_at(&token, T0_SECONDS + 90), None);
    // 0.4s + 700ms crosses into the next second: valid for that one second.
    let tokens = with_ttl("700ms");
    let token = tokens.assign_at("u", 3, T0).unwrap();
    assert_eq!(tokens.info_at(&token, T0_SECONDS), some("u", 3));
    assert_eq!(tokens.info_at(&token, T0_SECONDS + 1), None);
    // ttl=0 and negative ttls make tokens that are born expired, as in etcd.
    for ttl in ["0", "-1m"] {
        let tokens = with_ttl(ttl);
        assert_eq!(
            tokens.info_at(&tokens.assign_at("u", 3, T0).unwrap(), T0_SECONDS),
            None,
            "{ttl}"
        );
    }
}

#[test]
fn token_signed_with_another_key_is_refused() {
    let (fixture, other) = (Fixture::new(), Fixture::new());
    let other_secret = fixture.write("other-secret", b"another secret");
    let hs = member("HS256", Some(&fixture.secret), None).unwrap();
    let token = member("HS256", Some(&other_secret), None)
        .unwrap()
        .assign("u", 1)
        .unwrap();
    assert_eq!(hs.info(&token), None);
    for alg in ["ES256", "ES384", "ES512"] {
        let curve = method_named(alg).curve();
        let ours = member(alg, Some(&fixture.ec_files(curve).sec1), None).unwrap();
        let token = member(alg, Some(&other.ec_files(curve).sec1), None)
            .unwrap()
            .assign("u", 1)
            .unwrap();
        assert_eq!(ours.info(&token), None, "{alg}");
    }
    // One RSA key only: forge instead, new claims under a real signature.
    for alg in ["RS256", "PS256"] {
        let rsa = member(alg, Some(&fixture.rsa_pkcs8), None).unwrap();
        let token = rsa.assign("u", 1).unwrap();
        let segments: Vec<&str> = token.split('.').collect();
        let claims = String::from_utf8(SEGMENT.decode(segments[1]).unwrap())
            .unwrap()
            .replace("\"u\"", "\"root\"");
        let forged = format!("{}.{}.{}", segments[0], SEGMENT.encode(claims), segments[2]);
        assert_eq!(rsa.info(&forged), None, "{alg}");
        assert_eq!(rsa.info(&token), some("u", 1));
    }
}

#[test]
fn token_with_another_alg_is_refused() {
    let fixture = Fixture::new();
    let rs256 = member("RS256", Some(&fixture.rsa_pkcs8), None).unwrap();
    let ps256 = member("PS256", Some(&fixture.rsa_pkcs8), None).unwrap();
    assert_eq!(rs256.info(&ps256.assign("u", 1).unwrap()), None);
    assert_eq!(ps256.info(&rs256.assign("u", 1).unwrap()), None);
    // The classic confusion: HS256 keyed with the RSA public key file.
    let public = std::fs::read(&fixture.rsa_public).unwrap();
    let exp = T0_SECONDS + 60;
    let claims = format!(r#"{{"exp":{exp},"revision":1,"username":"root"}}"#);
    let confused = hs256_token(&public, r#"{"alg":"HS256","typ":"JWT"}"#, &claims);
    assert_eq!(rs256.info_at(&confused, T0_SECONDS), None);
    let unsigned = format!(
        "{}.{}.",
        SEGMENT.encode(r#"{"alg":"none","typ":"JWT"}"#),
        SEGMENT.encode(&claims)
    );
    assert_eq!(rs256.info_at(&unsigned, T0_SECONDS), None);
    let hs = member("HS256", Some(&fixture.secret), None).unwrap();
    assert_eq!(hs.info_at(&unsigned, T0_SECONDS), None);
    // ES256 and ES384 members with the same (P-256) key: the alg decides.
    let p256 = &fixture.ec_files(Curve::P256).sec1;
    let es384 = member("ES384", Some(p256), None).unwrap();
    assert_eq!(
        es384.info(
            &member("ES256", Some(p256), None)
                .unwrap()
                .assign("u", 1)
                .unwrap()
        ),
        None
    );
}

#[test]
fn claims_are_read_as_golang_jwt_reads_them() {
    let fixture = Fixture::new();
    let secret = std::fs::read(&fixture.secret).unwrap();
    let tokens = member("HS256", Some(&fixture.secret), None).unwrap();
    let header = r#"{"alg":"HS256","typ":"JWT"}"#;
    let (future, past) = (T0_SECONDS + 60, T0_SECONDS - 60);
    let info = |header: &str, claims: &str| {
        tokens.info_at(&hs256_token(&secret, header, claims), T0_SECONDS)
    };
    // Field order, extra fields and spacing do not matter.
    let reordered =
        format!(r#"{{ "username" : "u", "extra": [1], "revision": 5, "exp": {future} }}"#);
    assert_eq!(
        info(r#"{"typ":"JWT", "kid":"x", "alg":"HS256"}"#, &reordered),
        some("u", 5)
    );
    assert_eq!(
        info(
            header,
            &format!("{{\"exp\":{future},\"revision\":5,\"username\":\"u\"}} trailing")
        ),
        some("u", 5)
    );
    // etcd's TestJWTTokenWithMissingFields.
    assert_eq!(
        info(header, &format!(r#"{{"exp":{future},"revision":5}}"#)),
        None
    );
    assert_eq!(
        info(header, &format!(r#"{{"exp":{future},"username":"u"}}"#)),
        None
    );
    assert_eq!(
        info(
            header,
            &format!(r#"{{"exp":{future},"revision":5,"username":7}}"#)
        ),
        None
    );
    assert_eq!(
        info(
            header,
            &format!(r#"{{"exp":{future},"revision":"5","username":"u"}}"#)
        ),
        None
    );
    // The revision is a float64 in Go.
    assert_eq!(
        info(
            header,
            &format!(r#"{{"exp":{future},"revision":1e2,"username":"u"}}"#)
        ),
        some("u", 100)
    );
    assert_eq!(
        info(
            header,
            &format!(r#"{{"exp":{future},"revision":2.9,"username":"u"}}"#)
        ),
        some("u", 2)
    );
    // exp, iat and nbf are checked only when present (and not 0).
    assert_eq!(
        info(header, r#"{"revision":5,"username":"u"}"#),
        some("u", 5)
    );
    assert_eq!(
        info(header, r#"{"exp":0,"revision":5,"username":"u"}"#),
        some("u", 5)
    );
    assert_eq!(
        info(
            header,
            &format!(r#"{{"exp":{past},"revision":5,"username":"u"}}"#)
        ),
        None
    );
    assert_eq!(
        info(header, r#"{"exp":"never","revision":5,"username":"u"}"#),
        None
    );
    assert_eq!(
        info(header, r#"{"exp":null,"revision":5,"username":"u"}"#),
        None
    );
    assert_eq!(
        info(
            header,
            &format!(r#"{{"nbf":{future},"revision":5,"username":"u"}}"#)
        ),
        None
    );
    assert_eq!(
        info(
            header,
            &format!(r#"{{"iat":{future},"revision":5,"username":"u"}}"#)
        ),
        None
    );
    assert_eq!(
        info(
            header,
            &format!(r#"{{"iat":{past},"nbf":{T0_SECONDS},"revision":5,"username":"u"}}"#)
        ),
        some("u", 5)
    );
    // Malformed tokens.
    let good = hs256_token(
        &secret,
        header,
        &format!(r#"{{"exp":{future},"revision":5,"username":"u"}}"#),
    );
    assert_eq!(tokens.info_at(&good, T0_SECONDS), some("u", 5));
    assert_eq!(tokens.info_at(&format!("{good}."), T0_SECONDS), None);
    assert_eq!(tokens.info_at(&format!("{good}="), T0_SECONDS), None);
    assert_eq!(tokens.info_at(&good.replacen('.', "", 1), T0_SECONDS), None);
    assert_eq!(
        tokens.info_at(&"a".repeat(MAX_TOKEN_LEN + 1), T0_SECONDS),
        None
    );
    assert_eq!(
        info(
            r#"["HS256"]"#,
            &format!(r#"{{"exp":{future},"revision":5,"username":"u"}}"#)
        ),
        None
    );
    assert_eq!(
        info(
            r#"{"typ":"JWT"}"#,
            &format!(r#"{{"exp":{future},"revision":5,"username":"u"}}"#)
        ),
        None
    );
}

#[test]
fn assigned_token_is_what_etcd_writes() {
    let fixture = Fixture::new();
    let tokens = member("HS256", Some(&fixture.secret), None).unwrap();
    let token = tokens.assign_at("a<b\"c\u{8}", 7, T0).unwrap();
    let segments: Vec<&str> = token.split('.').collect();
    assert_eq!(segments.len(), 3);
    let decoded = |segment: &str| String::from_utf8(SEGMENT.decode(segment).unwrap()).unwrap();
    assert_eq!(decoded(segments[0]), r#"{"alg":"HS256","typ":"JWT"}"#);
    let expected_claims = format!(
        r#"{{"exp":{},"revision":7,"username":"a\u003cb\"c\b"}}"#,
        T0_SECONDS + 300
    );
    assert_eq!(decoded(segments[1]), expected_claims);
    assert!(!token.contains('='));
    let secret = std::fs::read(&fixture.secret).unwrap();
    assert_eq!(
        token,
        hs256_token(&secret, r#"{"alg":"HS256","typ":"JWT"}"#, &expected_claims)
    );
    assert_eq!(tokens.info_at(&token, T0_SECONDS), some("a<b\"c\u{8}", 7));
}

#[test]
fn es_signatures_are_jose_r_then_s() {
    // Checked by ring, another ECDSA implementation, as fixed-width r || s.
    let fixture = Fixture::new();
    let cases: [(
        &str,
        Curve,
        Option<&ring_signature::EcdsaVerificationAlgorithm>,
        usize,
    ); 3] = [
        (
            "ES256",
            Curve::P256,
            Some(&ring_signature::ECDSA_P256_SHA256_FIXED),
            64,
        ),
        (
            "ES384",
            Curve::P384,
            Some(&ring_signature::ECDSA_P384_SHA384_FIXED),
            96,
        ),
        ("ES512", Curve::P521, None, 132),
    ];
    for (alg, curve, ring_algorithm, width) in cases {
        let files = fixture.ec_files(curve);
        let token = member(alg, Some(&files.sec1), None)
            .unwrap()
            .assign("u", 1)
            .unwrap();
        let (input, signature) = token.rsplit_once('.').unwrap();
        let signature = SEGMENT.decode(signature).unwrap();
        assert_eq!(signature.len(), width, "{alg}");
        let Some(ring_algorithm) = ring_algorithm else {
            continue;
        };
        let point =
            with_public_key_info(std::fs::read(&files.public).unwrap().as_slice(), |info| {
                Ok(info.subject_public_key.data.to_vec())
            })
            .unwrap();
        ring_signature::UnparsedPublicKey::new(ring_algorithm, point)
            .verify(input.as_bytes(), &signature)
            .unwrap();
    }
}

#[test]
fn bad_options_refuse_to_start() {
    // etcd's TestJWTBad, and the other refusals of options.go.
    let fixture = Fixture::new();
    let empty = fixture.write("empty", b"");
    let not_pem = fixture.write("not-pem", b"not a key");
    let (rsa_private, rsa_public) = (fixture.rsa_pkcs1.as_str(), fixture.rsa_public.as_str());
    let (ec_private, ec_public) = (
        fixture.ec_files(Curve::P256).sec1.as_str(),
        fixture.ec_files(Curve::P256).public.as_str(),
    );
    let ec_pkcs8 = fixture.ec_files(Curve::P256).pkcs8.as_str();
    let p384_public = fixture.ec_files(Curve::P384).public.as_str();
    let cases: &[(&[(&str, &str)], &str)] = &[
        (&[], ERR_INVALID_AUTH_METHOD),
        (&[(OPT_SIGN_METHOD, "invalid")], ERR_INVALID_AUTH_METHOD),
        (&[(OPT_SIGN_METHOD, "rs256")], ERR_INVALID_AUTH_METHOD),
        (
            &[(OPT_SIGN_METHOD, "EdDSA"), (OPT_PRIVATE_KEY, ec_private)],
            "unsupported signing method: *jwt.SigningMethodEd25519",
        ),
        (
            &[(OPT_SIGN_METHOD, "none")],
            "unsupported signing method: *jwt.signingMethodNone",
        ),
        (&[(OPT_SIGN_METHOD, "RS256")], ERR_MISSING_KEY),
        (
            &[(OPT_SIGN_METHOD, "RS256"), (OPT_TTL, "forever")],
            "time: invalid duration",
        ),
        (
            &[(OPT_SIGN_METHOD, "RS256"), (OPT_TTL, "5")],
            "time: missing unit",
        ),
        (
            &[
                (OPT_SIGN_METHOD, "RS256"),
                (OPT_PUBLIC_KEY, rsa_private),
                (OPT_PRIVATE_KEY, rsa_private),
            ],
            "x509",
        ),
        (
            &[
                (OPT_SIGN_METHOD, "RS256"),
                (OPT_PUBLIC_KEY, rsa_public),
                (OPT_PRIVATE_KEY, rsa_public),
            ],
            "RSA private key",
        ),
        (
            &[(OPT_SIGN_METHOD, "RS256"), (OPT_PRIVATE_KEY, ec_pkcs8)],
            ERR_NOT_RSA_PRIVATE_KEY,
        ),
        (
            &[(OPT_SIGN_METHOD, "RS256"), (OPT_PUBLIC_KEY, ec_public)],
            ERR_NOT_RSA_PUBLIC_KEY,
        ),
        (
            &[(OPT_SIGN_METHOD, "RS256"), (OPT_PRIVATE_KEY, &not_pem)],
            ERR_KEY_MUST_BE_PEM,
        ),
        (&[(OPT_SIGN_METHOD, "HS256")], ERR_MISSING_KEY),
        (
            &[(OPT_SIGN_METHOD, "HS256"), (OPT_PUBLIC_KEY, rsa_public)],
            ERR_MISSING_KEY,
        ),
        (
            &[(OPT_SIGN_METHOD, "HS256"), (OPT_PRIVATE_KEY, &empty)],
            ERR_MISSING_KEY,
        ),
        (
            &[(OPT_SIGN_METHOD, "HS256"), (OPT_PUBLIC_KEY, "missing-file")],
            "open missing-file",
        ),
        (
            &[
                (OPT_SIGN_METHOD, "HS256"),
                (OPT_PRIVATE_KEY, "missing-file"),
            ],
            "open missing-file",
        ),
        (&[(OPT_SIGN_METHOD, "ES256")], ERR_MISSING_KEY),
        (
            &[
                (OPT_SIGN_METHOD, "ES256"),
                (OPT_PUBLIC_KEY, ec_private),
                (OPT_PRIVATE_KEY, ec_private),
            ],
            "x509",
        ),
        (
            &[
                (OPT_SIGN_METHOD, "ES256"),
                (OPT_PUBLIC_KEY, ec_public),
                (OPT_PRIVATE_KEY, ec_public),
            ],
            "x509",
        ),
        (
            &[
                (OPT_SIGN_METHOD, "ES256"),
                (OPT_PRIVATE_KEY, &fixture.rsa_pkcs8),
            ],
            ERR_NOT_EC_PRIVATE_KEY,
        ),
        (
            &[
                (OPT_SIGN_METHOD, "ES256"),
                (OPT_PRIVATE_KEY, &fixture.ec_files(Curve::P256).sec1_unnamed),
            ],
            "x509: unknown elliptic curve",
        ),
        (
            &[(OPT_SIGN_METHOD, "ES256"), (OPT_PUBLIC_KEY, rsa_public)],
            ERR_NOT_EC_PUBLIC_KEY,
        ),
        (
            &[
                (OPT_SIGN_METHOD, "ES256"),
                (OPT_PRIVATE_KEY, ec_private),
                (OPT_PUBLIC_KEY, p384_public),
            ],
            ERR_KEY_MISMATCH,
        ),
    ];
    for (pairs, reason) in cases {
        match JwtTokens::new(&options(pairs)) {
            Ok(_) => panic!("{pairs:?} started"),
            Err(err) => assert!(
                err.contains(reason),
                "{pairs:?}: {err:?} does not say {reason:?}"
            ),
        }
    }
    // An unknown option is only warned about.
    let opts = options(&[
        (OPT_SIGN_METHOD, "HS256"),
        (OPT_PRIVATE_KEY, &fixture.secret),
        ("foo", "bar"),
    ]);
    assert!(JwtTokens::new(&opts).is_ok());
}

#[test]
fn keys_are_matched_as_loosely_as_etcd_matches_them() {
    // options.go refuses only a public key differing in every part it
    // compares (`&&`): another key on the same curve, or with the same
    // RSA exponent, passes and the private key is used.
    let (fixture, other) = (Fixture::new(), Fixture::new());
    let p256 = fixture.ec_files(Curve::P256);
    let tokens = member(
        "ES256",
        Some(&p256.sec1),
        Some(&other.ec_files(Curve::P256).public),
    )
    .unwrap();
    let own = member("ES256", None, Some(&p256.public)).unwrap();
    assert_eq!(own.info(&tokens.assign("u", 1).unwrap()), some("u", 1));
    assert!(member("RS256", Some(&fixture.rsa_pkcs1), Some(&fixture.rsa_public)).is_ok());
}

#[test]
fn es_method_with_a_key_on_another_curve_starts_but_cannot_sign() {
    let fixture = Fixture::new();
    let tokens = member("ES256", Some(&fixture.ec_files(Curve::P384).sec1), None).unwrap();
    assert_eq!(tokens.assign("u", 1), Err(INVALID_KEY));
    let p384_token = member("ES384", Some(&fixture.ec_files(Curve::P384).sec1), None)
        .unwrap()
        .assign("u", 1)
        .unwrap();
    assert_eq!(tokens.info(&p384_token), None);
}

#[test]
fn ttl_is_a_go_duration_defaulting_to_five_minutes() {
    let fixture = Fixture::new();
    let ttl = |ttl: Option<&str>| {
        let mut opts = options(&[
            (OPT_SIGN_METHOD, "HS512"),
            (OPT_PRIVATE_KEY, &fixture.secret),
        ]);
        opts.extend(ttl.map(|ttl| (OPT_TTL.to_string(), ttl.to_string())));
        JwtTokens::new(&opts).unwrap().ttl()
    };
    assert_eq!(ttl(None), Duration::from_secs(300));
    assert_eq!(ttl(Some("")), Duration::from_secs(300));
    assert_eq!(ttl(Some("1h30m")), Duration::from_secs(5400));
    assert_eq!(ttl(Some("0")), Duration::ZERO);
    assert_eq!(ttl(Some("-5m")), Duration::ZERO);
}

#[test]
fn go_durations_parse_as_time_parse_duration() {
    let ok = [
        ("5m", 300_000_000_000),
        ("300s", 300_000_000_000),
        ("1h30m", 5_400_000_000_000),
        ("100ms", 100_000_000),
        ("1.5h", 5_400_000_000_000),
        (".5s", 500_000_000),
        ("5.s", 5_000_000_000),
        ("+5m", 300_000_000_000),
        ("0", 0),
        ("-0", 0),
        ("0s", 0),
        ("1ns", 1),
        ("1us", 1_000),
        ("1\u{b5}s", 1_000),
        ("1\u{3bc}s", 1_000),
        ("1h1m1s1ms1us1ns", 3_661_001_001_001),
        ("0.000000001s", 1),
        ("0.1234567890123456789s", 123_456_789),
        ("2562047h47m16.854775807s", i64::MAX as u64),
    ];
    for (text, nanos) in ok {
        assert_eq!(
            parse_go_duration(text),
            Some(Duration::from_nanos(nanos)),
            "{text}"
        );
    }
    assert_eq!(go_duration_nanos("-1.5s"), Ok(-1_500_000_000));
    assert_eq!(go_duration_nanos("-2562047h47m16.854775808s"), Ok(i64::MIN));
    for text in [
        "",
        "5",
        "forever",
        "1e3s",
        "5 m",
        "5M",
        "-5m",
        "+",
        ".",
        ".s",
        "1.2.3s",
        "2562047h47m16.854775808s",
        "9999999999h",
    ] {
        assert_eq!(parse_go_duration(text), None, "{text}");
    }
}

#[test]
fn go_conversions_of_claim_numbers() {
    assert_eq!(go_numeric_date(1.9), 1);
    assert_eq!(go_numeric_date(-1.5), -2);
    assert_eq!(go_uint64(123.0), 123);
    assert_eq!(go_uint64(-1.0), u64::MAX);
    assert_eq!(go_uint64(1e300), 1 << 63);
    assert_eq!(
        go_json_string("\u{0}\t\u{2028}&>"),
        r#""\u0000\t\u2028\u0026\u003e""#
    );
}
