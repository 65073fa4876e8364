//! The peer port: each accepted connection is sorted by its first bytes
//! into a raft link (served by [`super::adopt_raft_link`] on the raft
//! thread's runtime) or gRPC (the [`PeerService`] plus whatever services the
//! member adds: lease forwarding, hashes). Every connection holds a permit
//! while it lasts, bounding what peers can make a member hold.

use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::sync::{watch, OwnedSemaphorePermit};
use tonic::transport::server::Connected as _;

use super::{PeerService, PeerTransport};
use crate::RaftHandle;

/// Connections open at once on the peer port (raft links and gRPC): each
/// peer needs about four (its raft link, probes, snapshots, lease and hash
/// requests); beyond the bound a new connection is closed at once.
pub const MAX_PEER_CONNECTIONS: usize = 128;
/// gRPC streams at once on one peer connection.
pub const MAX_PEER_STREAMS_PER_CONNECTION: u32 = 16;
/// Connections sorted as gRPC, waiting for the gRPC server.
const PEER_ACCEPT_QUEUE: usize = 64;

/// The next connection on `listener`, with TCP_NODELAY set (without it small
/// responses wait for delayed ACKs, ~40 ms); None once `shutdown` is set.
/// A failed accept (out of descriptors and the like) is logged and retried
/// after a pause rather than in a spin.
pub async fn accept_until_stop(
    listener: &TcpListener,
    shutdown: &mut watch::Receiver<bool>,
    which: &str,
) -> Option<tokio::net::TcpStream> {
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            _ = shutdown.wait_for(|stop| *stop) => return None,
        };
        match accepted {
            Ok((stream, _)) => {
                let _ = stream.set_nodelay(true);
                return Some(stream);
            }
            Err(e) => {
                tracing::warn!(error = %e, "{which} listener: accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}

/// The largest HTTP/2 frame a peer may send us: a snapshot chunk's message
/// in one DATA frame rather than five of h2's default 16 KiB.
const PEER_MAX_FRAME_BYTES: u32 = (super::snapshot::SNAPSHOT_CHUNK_BYTES + 1024) as u32;

/// Serves the peer port on `listener` until `shutdown`: raft links and the
/// peer gRPC service, plus `extra` services (their own message limits
/// should not exceed [`super::MAX_PEER_RPC_BYTES`]).
pub async fn serve_peer_listener(
    listener: TcpListener,
    transport: Arc<PeerTransport>,
    raft: RaftHandle,
    snap_dir: std::path::PathBuf,
    extra: tonic::service::Routes,
    mut shutdown: watch::Receiver<bool>,
) {
    // Raft links (a raw framed stream, see consensus::transport) and gRPC
    // share the port: each connection is sorted by its first bytes. Each
    // holds a permit while it lasts: past MAX_PEER_CONNECTIONS a new
    // connection is closed at once.
    let permits = Arc::new(tokio::sync::Semaphore::new(MAX_PEER_CONNECTIONS));
    let (grpc_tx, grpc_rx) =
        tokio::sync::mpsc::channel::<std::io::Result<PeerConnection>>(PEER_ACCEPT_QUEUE);
    let sorter = {
        let raft = raft.clone();
        let transport = transport.clone();
        let mut shutdown = shutdown.clone();
        tokio::spawn(async move {
            let mut refused = 0u64;
            while let Some(stream) = accept_until_stop(&listener, &mut shutdown, "peer").await {
                let Ok(permit) = permits.clone().try_acquire_owned() else {
                    refused += 1;
                    if refused.is_power_of_two() {
                        tracing::warn!(
                            refused,
                            limit = MAX_PEER_CONNECTIONS,
                            "peer listener: too many connections; closing new ones"
                        );
                    }
                    continue;
                };
                let raft = raft.clone();
                let transport = transport.clone();
                let grpc_tx = grpc_tx.clone();
                let shutdown = shutdown.clone();
                match transport.tls().map(|t| t.server.clone()) {
                    None => tokio::spawn(sort_plain(
                        stream, transport, raft, grpc_tx, permit, shutdown,
                    )),
                    Some(config) => tokio::spawn(sort_tls(
                        stream, config, transport, raft, grpc_tx, permit, shutdown,
                    )),
                };
            }
        })
    };
    let incoming = tokio_stream::wrappers::ReceiverStream::new(grpc_rx);
    let peer = PeerService::server(transport, raft, snap_dir);
    let result = tonic::transport::Server::builder()
        .max_concurrent_streams(MAX_PEER_STREAMS_PER_CONNECTION)
        .max_frame_size(Some(PEER_MAX_FRAME_BYTES))
        .add_routes(extra)
        .add_service(peer)
        .serve_with_incoming_shutdown(incoming, async move {
            let _ = shutdown.wait_for(|stop| *stop).await;
        })
        .await;
    sorter.abort();
    if let Err(e) = result {
        tracing::error!(error = %e, "peer listener stopped");
    }
}

type GrpcQueue = tokio::sync::mpsc::Sender<std::io::Result<PeerConnection>>;

/// A plaintext connection: sorted by peeking at its first bytes.
async fn sort_plain(
    stream: tokio::net::TcpStream,
    transport: Arc<PeerTransport>,
    raft: RaftHandle,
    grpc: GrpcQueue,
    permit: OwnedSemaphorePermit,
    mut shutdown: watch::Receiver<bool>,
) {
    match super::is_raft_link(&stream).await {
        Some(true) => {
            // on the raft thread, which ends it when it stops
            let link = super::adopt_raft_link(stream, None, transport, raft, permit);
            tokio::select! {
                _ = link => {}
                _ = shutdown.wait_for(|stop| *stop) => {}
            }
        }
        Some(false) => {
            let info = stream.connect_info();
            let _ = grpc
                .send(Ok(PeerConnection {
                    stream: Box::new(stream),
                    info,
                    _permit: permit,
                }))
                .await;
        }
        None => {}
    }
}

/// How long a member may take to finish its TLS handshake on the peer port
/// (etcd: the peer listener's 5 s read and write deadlines).
const PEER_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);

/// A TLS connection: a raft link says so in its ClientHello's ALPN
/// ([`super::RAFT_ALPN`]) and is handshaken on the raft thread's runtime;
/// anything else is handshaken here and served as gRPC.
async fn sort_tls(
    stream: tokio::net::TcpStream,
    config: Arc<rustls::ServerConfig>,
    transport: Arc<PeerTransport>,
    raft: RaftHandle,
    grpc: GrpcQueue,
    permit: OwnedSemaphorePermit,
    mut shutdown: watch::Receiver<bool>,
) {
    if offers_raft_alpn(&stream).await == Some(true) {
        // a raft link: handshaken and served on the raft thread's runtime
        let link = super::adopt_raft_link(stream, Some(config), transport, raft, permit);
        tokio::select! {
            _ = link => {}
            _ = shutdown.wait_for(|stop| *stop) => {}
        }
        return;
    }
    let info = stream.connect_info();
    let Some(tls) = accept_peer_tls(stream, config, &transport).await else {
        return;
    };
    let _ = grpc
        .send(Ok(PeerConnection {
            stream: Box::new(tls),
            info,
            _permit: permit,
        }))
        .await;
}

/// The TLS handshake of a connection to the peer port, then etcd's SAN
/// check of its address; a refusal is logged as etcd logs it.
pub(crate) async fn accept_peer_tls(
    stream: tokio::net::TcpStream,
    config: Arc<rustls::ServerConfig>,
    transport: &PeerTransport,
) -> Option<tokio_rustls::server::TlsStream<tokio::net::TcpStream>> {
    let remote_addr = stream.peer_addr().ok();
    let remote = remote_addr.map(|a| a.to_string()).unwrap_or_default();
    let acceptor = tokio_rustls::TlsAcceptor::from(config);
    let refused = |error: &dyn std::fmt::Display| {
        tracing::warn!("remote-addr" = %remote, error = %error, "rejected connection on peer endpoint");
    };
    let tls = match tokio::time::timeout(PEER_HANDSHAKE_TIMEOUT, acceptor.accept(stream)).await {
        Ok(Ok(tls)) => tls,
        Ok(Err(e)) => {
            refused(&e);
            return None;
        }
        Err(_) => {
            refused(&"TLS handshake timed out");
            return None;
        }
    };
    let skip_san = transport
        .tls()
        .is_none_or(|t| t.skip_client_san_verification);
    if let (false, Some(ip)) = (skip_san, remote_addr.map(|a| a.ip())) {
        let leaf = tls
            .get_ref()
            .1
            .peer_certificates()
            .and_then(|c| c.first())
            .cloned();
        if let Some(leaf) = leaf {
            if let Err(e) = tls::check_cert_san(&leaf, ip).await {
                refused(&e);
                return None;
            }
        }
    }
    Some(tls)
}

/// Whether a connection's TLS ClientHello offers ALPN [`super::RAFT_ALPN`],
/// read by peeking (its bytes stay for the handshake, wherever it runs);
/// None if it closed or said nothing in time.
async fn offers_raft_alpn(stream: &tokio::net::TcpStream) -> Option<bool> {
    let mut buf = vec![0u8; 16 * 1024];
    let deadline = tokio::time::Instant::now() + PEER_HANDSHAKE_TIMEOUT;
    loop {
        let n = tokio::time::timeout_at(deadline, stream.peek(&mut buf))
            .await
            .ok()?
            .ok()?;
        if n == 0 {
            return None;
        }
        let mut acceptor = rustls::server::Acceptor::default();
        let mut peeked = &buf[..n];
        while !peeked.is_empty() {
            match acceptor.read_tls(&mut peeked) {
                Ok(0) | Err(_) => return Some(false),
                Ok(_) => {}
            }
        }
        match acceptor.accept() {
            Ok(Some(accepted)) => {
                let alpn = accepted.client_hello().alpn();
                return Some(alpn.is_some_and(|mut p| p.any(|p| p == super::RAFT_ALPN)));
            }
            // not all of the ClientHello yet
            Ok(None) if n < buf.len() => {
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
            // not TLS, or more than a ClientHello holds: the handshake decides
            _ => return Some(false),
        }
    }
}

/// A gRPC connection on the peer port, holding its connection permit.
struct PeerConnection {
    stream: Box<dyn super::link::LinkIo>,
    info: tonic::transport::server::TcpConnectInfo,
    _permit: OwnedSemaphorePermit,
}

impl tonic::transport::server::Connected for PeerConnection {
    type ConnectInfo = tonic::transport::server::TcpConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.info.clone()
    }
}

impl tokio::io::AsyncRead for PeerConnection {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.stream).poll_read(cx, buf)
    }
}

impl tokio::io::AsyncWrite for PeerConnection {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        std::pin::Pin::new(&mut self.stream).poll_write(cx, buf)
    }

    fn poll_flush(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.stream).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> std::task::Poll<std::io::Result<usize>> {
        std::pin::Pin::new(&mut self.stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use testkit::pki::{TestCa, Usage};

    /// What the listener sees of a client offering `alpn`.
    async fn seen(alpn: &[u8]) -> Option<bool> {
        let dir = tempfile::tempdir().unwrap();
        let mut ca = TestCa::new(dir.path(), "ca");
        let member = ca.issue("m", "m", &["127.0.0.1"], Usage::Peer);
        let client = tls::TlsInfo {
            trusted_ca_file: Some(ca.ca_file()),
            cert_file: Some(member.cert.clone()),
            key_file: Some(member.key.clone()),
            ..Default::default()
        }
        .client_config()
        .unwrap();
        let mut client = (*client).clone();
        client.alpn_protocols = vec![alpn.to_vec()];
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let dial = tokio::spawn(async move {
            let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
            let name = rustls::pki_types::ServerName::try_from("127.0.0.1").unwrap();
            // the handshake never finishes: nobody answers it
            let _ = tokio::time::timeout(
                Duration::from_secs(2),
                tokio_rustls::TlsConnector::from(Arc::new(client)).connect(name, tcp),
            )
            .await;
        });
        let (stream, _) = listener.accept().await.unwrap();
        let seen = offers_raft_alpn(&stream).await;
        let mut peeked = [0u8; 1];
        assert_eq!(stream.peek(&mut peeked).await.unwrap(), 1, "the bytes stay");
        dial.abort();
        seen
    }

    #[tokio::test]
    async fn a_raft_link_is_told_from_grpc_by_its_alpn_before_the_handshake() {
        assert_eq!(seen(super::super::RAFT_ALPN).await, Some(true));
        assert_eq!(seen(b"h2").await, Some(false));
    }
}
