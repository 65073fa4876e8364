//! A listener's certificate, re-read when its files change.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::SystemTime;

use parking_lot::Mutex;
use rustls::client::ResolvesClientCert;
use rustls::crypto::CryptoProvider;
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;

use crate::{file_error, read_certs, read_key, TlsError};

/// What identifies a version of the two files: modification time and
/// length of each.
type Stamp = [(Option<SystemTime>, u64); 2];

fn stamp(cert: &Path, key: &Path) -> Stamp {
    let of =
        |path: &Path| std::fs::metadata(path).map_or((None, 0), |m| (m.modified().ok(), m.len()));
    [of(cert), of(key)]
}

struct Loaded {
    stamp: Stamp,
    key: Arc<CertifiedKey>,
    /// The stamp of a replacement that failed to load: not retried (nor
    /// logged again) until the files change once more.
    broken: Option<Stamp>,
}

/// The certificate and key a listener presents: loaded at start (an error
/// then refuses to start), then checked at each handshake and re-read when
/// either file changed, so that replacing them rotates the certificate for
/// new connections without a restart. A replacement that does not load
/// (half written, a key that does not match) is logged and the last good
/// certificate kept.
pub struct ReloadingCert {
    cert_path: PathBuf,
    key_path: PathBuf,
    provider: Arc<CryptoProvider>,
    loaded: Mutex<Loaded>,
}

impl std::fmt::Debug for ReloadingCert {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReloadingCert")
            .field("cert", &self.cert_path)
            .field("key", &self.key_path)
            .finish()
    }
}

impl ReloadingCert {
    pub fn load(
        cert_path: &Path,
        key_path: &Path,
        provider: Arc<CryptoProvider>,
    ) -> Result<ReloadingCert, TlsError> {
        let stamp = stamp(cert_path, key_path);
        let key = certified_key(cert_path, key_path, &provider)?;
        Ok(ReloadingCert {
            cert_path: cert_path.to_path_buf(),
            key_path: key_path.to_path_buf(),
            provider,
            loaded: Mutex::new(Loaded {
                stamp,
                key: Arc::new(key),
                broken: None,
            }),
        })
    }

    /// The certificate for a new handshake.
    pub fn current(&self) -> Arc<CertifiedKey> {
        let now = stamp(&self.cert_path, &self.key_path);
        let mut loaded = self.loaded.lock();
        if now != loaded.stamp && loaded.broken != Some(now) {
            match certified_key(&self.cert_path, &self.key_path, &self.provider) {
                Ok(key) => {
                    tracing::info!(
                        "cert-file" = %self.cert_path.display(),
                        "key-file" = %self.key_path.display(),
                        "reloaded the certificate for new connections"
                    );
                    *loaded = Loaded {
                        stamp: now,
                        key: Arc::new(key),
                        broken: None,
                    };
                }
                Err(e) => {
                    tracing::error!(
                        "cert-file" = %self.cert_path.display(),
                        "key-file" = %self.key_path.display(),
                        error = %e,
                        "failed to reload the certificate; serving the last good one"
                    );
                    loaded.broken = Some(now);
                }
            }
        }
        loaded.key.clone()
    }
}

impl ResolvesServerCert for ReloadingCert {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.current())
    }
}

/// Outgoing connections present the certificate as it is now too (etcd's
/// GetClientCertificate re-reads the files per handshake).
impl ResolvesClientCert for ReloadingCert {
    fn resolve(
        &self,
        _root_hint_subjects: &[&[u8]],
        _sigschemes: &[rustls::SignatureScheme],
    ) -> Option<Arc<CertifiedKey>> {
        Some(self.current())
    }

    fn has_certs(&self) -> bool {
        true
    }
}

/// The chain and key of the two files, checked to belong together.
fn certified_key(
    cert_path: &Path,
    key_path: &Path,
    provider: &CryptoProvider,
) -> Result<CertifiedKey, TlsError> {
    let chain = read_certs(cert_path)?;
    let key = read_key(key_path)?;
    CertifiedKey::from_der(chain, key, provider).map_err(|e| {
        file_error(
            key_path,
            format!("does not go with {}: {e}", cert_path.display()),
        )
    })
}
