//! The peer transport (our rafthttp): raft messages to each peer over one
//! long-lived TCP "raft link" on the peer's `--listen-peer-urls`, batched,
//! with reconnect and back-off. The link is a plain framed stream (see
//! [`RAFT_MAGIC`]), told apart from gRPC by its first bytes on the same
//! port; snapshots, probes and the other peer services stay gRPC.
//!
//! Both ends of every link run on the raft thread's own runtime
//! ([`crate::Transport::start`], [`adopt_raft_link`]): the raft thread
//! writes its messages to the socket itself (flushing before each
//! fdatasync) and reads its peers' messages while it waits, so a message
//! costs no thread wake-up on either side. Through gRPC it took five (raft
//! thread, sender task, body pipe, connection task; connection task,
//! handler, raft thread): measured on a 3-member cluster, 47 → 20 context
//! switches per write.
//!
//! Never blocks the raft thread: `send` only `try_send`s into a bounded
//! queue per peer and drops what does not fit (raft retransmits; a dead or
//! slow peer costs memory bounded by `PEER_QUEUE_CAPACITY`).
//!
//! While a peer is connected, a prober times a `Probe` call on the same
//! connection every [`PROBE_INTERVAL`]; the round trips, bytes and
//! connection changes go to a [`NetworkObserver`] (the server's
//! etcd_network_* metrics; this crate knows no metrics).

use std::collections::HashMap;
use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use api::oxcdpeerpb::peer_client::PeerClient;
use api::oxcdpeerpb::peer_server::{Peer, PeerServer};
use api::oxcdpeerpb::{ProbeRequest, ProbeResponse, RaftBatch, SnapshotChunk, StreamAck};
use parking_lot::RwLock;
use protobuf::Message as _;
use raft::eraftpb::{self, MessageType};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};

use crate::{RaftHandle, Transport};

/// Messages queued for one peer; beyond this they are dropped.
pub const PEER_QUEUE_CAPACITY: usize = 4096;
/// Messages per batch on the wire.
pub const MAX_BATCH_MESSAGES: usize = 256;
/// Opens a raft link on a peer listener, before the hello's cluster ID,
/// sender and receiver (u64 little-endian each); then each message is a
/// u32 little-endian length and an encoded raft `Message`.
pub const RAFT_MAGIC: &[u8; 8] = b"OXRAFT01";
const RAFT_HELLO_LEN: usize = 8 + 3 * 8;
/// A raft link whose peer does not take a batch within this is dropped and
/// reconnected (etcd's ConnWriteTimeout).
const WRITE_TIMEOUT: Duration = Duration::from_secs(5);
/// An accepted connection must say what it is within this.
const HELLO_TIMEOUT: Duration = Duration::from_secs(5);
const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);
const BACKOFF_MIN: Duration = Duration::from_millis(50);
const BACKOFF_MAX: Duration = Duration::from_secs(1);
/// The largest raft message a member accepts from a peer (entries are
/// bounded by max_size_per_msg; snapshots travel out of band).
pub const MAX_PEER_MESSAGE_BYTES: usize = 64 * 1024 * 1024;

/// Bytes of backend per snapshot chunk.
pub const SNAPSHOT_CHUNK_BYTES: usize = 1024 * 1024;

/// How often a connected peer's round trip is measured (etcd's
/// proberInterval: ConnReadTimeout - 1 s).
pub const PROBE_INTERVAL: Duration = Duration::from_secs(4);
/// A probe not answered in time is not observed (the stream's own failure
/// shows the peer is gone).
const PROBE_TIMEOUT: Duration = Duration::from_secs(5);

/// Told what the transport sees, for etcd's etcd_network_* metrics.
pub trait NetworkObserver: Send + Sync {
    /// A probe to `to` came back after `rtt`.
    fn round_trip(&self, to: u64, rtt: Duration);
    /// Raft message bytes sent to `to`.
    fn sent(&self, to: u64, bytes: u64);
    /// Raft message bytes received from `from`.
    fn received(&self, from: u64, bytes: u64);
    /// Messages to `to` that could not be sent (queue full, stream broken).
    fn send_failed(&self, to: u64, messages: u64);
    /// The stream to `peer` connected (true) or broke (false).
    fn connection(&self, peer: u64, active: bool);
}

/// Observes nothing.
pub struct NoNetworkObserver;

impl NetworkObserver for NoNetworkObserver {
    fn round_trip(&self, _: u64, _: Duration) {}
    fn sent(&self, _: u64, _: u64) {}
    fn received(&self, _: u64, _: u64) {}
    fn send_failed(&self, _: u64, _: u64) {}
    fn connection(&self, _: u64, _: bool) {}
}

/// Makes backend snapshots for followers that need one.
pub trait SnapshotSource: Send + Sync {
    /// A file holding a consistent copy of the backend whose consistent
    /// index is at least `index` (so that the follower, once it installs
    /// it, misses no entry at or below the raft snapshot). The transport
    /// deletes the file after sending it.
    fn backend_snapshot(
        &self,
        index: u64,
    ) -> Pin<Box<dyn Future<Output = Result<PathBuf, String>> + Send>>;
}

struct PeerQueue {
    tx: mpsc::Sender<Vec<u8>>,
    url: String,
    snapshot_in_flight: Arc<AtomicBool>,
}

/// A peer's link, URL and message queue, before the raft thread starts.
type PendingSender = (Link, String, mpsc::Receiver<Vec<u8>>);

/// Sends raft messages to peers. Cheap to share; one task per peer.
pub struct PeerTransport {
    id: u64,
    cluster_id: u64,
    peers: RwLock<HashMap<u64, PeerQueue>>,
    dropped: AtomicU64,
    runtime: tokio::runtime::Handle,
    snapshots: OnceLock<(RaftHandle, Arc<dyn SnapshotSource>)>,
    observer: Arc<dyn NetworkObserver>,
    /// Each peer's sender, until [`Transport::start`] spawns it on the raft
    /// thread's runtime (messages queue in the meantime).
    senders: parking_lot::Mutex<Vec<PendingSender>>,
}

impl PeerTransport {
    /// `peers`: every other member's ID and peer URL. Tasks run on `runtime`.
    pub fn new(
        id: u64,
        cluster_id: u64,
        peers: &[(u64, String)],
        runtime: &tokio::runtime::Handle,
        observer: Arc<dyn NetworkObserver>,
    ) -> Arc<PeerTransport> {
        let transport = Arc::new(PeerTransport {
            id,
            cluster_id,
            peers: RwLock::new(HashMap::new()),
            dropped: AtomicU64::new(0),
            runtime: runtime.clone(),
            snapshots: OnceLock::new(),
            observer: observer.clone(),
            senders: parking_lot::Mutex::new(Vec::new()),
        });
        for (peer, url) in peers {
            if *peer == id {
                continue;
            }
            let (tx, rx) = mpsc::channel(PEER_QUEUE_CAPACITY);
            let queue = PeerQueue {
                tx,
                url: url.clone(),
                snapshot_in_flight: Arc::new(AtomicBool::new(false)),
            };
            transport.peers.write().insert(*peer, queue);
            let link = Link {
                from: id,
                to: *peer,
                cluster_id,
                observer: observer.clone(),
                probes: runtime.clone(),
            };
            transport.senders.lock().push((link, url.clone(), rx));
        }
        transport
    }

    /// Enables sending snapshots: done once raft has started (the transport
    /// exists before the raft handle does).
    pub fn attach_snapshots(&self, raft: RaftHandle, source: Arc<dyn SnapshotSource>) {
        let _ = self.snapshots.set((raft, source));
    }

    /// Messages dropped because a peer's queue was full.
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }
}

impl PeerTransport {
    /// One snapshot per peer at a time; raft asks again if this one fails.
    fn start_snapshot(&self, peer: &PeerQueue, msg: eraftpb::Message) {
        let Some((raft, source)) = self.snapshots.get() else {
            tracing::warn!(to = %format!("{:x}", msg.to), "raft: snapshot needed but snapshots are not enabled");
            return;
        };
        if peer.snapshot_in_flight.swap(true, Ordering::AcqRel) {
            return;
        }
        let job = SnapshotJob {
            cluster_id: self.cluster_id,
            url: peer.url.clone(),
            raft: raft.clone(),
            source: source.clone(),
            in_flight: peer.snapshot_in_flight.clone(),
        };
        self.runtime.spawn(job.run(msg));
    }
}

struct SnapshotJob {
    cluster_id: u64,
    url: String,
    raft: RaftHandle,
    source: Arc<dyn SnapshotSource>,
    in_flight: Arc<AtomicBool>,
}

impl SnapshotJob {
    async fn run(self, msg: eraftpb::Message) {
        let to = msg.to;
        let index = msg.get_snapshot().get_metadata().index;
        tracing::info!(to = %format!("{to:x}"), index, "sending database snapshot to a member");
        let result = self.send(msg).await;
        match &result {
            Ok(bytes) => {
                tracing::info!(to = %format!("{to:x}"), index, bytes, "sent database snapshot")
            }
            Err(e) => {
                tracing::warn!(to = %format!("{to:x}"), index, error = %e, "failed to send database snapshot")
            }
        }
        self.raft.report_snapshot(to, result.is_ok());
        self.in_flight.store(false, Ordering::Release);
    }

    async fn send(&self, msg: eraftpb::Message) -> Result<u64, String> {
        let index = msg.get_snapshot().get_metadata().index;
        let path = self.source.backend_snapshot(index).await?;
        let sent = self.stream_file(&msg, &path).await;
        let _ = tokio::fs::remove_file(&path).await;
        sent
    }

    async fn stream_file(
        &self,
        msg: &eraftpb::Message,
        path: &std::path::Path,
    ) -> Result<u64, String> {
        let mut file = tokio::fs::File::open(path)
            .await
            .map_err(|e| format!("open {}: {e}", path.display()))?;
        let endpoint =
            tonic::transport::Endpoint::from_shared(self.url.clone()).map_err(|e| e.to_string())?;
        let channel = endpoint
            .connect_timeout(CONNECT_TIMEOUT)
            .connect()
            .await
            .map_err(|e| e.to_string())?;
        let mut client = PeerClient::new(channel).max_encoding_message_size(MAX_PEER_MESSAGE_BYTES);
        let (chunks, wire) = mpsc::channel::<SnapshotChunk>(4);
        let call = tokio::spawn(async move { client.snapshot(ReceiverStream::new(wire)).await });
        let header = SnapshotChunk {
            cluster_id: self.cluster_id,
            from: msg.from,
            to: msg.to,
            message: msg.write_to_bytes().map_err(|e| e.to_string())?.into(),
            data: Default::default(),
            last: false,
        };
        let mut sent = 0u64;
        let mut pending = Some(header);
        let mut buf = vec![0u8; SNAPSHOT_CHUNK_BYTES];
        loop {
            if let Some(chunk) = pending.take() {
                if chunks.send(chunk).await.is_err() {
                    break;
                }
            }
            let n = file.read(&mut buf).await.map_err(|e| e.to_string())?;
            sent += n as u64;
            let chunk = SnapshotChunk {
                data: buf[..n].to_vec().into(),
                last: n == 0,
                ..Default::default()
            };
            if n == 0 {
                let _ = chunks.send(chunk).await;
                break;
            }
            pending = Some(chunk);
        }
        drop(chunks);
        match call.await {
            Ok(Ok(_)) => Ok(sent),
            Ok(Err(status)) => Err(status.message().to_string()),
            Err(e) => Err(e.to_string()),
        }
    }
}

impl Transport for PeerTransport {
    fn start(&self, io: &tokio::runtime::Handle) {
        for (link, url, rx) in self.senders.lock().drain(..) {
            io.spawn(run_peer(link, url, rx));
        }
    }

    fn send(&self, msgs: Vec<eraftpb::Message>) {
        let peers = self.peers.read();
        for msg in msgs {
            let Some(peer) = peers.get(&msg.to) else {
                tracing::debug!(
                    from = self.id,
                    to = msg.to,
                    "raft: message to an unknown peer dropped"
                );
                continue;
            };
            if msg.get_msg_type() == MessageType::MsgSnapshot {
                self.start_snapshot(peer, msg);
                continue;
            }
            let bytes = match msg.write_to_bytes() {
                Ok(b) => b,
                Err(e) => {
                    tracing::error!(error = %e, "raft: cannot encode a message");
                    continue;
                }
            };
            if peer.tx.try_send(bytes).is_err() {
                self.dropped.fetch_add(1, Ordering::Relaxed);
                self.observer.send_failed(msg.to, 1);
            }
        }
    }
}

/// One direction between two members.
#[derive(Clone)]
struct Link {
    from: u64,
    to: u64,
    cluster_id: u64,
    observer: Arc<dyn NetworkObserver>,
    /// Where probes run: the main runtime, not the raft thread's.
    probes: tokio::runtime::Handle,
}

/// One peer's sender: connect, stream batches, reconnect with back-off.
async fn run_peer(link: Link, url: String, mut queue: mpsc::Receiver<Vec<u8>>) {
    let to = link.to;
    let Some(addr) = host_port(&url) else {
        tracing::error!(peer = %format!("{to:x}"), url = %url, "invalid peer URL");
        return;
    };
    // Probes ride a gRPC channel of their own to the same listener, served
    // by the main runtime.
    let probe_channel = match tonic::transport::Endpoint::from_shared(url.clone()) {
        Ok(e) => {
            let _main = link.probes.enter();
            e.connect_timeout(CONNECT_TIMEOUT)
                .tcp_nodelay(true)
                .connect_lazy()
        }
        Err(e) => {
            tracing::error!(peer = %format!("{to:x}"), url = %url, error = %e, "invalid peer URL");
            return;
        }
    };
    let mut backoff = BACKOFF_MIN;
    let mut was_connected = false;
    loop {
        let stream = match tokio::time::timeout(CONNECT_TIMEOUT, connect_raft(&addr, &link)).await {
            Ok(Ok(stream)) => stream,
            _ => {
                if was_connected {
                    tracing::warn!(peer = %format!("{to:x}"), "lost TCP streaming connection with remote peer");
                    link.observer.connection(to, false);
                    was_connected = false;
                }
                // Messages queued while the peer is unreachable are stale.
                let mut stale = 0;
                while queue.try_recv().is_ok() {
                    stale += 1;
                }
                if stale > 0 {
                    link.observer.send_failed(to, stale);
                }
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(BACKOFF_MAX);
                continue;
            }
        };
        let prober = {
            let link = link.clone();
            let channel = probe_channel.clone();
            link.probes
                .clone()
                .spawn(async move { probe(link, PeerClient::new(channel)).await })
        };
        if !was_connected {
            tracing::info!(peer = %format!("{to:x}"), "established TCP streaming connection with remote peer");
            link.observer.connection(to, true);
            was_connected = true;
        }
        let (mut reader, mut writer) = stream.into_split();
        let mut frames = Vec::new();
        let mut eof = [0u8; 1];
        loop {
            // The peer never writes on this connection: a read that returns
            // means it closed (died, or refused us), noticed at once rather
            // than at the next message (a follower may send nothing to this
            // peer for a long time).
            let first = tokio::select! {
                first = queue.recv() => first,
                _ = reader.read(&mut eof) => break,
            };
            let Some(first) = first else {
                prober.abort();
                return; // the transport is gone: the member is stopping
            };
            frames.clear();
            let mut count = 0u64;
            push_frame(&mut frames, &first);
            count += 1;
            while count < MAX_BATCH_MESSAGES as u64 {
                match queue.try_recv() {
                    Ok(m) => {
                        push_frame(&mut frames, &m);
                        count += 1;
                    }
                    Err(_) => break,
                }
            }
            // A peer that stops reading (a partition) must not hold this
            // link forever: etcd's ConnWriteTimeout.
            match tokio::time::timeout(WRITE_TIMEOUT, writer.write_all(&frames)).await {
                Ok(Ok(())) => {}
                _ => {
                    link.observer.send_failed(to, count);
                    break;
                }
            }
            link.observer.sent(to, (frames.len() as u64) - 4 * count);
            // Only a link that carries messages resets the back-off: one
            // the peer refuses at once must not be retried in a tight loop.
            backoff = BACKOFF_MIN;
        }
        prober.abort();
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(BACKOFF_MAX);
    }
}

/// `host:port` of a peer URL (`http://host:port[/...]`).
fn host_port(url: &str) -> Option<String> {
    let rest = url
        .strip_prefix("http://")
        .or_else(|| url.strip_prefix("https://"))
        .unwrap_or(url);
    let authority = rest.split('/').next()?;
    (!authority.is_empty() && authority.contains(':')).then(|| authority.to_string())
}

/// Opens a raft link: TCP, then the hello naming cluster and members.
async fn connect_raft(addr: &str, link: &Link) -> std::io::Result<tokio::net::TcpStream> {
    let mut stream = tokio::net::TcpStream::connect(addr).await?;
    stream.set_nodelay(true)?;
    let mut hello = Vec::with_capacity(RAFT_HELLO_LEN);
    hello.extend_from_slice(RAFT_MAGIC);
    hello.extend_from_slice(&link.cluster_id.to_le_bytes());
    hello.extend_from_slice(&link.from.to_le_bytes());
    hello.extend_from_slice(&link.to.to_le_bytes());
    stream.write_all(&hello).await?;
    Ok(stream)
}

fn push_frame(frames: &mut Vec<u8>, message: &[u8]) {
    frames.extend_from_slice(&(message.len() as u32).to_le_bytes());
    frames.extend_from_slice(message);
}

/// Whether a connection to the peer listener opens with [`RAFT_MAGIC`]:
/// `Some(true)` for a raft link, `Some(false)` for anything else (gRPC,
/// HTTP), `None` if it closed or said nothing in time. Peeks only: the
/// bytes stay for whoever serves the connection.
pub async fn is_raft_link(stream: &tokio::net::TcpStream) -> Option<bool> {
    let mut buf = [0u8; 8];
    let deadline = tokio::time::Instant::now() + HELLO_TIMEOUT;
    loop {
        let n = tokio::time::timeout_at(deadline, stream.peek(&mut buf))
            .await
            .ok()?
            .ok()?;
        if n == 0 {
            return None;
        }
        if buf[..n] != RAFT_MAGIC[..n] {
            return Some(false);
        }
        if n == RAFT_MAGIC.len() {
            return Some(true);
        }
        // fewer bytes than the magic so far: wait for more
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

/// Serves a raft link accepted on the peer listener on the raft thread's
/// runtime, so that its messages reach raft without a thread wake-up (on
/// the caller's runtime until the raft thread has started).
pub async fn adopt_raft_link(
    stream: tokio::net::TcpStream,
    cluster_id: u64,
    id: u64,
    raft: RaftHandle,
    observer: Arc<dyn NetworkObserver>,
) {
    let Some(io) = raft.io_runtime() else {
        return serve_raft_link(stream, cluster_id, id, raft, observer).await;
    };
    let Ok(stream) = stream.into_std() else {
        return;
    };
    io.spawn(async move {
        if let Ok(stream) = tokio::net::TcpStream::from_std(stream) {
            serve_raft_link(stream, cluster_id, id, raft, observer).await;
        }
    });
}

/// Serves one raft link accepted on the peer listener (see
/// [`is_raft_link`]): checks the hello, then steps every message into the
/// local raft node until the peer closes the connection.
pub async fn serve_raft_link(
    stream: tokio::net::TcpStream,
    cluster_id: u64,
    id: u64,
    raft: RaftHandle,
    observer: Arc<dyn NetworkObserver>,
) {
    let _ = stream.set_nodelay(true);
    let mut reader = tokio::io::BufReader::with_capacity(64 * 1024, stream);
    let mut hello = [0u8; RAFT_HELLO_LEN];
    if tokio::time::timeout(HELLO_TIMEOUT, reader.read_exact(&mut hello))
        .await
        .is_err()
    {
        return;
    }
    let field = |i: usize| {
        let at = RAFT_MAGIC.len() + 8 * i;
        u64::from_le_bytes(hello[at..at + 8].try_into().expect("8 bytes"))
    };
    let (remote_cluster, from, to) = (field(0), field(1), field(2));
    if remote_cluster != cluster_id || to != id {
        tracing::warn!(
            local_cluster = %format!("{cluster_id:x}"), remote_cluster = %format!("{remote_cluster:x}"),
            local_member = %format!("{id:x}"), to = %format!("{to:x}"), from = %format!("{from:x}"),
            "refused a raft link for another cluster or member"
        );
        return;
    }
    let mut payload = Vec::new();
    loop {
        let mut len = [0u8; 4];
        if reader.read_exact(&mut len).await.is_err() {
            return; // closed
        }
        let len = u32::from_le_bytes(len) as usize;
        if len > MAX_PEER_MESSAGE_BYTES {
            tracing::warn!(from = %format!("{from:x}"), len, "raft link: message too large, closing");
            return;
        }
        payload.resize(len, 0);
        if reader.read_exact(&mut payload).await.is_err() {
            return;
        }
        observer.received(from, len as u64);
        let msg = match eraftpb::Message::parse_from_bytes(&payload) {
            Ok(msg) => msg,
            Err(e) => {
                tracing::warn!(from = %format!("{from:x}"), error = %e, "raft link: bad message, closing");
                return;
            }
        };
        if raft.step(msg).await.is_err() {
            return; // stopping
        }
    }
}

/// Times a probe on the peer's connection now and every [`PROBE_INTERVAL`]
/// while the connection lasts (the caller aborts it).
async fn probe(link: Link, mut client: PeerClient<tonic::transport::Channel>) {
    let mut ticks = tokio::time::interval(PROBE_INTERVAL);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticks.tick().await;
        let request = ProbeRequest {
            cluster_id: link.cluster_id,
            from: link.from,
            to: link.to,
        };
        let started = Instant::now();
        if let Ok(Ok(_)) = tokio::time::timeout(PROBE_TIMEOUT, client.probe(request)).await {
            link.observer.round_trip(link.to, started.elapsed());
        }
    }
}

/// The receiving side: steps every message into the local raft node.
pub struct PeerService {
    cluster_id: u64,
    id: u64,
    raft: RaftHandle,
    /// `<member_dir>/snap`, where received backend snapshots land.
    snap_dir: PathBuf,
    observer: Arc<dyn NetworkObserver>,
}

impl PeerService {
    pub fn server(
        id: u64,
        cluster_id: u64,
        raft: RaftHandle,
        snap_dir: PathBuf,
        observer: Arc<dyn NetworkObserver>,
    ) -> PeerServer<PeerService> {
        PeerServer::new(PeerService {
            cluster_id,
            id,
            raft,
            snap_dir,
            observer,
        })
        .max_decoding_message_size(MAX_PEER_MESSAGE_BYTES)
    }
}

#[tonic::async_trait]
impl Peer for PeerService {
    /// Raft messages over a gRPC client stream: how members sent them
    /// before the raft link; still served for such a peer.
    async fn stream(
        &self,
        request: Request<Streaming<RaftBatch>>,
    ) -> Result<Response<StreamAck>, Status> {
        let mut stream = request.into_inner();
        while let Some(batch) = stream.message().await? {
            if batch.cluster_id != self.cluster_id {
                return Err(Status::failed_precondition(format!(
                    "cluster ID mismatch: local {:x}, remote {:x}",
                    self.cluster_id, batch.cluster_id
                )));
            }
            if batch.to != self.id {
                return Err(Status::failed_precondition(format!(
                    "member ID mismatch: local {:x}, message for {:x}",
                    self.id, batch.to
                )));
            }
            let bytes: usize = batch.messages.iter().map(|m| m.len()).sum();
            self.observer.received(batch.from, bytes as u64);
            for bytes in batch.messages {
                let msg = eraftpb::Message::parse_from_bytes(&bytes)
                    .map_err(|e| Status::invalid_argument(format!("bad raft message: {e}")))?;
                self.raft
                    .step(msg)
                    .await
                    .map_err(|e| Status::unavailable(e.to_string()))?;
            }
        }
        Ok(Response::new(StreamAck {}))
    }

    async fn probe(
        &self,
        request: Request<ProbeRequest>,
    ) -> Result<Response<ProbeResponse>, Status> {
        let probe = request.into_inner();
        if probe.cluster_id != self.cluster_id || probe.to != self.id {
            return Err(Status::failed_precondition(
                "probe for another cluster or member",
            ));
        }
        Ok(Response::new(ProbeResponse {}))
    }

    async fn snapshot(
        &self,
        request: Request<Streaming<SnapshotChunk>>,
    ) -> Result<Response<StreamAck>, Status> {
        let mut stream = request.into_inner();
        let first = stream
            .message()
            .await?
            .ok_or_else(|| Status::invalid_argument("empty snapshot stream"))?;
        if first.cluster_id != self.cluster_id || first.to != self.id {
            return Err(Status::failed_precondition(
                "snapshot for another cluster or member",
            ));
        }
        let mut msg = eraftpb::Message::parse_from_bytes(&first.message)
            .map_err(|e| Status::invalid_argument(format!("bad raft message: {e}")))?;
        if msg.get_msg_type() != MessageType::MsgSnapshot {
            return Err(Status::invalid_argument(
                "the first chunk must carry a MsgSnapshot",
            ));
        }
        let index = msg.get_snapshot().get_metadata().index;
        // etcd's name for a received backend: <index>.snap.db in the snap dir.
        let path = self.snap_dir.join(format!("{index:016x}.snap.db"));
        let partial = self.snap_dir.join(format!("{index:016x}.snap.db.part"));
        let io =
            |e: std::io::Error| Status::internal(format!("writing the received snapshot: {e}"));
        let mut file = tokio::fs::File::create(&partial).await.map_err(io)?;
        let mut received = 0u64;
        let mut last = first.last;
        while !last {
            let chunk = stream
                .message()
                .await?
                .ok_or_else(|| Status::aborted("snapshot stream ended early"))?;
            file.write_all(&chunk.data).await.map_err(io)?;
            received += chunk.data.len() as u64;
            last = chunk.last;
        }
        file.sync_all().await.map_err(io)?;
        drop(file);
        tokio::fs::rename(&partial, &path).await.map_err(io)?;
        tracing::info!(from = %format!("{:x}", first.from), index, bytes = received, "received database snapshot");
        msg.mut_snapshot()
            .set_data(path.to_string_lossy().as_bytes().to_vec().into());
        self.raft
            .step(msg)
            .await
            .map_err(|e| Status::unavailable(e.to_string()))?;
        Ok(Response::new(StreamAck {}))
    }
}

#[cfg(test)]
mod tests {
    use super::host_port;

    #[test]
    fn peer_url_to_host_port() {
        assert_eq!(
            host_port("http://127.0.0.1:2380").as_deref(),
            Some("127.0.0.1:2380")
        );
        assert_eq!(
            host_port("https://m1.example:2380/").as_deref(),
            Some("m1.example:2380")
        );
        assert_eq!(
            host_port("127.0.0.2:2380").as_deref(),
            Some("127.0.0.2:2380")
        );
        assert_eq!(host_port("http://no-port"), None);
        assert_eq!(host_port("http://"), None);
    }
}
