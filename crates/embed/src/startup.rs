//! Bringing a member up and down: backend, raft, apply loop, listeners,
//! background loops; and a clean stop that loses nothing.

use std::net::SocketAddr;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use api::etcdserverpb::{Attributes, ClusterMemberAttrSetRequest};
use consensus::transport::PeerTransport;
use consensus::{RaftConfig, RaftHandle};
use mvcc::Store;
use tokio::sync::watch;

use crate::distributed_tracing::RequestTracing;
use crate::listeners::{bind, serve_clients, serve_metrics, serve_peers, ClientListener, Serves};
use etcdserver::alarms::Alarms;
use etcdserver::apply::{ApplyLoop, StateMachine};
use etcdserver::auth::AuthStore;
use etcdserver::bootstrap::{
    check_volume, identity, is_tls_url, join_existing, joins_existing, known_members,
    parse_listen_url, parse_url, prepare_data_dir, recover_alarms, recover_lessor, Identity,
    ListenAddr, StartError,
};
use etcdserver::config::ServerConfig;
use etcdserver::membership::ClusterMembers;
use etcdserver::metrics::Metrics;
use etcdserver::EtcdServer;
use etcdserver::{CLUSTER_VERSION, ETCD_VERSION};
use lease::Lessor;

/// A running member.
pub struct Member {
    pub server: Arc<EtcdServer>,
    client_addrs: Vec<SocketAddr>,
    shutdown: watch::Sender<bool>,
    serving: Vec<tokio::task::JoinHandle<()>>,
    apply_thread: Option<JoinHandle<()>>,
    /// Set when this member applies its own removal from the cluster.
    removed: Arc<watch::Sender<bool>>,
    /// Set when a peer refuses this member's raft link as removed.
    refused_as_removed: watch::Receiver<bool>,
    /// `--experimental-enable-distributed-tracing`'s provider; None: off.
    request_tracing: Option<RequestTracing>,
}

impl Member {
    /// The TCP addresses the gRPC client listeners are bound to (port 0
    /// resolved); Unix socket listeners are not among them.
    pub fn client_addrs(&self) -> &[SocketAddr] {
        &self.client_addrs
    }

    /// Resolves with the cause once the member cannot go on (a WAL or
    /// backend write failed, a committed entry cannot be applied): its
    /// owner then stops it and exits non-zero, as etcd does.
    pub async fn fatal(&self) -> String {
        self.server.raft.fatal().raised().await
    }

    /// Resolves about a second after this member learns it was removed
    /// from the cluster (it applied its removal, or a peer refused it as
    /// removed), having logged etcd's lines: its owner then stops it and
    /// exits with status 0, as etcd does.
    pub async fn removed(&self) {
        let mut applied = self.removed.subscribe();
        let mut refused = self.refused_as_removed.clone();
        let removed = tokio::select! {
            r = applied.wait_for(|r| *r) => r.is_ok(),
            r = refused.wait_for(|r| *r) => r.is_ok(),
        };
        if !removed {
            return std::future::pending().await;
        }
        const REMOVED: &str = "the member has been permanently removed from the cluster";
        // etcd's stopWithDelay: the removal's response goes out first
        tokio::time::sleep(REMOVED_STOP_DELAY).await;
        tracing::warn!(error = REMOVED, "server error");
        tracing::warn!("data-dir used by this member must be removed");
    }

    /// Resolves once the member has a leader and has applied everything
    /// committed so far (etcd's ReadyNotify).
    pub async fn ready(&self) {
        wait_ready(&self.server).await;
    }

    /// Stops serving, stops raft, finishes applying and commits the backend
    /// durably. Every acknowledged write is in the WAL and in the backend.
    pub async fn stop(mut self) {
        log_closing(&self.server.cfg, "closing etcd server");
        if self.server.raft.fatal().cause().is_some() {
            self.server.abandon_waiting_proposals();
        }
        let _ = self.shutdown.send(true);
        for task in self.serving.drain(..) {
            let _ = tokio::time::timeout(Duration::from_secs(5), task).await;
        }
        // as etcd: the spans still queued go out once the listeners are closed
        if let Some(request_tracing) = self.request_tracing.take() {
            let _ = tokio::task::spawn_blocking(move || request_tracing.shutdown()).await;
        }
        log_leadership_kept(&self.server);
        let raft = self.server.raft.clone();
        let apply_thread = self.apply_thread.take();
        let _ = tokio::task::spawn_blocking(move || {
            raft.stop();
            if let Some(t) = apply_thread {
                let _ = t.join();
            }
        })
        .await;
        log_closing(&self.server.cfg, "closed etcd server");
    }
}

/// etcd's "closing etcd server" and "closed etcd server" lines.
fn log_closing(cfg: &ServerConfig, msg: &'static str) {
    tracing::info!(
        name = %cfg.name,
        "data-dir" = %cfg.data_dir.display(),
        "advertise-peer-urls" = %crate::logutil::strings(&cfg.initial_advertise_peer_urls),
        "advertise-client-urls" = %crate::logutil::strings(&cfg.advertise_client_urls),
        "{msg}"
    );
}

/// etcd hands leadership over before it stops (TransferLeadership); of
/// its lines, those for the cases where it keeps it. oxcd's leader of a
/// larger cluster stops without handing over (its followers elect anew).
fn log_leadership_kept(server: &EtcdServer) {
    let status = server.raft.status();
    let (id, leader) = (
        format!("{:x}", server.member.id),
        format!("{:x}", status.leader),
    );
    if !status.is_leader {
        tracing::info!("local-member-id" = %id, "current-leader-member-id" = %leader,
            "skipped leadership transfer; local server is not leader");
    } else if server
        .members
        .list()
        .iter()
        .filter(|m| !m.is_learner)
        .count()
        <= 1
    {
        tracing::info!("local-member-id" = %id, "current-leader-member-id" = %leader,
            "skipped leadership transfer for single voting member cluster");
    }
}

/// How long a removed member goes on before it stops (etcd's
/// stopWithDelay after applying its own removal).
const REMOVED_STOP_DELAY: Duration = Duration::from_secs(1);

/// Starts a member: returns once its client listeners are bound.
pub async fn start(cfg: ServerConfig) -> Result<Member, StartError> {
    let peer_tls = peer_tls(&cfg)?;
    let identity = if joins_existing(&cfg) {
        join_existing(&cfg, peer_tls.as_ref().map(|t| t.client.clone())).await?
    } else {
        identity(&cfg)?
    };
    let client_addrs = parse_listen_urls(&cfg.listen_client_urls)?;
    let http_addrs = parse_listen_urls(&cfg.listen_client_http_urls)?;
    if let Some(url) = cfg
        .listen_client_http_urls
        .iter()
        .zip(&http_addrs)
        .find(|(_, addr)| client_addrs.contains(addr))
        .map(|(url, _)| url)
    {
        return Err(StartError::Config(format!(
            "cannot bind both --client-listen-urls and --client-listen-http-urls on the same url {url}"
        )));
    }
    let metrics_addrs = parse_urls(&cfg.listen_metrics_urls)?;
    let client_tls = client_tls(&cfg)?;
    let metrics = Arc::new(Metrics::new(identity.member.id, cfg.metrics_extensive));
    check_volume(&cfg)?;
    prepare_data_dir(&cfg)?;
    let request_tracing = cfg.distributed_tracing.as_ref().map(RequestTracing::start);
    log_start(&cfg, identity.restarted);
    let backend = open_backend(&cfg, &metrics).await?;
    let removed_members: Vec<u64> = backend
        .store
        .side_records(mvcc::SideTable::MembersRemoved)?
        .into_keys()
        .collect();
    let members = Arc::new(ClusterMembers::with_removed(
        known_members(&backend.store, identity.members.clone(), &identity.member)?,
        removed_members.clone(),
    ));
    // A single member's transport has no peers: it sends nothing and
    // refuses every raft link and peer request (no sender is a member).
    let peer_transport = PeerTransport::new(
        identity.member.id,
        identity.cluster_id,
        &peer_urls(&members, identity.member.id),
        &tokio::runtime::Handle::current(),
        metrics.network.clone(),
        peer_tls.clone(),
    );
    for id in &removed_members {
        peer_transport.remove_peer(*id);
    }
    // Before raft starts: conf changes replayed from the WAL reach the
    // transport too.
    let removed = Arc::new(watch::channel(false).0);
    follow_membership(&members, &peer_transport, identity.member.id, &removed);
    if removed_members.contains(&identity.member.id) {
        removed.send_replace(true);
    }
    let (raft, committed) = start_raft(
        &cfg,
        &identity,
        &backend.store,
        peer_transport.clone(),
        &metrics,
    )?;
    let apply = start_apply(&cfg, &backend, &raft, &members, &metrics, committed)?;
    let server = Arc::new_cyclic(|me| {
        EtcdServer::new(
            members,
            cfg.clone(),
            backend.store,
            raft,
            identity.member,
            identity.cluster_id,
            (apply.wait, apply.conf_wait),
            apply.applied,
            metrics,
            backend.lessor,
            backend.alarms,
            backend.auth,
            me.clone(),
        )
    });
    tracing::info!(
        "local-member-id" = %format!("{:x}", server.member.id),
        "local-server-version" = ETCD_VERSION,
        "cluster-version" = if identity.restarted { CLUSTER_VERSION } else { "to_be_decided" },
        "starting etcd server"
    );
    if let Some(tls) = &peer_tls {
        server.set_peer_client_tls(tls.client.clone());
    }
    server.set_transport(peer_transport.clone());
    let source = server.snapshot_source(cfg.member_dir().join("snap"));
    peer_transport.attach_snapshots(server.raft.clone(), Arc::new(source));
    let (shutdown, shutdown_rx) = watch::channel(false);
    let mut member = Member {
        server,
        client_addrs: Vec::new(),
        shutdown,
        serving: Vec::new(),
        apply_thread: Some(apply.thread),
        removed,
        refused_as_removed: peer_transport.removed_notice(),
        request_tracing,
    };
    serve_peer_urls(&mut member, &peer_transport, &shutdown_rx).await?;
    if cfg.initial_corrupt_check {
        if let Err(reason) = etcdserver::corrupt::check_initial(&member.server).await {
            member.stop().await;
            return Err(StartError::Corrupt(reason));
        }
    }
    let addrs = (client_addrs, http_addrs, metrics_addrs);
    serve_client_urls(&mut member, addrs, client_tls, &shutdown_rx).await?;
    start_background_loops(&mut member, &shutdown_rx);
    log_serving(&member.server);
    Ok(member)
}

/// etcd's "now serving peer/client/metrics" line.
fn log_serving(server: &EtcdServer) {
    let cfg = &server.cfg;
    let urls = crate::logutil::strings;
    tracing::info!(
        "local-member-id" = %format!("{:x}", server.member.id),
        "initial-advertise-peer-urls" = %urls(&cfg.initial_advertise_peer_urls),
        "listen-peer-urls" = %urls(&cfg.listen_peer_urls),
        "advertise-client-urls" = %urls(&cfg.advertise_client_urls),
        "listen-client-urls" = %urls(&cfg.listen_client_urls),
        "listen-metrics-urls" = %urls(&cfg.listen_metrics_urls),
        "now serving peer/client/metrics"
    );
}

/// etcd's "starting an etcd server" line.
fn log_start(cfg: &ServerConfig, restarted: bool) {
    // etcd's --wal-dir: '' unless given
    let wal_dir = cfg.dedicated_wal_dir.clone().unwrap_or_default();
    tracing::info!(
        "etcd-version" = ETCD_VERSION,
        "oxcd-version" = env!("CARGO_PKG_VERSION"),
        name = %cfg.name,
        "data-dir" = %cfg.data_dir.display(),
        "wal-dir" = %wal_dir.display(),
        "wal-dir-dedicated" = %wal_dir.display(),
        "member-dir" = %cfg.member_dir().display(),
        "max-wals" = cfg.max_wals,
        "max-snapshots" = cfg.max_snapshots,
        "member-initialized" = restarted,
        "starting an etcd server"
    );
}

/// The peer listeners (`--listen-peer-urls`).
async fn serve_peer_urls(
    member: &mut Member,
    transport: &Arc<PeerTransport>,
    shutdown: &watch::Receiver<bool>,
) -> Result<(), StartError> {
    tracing::info!(
        "listen-peer-urls" = %crate::logutil::strings(&member.server.cfg.listen_peer_urls),
        "configuring peer listeners"
    );
    for url in &member.server.cfg.listen_peer_urls {
        let reuse_port = member.server.cfg.socket_reuse_port;
        let (listener, local) = bind(url, parse_url(url)?, reuse_port).await?;
        let serve = serve_peers(
            member.server.clone(),
            transport.clone(),
            listener,
            shutdown.clone(),
        );
        member.serving.push(tokio::spawn(serve));
        tracing::info!(address = %local, "serving peer traffic");
    }
    Ok(())
}

/// The client listeners (`--listen-client-urls`) and the metrics listeners
/// (`--listen-metrics-urls`), resolved beforehand.
async fn serve_client_urls(
    member: &mut Member,
    (client_addrs, http_addrs, metrics_addrs): (Vec<ListenAddr>, Vec<ListenAddr>, Vec<SocketAddr>),
    tls: Option<Arc<rustls::ServerConfig>>,
    shutdown: &watch::Receiver<bool>,
) -> Result<(), StartError> {
    let cfg = member.server.cfg.clone();
    tracing::info!(
        "listen-client-urls" = %crate::logutil::strings(&cfg.listen_client_urls),
        "configuring client listeners"
    );
    let tls_for = |url: &str| is_tls_url(url).then(|| tls.clone()).flatten();
    let split = !cfg.listen_client_http_urls.is_empty();
    let client = Serves {
        grpc: true,
        http: !split,
    };
    let http_only = Serves {
        grpc: false,
        http: true,
    };
    let listeners = (cfg
        .listen_client_urls
        .iter()
        .zip(client_addrs)
        .map(|u| (u, client)))
    .chain(
        cfg.listen_client_http_urls
            .iter()
            .zip(http_addrs)
            .map(|u| (u, http_only)),
    );
    for ((url, addr), serves) in listeners {
        let listener = ClientListener::bind(url, &addr, cfg.socket_reuse_port).await?;
        let local = listener.address();
        if let Some(addr) = listener.tcp_addr().filter(|_| serves.grpc) {
            member.client_addrs.push(addr);
        }
        let secure = tls_for(url);
        if secure.is_some() {
            tracing::info!(address = %local, "serving client traffic securely");
        } else {
            tracing::warn!(address = %local, "serving client traffic insecurely; this is strongly discouraged!");
        }
        let serve = serve_clients(
            member.server.clone(),
            listener,
            secure,
            serves,
            member.request_tracing.as_ref().map(RequestTracing::layer),
            shutdown.clone(),
        );
        member.serving.push(tokio::spawn(serve));
    }
    for (url, addr) in cfg.listen_metrics_urls.iter().zip(metrics_addrs) {
        let (listener, local) = bind(url, addr, cfg.socket_reuse_port).await?;
        let serve = serve_metrics(
            member.server.clone(),
            listener,
            tls_for(url),
            shutdown.clone(),
        );
        member.serving.push(tokio::spawn(serve));
        tracing::info!(address = %local, "serving metrics");
    }
    Ok(())
}

/// The client port's TLS configuration when a client or metrics URL is
/// `https://`, checked as etcd checks it (server/embed/etcd.go).
fn client_tls(cfg: &ServerConfig) -> Result<Option<Arc<rustls::ServerConfig>>, StartError> {
    let client_urls: Vec<String> = cfg
        .listen_client_urls
        .iter()
        .chain(&cfg.listen_client_http_urls)
        .cloned()
        .collect();
    let https_client = client_urls.iter().find(|u| is_tls_url(u));
    let https_metrics = cfg.listen_metrics_urls.iter().any(|u| is_tls_url(u));
    if https_client.is_none() && !https_metrics {
        if cfg.client_tls.client_cert_auth {
            tracing::warn!("scheme is HTTP while --client-cert-auth is enabled; ignored client cert auth for this URL");
        }
        return Ok(None);
    }
    let mut info = cfg.client_tls.clone();
    if cfg.auto_tls {
        auto_tls(cfg, &mut info, "client", &client_urls)?;
    }
    if !info.has_cert() {
        return Err(StartError::Config(match https_client {
            Some(url) => format!(
                "TLS key/cert (--cert-file, --key-file) must be provided for client url {url} with HTTPS scheme"
            ),
            None => "client TLS key/cert (--cert-file, --key-file) must be provided for metrics secure url".into(),
        }));
    }
    let error = |e: tls::TlsError| StartError::Config(format!("client TLS: {e}"));
    info.outgoing_identity().map_err(error)?;
    let config = info.server_config().map_err(error)?;
    Ok(Some(config))
}

/// The peer side's TLS when a peer URL is `https://`, checked as etcd
/// checks it; `--peer-auto-tls` makes a self-signed certificate and then
/// verifies no peer's.
fn peer_tls(cfg: &ServerConfig) -> Result<Option<consensus::transport::PeerTls>, StartError> {
    let urls = cfg
        .listen_peer_urls
        .iter()
        .chain(&cfg.initial_advertise_peer_urls);
    let Some(https) = urls.clone().find(|u| is_tls_url(u)) else {
        return Ok(None);
    };
    let mut info = cfg.peer_tls.clone();
    let auto = cfg.peer_auto_tls && auto_tls(cfg, &mut info, "peer", &cfg.listen_peer_urls)?;
    if !info.has_cert() {
        return Err(StartError::Config(format!(
            "cannot listen on TLS for {https}: KeyFile and CertFile are not presented"
        )));
    }
    let error = |e: tls::TlsError| StartError::Config(format!("peer TLS: {e}"));
    let mut server = (*info.server_config().map_err(error)?).clone();
    // raft links say so in their ALPN (consensus::transport::RAFT_ALPN)
    server
        .alpn_protocols
        .push(consensus::transport::RAFT_ALPN.to_vec());
    let server = Arc::new(server);
    let client = if auto {
        info.insecure_client_config()
    } else {
        info.client_config()
    }
    .map_err(error)?;
    Ok(Some(consensus::transport::PeerTls {
        server,
        client,
        skip_client_san_verification: cfg.peer_skip_client_san_verification,
    }))
}

/// Auto-TLS for one side (`client` or `peer`): without certificate files,
/// a self-signed certificate for the hosts of `urls` under
/// `<data-dir>/fixtures/<side>` (etcd's `ClientSelfCert`/`PeerSelfCert`);
/// returns whether it is used.
fn auto_tls(
    cfg: &ServerConfig,
    info: &mut tls::TlsInfo,
    side: &str,
    urls: &[String],
) -> Result<bool, StartError> {
    if info.has_cert() {
        tracing::warn!("ignoring {side} auto TLS since certs given");
        return Ok(false);
    }
    let hosts: Vec<String> = urls.iter().filter_map(|u| url_host(u)).collect();
    let dir = cfg.data_dir.join("fixtures").join(side);
    let generated = tls::self_signed(&dir, &hosts, cfg.self_signed_cert_validity)
        .map_err(|e| StartError::Config(format!("{side} auto TLS: {e}")))?;
    info.cert_file = generated.cert_file;
    info.key_file = generated.key_file;
    Ok(true)
}

/// The host of a URL (`https://host:port/...`), brackets of an IPv6
/// address removed.
fn url_host(url: &str) -> Option<String> {
    let rest = url.split_once("://").map_or(url, |(_, rest)| rest);
    let authority = rest.split('/').next()?;
    let host = authority
        .rsplit_once(':')
        .map_or(authority, |(host, _)| host);
    let host = host.trim_start_matches('[').trim_end_matches(']');
    (!host.is_empty()).then(|| host.to_string())
}

/// The backend and the state rebuilt from it.
struct Backend {
    store: Arc<Store>,
    lessor: Arc<Lessor>,
    alarms: Arc<Alarms>,
    auth: Arc<AuthStore>,
}

async fn open_backend(cfg: &ServerConfig, metrics: &Metrics) -> Result<Backend, StartError> {
    let path = cfg.backend_path();
    let store = {
        let path = path.clone();
        let snap_dir = cfg.member_dir().join("snap");
        let defrag_threshold = cfg.bootstrap_defrag_threshold_bytes;
        tokio::task::spawn_blocking(move || {
            let store = Store::open_deferring_check(&path)?;
            if let Some(index) = etcdserver::snapshot::install_received_backend(&store, &snap_dir)?
            {
                tracing::info!(
                    index,
                    "consistent-index" = store.consistent_index(),
                    "installed the database snapshot received before a restart"
                );
            }
            if defrag_threshold != 0 {
                maybe_defrag_backend(&store, &path, defrag_threshold)?;
            }
            Ok::<_, mvcc::MvccError>(store)
        })
        .await
        .map_err(|e| StartError::Config(format!("backend open task failed: {e}")))??
    };
    let store = Arc::new(store);
    store
        .start_compactor(cfg.compaction_batches)
        .map_err(|e| StartError::Config(format!("cannot start the compactor thread: {e}")))?;
    store
        .start_flusher(mvcc::FLUSH_INTERVAL)
        .map_err(|e| StartError::Config(format!("cannot start the backend flush thread: {e}")))?;
    store.set_commit_observer(metrics.backend_commit_observer());
    store.set_compaction_observer(metrics.compaction.clone());
    let lessor = Arc::new(Lessor::new(
        lease::min_lease_ttl(cfg.heartbeat, cfg.election_timeout),
        cfg.lease_checkpoint_interval,
    ));
    recover_lessor(&lessor, &store)?;
    let alarms = Arc::new(Alarms::default());
    recover_alarms(&alarms, &store)?;
    let auth = AuthStore::new(&cfg.auth, metrics.auth_revision.clone()).map_err(|e| {
        tracing::error!(error = %e, "failed to create a token provider");
        StartError::Config(e.to_string())
    })?;
    auth.recover(&store)?;
    {
        let lessor = lessor.clone();
        store.set_lease_lookup(Arc::new(move |id| lessor.exists(id)));
    }
    tracing::info!(path = %path.display(), "consistent-index" = store.consistent_index(),
        revision = store.current_revision(), "opened backend db");
    tracing::info!("current-rev" = store.current_revision(), "kvstore restored");
    Ok(Backend {
        store,
        lessor,
        alarms,
        auth: Arc::new(auth),
    })
}

/// etcd's maybeDefragBackend (--experimental-bootstrap-defrag-threshold-megabytes):
/// before serving, defragments the backend when at least `threshold` bytes
/// of it are free (size minus size in use), with backend.defrag's lines.
fn maybe_defrag_backend(
    store: &Store,
    path: &std::path::Path,
    threshold: u64,
) -> Result<(), mvcc::MvccError> {
    use mvcc::snapshot_file::humanize_bytes;
    let size = store.db_size();
    let in_use = store.measure_size_in_use()?;
    // etcd: uint(size - sizeInUse)
    let freeable = size.wrapping_sub(in_use) as u64;
    if freeable < threshold {
        tracing::info!(
            "current-db-size-bytes" = size,
            "current-db-size" = %humanize_bytes(size.max(0) as u64),
            "current-db-size-in-use-bytes" = in_use,
            "current-db-size-in-use" = %humanize_bytes(in_use.max(0) as u64),
            "experimental-bootstrap-defrag-threshold-bytes" = threshold,
            "experimental-bootstrap-defrag-threshold" = %humanize_bytes(threshold),
            "Skipping defragmentation"
        );
        return Ok(());
    }
    tracing::info!(path = %path.display(),
        "current-db-size-bytes" = size,
        "current-db-size" = %humanize_bytes(size.max(0) as u64),
        "current-db-size-in-use-bytes" = in_use,
        "current-db-size-in-use" = %humanize_bytes(in_use.max(0) as u64),
        "defragmenting");
    let stats = store.defragment()?;
    tracing::info!(path = %path.display(),
        "current-db-size-bytes-diff" = stats.size_after - stats.size_before,
        "current-db-size-bytes" = stats.size_after,
        "current-db-size" = %humanize_bytes(stats.size_after.max(0) as u64),
        "current-db-size-in-use-bytes-diff" = store.db_size_in_use() - in_use,
        "current-db-size-in-use-bytes" = store.db_size_in_use(),
        "current-db-size-in-use" = %humanize_bytes(store.db_size_in_use().max(0) as u64),
        "took" = ?stats.copy_time + stats.swap_time,
        "finished defragmenting directory");
    Ok(())
}

fn parse_urls(urls: &[String]) -> Result<Vec<SocketAddr>, StartError> {
    urls.iter().map(|u| parse_url(u)).collect()
}

/// Client URLs: TCP or Unix socket addresses.
fn parse_listen_urls(urls: &[String]) -> Result<Vec<ListenAddr>, StartError> {
    urls.iter().map(|u| parse_listen_url(u)).collect()
}

/// Keeps the peer transport on the member list as committed entries
/// change it, and tells when this member itself is removed.
fn follow_membership(
    members: &ClusterMembers,
    transport: &Arc<PeerTransport>,
    own: u64,
    removed: &Arc<watch::Sender<bool>>,
) {
    use etcdserver::membership::MembershipChange;
    let transport = transport.clone();
    let removed = removed.clone();
    members.observe(Box::new(move |change| match change {
        MembershipChange::Upserted(m) => {
            if let Some(url) = m.peer_urls.first() {
                transport.add_peer(m.id, url);
            }
        }
        MembershipChange::Removed(id) => {
            transport.remove_peer(*id);
            if *id == own {
                removed.send_replace(true);
            }
        }
        MembershipChange::Replaced {
            members,
            removed: gone,
        } => {
            for m in members {
                if let Some(url) = m.peer_urls.first() {
                    transport.add_peer(m.id, url);
                }
            }
            for id in gone {
                transport.remove_peer(*id);
            }
            if gone.contains(&own) {
                removed.send_replace(true);
            }
        }
    }));
}

/// Every other member's ID and first peer URL.
fn peer_urls(members: &ClusterMembers, me: u64) -> Vec<(u64, String)> {
    members
        .list()
        .iter()
        .filter(|m| m.id != me)
        .filter_map(|m| m.peer_urls.first().map(|url| (m.id, url.clone())))
        .collect()
}

fn start_raft(
    cfg: &ServerConfig,
    identity: &Identity,
    store: &Store,
    transport: Arc<PeerTransport>,
    metrics: &Metrics,
) -> Result<
    (
        RaftHandle,
        tokio::sync::mpsc::Receiver<consensus::CommittedBatch>,
    ),
    StartError,
> {
    let raft_cfg = RaftConfig {
        id: identity.member.id,
        member_dir: cfg.member_dir(),
        wal_dir: cfg.wal_dir(),
        voters: identity.voters.clone(),
        heartbeat: cfg.heartbeat,
        election_timeout: cfg.election_timeout,
        applied: store.consistent_index(),
        cluster_id: identity.cluster_id,
        force_new_cluster: cfg.force_new_cluster,
    };
    let options = consensus::StartOptions {
        snapshot_catch_up_entries: cfg.snapshot_catch_up_entries,
        disable_pre_vote: !cfg.pre_vote,
        max_snapshots: Some(cfg.max_snapshots),
        wal_sync_observer: Some(metrics.wal_sync_observer()),
        observer: Some(metrics.raft_observer()),
        wal: consensus::wal::WalOptions {
            unsafe_no_fsync: cfg.unsafe_no_fsync,
            max_files: cfg.max_wals,
            ..Default::default()
        },
    };
    let started = consensus::start_with_options(raft_cfg, transport, options)?;
    tracing::info!("local-member-id" = %format!("{:x}", identity.member.id),
        "cluster-id" = %format!("{:x}", identity.cluster_id), "starting local member");
    Ok(started)
}

fn start_apply(
    cfg: &ServerConfig,
    backend: &Backend,
    raft: &RaftHandle,
    members: &Arc<ClusterMembers>,
    metrics: &Arc<Metrics>,
    committed: tokio::sync::mpsc::Receiver<consensus::CommittedBatch>,
) -> Result<ApplyLoop, StartError> {
    let machine = StateMachine::new(
        backend.store.clone(),
        backend.lessor.clone(),
        backend.alarms.clone(),
        members.clone(),
        metrics.clone(),
        backend.auth.clone(),
    )
    .with_warning_apply_duration(cfg.warning_apply_duration);
    etcdserver::apply::start(
        machine,
        raft,
        cfg.snapshot_count,
        cfg.backend_batch,
        committed,
    )
    .map_err(|e| StartError::Config(format!("cannot start the apply thread: {e}")))
}

/// The member's own loops: damaged-read alarms, publishing itself, lease
/// primacy and expiry, corruption checks and auto-compaction when enabled.
fn start_background_loops(member: &mut Member, shutdown: &watch::Receiver<bool>) {
    let server = &member.server;
    let serving = &mut member.serving;
    serving.push(etcdserver::corrupt::raise_on_damaged_reads(
        server,
        shutdown.clone(),
    ));
    if let Err(e) = etcdserver::corrupt::check_deferred_backend(server, shutdown.clone()) {
        // the next start checks every page (the marker stays)
        tracing::warn!(error = %e, "cannot start the check of the backend a clean stop left");
    }
    let announce = announce_when_ready(server.clone());
    let mut stop = shutdown.clone();
    serving.push(tokio::spawn(async move {
        tokio::select! {
            _ = announce => {}
            _ = stop.wait_for(|stop| *stop) => {}
        }
    }));
    serving.push(tokio::spawn(etcdserver::ticks::adjust(
        server.clone(),
        shutdown.clone(),
    )));
    serving.push(tokio::spawn(etcdserver::lease_driver::run_primacy(
        server.clone(),
        shutdown.clone(),
    )));
    serving.push(tokio::spawn(etcdserver::lease_driver::run_expiry(
        server.clone(),
        shutdown.clone(),
    )));
    if !server.cfg.corrupt_check_time.is_zero() {
        let check = etcdserver::corrupt::run_periodic(
            server.clone(),
            server.cfg.corrupt_check_time,
            shutdown.clone(),
        );
        serving.push(tokio::spawn(check));
    }
    if let Some(interval) = server.cfg.compact_hash_check {
        let check =
            etcdserver::corrupt::run_compact_hash_check(server.clone(), interval, shutdown.clone());
        serving.push(tokio::spawn(check));
    }
    if let Some(mode) = server.cfg.auto_compaction {
        let interval = server.cfg.auto_compaction_revision_interval;
        serving.push(tokio::spawn(etcdserver::compactor::run(
            server.clone(),
            mode,
            interval,
            shutdown.clone(),
        )));
    }
}

/// The lifecycle lines operators wait for, once this member has a leader
/// and has applied what was committed before it started serving.
/// Ready: a leader that has committed an entry of its term, and this member
/// has applied up to it (a ReadIndex round proves both, as etcd's publish
/// through raft does).
/// False when the member stopped first.
async fn wait_ready(server: &EtcdServer) -> bool {
    loop {
        match server.linearizable_read_notify().await {
            Ok(()) => return true,
            Err(e) if e == api::rpctypes::STOPPED => return false,
            Err(_) => continue,
        }
    }
}

/// etcd's publish: this member's name and client URLs go through raft so
/// that every member lists them. Retried until it commits; false when the
/// member stopped first.
async fn publish(server: &EtcdServer) -> bool {
    let attributes = ClusterMemberAttrSetRequest {
        member_id: server.member.id,
        member_attributes: Some(Attributes {
            name: server.member.name.clone(),
            client_urls: server.member.client_urls.clone(),
        }),
    };
    loop {
        match server.propose(attributes.clone()).await {
            Ok(_) => return true,
            Err(e) if e == api::rpctypes::STOPPED => return false,
            Err(e) => {
                tracing::warn!(error = %e, "failed to publish local member to cluster through raft");
                tokio::time::sleep(PUBLISH_RETRY).await;
            }
        }
    }
}

/// How long a failed publish waits before trying again.
const PUBLISH_RETRY: Duration = Duration::from_millis(500);

/// A member that stops first (a fatal error) announces nothing.
async fn announce_when_ready(server: Arc<EtcdServer>) {
    if !wait_ready(&server).await || !publish(&server).await {
        return;
    }
    tracing::info!(
        "local-member-id" = %format!("{:x}", server.member.id),
        "local-member-attributes" = %format!("{{Name:{} ClientURLs:[{}]}}", server.member.name, server.member.client_urls.join(" ")),
        "cluster-id" = %format!("{:x}", server.cluster_id),
        "published local member to cluster through raft"
    );
    tracing::info!(
        "cluster-version" = CLUSTER_VERSION,
        "enabled capabilities for version"
    );
    tracing::info!("ready to serve client requests");
}

// Inline apply runs on the raft thread: it needs a request thread's stack.
const _: () = assert!(consensus::RAFT_THREAD_STACK_BYTES >= api::codec::REQUEST_THREAD_STACK_BYTES);
