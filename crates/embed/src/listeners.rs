//! The listeners: client connections on per-CPU threads, the peer port
//! (raft links and peer gRPC), the metrics port.
//!
//! A client listener is TCP (`http://`, `https://`) or a Unix socket
//! (`unix://`, `unixs://`, as etcd's `transport.NewUnixListener`: a file
//! already at its path is removed first, and the file is removed when the
//! listener closes). Both kinds of connection take the same way: the
//! accept loop, the connection threads, the TLS handshake on `unixs://` as
//! on `https://`, the same routes.

use std::io;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use crate::access::{AccessController, AccessLayer};
use crate::ping_policy::PingPoliced;
use api::etcdserverpb::auth_server::AuthServer;
use api::etcdserverpb::cluster_server::ClusterServer;
use api::etcdserverpb::kv_server::KvServer;
use api::etcdserverpb::lease_server::LeaseServer;
use api::etcdserverpb::maintenance_server::MaintenanceServer;
use api::etcdserverpb::watch_server::WatchServer;
use api::v3electionpb::election_server::ElectionServer;
use api::v3lockpb::lock_server::LockServer;
use consensus::transport::{accept_until_stop, PeerTransport};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tonic::transport::server::Connected;
use v3rpc::auth::AuthService;

use etcdhttp::gateway::Gateway;
use etcdserver::bootstrap::{ListenAddr, StartError};
use etcdserver::config::GRPC_OVERHEAD_BYTES;
use etcdserver::metrics::grpc::GrpcMetricsLayer;
use etcdserver::EtcdServer;
use v3rpc::cluster::ClusterService;
use v3rpc::concurrency::LocalClient;
use v3rpc::election::ElectionService;
use v3rpc::kv::KvService;
use v3rpc::lease::LeaseService;
use v3rpc::lock::LockService;
use v3rpc::maintenance::MaintenanceService;
use v3rpc::watch::WatchService;

/// Binds a listener for `url` (resolved to `addr`); returns it with the
/// address it got (port 0 resolved). SO_REUSEADDR is always set (as
/// tokio's and Go's listeners do); SO_REUSEPORT with `reuse_port` (etcd's
/// `--socket-reuse-port`).
pub(crate) async fn bind(
    url: &str,
    addr: SocketAddr,
    reuse_port: bool,
) -> Result<(TcpListener, SocketAddr), StartError> {
    let listen_error = |error| StartError::Listen {
        url: url.to_string(),
        error,
    };
    let socket = if addr.is_ipv4() {
        tokio::net::TcpSocket::new_v4()
    } else {
        tokio::net::TcpSocket::new_v6()
    }
    .map_err(listen_error)?;
    socket.set_reuseaddr(true).map_err(listen_error)?;
    if reuse_port {
        socket.set_reuseport(true).map_err(listen_error)?;
    }
    socket.bind(addr).map_err(listen_error)?;
    // tokio's TcpListener::bind backlog
    let listener = socket.listen(1024).map_err(listen_error)?;
    let local = listener.local_addr().map_err(listen_error)?;
    Ok((listener, local))
}

/// A client listener.
pub(crate) enum ClientListener {
    Tcp(TcpListener),
    Unix(UnixSocketListener),
}

/// A Unix socket listener that removes its file when dropped (etcd's
/// `unixListener.Close`), so a member that stops leaves no socket behind.
pub(crate) struct UnixSocketListener {
    listener: tokio::net::UnixListener,
    path: PathBuf,
}

impl Drop for UnixSocketListener {
    fn drop(&mut self) {
        if let Err(e) = std::fs::remove_file(&self.path) {
            if e.kind() != io::ErrorKind::NotFound {
                tracing::warn!(path = %self.path.display(), error = %e, "cannot remove the client socket file");
            }
        }
    }
}

/// Removes what is at `path` as Go's `os.Remove` does (a file of any kind,
/// or an empty directory), as etcd does before listening on a Unix socket:
/// a socket file left by a member that did not stop cleanly refuses a new
/// bind.
fn remove_existing(path: &Path) -> io::Result<()> {
    match std::fs::remove_file(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => std::fs::remove_dir(path).map_err(|_| e),
    }
}

impl ClientListener {
    /// Binds a client listener for `url`, resolved to `addr`.
    pub(crate) async fn bind(
        url: &str,
        addr: &ListenAddr,
        reuse_port: bool,
    ) -> Result<ClientListener, StartError> {
        match addr {
            ListenAddr::Tcp(addr) => Ok(ClientListener::Tcp(bind(url, *addr, reuse_port).await?.0)),
            ListenAddr::Unix(path) => {
                let listen_error = |error| StartError::Listen {
                    url: url.to_string(),
                    error,
                };
                remove_existing(path).map_err(listen_error)?;
                let listener = tokio::net::UnixListener::bind(path).map_err(listen_error)?;
                Ok(ClientListener::Unix(UnixSocketListener {
                    listener,
                    path: path.clone(),
                }))
            }
        }
    }

    /// The bound TCP address (port 0 resolved); None for a Unix socket.
    pub(crate) fn tcp_addr(&self) -> Option<SocketAddr> {
        match self {
            ClientListener::Tcp(listener) => listener.local_addr().ok(),
            ClientListener::Unix(_) => None,
        }
    }

    /// The address etcd logs for the listener: `host:port`, or the socket's
    /// path as the URL gave it.
    pub(crate) fn address(&self) -> String {
        match self {
            ClientListener::Tcp(listener) => listener
                .local_addr()
                .map(|a| a.to_string())
                .unwrap_or_default(),
            ClientListener::Unix(unix) => unix.path.display().to_string(),
        }
    }

    /// The next connection, off this runtime (its connection thread
    /// registers it with its own); None once `shutdown` is set.
    async fn accept_until_stop(
        &self,
        shutdown: &mut watch::Receiver<bool>,
    ) -> Option<AcceptedStream> {
        loop {
            let accepted = match self {
                ClientListener::Tcp(listener) => accept_until_stop(listener, shutdown, "client")
                    .await?
                    .into_std()
                    .map(AcceptedStream::Tcp),
                ClientListener::Unix(unix) => accept_unix_until_stop(&unix.listener, shutdown)
                    .await?
                    .into_std()
                    .map(AcceptedStream::Unix),
            };
            if let Ok(stream) = accepted {
                return Some(stream);
            }
        }
    }
}

/// [`accept_until_stop`] for a Unix socket: a failed accept (out of
/// descriptors and the like) is logged and retried after a pause.
async fn accept_unix_until_stop(
    listener: &tokio::net::UnixListener,
    shutdown: &mut watch::Receiver<bool>,
) -> Option<tokio::net::UnixStream> {
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            _ = shutdown.wait_for(|stop| *stop) => return None,
        };
        match accepted {
            Ok((stream, _)) => return Some(stream),
            Err(e) => {
                tracing::warn!(error = %e, "client listener: accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}

/// An accepted client connection on its way to a connection thread, not
/// registered with any runtime.
enum AcceptedStream {
    Tcp(std::net::TcpStream),
    Unix(std::os::unix::net::UnixStream),
}

impl AcceptedStream {
    /// Registers the connection with the current runtime.
    fn register(self) -> io::Result<ClientStream> {
        match self {
            AcceptedStream::Tcp(stream) => {
                tokio::net::TcpStream::from_std(stream).map(ClientStream::Tcp)
            }
            AcceptedStream::Unix(stream) => {
                tokio::net::UnixStream::from_std(stream).map(ClientStream::Unix)
            }
        }
    }
}

/// A client connection: TCP or a Unix socket.
pub enum ClientStream {
    Tcp(tokio::net::TcpStream),
    Unix(tokio::net::UnixStream),
}

/// A plain client connection's info (a request extension): tonic's, by kind.
#[derive(Clone, Debug)]
pub enum ClientConnectInfo {
    Tcp(tonic::transport::server::TcpConnectInfo),
    Unix(tonic::transport::server::UdsConnectInfo),
}

impl ClientStream {
    /// The client's address; None on a Unix socket.
    pub fn peer_addr(&self) -> Option<SocketAddr> {
        match self {
            ClientStream::Tcp(stream) => stream.peer_addr().ok(),
            ClientStream::Unix(_) => None,
        }
    }

    /// The client's address as etcd logs it: `@` for a Unix socket's
    /// client (Go's unnamed `UnixAddr`).
    pub fn remote_address(&self) -> String {
        match self {
            ClientStream::Tcp(stream) => stream
                .peer_addr()
                .map(|a| a.to_string())
                .unwrap_or_default(),
            ClientStream::Unix(_) => "@".to_string(),
        }
    }
}

impl Connected for ClientStream {
    type ConnectInfo = ClientConnectInfo;

    fn connect_info(&self) -> ClientConnectInfo {
        match self {
            ClientStream::Tcp(stream) => ClientConnectInfo::Tcp(stream.connect_info()),
            ClientStream::Unix(stream) => ClientConnectInfo::Unix(stream.connect_info()),
        }
    }
}

impl tokio::io::AsyncRead for ClientStream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            ClientStream::Tcp(stream) => Pin::new(stream).poll_read(cx, buf),
            ClientStream::Unix(stream) => Pin::new(stream).poll_read(cx, buf),
        }
    }
}

impl tokio::io::AsyncWrite for ClientStream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            ClientStream::Tcp(stream) => Pin::new(stream).poll_write(cx, buf),
            ClientStream::Unix(stream) => Pin::new(stream).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            ClientStream::Tcp(stream) => Pin::new(stream).poll_flush(cx),
            ClientStream::Unix(stream) => Pin::new(stream).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            ClientStream::Tcp(stream) => Pin::new(stream).poll_shutdown(cx),
            ClientStream::Unix(stream) => Pin::new(stream).poll_shutdown(cx),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            ClientStream::Tcp(stream) => Pin::new(stream).poll_write_vectored(cx, bufs),
            ClientStream::Unix(stream) => Pin::new(stream).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            ClientStream::Tcp(stream) => stream.is_write_vectored(),
            ClientStream::Unix(stream) => stream.is_write_vectored(),
        }
    }
}

/// The peer port: consensus's listener (raft links, snapshots, probes)
/// with the member's own peer services (lease forwarding, hashes).
pub(crate) async fn serve_peers(
    server: Arc<EtcdServer>,
    transport: Arc<PeerTransport>,
    listener: TcpListener,
    shutdown: watch::Receiver<bool>,
) {
    use consensus::transport::MAX_PEER_RPC_BYTES;
    let extra = tonic::service::Routes::builder()
        .add_service(
            etcdserver::lease_driver::LeasePeerService::server(server.clone())
                .max_decoding_message_size(MAX_PEER_RPC_BYTES),
        )
        .add_service(
            etcdserver::corrupt::MaintenancePeerService::server(server.clone())
                .max_decoding_message_size(MAX_PEER_RPC_BYTES),
        )
        .add_service(
            etcdserver::reconfig::MembershipPeerService::server(server.clone())
                .max_decoding_message_size(MAX_PEER_RPC_BYTES),
        )
        .clone()
        .routes();
    let snap_dir = server.cfg.member_dir().join("snap");
    let raft = server.raft.clone();
    consensus::transport::serve_peer_listener(listener, transport, raft, snap_dir, extra, shutdown)
        .await
}

/// Starts the client connection threads at once (they exist when `start`
/// returns) and returns the accept loop that feeds them.
pub(crate) fn serve_clients(
    server: Arc<EtcdServer>,
    listener: ClientListener,
    tls: Option<Arc<rustls::ServerConfig>>,
    serves: Serves,
    request_tracing: Option<crate::distributed_tracing::RequestTracingLayer>,
    mut shutdown: watch::Receiver<bool>,
) -> impl std::future::Future<Output = ()> + Send + 'static {
    let routes = client_routes(&server, &shutdown, serves, request_tracing);
    // where etcd's grpc-go serves the connections itself (see ping_policy)
    let ping_min_time = (serves.grpc && (tls.is_none() || !serves.http))
        .then_some(server.cfg.grpc_keepalive_min_time);
    // --cors and --host-whitelist, where etcd's HTTP server serves
    let access = AccessLayer::new(
        serves.http.then(|| Arc::new(access_controller(&server))),
        tls.is_some(),
    );
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let mut workers = Vec::with_capacity(threads);
    for i in 0..threads {
        let thread = ClientThread::spawn(
            i,
            server.clone(),
            routes.clone(),
            tls.clone(),
            ping_min_time,
            access.clone(),
            shutdown.clone(),
        );
        match thread {
            Ok(worker) => workers.push(worker),
            Err(e) => tracing::error!(error = %e, "cannot start a client connection thread"),
        }
    }
    async move {
        if workers.is_empty() {
            tracing::error!("client listener stopped: no connection thread");
            return;
        }
        let mut next = 0;
        while let Some(stream) = listener.accept_until_stop(&mut shutdown).await {
            next = (next + 1) % workers.len();
            if workers[next].connections.send(stream).await.is_err() {
                tracing::error!("client listener stopped: a connection thread ended");
                break;
            }
        }
        // Closed now (a Unix socket's file removed), not once the
        // connections are done: a member that stops takes no new ones.
        drop(listener);
        // Closing the queues lets each thread's server finish its connections
        // (graceful, as on the shutdown signal); if this task is dropped before
        // they are done, the threads' hard-stop senders drop with it.
        let (done, hard_stops): (Vec<_>, Vec<_>) = workers
            .into_iter()
            .map(|worker| (worker.done, worker.hard_stop))
            .unzip();
        for finished in done {
            let _ = finished.await;
        }
        drop(hard_stops);
    }
}

/// etcd's access controller for the member's client URLs.
fn access_controller(server: &Arc<EtcdServer>) -> AccessController {
    let cfg = &server.cfg;
    let controller = AccessController::new(&cfg.cors, &cfg.host_whitelist);
    if !(cfg.client_tls.client_cert_auth && cfg.enable_grpc_gateway) {
        return controller;
    }
    let auth = server.auth.clone();
    controller.refusing_gateway_common_names(Arc::new(move || auth.is_enabled()))
}

/// What the client port serves: etcd's gRPC services (requests up to
/// `--max-request-bytes` plus gRPC's overhead, responses unbounded as etcd's
/// `math.MaxInt32`), the JSON gateway and the HTTP routes.
/// What a client listener serves: both (etcd's default), or, with
/// `--listen-client-http-urls`, gRPC alone on the client URLs and HTTP
/// alone (the gateway, /health, /version, /metrics) on the HTTP URLs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Serves {
    pub(crate) grpc: bool,
    pub(crate) http: bool,
}

/// With distributed tracing, the gRPC routes get its layer; without, they
/// are as they were.
fn client_routes(
    server: &Arc<EtcdServer>,
    shutdown: &watch::Receiver<bool>,
    serves: Serves,
    request_tracing: Option<crate::distributed_tracing::RequestTracingLayer>,
) -> tonic::service::Routes {
    let max_request = server.cfg.max_request_bytes + GRPC_OVERHEAD_BYTES;
    macro_rules! limits {
        ($service:expr) => {
            $service
                .max_decoding_message_size(max_request)
                .max_encoding_message_size(usize::MAX)
        };
    }
    let own_client = LocalClient::new(server.clone(), shutdown.clone());
    let grpc = tonic::service::Routes::builder()
        .add_service(limits!(KvServer::new(KvService::new(server.clone()))))
        .add_service(limits!(MaintenanceServer::new(MaintenanceService::new(
            server.clone()
        ))))
        .add_service(limits!(ClusterServer::new(ClusterService::new(
            server.clone()
        ))))
        .add_service(limits!(WatchServer::new(WatchService::new(
            server.clone(),
            shutdown.clone()
        ))))
        .add_service(limits!(LeaseServer::new(LeaseService::new(
            server.clone(),
            shutdown.clone()
        ))))
        .add_service(limits!(ElectionServer::new(ElectionService::new(
            own_client.clone()
        ))))
        .add_service(limits!(LockServer::new(LockService::new(
            own_client.clone()
        ))))
        .add_service(limits!(AuthServer::new(AuthService::new(server.clone()))))
        .clone()
        .routes();
    // Maintenance.Snapshot's chunks reach the socket without tonic's copy
    // (v3rpc::snapshot_stream): the path goes to its own route, the rest of
    // Maintenance to tonic's.
    let grpc = tonic::service::Routes::from(grpc.into_axum_router().route_service(
        v3rpc::snapshot_stream::SNAPSHOT_PATH,
        v3rpc::snapshot_stream::SnapshotRoute::new(server.clone()),
    ));
    let grpc = match request_tracing {
        Some(layer) => tonic::service::Routes::from(grpc.into_axum_router().route_layer(layer)),
        None => grpc,
    };
    let gateway = server
        .cfg
        .enable_grpc_gateway
        .then(|| Arc::new(Gateway::new(server.clone(), shutdown.clone(), own_client)));
    let http = etcdhttp::client_router(server.clone(), gateway);
    let router = match (serves.grpc, serves.http) {
        (true, true) => grpc.into_axum_router().merge(http),
        (true, false) => grpc.into_axum_router(),
        (false, _) => http,
    };
    tonic::service::Routes::from(etcdhttp::with_fallback(router))
}

/// Connections accepted but not yet taken by their connection thread.
const CLIENT_ACCEPT_QUEUE: usize = 64;

/// One of the threads serving client connections, each on its own
/// current-thread runtime (as many as there are CPUs). A connection stays on
/// the thread it is handed to, with every request stream it carries: a
/// request wakes one thread, where tokio's work-stealing scheduler would
/// also wake a second worker to look for more work each time one is
/// unparked (1 client put: ~1 context switch and ~30 µs of CPU per request).
struct ClientThread {
    connections: tokio::sync::mpsc::Sender<AcceptedStream>,
    /// Resolves when the thread's server has finished.
    done: tokio::sync::oneshot::Receiver<()>,
    /// Dropping it stops the thread's server without waiting for its
    /// connections.
    hard_stop: tokio::sync::oneshot::Sender<()>,
}

impl ClientThread {
    fn spawn(
        index: usize,
        server: Arc<EtcdServer>,
        routes: tonic::service::Routes,
        tls: Option<Arc<rustls::ServerConfig>>,
        ping_min_time: Option<Duration>,
        access: AccessLayer,
        mut shutdown: watch::Receiver<bool>,
    ) -> std::io::Result<ClientThread> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let (connections, queue) = tokio::sync::mpsc::channel(CLIENT_ACCEPT_QUEUE);
        let (done_tx, done) = tokio::sync::oneshot::channel();
        let (hard_stop, hard_stop_rx) = tokio::sync::oneshot::channel::<()>();
        std::thread::Builder::new()
            .name(format!("grpc-client-{index}"))
            .stack_size(api::codec::REQUEST_THREAD_STACK_BYTES)
            .spawn(move || {
                // A lone client's put turns the raft loop here, while the
                // member leads alone (consensus::turns).
                consensus::allow_client_turns();
                runtime.block_on(async move {
                    tokio::spawn(keep_next_wake_near());
                    let stop = async move {
                        let _ = shutdown.wait_for(|stop| *stop).await;
                    };
                    let accepted = tokio_stream::StreamExt::map(
                        tokio_stream::wrappers::ReceiverStream::new(queue),
                        AcceptedStream::register,
                    );
                    let serve = match tls {
                        None => {
                            let policed = tokio_stream::StreamExt::map(accepted, move |stream| {
                                stream.map(|stream| PingPoliced::new(stream, ping_min_time))
                            });
                            Box::pin(serve_connections(server, routes, access, policed, stop))
                        }
                        Some(config) => {
                            let ready = crate::secure::handshakes(
                                client_streams(accepted),
                                config,
                                "client",
                            );
                            let incoming = tokio_stream::StreamExt::map(
                                tokio_stream::wrappers::ReceiverStream::new(ready),
                                move |conn| {
                                    Ok::<_, std::io::Error>(PingPoliced::new(conn, ping_min_time))
                                },
                            );
                            Box::pin(serve_connections(server, routes, access, incoming, stop))
                                as std::pin::Pin<Box<dyn std::future::Future<Output = _>>>
                        }
                    };
                    tokio::select! {
                        result = serve => {
                            if let Err(e) = result {
                                tracing::error!(error = %e, "client listener stopped");
                            }
                        }
                        _ = hard_stop_rx => {}
                    }
                });
                runtime.shutdown_timeout(Duration::from_secs(1));
                let _ = done_tx.send(());
            })?;
        Ok(ClientThread {
            connections,
            done,
            hard_stop,
        })
    }
}

/// A timer armed earlier than the runtime's next wake makes tokio write the
/// runtime's eventfd (to shorten its wait), even from the runtime's own
/// thread: every put arms its request deadline (seconds away), and an
/// otherwise idle connection thread's next wake is its HTTP/2 keepalive
/// (hours away), so each put cost a write and an extra trip through
/// epoll. A timer of this period, re-armed forever, keeps the next wake
/// nearer than any request deadline.
async fn keep_next_wake_near() {
    let mut ticks = tokio::time::interval(NEXT_WAKE_PERIOD);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticks.tick().await;
    }
}

/// See [`keep_next_wake_near`]: shorter than the shortest request deadline
/// a put arms (etcd's request timeout: 5 s plus two election timeouts).
const NEXT_WAKE_PERIOD: Duration = Duration::from_secs(1);

/// Serves the connections of `incoming` (plain or TLS) with the
/// client port's routes: HTTP/2 gRPC and HTTP/1.1 (hyper's auto connection
/// builder tells the two apart by the HTTP/2 preface), for curl and the
/// gateway's clients.
async fn serve_connections<I, IO, IE>(
    server: Arc<EtcdServer>,
    routes: tonic::service::Routes,
    access: AccessLayer,
    incoming: I,
    stop: impl std::future::Future<Output = ()>,
) -> Result<(), tonic::transport::Error>
where
    I: tokio_stream::Stream<Item = Result<IO, IE>>,
    IO: tokio::io::AsyncRead
        + tokio::io::AsyncWrite
        + tonic::transport::server::Connected
        + Unpin
        + Send
        + 'static,
    IE: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    tonic::transport::Server::builder()
        .accept_http1(true)
        .max_concurrent_streams(server.cfg.max_concurrent_streams)
        .http2_keepalive_interval(server.cfg.grpc_keepalive.map(|(interval, _)| interval))
        .http2_keepalive_timeout(server.cfg.grpc_keepalive.map(|(_, timeout)| timeout))
        // outermost: etcd's access controller sees requests first
        .layer(access)
        .layer(crate::grpc_compat::GrpcGuardLayer {
            is_learner: Some({
                let server = std::sync::Arc::downgrade(&server);
                std::sync::Arc::new(move || server.upgrade().is_some_and(|s| s.is_learner()))
            }),
        })
        .layer(GrpcMetricsLayer::new(server.metrics.grpc.clone()))
        .layer(tower::util::MapResponseLayer::new(
            crate::grpc_compat::rewrite_oversized_request,
        ))
        .add_routes(routes)
        .serve_with_incoming_shutdown(incoming, stop)
        .await
}

/// The connections of `incoming` that the runtime took, as a queue.
fn client_streams(
    incoming: impl tokio_stream::Stream<Item = io::Result<ClientStream>> + Send + 'static,
) -> tokio::sync::mpsc::Receiver<ClientStream> {
    let (tx, rx) = tokio::sync::mpsc::channel(CLIENT_ACCEPT_QUEUE);
    tokio::spawn(async move {
        let mut incoming = std::pin::pin!(incoming);
        while let Some(stream) = tokio_stream::StreamExt::next(&mut incoming).await {
            if let Ok(stream) = stream {
                if tx.send(stream).await.is_err() {
                    return;
                }
            }
        }
    });
    rx
}

/// `--listen-metrics-urls`: /metrics and /health over HTTP/1.1 or HTTP/2,
/// with the client port's TLS settings on an `https://` URL.
pub(crate) async fn serve_metrics(
    server: Arc<EtcdServer>,
    listener: TcpListener,
    tls: Option<Arc<rustls::ServerConfig>>,
    mut shutdown: watch::Receiver<bool>,
) {
    let routes =
        tonic::service::Routes::from(etcdhttp::with_fallback(etcdhttp::metrics_router(server)));
    let stop = async move {
        let _ = shutdown.wait_for(|stop| *stop).await;
    };
    let mut builder = tonic::transport::Server::builder().accept_http1(true);
    let result = match tls {
        None => {
            let incoming =
                tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true));
            builder
                .add_routes(routes)
                .serve_with_incoming_shutdown(incoming, stop)
                .await
        }
        Some(config) => {
            let tcp = tokio_stream::StreamExt::map(
                tokio_stream::wrappers::TcpListenerStream::new(listener),
                |stream| stream.map(ClientStream::Tcp),
            );
            let ready = crate::secure::handshakes(client_streams(tcp), config, "client");
            let incoming = tokio_stream::StreamExt::map(
                tokio_stream::wrappers::ReceiverStream::new(ready),
                Ok::<_, std::io::Error>,
            );
            builder
                .add_routes(routes)
                .serve_with_incoming_shutdown(incoming, stop)
                .await
        }
    };
    if let Err(e) = result {
        tracing::error!(error = %e, "metrics listener stopped");
    }
}
