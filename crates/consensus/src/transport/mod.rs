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
//!
//! Parts: [`link`] (the raft links, both ends), [`snapshot`] (backend
//! snapshots, both ends), [`service`] (the peer gRPC service), [`listener`]
//! (the peer port: raft links and gRPC sorted by their first bytes).

mod dial;
pub(crate) mod link;
mod listener;
mod service;
mod snapshot;

pub use dial::{channel, lazy_channel, PeerTls};
pub use link::{
    adopt_raft_link, is_raft_link, MAX_PEER_MESSAGE_BYTES, MAX_RAFT_LINK_BUFFERED_BYTES,
    PROBE_INTERVAL, RAFT_ALPN, RAFT_MAGIC, REMOVED_MARK,
};
pub use listener::{
    accept_until_stop, serve_peer_listener, MAX_PEER_CONNECTIONS, MAX_PEER_STREAMS_PER_CONNECTION,
};
pub use service::{received_backend_path, PeerService, MAX_PEER_RPC_BYTES};
pub use snapshot::SNAPSHOT_CHUNK_BYTES;

use std::collections::HashMap;
use std::collections::HashSet;
use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use parking_lot::RwLock;
use protobuf::Message as _;
use raft::eraftpb::{self, MessageType};

use tokio::sync::mpsc;

use crate::{RaftHandle, Transport};
use link::{run_peer, Link};

/// Messages queued for one peer; beyond this they are dropped.
pub(crate) const PEER_QUEUE_CAPACITY: usize = 4096;
/// Messages per batch on the wire.
pub(crate) const MAX_BATCH_MESSAGES: usize = 256;
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
    /// A backend snapshot to `to` began (true) or ended (false).
    fn snapshot_sending(&self, _to: u64, _in_flight: bool) {}
    /// A backend snapshot to `to` ended: the time it took when the receiver
    /// took it whole, None when it failed.
    fn snapshot_sent(&self, _to: u64, _took: Option<Duration>) {}
    /// A backend snapshot from `from` began (true) or ended (false).
    fn snapshot_receiving(&self, _from: u64, _in_flight: bool) {}
    /// A backend snapshot from `from` ended: the time it took when it was
    /// received whole and handed to raft, None when it failed.
    fn snapshot_received(&self, _from: u64, _took: Option<Duration>) {}
    /// A received backend snapshot is on disk: its fsync and the whole
    /// save, from the first byte written (etcd's etcd_snap_db_* metrics).
    fn snapshot_db_saved(&self, _fsync: Duration, _total: Duration) {}
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

    /// The backend as a record stream (mvcc's `record_stream`), under the
    /// same condition as [`SnapshotSource::backend_snapshot`]: resolves
    /// once applied up to `index` with the blocking writer of the stream.
    fn backend_records(
        &self,
        index: u64,
    ) -> Pin<Box<dyn Future<Output = Result<RecordWriter, String>> + Send>>;

    /// Builds the backend a received record stream carries into a new
    /// file at `path` (blocking calls).
    fn records_receiver(&self, path: &std::path::Path) -> Result<Box<dyn RecordReceiver>, String>;

    /// The backend's file as an image stream (mvcc's `image_stream`), under
    /// the same condition as [`SnapshotSource::backend_records`].
    fn backend_image(
        &self,
        index: u64,
    ) -> Pin<Box<dyn Future<Output = Result<RecordWriter, String>> + Send>>;

    /// Writes the file a received image stream carries at `path`
    /// (blocking calls).
    fn image_receiver(&self, path: &std::path::Path) -> Result<Box<dyn RecordReceiver>, String>;
}

/// Writes a backend's record stream to the sink in pieces (the sink
/// answers false to stop); the consistent index the stream holds.
pub type RecordWriter =
    Box<dyn FnOnce(&mut dyn FnMut(&[u8]) -> bool) -> Result<u64, String> + Send>;

/// Turns a received record stream into a backend file, piece by piece.
pub trait RecordReceiver: Send {
    /// The next bytes of the stream: the chunks received, in order.
    fn feed(&mut self, chunks: &[bytes::Bytes]) -> Result<(), String>;
    /// The stream ended: the file is complete and durable, or refused.
    fn finish(self: Box<Self>) -> Result<(), String>;
}

struct PeerQueue {
    tx: mpsc::Sender<Vec<u8>>,
    url: String,
    snapshot_in_flight: Arc<AtomicBool>,
    /// Wakes the peer's sender out of its back-off: the peer just opened a
    /// link to us, so it is up (a member added before it started would
    /// otherwise wait up to a full back-off before hearing from us).
    redial: Arc<tokio::sync::Notify>,
}

/// A peer's link, URL and message queue, before the raft thread starts.
type PendingSender = (Link, String, mpsc::Receiver<Vec<u8>>);

/// Sends raft messages to peers. Cheap to share; one task per peer.
pub struct PeerTransport {
    id: u64,
    cluster_id: u64,
    peers: RwLock<HashMap<u64, PeerQueue>>,
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
    /// TLS on the peer port and to peers (`https://` peer URLs).
    tls: Option<PeerTls>,
    /// Members removed from the cluster: their links are refused with
    /// [`REMOVED_MARK`] (etcd answers their streams 410).
    removed: RwLock<HashSet<u64>>,
    /// Shared with every link: when each peer's outbound link came up,
    /// and whether a peer told this member it was removed.
    links: Arc<LinkState>,
    /// The raft thread's runtime, once started: senders of peers added
    /// later are spawned there.
    io: OnceLock<tokio::runtime::Handle>,
}

/// What the links of one member share.
#[derive(Default)]
pub(crate) struct LinkState {
    /// Since when each peer's outbound raft link has been up.
    pub(crate) active_since: parking_lot::Mutex<HashMap<u64, std::time::Instant>>,
    /// Set when a peer refuses this member's link because it was removed.
    pub(crate) removed: tokio::sync::watch::Sender<bool>,
}

impl PeerTransport {
    /// `peers`: every other member's ID and peer URL. Tasks run on `runtime`.
    pub fn new(
        id: u64,
        cluster_id: u64,
        peers: &[(u64, String)],
        runtime: &tokio::runtime::Handle,
        observer: Arc<dyn NetworkObserver>,
        tls: Option<PeerTls>,
    ) -> Arc<PeerTransport> {
        let transport = Arc::new(PeerTransport {
            id,
            cluster_id,
            peers: RwLock::new(HashMap::new()),
            runtime: runtime.clone(),
            snapshots: OnceLock::new(),
            observer: observer.clone(),
            senders: parking_lot::Mutex::new(Vec::new()),
            inbound: parking_lot::Mutex::new(HashMap::new()),
            next_link: AtomicU64::new(0),
            link_bytes: Arc::new(AtomicUsize::new(0)),
            receiving_snapshots: parking_lot::Mutex::new(HashSet::new()),
            tls,
            removed: RwLock::new(HashSet::new()),
            links: Arc::new(LinkState::default()),
            io: OnceLock::new(),
        });
        for (peer, url) in peers {
            transport.add_peer(*peer, url);
        }
        transport
    }

    /// Starts sending to a member (added to the cluster, or its peer URL
    /// changed: its old link is replaced).
    pub fn add_peer(&self, peer: u64, url: &str) {
        if peer == self.id {
            return;
        }
        if self
            .peers
            .read()
            .get(&peer)
            .is_some_and(|known| known.url == url)
        {
            return;
        }
        let (tx, rx) = mpsc::channel(PEER_QUEUE_CAPACITY);
        let redial = Arc::new(tokio::sync::Notify::new());
        let queue = PeerQueue {
            tx,
            url: url.to_string(),
            snapshot_in_flight: Arc::new(AtomicBool::new(false)),
            redial: redial.clone(),
        };
        // the old queue's sender, if any, stops once its queue is closed
        self.peers.write().insert(peer, queue);
        self.removed.write().remove(&peer);
        let link = Link {
            from: self.id,
            to: peer,
            cluster_id: self.cluster_id,
            observer: self.observer.clone(),
            probes: self.runtime.clone(),
            tls: tls_for(self.tls.as_ref(), url),
            state: self.links.clone(),
            redial,
        };
        // under the senders' lock: `start` sets `io` and drains under it
        let mut senders = self.senders.lock();
        match self.io.get() {
            Some(io) => {
                io.spawn(run_peer(link, url.to_string(), rx));
            }
            None => senders.push((link, url.to_string(), rx)),
        }
    }

    /// Stops talking to a member removed from the cluster: its link is
    /// closed and its future links and requests are refused.
    pub fn remove_peer(&self, peer: u64) {
        if peer == self.id {
            return;
        }
        self.peers.write().remove(&peer);
        self.removed.write().insert(peer);
        self.links.active_since.lock().remove(&peer);
        if let Some((_, close)) = self.inbound.lock().remove(&peer) {
            close.notify_one();
        }
    }

    /// Since when this member's raft link to `peer` has been up (None:
    /// not connected). etcd's ActiveSince, for its "unhealthy cluster"
    /// check before a membership change.
    pub fn active_since(&self, peer: u64) -> Option<std::time::Instant> {
        self.links.active_since.lock().get(&peer).copied()
    }

    /// Becomes true when a peer refuses this member's raft link because
    /// it was removed from the cluster (etcd's errMemberRemoved).
    pub fn removed_notice(&self) -> tokio::sync::watch::Receiver<bool> {
        self.links.removed.subscribe()
    }

    pub(crate) fn is_removed(&self, id: u64) -> bool {
        self.removed.read().contains(&id)
    }

    /// Enables sending snapshots: done once raft has started (the transport
    /// exists before the raft handle does).
    pub fn attach_snapshots(&self, raft: RaftHandle, source: Arc<dyn SnapshotSource>) {
        let _ = self.snapshots.set((raft, source));
    }

    /// Whether `id` is another member of the cluster (etcd's stream handler
    /// answers "404 error sender not found" otherwise).
    /// The client configuration for a connection to `url`: TLS for an
    /// `https://` URL.
    pub fn client_tls(&self, url: &str) -> Option<Arc<rustls::ClientConfig>> {
        tls_for(self.tls.as_ref(), url)
    }

    /// The peer side's TLS, if the peer URLs are `https://`.
    pub fn tls(&self) -> Option<&PeerTls> {
        self.tls.as_ref()
    }

    pub(crate) fn is_peer(&self, id: u64) -> bool {
        self.peers.read().contains_key(&id)
    }

    /// Records `from`'s new inbound link, closing the one it replaces.
    fn register_inbound(&self, from: u64) -> (u64, Arc<tokio::sync::Notify>) {
        if let Some(peer) = self.peers.read().get(&from) {
            peer.redial.notify_one();
        }
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

impl Transport for PeerTransport {
    fn start(&self, io: &tokio::runtime::Handle) {
        let mut senders = self.senders.lock();
        let _ = self.io.set(io.clone());
        for (link, url, rx) in senders.drain(..) {
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
                self.observer.send_failed(msg.to, 1);
            }
        }
    }
}

/// TLS to a peer at `url` when its scheme asks for it.
fn tls_for(tls: Option<&PeerTls>, url: &str) -> Option<Arc<rustls::ClientConfig>> {
    tls.filter(|_| url.starts_with("https://"))
        .map(|t| t.client.clone())
}
