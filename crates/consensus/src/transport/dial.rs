//! The peer port's TLS: what a member presents and checks when its peer
//! URLs are `https://` (etcd's `--peer-*` flags), and gRPC channels to a
//! peer URL over TLS or plaintext as its scheme says.

use std::sync::Arc;
use std::time::Duration;

use tonic::transport::{Channel, Endpoint};

/// The peer side's TLS: the listener's configuration (its certificate, and
/// the CA that connecting members' certificates must chain to) and the
/// one outgoing connections use (the CA the peers' certificates must chain
/// to, and the certificate this member presents).
#[derive(Clone)]
pub struct PeerTls {
    pub server: Arc<rustls::ServerConfig>,
    pub client: Arc<rustls::ClientConfig>,
    /// `--experimental-peer-skip-client-san-verification`: do not check
    /// that a connecting member's address is one its certificate names.
    pub skip_client_san_verification: bool,
}

/// An endpoint for `url` with TCP_NODELAY and a connect timeout.
fn endpoint(url: &str, connect_timeout: Duration) -> Result<Endpoint, String> {
    Ok(Endpoint::from_shared(url.to_string())
        .map_err(|e| format!("{url}: {e}"))?
        .tcp_nodelay(true)
        .connect_timeout(connect_timeout))
}

/// A channel to `url` that connects on first use; over TLS with `tls`.
pub fn lazy_channel(
    url: &str,
    connect_timeout: Duration,
    tls: Option<&Arc<rustls::ClientConfig>>,
) -> Result<Channel, String> {
    let endpoint = endpoint(url, connect_timeout)?;
    Ok(match tls {
        Some(config) => endpoint.connect_with_connector_lazy(tls::TlsDialer::new(config.clone())),
        None => endpoint.connect_lazy(),
    })
}

/// A channel to `url`, connected now; over TLS with `tls`. A failure
/// says why (tonic's own text is only "transport error"), a TLS one in
/// Go's words (`remote error: tls: bad certificate`).
pub async fn channel(
    url: &str,
    connect_timeout: Duration,
    tls: Option<&Arc<rustls::ClientConfig>>,
) -> Result<Channel, String> {
    let endpoint = endpoint(url, connect_timeout)?;
    let connected = match tls {
        Some(config) => {
            endpoint
                .connect_with_connector(tls::TlsDialer::new(config.clone()))
                .await
        }
        None => endpoint.connect().await,
    };
    connected.map_err(|e| tls::go_error_chain_text(&e))
}
