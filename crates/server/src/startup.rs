//! Bringing a member up and down: data dir, backend, raft, apply loop,
//! client listeners; and a clean stop that loses nothing.

use std::fs;
use std::net::{SocketAddr, ToSocketAddrs};
use std::path::Path;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use api::etcdserverpb::cluster_server::ClusterServer;
use api::etcdserverpb::kv_server::KvServer;
use api::etcdserverpb::lease_server::LeaseServer;
use api::etcdserverpb::maintenance_server::MaintenanceServer;
use api::etcdserverpb::watch_server::WatchServer;
use api::etcdserverpb::{Attributes, ClusterMemberAttrSetRequest, InternalRaftRequest};
use api::v3electionpb::election_server::ElectionServer;
use api::v3lockpb::lock_server::LockServer;
use consensus::transport::{PeerService, PeerTransport};
use consensus::{RaftConfig, Transport};
use mvcc::Store;
use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::alarms::Alarms;
use crate::apply::Applier;
use crate::config::{ServerConfig, GRPC_OVERHEAD_BYTES};
use crate::etcdserver::EtcdServer;
use crate::gateway::Gateway;
use crate::membership::{ClusterMembers, Member as MemberInfo};
use crate::metrics::grpc::GrpcMetricsLayer;
use crate::metrics::Metrics;
use crate::snapshot::BackendSnapshots;
use crate::v3rpc::cluster::ClusterService;
use crate::v3rpc::concurrency::LocalClient;
use crate::v3rpc::election::ElectionService;
use crate::v3rpc::kv::KvService;
use crate::v3rpc::lease::LeaseService;
use crate::v3rpc::lock::LockService;
use crate::v3rpc::maintenance::{MaintenanceService, CLUSTER_VERSION, ETCD_VERSION};
use crate::v3rpc::watch::WatchService;
use crate::wait::Wait;
use lease::Lessor;
use schema::members as membership;

#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("{0}")]
    Config(String),
    #[error("{0}")]
    DataDir(String),
    #[error("failed to open backend: {0}")]
    Backend(#[from] mvcc::MvccError),
    #[error("failed to start raft: {0}")]
    Raft(#[from] consensus::ConsensusError),
    #[error("failed to listen on {url}: {error}")]
    Listen { url: String, error: std::io::Error },
    #[error("{0}")]
    Corrupt(String),
}

/// Binds a listener for `url` (resolved to `addr`); returns it with the
/// address it got (port 0 resolved).
async fn bind(url: &str, addr: SocketAddr) -> Result<(TcpListener, SocketAddr), StartError> {
    let listen_error = |error| StartError::Listen {
        url: url.to_string(),
        error,
    };
    let listener = TcpListener::bind(addr).await.map_err(listen_error)?;
    let local = listener.local_addr().map_err(listen_error)?;
    Ok((listener, local))
}

/// Rebuilds the alarms from the backend's alarm table.
pub(crate) fn recover_alarms(alarms: &Alarms, store: &Store) -> Result<(), StartError> {
    let records = store.side_records(mvcc::SideTable::Alarms)?;
    alarms.recover(records.into_values());
    Ok(())
}

/// Rebuilds the lessor from the backend's lease table and leased keys.
pub(crate) fn recover_lessor(lessor: &Lessor, store: &Store) -> Result<(), StartError> {
    let records = store.side_records(mvcc::SideTable::Leases)?;
    lessor.recover(records.into_values(), store.take_loaded_leased_keys());
    Ok(())
}

/// A running member.
pub struct Member {
    pub server: Arc<EtcdServer>,
    client_addrs: Vec<SocketAddr>,
    shutdown: watch::Sender<bool>,
    serving: Vec<tokio::task::JoinHandle<()>>,
    apply_thread: Option<JoinHandle<()>>,
}

impl Member {
    /// The addresses the client listeners are bound to (port 0 resolved).
    pub fn client_addrs(&self) -> &[SocketAddr] {
        &self.client_addrs
    }

    /// Resolves with the cause once the member cannot go on (a WAL or
    /// backend write failed, a committed entry cannot be applied): its
    /// owner then stops it and exits non-zero, as etcd does.
    pub async fn fatal(&self) -> String {
        self.server.raft.fatal().raised().await
    }

    /// Resolves once the member has a leader and has applied everything
    /// committed so far (etcd's ReadyNotify).
    pub async fn ready(&self) {
        wait_ready(&self.server).await
    }

    /// Stops serving, stops raft, finishes applying and commits the backend
    /// durably. Every acknowledged write is in the WAL and in the backend.
    pub async fn stop(mut self) {
        tracing::info!(name = %self.server.cfg.name, "closing etcd server");
        if self.server.raft.fatal().cause().is_some() {
            // Nothing more will be applied: requests waiting for their entry
            // answer "server stopped" now rather than at their timeout.
            self.server.wait.close();
        }
        let _ = self.shutdown.send(true);
        for task in self.serving.drain(..) {
            let _ = tokio::time::timeout(Duration::from_secs(5), task).await;
        }
        let raft = self.server.raft.clone();
        let apply_thread = self.apply_thread.take();
        let _ = tokio::task::spawn_blocking(move || {
            raft.stop();
            if let Some(t) = apply_thread {
                let _ = t.join();
            }
        })
        .await;
        tracing::info!(name = %self.server.cfg.name, "closed etcd server");
    }
}

pub fn parse_url(url: &str) -> Result<SocketAddr, StartError> {
    let parsed = url::Url::parse(url)
        .map_err(|e| StartError::Config(format!("invalid URL {url:?}: {e}")))?;
    match parsed.scheme() {
        "http" => {}
        "https" | "unixs" => {
            return Err(StartError::Config(format!(
                "TLS is not supported yet: {url}"
            )));
        }
        other => {
            return Err(StartError::Config(format!(
                "URL scheme must be http, https, unix or unixs: {other}"
            )))
        }
    }
    let host = parsed
        .host_str()
        .ok_or_else(|| StartError::Config(format!("URL has no host: {url}")))?;
    let host = host.trim_start_matches('[').trim_end_matches(']');
    let port = parsed.port().ok_or_else(|| {
        StartError::Config(format!(
            "URL address does not have the form \"host:port\": {url}"
        ))
    })?;
    let host = if host == "localhost" {
        "127.0.0.1"
    } else {
        host
    };
    (host, port)
        .to_socket_addrs()
        .map_err(|e| StartError::Config(format!("cannot resolve {url}: {e}")))?
        .next()
        .ok_or_else(|| StartError::Config(format!("cannot resolve {url}")))
}

/// A member restarted on a volume that filled up (it stopped on ENOSPC)
/// would replay its log, stop the same way and append WAL records each
/// time: below this much free space it refuses to start, writing nothing.
pub const MIN_FREE_BYTES_TO_START: u64 = 1 << 20;

/// Refuses a data dir on a full volume; warns when the volume cannot hold
/// two WAL segments (the member then stops, whole, when it fills).
fn check_volume(cfg: &ServerConfig) -> Result<(), StartError> {
    let probe = cfg
        .data_dir
        .ancestors()
        .find(|p| p.exists())
        .map_or_else(|| Path::new(".").to_path_buf(), Path::to_path_buf);
    let free = match consensus::wal::free_bytes(&probe) {
        Ok(free) => free,
        Err(e) => {
            tracing::warn!(path = %probe.display(), error = %e, "cannot tell the volume's free space");
            return Ok(());
        }
    };
    if free < MIN_FREE_BYTES_TO_START {
        return Err(StartError::DataDir(format!(
            "no space left on device: the volume holding {} has {free} bytes free, and a member \
             needs at least {MIN_FREE_BYTES_TO_START} to start; free space on it, then start again",
            cfg.data_dir.display()
        )));
    }
    let safe = 2 * consensus::wal::SEGMENT_BYTES;
    if free < safe {
        tracing::warn!(
            "data-dir" = %cfg.data_dir.display(),
            "volume-free-bytes" = free,
            "safe-free-bytes" = safe,
            "the data dir's volume is too small to be safe: less than two WAL segments free; \
             the member stops when it fills"
        );
    }
    Ok(())
}

/// etcd's data dir shape, refusing a dir that holds etcd's own bbolt files.
fn prepare_data_dir(cfg: &ServerConfig) -> Result<(), StartError> {
    let member = cfg.member_dir();
    for dir in [member.join("wal"), member.join("snap")] {
        fs::create_dir_all(&dir)
            .map_err(|e| StartError::DataDir(format!("cannot create {}: {e}", dir.display())))?;
    }
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let _ = fs::set_permissions(&cfg.data_dir, fs::Permissions::from_mode(0o700));
    }
    check_backend_is_ours(&cfg.backend_path())
}

struct Identity {
    member: MemberInfo,
    /// Every member this one knows, itself included.
    members: Vec<MemberInfo>,
    cluster_id: u64,
    voters: Vec<u64>,
    restarted: bool,
}

/// The members named by `--initial-cluster`, with etcd's IDs.
fn initial_members(cfg: &ServerConfig) -> Result<Vec<MemberInfo>, StartError> {
    let cluster =
        membership::parse_initial_cluster(&cfg.initial_cluster).map_err(StartError::Config)?;
    Ok(cluster
        .into_iter()
        .map(|(name, urls)| MemberInfo {
            id: membership::member_id(&urls, &cfg.initial_cluster_token),
            client_urls: if name == cfg.name {
                cfg.advertise_client_urls.clone()
            } else {
                Vec::new()
            },
            name,
            peer_urls: urls,
            is_learner: false,
        })
        .collect())
}

/// Who this member is. A member with a WAL takes its IDs and voters from it
/// and ignores the bootstrap token, as etcd does; a new one derives them
/// from `--initial-cluster` and `--initial-cluster-token` as etcd does.
/// Peer URLs come from `--initial-cluster` in both cases (etcd keeps them in
/// its membership store; ours arrives with membership changes).
fn identity(cfg: &ServerConfig) -> Result<Identity, StartError> {
    check_backend_is_ours(&cfg.backend_path())?;
    let wal_dir = cfg.member_dir().join("wal");
    let recorded = if wal_dir.exists() {
        consensus::wal::Wal::read_metadata(&wal_dir).map_err(|e| {
            StartError::DataDir(format!("cannot read the WAL in {}: {e}", wal_dir.display()))
        })?
    } else {
        None
    };
    if let Some(meta) = recorded {
        tracing::info!("local-member-id" = %format!("{:x}", meta.node_id), "cluster-id" = %format!("{:x}", meta.cluster_id),
            "restarting local member");
        let by_url: Vec<MemberInfo> = initial_members(cfg).unwrap_or_default();
        let mut members = Vec::new();
        for voter in &meta.initial_voters {
            match by_url.iter().find(|m| m.id == *voter) {
                Some(m) => members.push(m.clone()),
                None if *voter == meta.node_id => {}
                None => tracing::warn!(member = %format!("{voter:x}"),
                    "peer URLs of a member are unknown: --initial-cluster does not name it"),
            }
        }
        let mut member = members
            .iter()
            .find(|m| m.id == meta.node_id)
            .cloned()
            .unwrap_or(MemberInfo {
                id: meta.node_id,
                name: cfg.name.clone(),
                peer_urls: cfg.initial_advertise_peer_urls.clone(),
                client_urls: Vec::new(),
                is_learner: false,
            });
        member.name = cfg.name.clone();
        member.client_urls = cfg.advertise_client_urls.clone();
        members.retain(|m| m.id != member.id);
        members.push(member.clone());
        return Ok(Identity {
            member,
            members,
            cluster_id: meta.cluster_id,
            voters: meta.initial_voters,
            restarted: true,
        });
    }

    if cfg.initial_cluster_state == "existing" {
        return Err(StartError::Config(
            "joining an existing cluster (--initial-cluster-state existing) is not supported yet"
                .to_string(),
        ));
    }
    let members = initial_members(cfg)?;
    let Some(member) = members.iter().find(|m| m.name == cfg.name).cloned() else {
        return Err(StartError::Config(format!(
            "couldn't find local name {:?} in the initial cluster configuration",
            cfg.name
        )));
    };
    let voters: Vec<u64> = members.iter().map(|m| m.id).collect();
    Ok(Identity {
        cluster_id: membership::cluster_id(&voters),
        member,
        members,
        voters,
        restarted: false,
    })
}

fn check_backend_is_ours(path: &Path) -> Result<(), StartError> {
    use schema::backend_file::{inspect, Kind};
    match inspect(path) {
        Kind::Absent | Kind::Ours => Ok(()),
        Kind::Bbolt => Err(StartError::DataDir(format!(
            "{} is not an oxcd backend (it looks like an etcd bbolt database); oxcd does not open etcd's data files: \
             restore an etcd snapshot into a fresh oxcd data dir instead",
            path.display()
        ))),
        Kind::Unknown => Err(StartError::DataDir(format!(
            "{} is not an oxcd backend, or its first page is damaged: it does not begin with redb's file magic; \
             restore it from a snapshot or another member",
            path.display()
        ))),
    }
}

/// The members this one knows: the backend's members table once it has
/// one (it survives restarts and carries published attributes), else the
/// bootstrap list, which is then written to it. This member's own entry
/// always takes its current name and advertised client URLs.
fn known_members(
    store: &Store,
    bootstrap: Vec<MemberInfo>,
    own: &MemberInfo,
) -> Result<Vec<MemberInfo>, StartError> {
    let stored: Vec<MemberInfo> = store
        .members()?
        .values()
        .filter_map(|b| membership::decode(b))
        .collect();
    let mut members = if stored.is_empty() {
        for m in &bootstrap {
            store.put_member(m.id, Some(membership::encode(m)), store.consistent_index());
        }
        bootstrap
    } else {
        stored
    };
    match members.iter_mut().find(|m| m.id == own.id) {
        Some(m) => {
            m.name = own.name.clone();
            m.client_urls = own.client_urls.clone();
        }
        None => members.push(own.clone()),
    }
    Ok(members)
}

/// Starts a member: returns once its client listeners are bound.
pub async fn start(cfg: ServerConfig) -> Result<Member, StartError> {
    let identity = identity(&cfg)?;
    let (member, members, cluster_id, voters) = (
        identity.member,
        identity.members,
        identity.cluster_id,
        identity.voters,
    );
    let client_addrs: Vec<SocketAddr> = cfg
        .listen_client_urls
        .iter()
        .map(|u| parse_url(u))
        .collect::<Result<_, _>>()?;
    let metrics_addrs: Vec<SocketAddr> = cfg
        .listen_metrics_urls
        .iter()
        .map(|u| parse_url(u))
        .collect::<Result<_, _>>()?;
    let metrics = Arc::new(Metrics::new(member.id, cfg.metrics_extensive));

    let existed = identity.restarted;
    check_volume(&cfg)?;
    prepare_data_dir(&cfg)?;
    tracing::info!(
        "etcd-version" = ETCD_VERSION,
        "oxcd-version" = env!("CARGO_PKG_VERSION"),
        name = %cfg.name,
        "data-dir" = %cfg.data_dir.display(),
        "member-initialized" = existed,
        "starting an etcd server"
    );
    let backend_path = cfg.backend_path();
    let store = {
        let path = backend_path.clone();
        tokio::task::spawn_blocking(move || Store::open(&path))
            .await
            .map_err(|e| StartError::Config(format!("backend open task failed: {e}")))??
    };
    let store = Arc::new(store);
    store.set_commit_observer(metrics.backend_commit_observer());
    let lessor = Arc::new(Lessor::new(
        lease::min_lease_ttl(cfg.heartbeat, cfg.election_timeout),
        cfg.lease_checkpoint_interval,
    ));
    recover_lessor(&lessor, &store)?;
    let alarms = Arc::new(Alarms::default());
    recover_alarms(&alarms, &store)?;
    {
        let lessor = lessor.clone();
        store.set_lease_lookup(Arc::new(move |id| lessor.exists(id)));
    }
    tracing::info!(path = %backend_path.display(), "consistent-index" = store.consistent_index(),
        revision = store.current_revision(), "opened backend db");

    let members = Arc::new(ClusterMembers::new(known_members(
        &store, members, &member,
    )?));

    let raft_cfg = RaftConfig {
        id: member.id,
        member_dir: cfg.member_dir(),
        voters,
        heartbeat: cfg.heartbeat,
        election_timeout: cfg.election_timeout,
        applied: store.consistent_index(),
        cluster_id,
    };
    let peers: Vec<(u64, String)> = members
        .list()
        .iter()
        .filter(|m| m.id != member.id)
        .filter_map(|m| m.peer_urls.first().map(|url| (m.id, url.clone())))
        .collect();
    // A single member's transport has no peers: it sends nothing and
    // refuses every raft link and peer request (no sender is a member).
    let peer_transport = PeerTransport::new(
        member.id,
        cluster_id,
        &peers,
        &tokio::runtime::Handle::current(),
        metrics.network.clone(),
    );
    let transport: Arc<dyn Transport> = peer_transport.clone();
    let options = consensus::StartOptions {
        snapshot_catch_up_entries: cfg.snapshot_catch_up_entries,
        wal_sync_observer: Some(metrics.wal_sync_observer()),
        wal: consensus::wal::WalOptions {
            unsafe_no_fsync: cfg.unsafe_no_fsync,
            ..Default::default()
        },
    };
    let (raft, committed) = consensus::start_with_options(raft_cfg, transport, options)?;
    tracing::info!("local-member-id" = %format!("{:x}", member.id), "cluster-id" = %format!("{:x}", cluster_id),
        "starting local member");

    let wait = Arc::new(Wait::default());
    let (applied_tx, applied_rx) = watch::channel(store.consistent_index());
    let applier = Applier {
        store: store.clone(),
        raft: raft.clone(),
        wait: wait.clone(),
        applied: applied_tx,
        snapshot_count: cfg.snapshot_count.max(1),
        members: members.clone(),
        lessor: lessor.clone(),
        alarms: alarms.clone(),
        metrics: metrics.clone(),
        last_snapshot: store.consistent_index().into(),
        busy: parking_lot::Mutex::new(()),
        fatal: raft.fatal(),
        halted: false.into(),
    };
    let applier = Arc::new(applier);
    // Weak: the apply thread owns the applier (which holds the raft handle);
    // the hook must not keep it, and the store in it, alive past shutdown.
    let inline = Arc::downgrade(&applier);
    raft.set_inline_apply(Box::new(move |batch| match inline.upgrade() {
        Some(applier) => applier.try_apply_inline(batch),
        None => Err(batch),
    }));
    let fatal = raft.fatal();
    let apply_thread = std::thread::Builder::new()
        .name("apply".into())
        .stack_size(api::codec::REQUEST_THREAD_STACK_BYTES)
        .spawn(move || fatal.run_thread("apply", move || applier.run(committed)))
        .map_err(|e| StartError::Config(format!("cannot start the apply thread: {e}")))?;

    let server = Arc::new_cyclic(|me| {
        EtcdServer::new(
            members.clone(),
            cfg.clone(),
            store,
            raft,
            member,
            cluster_id,
            wait,
            applied_rx,
            metrics,
            lessor,
            alarms,
            me.clone(),
        )
    });
    let source = BackendSnapshots {
        store: server.store.clone(),
        applied: server.applied.clone(),
        snap_dir: cfg.member_dir().join("snap"),
    };
    peer_transport.attach_snapshots(server.raft.clone(), Arc::new(source));
    let (shutdown, shutdown_rx) = watch::channel(false);
    let mut bound = Vec::new();
    let mut serving = Vec::new();
    for url in &cfg.listen_peer_urls {
        let addr = parse_url(url)?;
        let (listener, local) = bind(url, addr).await?;
        serving.push(tokio::spawn(serve_peers(
            server.clone(),
            peer_transport.clone(),
            listener,
            shutdown_rx.clone(),
        )));
        tracing::info!(address = %local, "serving peer traffic");
    }
    if cfg.initial_corrupt_check {
        if let Err(reason) = crate::corrupt::check_initial(&server).await {
            let _ = shutdown.send(true);
            let raft = server.raft.clone();
            let _ = tokio::task::spawn_blocking(move || {
                raft.stop();
                let _ = apply_thread.join();
            })
            .await;
            return Err(StartError::Corrupt(reason));
        }
    }
    if !cfg.corrupt_check_time.is_zero() {
        serving.push(tokio::spawn(crate::corrupt::run_periodic(
            server.clone(),
            cfg.corrupt_check_time,
            shutdown_rx.clone(),
        )));
    }
    for (url, addr) in cfg.listen_client_urls.iter().zip(client_addrs) {
        let (listener, local) = bind(url, addr).await?;
        bound.push(local);
        serving.push(tokio::spawn(serve_clients(
            server.clone(),
            listener,
            shutdown_rx.clone(),
        )));
        tracing::warn!(address = %local, "serving client traffic insecurely; this is strongly discouraged!");
    }
    for (url, addr) in cfg.listen_metrics_urls.iter().zip(metrics_addrs) {
        let (listener, local) = bind(url, addr).await?;
        serving.push(tokio::spawn(serve_metrics(
            server.clone(),
            listener,
            shutdown_rx.clone(),
        )));
        tracing::info!(address = %local, "serving metrics");
    }
    serving.push(crate::corrupt::raise_on_damaged_reads(
        &server,
        shutdown_rx.clone(),
    ));
    tokio::spawn(announce_when_ready(server.clone()));
    serving.push(tokio::spawn(crate::lease_driver::run_primacy(
        server.clone(),
        shutdown_rx.clone(),
    )));
    serving.push(tokio::spawn(crate::lease_driver::run_expiry(
        server.clone(),
        shutdown_rx.clone(),
    )));
    if let Some(mode) = server.cfg.auto_compaction {
        serving.push(tokio::spawn(crate::compactor::run(
            server.clone(),
            mode,
            server.cfg.auto_compaction_revision_interval,
            shutdown_rx.clone(),
        )));
    }
    Ok(Member {
        server,
        client_addrs: bound,
        shutdown,
        serving,
        apply_thread: Some(apply_thread),
    })
}

/// The next connection on `listener`, with TCP_NODELAY set (without it small
/// responses wait for delayed ACKs, ~40 ms); None once `shutdown` is set.
/// A failed accept (out of descriptors and the like) is logged and retried
/// after a pause rather than in a spin.
async fn accept_until_stop(
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

/// Connections to the peer listener waiting for the gRPC server.
const PEER_ACCEPT_QUEUE: usize = 64;

async fn serve_peers(
    server: Arc<EtcdServer>,
    transport: Arc<PeerTransport>,
    listener: TcpListener,
    mut shutdown: watch::Receiver<bool>,
) {
    use consensus::transport::{
        MAX_PEER_CONNECTIONS, MAX_PEER_RPC_BYTES, MAX_PEER_STREAMS_PER_CONNECTION,
    };
    // Raft links (a raw framed stream, see consensus::transport) and gRPC
    // share the port: each connection is sorted by its first bytes. Each
    // holds a permit while it lasts: past MAX_PEER_CONNECTIONS a new
    // connection is closed at once.
    let permits = Arc::new(tokio::sync::Semaphore::new(MAX_PEER_CONNECTIONS));
    let (grpc_tx, grpc_rx) =
        tokio::sync::mpsc::channel::<std::io::Result<PeerConnection>>(PEER_ACCEPT_QUEUE);
    let sorter = {
        let raft = server.raft.clone();
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
                let mut shutdown = shutdown.clone();
                tokio::spawn(async move {
                    match consensus::transport::is_raft_link(&stream).await {
                        Some(true) => {
                            // on the raft thread, which ends it when it stops
                            let link = consensus::transport::adopt_raft_link(
                                stream, transport, raft, permit,
                            );
                            tokio::select! {
                                _ = link => {}
                                _ = shutdown.wait_for(|stop| *stop) => {}
                            }
                        }
                        Some(false) => {
                            let _ = grpc_tx
                                .send(Ok(PeerConnection {
                                    stream,
                                    _permit: permit,
                                }))
                                .await;
                        }
                        None => {}
                    }
                });
            }
        })
    };
    let incoming = tokio_stream::wrappers::ReceiverStream::new(grpc_rx);
    let snap_dir = server.cfg.member_dir().join("snap");
    let peer = PeerService::server(transport, server.raft.clone(), snap_dir);
    let result = tonic::transport::Server::builder()
        .max_concurrent_streams(MAX_PEER_STREAMS_PER_CONNECTION)
        .add_service(peer)
        .add_service(
            crate::lease_driver::LeasePeerService::server(server.clone())
                .max_decoding_message_size(MAX_PEER_RPC_BYTES),
        )
        .add_service(
            crate::corrupt::MaintenancePeerService::server(server.clone())
                .max_decoding_message_size(MAX_PEER_RPC_BYTES),
        )
        .serve_with_incoming_shutdown(incoming, async move {
            let _ = shutdown.wait_for(|stop| *stop).await;
        })
        .await;
    sorter.abort();
    if let Err(e) = result {
        tracing::error!(error = %e, "peer listener stopped");
    }
}

/// A gRPC connection on the peer port, holding its connection permit.
struct PeerConnection {
    stream: tokio::net::TcpStream,
    _permit: tokio::sync::OwnedSemaphorePermit,
}

impl tonic::transport::server::Connected for PeerConnection {
    type ConnectInfo = <tokio::net::TcpStream as tonic::transport::server::Connected>::ConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.stream.connect_info()
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

/// Starts the client connection threads at once (they exist when `start`
/// returns) and returns the accept loop that feeds them.
fn serve_clients(
    server: Arc<EtcdServer>,
    listener: TcpListener,
    mut shutdown: watch::Receiver<bool>,
) -> impl std::future::Future<Output = ()> + Send + 'static {
    let max_request = server.cfg.max_request_bytes + GRPC_OVERHEAD_BYTES;
    let kv = KvServer::new(KvService::new(server.clone()))
        .max_decoding_message_size(max_request)
        .max_encoding_message_size(usize::MAX);
    let maintenance = MaintenanceServer::new(MaintenanceService::new(server.clone()))
        .max_decoding_message_size(max_request)
        .max_encoding_message_size(usize::MAX);
    let cluster = ClusterServer::new(ClusterService::new(server.clone()))
        .max_decoding_message_size(max_request)
        .max_encoding_message_size(usize::MAX);
    let watch = WatchServer::new(WatchService::new(server.clone(), shutdown.clone()))
        .max_decoding_message_size(max_request)
        .max_encoding_message_size(usize::MAX);
    let lease = LeaseServer::new(LeaseService::new(server.clone(), shutdown.clone()))
        .max_decoding_message_size(max_request)
        .max_encoding_message_size(usize::MAX);
    let own_client = LocalClient::new(server.clone(), shutdown.clone());
    let election = ElectionServer::new(ElectionService::new(own_client.clone()))
        .max_decoding_message_size(max_request)
        .max_encoding_message_size(usize::MAX);
    let lock = LockServer::new(LockService::new(own_client.clone()))
        .max_decoding_message_size(max_request)
        .max_encoding_message_size(usize::MAX);
    let grpc = tonic::service::Routes::builder()
        .add_service(kv)
        .add_service(maintenance)
        .add_service(cluster)
        .add_service(watch)
        .add_service(lease)
        .add_service(election)
        .add_service(lock)
        .clone()
        .routes();
    let gateway = Arc::new(Gateway::new(server.clone(), shutdown.clone(), own_client));
    let routes = tonic::service::Routes::from(crate::http::with_fallback(
        grpc.into_axum_router()
            .merge(crate::http::client_router(server.clone(), gateway)),
    ));
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let mut workers = Vec::with_capacity(threads);
    for i in 0..threads {
        match ClientThread::spawn(i, server.clone(), routes.clone(), shutdown.clone()) {
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
        while let Some(stream) = accept_until_stop(&listener, &mut shutdown, "client").await {
            // Leave this runtime's reactor; the connection thread registers it
            // with its own.
            let Ok(stream) = stream.into_std() else {
                continue;
            };
            next = (next + 1) % workers.len();
            if workers[next].connections.send(stream).await.is_err() {
                tracing::error!("client listener stopped: a connection thread ended");
                break;
            }
        }
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

/// Connections accepted but not yet taken by their connection thread.
const CLIENT_ACCEPT_QUEUE: usize = 64;

/// One of the threads serving client connections, each on its own
/// current-thread runtime (as many as there are CPUs). A connection stays on
/// the thread it is handed to, with every request stream it carries: a
/// request wakes one thread, where tokio's work-stealing scheduler would
/// also wake a second worker to look for more work each time one is
/// unparked (1 client put: ~1 context switch and ~30 µs of CPU per request).
struct ClientThread {
    connections: tokio::sync::mpsc::Sender<std::net::TcpStream>,
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
                let incoming = tokio_stream::StreamExt::map(
                    tokio_stream::wrappers::ReceiverStream::new(queue),
                    tokio::net::TcpStream::from_std,
                );
                // HTTP/1.1 too (hyper's auto connection builder tells the two
                // apart by the HTTP/2 preface), for curl and the gateway's
                // clients.
                let serve = tonic::transport::Server::builder()
                    .accept_http1(true)
                    .max_concurrent_streams(server.cfg.max_concurrent_streams)
                    .http2_keepalive_interval(Some(Duration::from_secs(2 * 60 * 60)))
                    .http2_keepalive_timeout(Some(Duration::from_secs(20)))
                    .layer(crate::grpc_compat::GrpcGuardLayer)
                    .layer(GrpcMetricsLayer::new(server.metrics.grpc.clone()))
                    .layer(tower::util::MapResponseLayer::new(
                        crate::grpc_compat::rewrite_oversized_request,
                    ))
                    .add_routes(routes)
                    .serve_with_incoming_shutdown(incoming, async move {
                        let _ = shutdown.wait_for(|stop| *stop).await;
                    });
                drop(server);
                runtime.block_on(async move {
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

/// `--listen-metrics-urls`: /metrics and /health over HTTP/1.1 or HTTP/2.
async fn serve_metrics(
    server: Arc<EtcdServer>,
    listener: TcpListener,
    mut shutdown: watch::Receiver<bool>,
) {
    let incoming = tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true));
    let routes = crate::http::with_fallback(crate::http::metrics_router(server));
    let result = tonic::transport::Server::builder()
        .accept_http1(true)
        .add_routes(tonic::service::Routes::from(routes))
        .serve_with_incoming_shutdown(incoming, async move {
            let _ = shutdown.wait_for(|stop| *stop).await;
        })
        .await;
    if let Err(e) = result {
        tracing::error!(error = %e, "metrics listener stopped");
    }
}

/// The lifecycle lines operators wait for, once this member has a leader
/// and has applied what was committed before it started serving.
/// Ready: a leader that has committed an entry of its term, and this member
/// has applied up to it (a ReadIndex round proves both, as etcd's publish
/// through raft does).
async fn wait_ready(server: &EtcdServer) {
    loop {
        match server.linearizable_read_notify().await {
            Ok(()) => return,
            Err(e) if e == api::rpctypes::STOPPED => return,
            Err(_) => continue,
        }
    }
}

/// etcd's publish: this member's name and client URLs go through raft so
/// that every member lists them. Retried until it commits.
async fn publish(server: &EtcdServer) {
    let attributes = ClusterMemberAttrSetRequest {
        member_id: server.member.id,
        member_attributes: Some(Attributes {
            name: server.member.name.clone(),
            client_urls: server.member.client_urls.clone(),
        }),
    };
    loop {
        let request = InternalRaftRequest {
            cluster_member_attr_set: Some(attributes.clone()),
            ..Default::default()
        };
        match server.propose(request).await {
            Ok(_) => return,
            Err(e) if e == api::rpctypes::STOPPED => return,
            Err(e) => {
                tracing::warn!(error = %e, "failed to publish local member to cluster through raft");
                tokio::time::sleep(PUBLISH_RETRY).await;
            }
        }
    }
}

/// How long a failed publish waits before trying again.
const PUBLISH_RETRY: Duration = Duration::from_millis(500);

async fn announce_when_ready(server: Arc<EtcdServer>) {
    wait_ready(&server).await;
    publish(&server).await;
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
