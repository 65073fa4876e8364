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
use std::collections::HashSet;
use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use api::oxcdpeerpb::peer_client::PeerClient;
use api::oxcdpeerpb::peer_server::{Peer, PeerServer};
use api::oxcdpeerpb::{ProbeRequest, ProbeResponse, SnapshotChunk, StreamAck};
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
/// bounded by max_size_per_msg, but one entry may be as large as the
/// largest request; snapshots travel out of band).
pub const MAX_PEER_MESSAGE_BYTES: usize = 64 * 1024 * 1024;

// The peer port is unauthenticated (without TLS anyone who can reach it and
// read a response header knows the cluster and member IDs), so what a peer
// can make a member hold is bounded:

/// Bytes all inbound raft links together may hold in frames still
/// arriving or being handed to raft; a link that would go past it is
/// closed (the sender reconnects; raft retransmits). A frame's buffer grows
/// with the bytes received, never by its declared length.
pub const MAX_RAFT_LINK_BUFFERED_BYTES: usize = 128 * 1024 * 1024;
/// Bytes read from a raft link at a time.
const LINK_READ_CHUNK_BYTES: usize = 64 * 1024;
/// A frame's buffer capacity kept between frames (more is given back).
const LINK_BUFFER_KEEP_BYTES: usize = 1024 * 1024;
/// A frame whose bytes stop arriving for this long closes the link (etcd's
/// ConnReadTimeout); between frames a link may idle.
const FRAME_STALL_TIMEOUT: Duration = Duration::from_secs(5);
/// Connections open at once on the peer port (raft links and gRPC): each
/// peer needs about four (its raft link, probes, snapshots, lease and hash
/// requests); beyond the bound a new connection is closed at once.
pub const MAX_PEER_CONNECTIONS: usize = 128;
/// gRPC streams at once on one peer connection.
pub const MAX_PEER_STREAMS_PER_CONNECTION: u32 = 16;
/// Bytes of backend per snapshot chunk.
pub const SNAPSHOT_CHUNK_BYTES: usize = 64 * 1024;
/// The largest gRPC message on the peer port: a snapshot chunk and its
/// framing; probes, lease and hash requests are far smaller. With the two
/// bounds above, gRPC on the peer port buffers at most
/// 128 × 16 × 128 KiB = 256 MiB, whatever the peers send.
pub const MAX_PEER_RPC_BYTES: usize = SNAPSHOT_CHUNK_BYTES + 64 * 1024;
/// A snapshot stream whose next chunk does not come within this is dropped
/// (and its partial file removed).
const SNAPSHOT_CHUNK_TIMEOUT: Duration = Duration::from_secs(30);

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
    /// The inbound raft link of each peer: (its number, how to close it).
    /// One per peer: a new link replaces the old one.
    inbound: parking_lot::Mutex<HashMap<u64, (u64, Arc<tokio::sync::Notify>)>>,
    next_link: AtomicU64,
    /// Bytes held by inbound raft links' frames (see
    /// [`MAX_RAFT_LINK_BUFFERED_BYTES`]).
    link_bytes: Arc<AtomicUsize>,
    /// Peers whose backend snapshot is being received (one at a time each).
    receiving_snapshots: parking_lot::Mutex<HashSet<u64>>,
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
            inbound: parking_lot::Mutex::new(HashMap::new()),
            next_link: AtomicU64::new(0),
            link_bytes: Arc::new(AtomicUsize::new(0)),
            receiving_snapshots: parking_lot::Mutex::new(HashSet::new()),
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

    /// Whether `id` is another member of the cluster (etcd's stream handler
    /// answers "404 error sender not found" otherwise).
    pub fn is_peer(&self, id: u64) -> bool {
        self.peers.read().contains_key(&id)
    }

    pub fn member_id(&self) -> u64 {
        self.id
    }

    pub fn cluster_id(&self) -> u64 {
        self.cluster_id
    }

    /// Records `from`'s new inbound link, closing the one it replaces.
    fn register_inbound(&self, from: u64) -> (u64, Arc<tokio::sync::Notify>) {
        let link = self.next_link.fetch_add(1, Ordering::Relaxed);
        let close = Arc::new(tokio::sync::Notify::new());
        if let Some((_, old)) = self.inbound.lock().insert(from, (link, close.clone())) {
            // notify_one keeps a permit for a link not waiting right now
            old.notify_one();
        }
        (link, close)
    }

    fn deregister_inbound(&self, from: u64, link: u64) {
        let mut inbound = self.inbound.lock();
        if inbound
            .get(&from)
            .is_some_and(|(current, _)| *current == link)
        {
            inbound.remove(&from);
        }
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
/// the caller's runtime until the raft thread has started). `guard` is
/// held while the link lasts (the listener's connection permit).
pub async fn adopt_raft_link(
    stream: tokio::net::TcpStream,
    transport: Arc<PeerTransport>,
    raft: RaftHandle,
    guard: impl Send + 'static,
) {
    let Some(io) = raft.io_runtime() else {
        transport.serve_raft_link(stream, raft).await;
        drop(guard);
        return;
    };
    let Ok(stream) = stream.into_std() else {
        return;
    };
    io.spawn(async move {
        if let Ok(stream) = tokio::net::TcpStream::from_std(stream) {
            transport.serve_raft_link(stream, raft).await;
        }
        drop(guard);
    });
}

/// Why an inbound raft link was closed by this member.
#[derive(Debug, thiserror::Error)]
enum LinkError {
    #[error("message of {0} bytes is larger than {MAX_PEER_MESSAGE_BYTES}")]
    TooLarge(usize),
    #[error("inbound raft links already hold {MAX_RAFT_LINK_BUFFERED_BYTES} bytes")]
    OverBudget,
    #[error("no bytes of a started message for {FRAME_STALL_TIMEOUT:?}")]
    Stalled,
    #[error("closed in the middle of a message")]
    Truncated,
    #[error("{0}")]
    Io(#[from] std::io::Error),
}

/// Bytes of frames held by inbound links, released when dropped.
struct LinkBytes<'a> {
    total: &'a AtomicUsize,
    held: usize,
}

impl<'a> LinkBytes<'a> {
    fn new(total: &'a AtomicUsize) -> Self {
        LinkBytes { total, held: 0 }
    }

    fn take(&mut self, bytes: usize) -> Result<(), LinkError> {
        let before = self.total.fetch_add(bytes, Ordering::AcqRel);
        if before + bytes > MAX_RAFT_LINK_BUFFERED_BYTES {
            self.total.fetch_sub(bytes, Ordering::AcqRel);
            return Err(LinkError::OverBudget);
        }
        self.held += bytes;
        Ok(())
    }

    fn give_back(&mut self, bytes: usize) {
        self.total.fetch_sub(bytes, Ordering::AcqRel);
        self.held -= bytes;
    }
}

impl Drop for LinkBytes<'_> {
    fn drop(&mut self) {
        self.total.fetch_sub(self.held, Ordering::AcqRel);
    }
}

/// Reads one frame into `payload`, which grows with the bytes received and
/// is charged to `budget` meanwhile. Ok(false): the link closed between
/// frames.
async fn read_frame<R: tokio::io::AsyncRead + Unpin>(
    reader: &mut R,
    payload: &mut Vec<u8>,
    budget: &mut LinkBytes<'_>,
) -> Result<bool, LinkError> {
    let mut len = [0u8; 4];
    if reader.read_exact(&mut len).await.is_err() {
        return Ok(false);
    }
    let len = u32::from_le_bytes(len) as usize;
    if len > MAX_PEER_MESSAGE_BYTES {
        return Err(LinkError::TooLarge(len));
    }
    payload.clear();
    while payload.len() < len {
        let start = payload.len();
        let want = (len - start).min(LINK_READ_CHUNK_BYTES);
        budget.take(want)?;
        payload.resize(start + want, 0);
        let read = tokio::time::timeout(FRAME_STALL_TIMEOUT, reader.read(&mut payload[start..]))
            .await
            .map_err(|_| LinkError::Stalled)??;
        if read == 0 {
            return Err(LinkError::Truncated);
        }
        payload.truncate(start + read);
        budget.give_back(want - read);
    }
    Ok(true)
}

impl PeerTransport {
    /// Serves one raft link accepted on the peer listener (see
    /// [`is_raft_link`]): checks the hello (this cluster, this member, a
    /// sender that is a member), replaces that sender's previous link, then
    /// steps every message into the local raft node until the peer closes
    /// the link or a newer one replaces it.
    pub async fn serve_raft_link(self: Arc<Self>, stream: tokio::net::TcpStream, raft: RaftHandle) {
        let _ = stream.set_nodelay(true);
        let mut reader = tokio::io::BufReader::with_capacity(LINK_READ_CHUNK_BYTES, stream);
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
        if remote_cluster != self.cluster_id || to != self.id {
            tracing::warn!(
                local_cluster = %format!("{:x}", self.cluster_id), remote_cluster = %format!("{remote_cluster:x}"),
                local_member = %format!("{:x}", self.id), to = %format!("{to:x}"), from = %format!("{from:x}"),
                "refused a raft link for another cluster or member"
            );
            return;
        }
        if !self.is_peer(from) {
            tracing::warn!(from = %format!("{from:x}"), "refused a raft link: sender not found");
            return;
        }
        let (link, replaced) = self.register_inbound(from);
        let result = tokio::select! {
            result = self.step_frames(&mut reader, from, &raft) => result,
            _ = replaced.notified() => {
                tracing::debug!(from = %format!("{from:x}"), "raft link replaced by a newer one");
                Ok(())
            }
        };
        self.deregister_inbound(from, link);
        if let Err(e) = result {
            tracing::warn!(from = %format!("{from:x}"), error = %e, "raft link: closing");
        }
    }

    async fn step_frames<R: tokio::io::AsyncRead + Unpin>(
        &self,
        reader: &mut R,
        from: u64,
        raft: &RaftHandle,
    ) -> Result<(), LinkError> {
        let mut payload = Vec::new();
        loop {
            let mut budget = LinkBytes::new(&self.link_bytes);
            if !read_frame(reader, &mut payload, &mut budget).await? {
                return Ok(()); // closed
            }
            self.observer.received(from, payload.len() as u64);
            let msg = eraftpb::Message::parse_from_bytes(&payload).map_err(|e| {
                LinkError::Io(std::io::Error::new(
                    std::io::ErrorKind::InvalidData,
                    format!("bad message: {e}"),
                ))
            })?;
            if msg.from != from {
                return Err(LinkError::Io(std::io::Error::new(
                    std::io::ErrorKind::InvalidData,
                    format!("a message from {:x} on {from:x}'s link", msg.from),
                )));
            }
            drop(budget);
            if payload.capacity() > LINK_BUFFER_KEEP_BYTES {
                payload = Vec::new();
            }
            if raft.step(msg).await.is_err() {
                return Ok(()); // stopping
            }
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

/// The receiving side of the peer gRPC services: snapshots and probes.
pub struct PeerService {
    transport: Arc<PeerTransport>,
    raft: RaftHandle,
    /// `<member_dir>/snap`, where received backend snapshots land.
    snap_dir: PathBuf,
}

impl PeerService {
    pub fn server(
        transport: Arc<PeerTransport>,
        raft: RaftHandle,
        snap_dir: PathBuf,
    ) -> PeerServer<PeerService> {
        PeerServer::new(PeerService {
            transport,
            raft,
            snap_dir,
        })
        .max_decoding_message_size(MAX_PEER_RPC_BYTES)
    }

    /// Whether a request names this cluster, this member and a sender that
    /// is a member.
    fn check_sender(&self, cluster_id: u64, from: u64, to: u64) -> Result<(), Status> {
        let t = &self.transport;
        if cluster_id != t.cluster_id || to != t.id {
            return Err(Status::failed_precondition(
                "request for another cluster or member",
            ));
        }
        if !t.is_peer(from) {
            return Err(Status::not_found("error sender not found"));
        }
        Ok(())
    }
}

/// The next chunk of a snapshot stream, if it comes in time.
async fn next_chunk(
    stream: &mut Streaming<SnapshotChunk>,
) -> Result<Option<SnapshotChunk>, Status> {
    tokio::time::timeout(SNAPSHOT_CHUNK_TIMEOUT, stream.message())
        .await
        .map_err(|_| Status::deadline_exceeded("snapshot stream stalled"))?
}

/// A received snapshot's sender, released when the receive ends; its
/// partial file is removed unless the receive completed.
struct SnapshotReceive<'a> {
    receiving: &'a parking_lot::Mutex<HashSet<u64>>,
    from: u64,
    partial: Option<PathBuf>,
}

impl Drop for SnapshotReceive<'_> {
    fn drop(&mut self) {
        if let Some(partial) = self.partial.take() {
            let _ = std::fs::remove_file(partial);
        }
        self.receiving.lock().remove(&self.from);
    }
}

#[tonic::async_trait]
impl Peer for PeerService {
    async fn probe(
        &self,
        request: Request<ProbeRequest>,
    ) -> Result<Response<ProbeResponse>, Status> {
        let probe = request.into_inner();
        self.check_sender(probe.cluster_id, probe.from, probe.to)?;
        Ok(Response::new(ProbeResponse {}))
    }

    async fn snapshot(
        &self,
        request: Request<Streaming<SnapshotChunk>>,
    ) -> Result<Response<StreamAck>, Status> {
        let mut stream = request.into_inner();
        let first = next_chunk(&mut stream)
            .await?
            .ok_or_else(|| Status::invalid_argument("empty snapshot stream"))?;
        self.check_sender(first.cluster_id, first.from, first.to)?;
        if !self.transport.receiving_snapshots.lock().insert(first.from) {
            return Err(Status::already_exists(
                "a snapshot from this member is being received",
            ));
        }
        let mut receive = SnapshotReceive {
            receiving: &self.transport.receiving_snapshots,
            from: first.from,
            partial: None,
        };
        let mut msg = eraftpb::Message::parse_from_bytes(&first.message)
            .map_err(|e| Status::invalid_argument(format!("bad raft message: {e}")))?;
        if msg.get_msg_type() != MessageType::MsgSnapshot || msg.from != first.from {
            return Err(Status::invalid_argument(
                "the first chunk must carry the sender's MsgSnapshot",
            ));
        }
        let index = msg.get_snapshot().get_metadata().index;
        // etcd's name for a received backend: <index>.snap.db in the snap dir.
        let path = self.snap_dir.join(format!("{index:016x}.snap.db"));
        let partial = self.snap_dir.join(format!("{index:016x}.snap.db.part"));
        let io =
            |e: std::io::Error| Status::internal(format!("writing the received snapshot: {e}"));
        let mut file = tokio::fs::File::create(&partial).await.map_err(io)?;
        receive.partial = Some(partial.clone());
        let mut received = 0u64;
        let mut last = first.last;
        while !last {
            let chunk = next_chunk(&mut stream)
                .await?
                .ok_or_else(|| Status::aborted("snapshot stream ended early"))?;
            file.write_all(&chunk.data).await.map_err(io)?;
            received += chunk.data.len() as u64;
            last = chunk.last;
        }
        file.sync_all().await.map_err(io)?;
        drop(file);
        tokio::fs::rename(&partial, &path).await.map_err(io)?;
        receive.partial = None;
        drop(receive);
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
    use super::*;

    fn frame_header(len: u32) -> Vec<u8> {
        len.to_le_bytes().to_vec()
    }

    /// A link whose peer sent a frame header declaring `len` bytes and
    /// then `sent` of them (the writing end is returned: dropping it closes
    /// the link).
    async fn link_with(
        len: u32,
        sent: usize,
    ) -> (tokio::io::DuplexStream, tokio::io::DuplexStream) {
        let (mut tx, rx) = tokio::io::duplex(1 << 20);
        let mut bytes = frame_header(len);
        bytes.extend(std::iter::repeat_n(9u8, sent));
        tx.write_all(&bytes).await.unwrap();
        (tx, rx)
    }

    #[tokio::test]
    async fn a_frame_grows_with_the_bytes_received_not_its_declared_length() {
        let total = AtomicUsize::new(0);
        let (_tx, mut rx) = link_with(40 << 20, 1000).await;
        let mut payload = Vec::new();
        let mut budget = LinkBytes::new(&total);
        let read = read_frame(&mut rx, &mut payload, &mut budget);
        let outcome = tokio::time::timeout(Duration::from_millis(200), read).await;
        assert!(outcome.is_err(), "the frame is incomplete: still reading");
        assert!(
            payload.capacity() < 1 << 20,
            "{} bytes allocated for 1000 received",
            payload.capacity()
        );
        // charged: what arrived, and at most one chunk being read
        assert!(total.load(Ordering::Acquire) <= 1000 + LINK_READ_CHUNK_BYTES);
    }

    #[tokio::test(start_paused = true)]
    async fn a_frame_that_stalls_closes_its_link_and_releases_its_bytes() {
        let total = AtomicUsize::new(0);
        let (_tx, mut rx) = link_with(1000, 10).await;
        let mut payload = Vec::new();
        {
            let mut budget = LinkBytes::new(&total);
            let result = read_frame(&mut rx, &mut payload, &mut budget).await;
            assert!(matches!(result, Err(LinkError::Stalled)), "{result:?}");
        }
        assert_eq!(total.load(Ordering::Acquire), 0);
        // Between frames a link may idle as long as it likes.
        let (_idle_tx, mut idle_rx) = tokio::io::duplex(64);
        let mut budget = LinkBytes::new(&total);
        let idle = read_frame(&mut idle_rx, &mut payload, &mut budget);
        assert!(tokio::time::timeout(FRAME_STALL_TIMEOUT * 10, idle)
            .await
            .is_err());
    }

    #[tokio::test]
    async fn frames_are_held_to_the_links_byte_budget_and_their_size_limit() {
        // Other links already hold nearly the whole budget.
        let total = AtomicUsize::new(MAX_RAFT_LINK_BUFFERED_BYTES - 100);
        let (_tx, mut rx) = link_with(1000, 1000).await;
        let mut payload = Vec::new();
        let mut budget = LinkBytes::new(&total);
        let result = read_frame(&mut rx, &mut payload, &mut budget).await;
        assert!(matches!(result, Err(LinkError::OverBudget)), "{result:?}");
        drop(budget);
        assert_eq!(
            total.load(Ordering::Acquire),
            MAX_RAFT_LINK_BUFFERED_BYTES - 100
        );

        let total = AtomicUsize::new(0);
        let (_tx, mut rx) = link_with(MAX_PEER_MESSAGE_BYTES as u32 + 1, 0).await;
        let mut budget = LinkBytes::new(&total);
        let result = read_frame(&mut rx, &mut payload, &mut budget).await;
        assert!(matches!(result, Err(LinkError::TooLarge(_))), "{result:?}");
        // A complete frame is read whole and its bytes are charged until dropped.
        let (tx, mut rx) = link_with(100_000, 100_000).await;
        drop(tx);
        let mut budget = LinkBytes::new(&total);
        assert!(read_frame(&mut rx, &mut payload, &mut budget)
            .await
            .unwrap());
        assert_eq!(payload, vec![9u8; 100_000]);
        assert_eq!(total.load(Ordering::Acquire), 100_000);
        drop(budget);
        assert_eq!(total.load(Ordering::Acquire), 0);
        // Then the link closes between frames: not an error.
        let mut budget = LinkBytes::new(&total);
        assert!(!read_frame(&mut rx, &mut payload, &mut budget)
            .await
            .unwrap());
    }

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
