//! TLS on the client and metrics listeners (`https://`, `unixs://`: the
//! same handshake over TCP or a Unix socket): each accepted connection's
//! handshake runs as its own task (a slow or silent client holds up no
//! other), bounded by [`HANDSHAKE_TIMEOUT`] (etcd has none on the client
//! port; a handshake that never finishes would hold its socket forever) and
//! by [`MAX_HANDSHAKES`] in flight per connection thread (past it a new
//! connection is closed at once). A refused
//! handshake is logged as etcd logs it (`rejected connection on client
//! endpoint`) and closes only its own connection.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::{mpsc, Semaphore};
use tokio_rustls::server::TlsStream;
use tokio_rustls::TlsAcceptor;
use tonic::transport::server::Connected;

/// How long a client may take to finish its handshake.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Handshakes in flight on one connection thread; past it a new
/// connection is closed at once (never queued: a flood of silent
/// connections must not hold up the accept loop, and with it every other
/// client).
pub const MAX_HANDSHAKES: usize = 1024;

use crate::listeners::ClientStream;

/// A client connection over TLS.
pub struct TlsConn(TlsStream<ClientStream>);

pub use v3rpc::TlsConnectInfo;

impl Connected for TlsConn {
    type ConnectInfo = TlsConnectInfo;

    fn connect_info(&self) -> TlsConnectInfo {
        let (stream, session) = self.0.get_ref();
        TlsConnectInfo {
            remote_addr: stream.peer_addr(),
            common_name: session
                .peer_certificates()
                .and_then(|chain| chain.first())
                // A verified certificate without a CN is the user "" (etcd:
                // permission denied, not "user name is empty").
                .map(|leaf| tls::client_common_name(leaf).unwrap_or_default()),
        }
    }
}

impl AsyncRead for TlsConn {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_read(cx, buf)
    }
}

impl AsyncWrite for TlsConn {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.0).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.0).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.0.is_write_vectored()
    }
}

/// Handshakes the connections of `accepted` as they come (on the current
/// runtime), handing each finished one to the returned queue.
pub fn handshakes(
    mut accepted: mpsc::Receiver<ClientStream>,
    config: Arc<rustls::ServerConfig>,
    endpoint: &'static str,
) -> mpsc::Receiver<TlsConn> {
    let (ready, queue) = mpsc::channel(MAX_HANDSHAKES);
    let acceptor = TlsAcceptor::from(config);
    let slots = Arc::new(Semaphore::new(MAX_HANDSHAKES));
    tokio::spawn(async move {
        let mut refused = 0u64;
        while let Some(stream) = accepted.recv().await {
            let Ok(slot) = slots.clone().try_acquire_owned() else {
                refused += 1;
                if refused.is_power_of_two() {
                    tracing::warn!(
                        refused,
                        limit = MAX_HANDSHAKES,
                        "too many TLS handshakes in flight; closing new connections"
                    );
                }
                continue;
            };
            let acceptor = acceptor.clone();
            let ready = ready.clone();
            tokio::spawn(async move {
                let remote = stream.remote_address();
                let result = tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(stream)).await;
                drop(slot);
                match result {
                    Ok(Ok(tls)) => {
                        let _ = ready.send(TlsConn(tls)).await;
                    }
                    Ok(Err(error)) => rejected(endpoint, remote, &error.to_string()),
                    Err(_) => rejected(endpoint, remote, "TLS handshake timed out"),
                }
            });
        }
    });
    queue
}

/// etcd's line for a refused TLS connection (config_logging.go).
fn rejected(endpoint: &str, remote: String, error: &str) {
    tracing::warn!(
        "remote-addr" = %remote,
        error = %error,
        "rejected connection on {endpoint} endpoint"
    );
}
