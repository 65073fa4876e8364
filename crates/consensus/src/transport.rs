//! The peer transport (our rafthttp): raft messages to each peer over one
//! long-lived gRPC client stream on the peer's `--listen-peer-urls`,
//! batched, with reconnect and back-off.
//!
//! Never blocks the raft thread: `send` only `try_send`s into a bounded
//! queue per peer and drops what does not fit (raft retransmits; a dead or
//! slow peer costs memory bounded by `PEER_QUEUE_CAPACITY`).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use api::oxcdpeerpb::peer_client::PeerClient;
use api::oxcdpeerpb::peer_server::{Peer, PeerServer};
use api::oxcdpeerpb::{RaftBatch, StreamAck};
use parking_lot::RwLock;
use protobuf::Message as _;
use raft::eraftpb;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};

use crate::{RaftHandle, Transport};

/// Messages queued for one peer; beyond this they are dropped.
pub const PEER_QUEUE_CAPACITY: usize = 4096;
/// Messages per batch on the wire.
pub const MAX_BATCH_MESSAGES: usize = 256;
/// Batches in flight inside one stream before the sender waits.
const STREAM_WINDOW: usize = 64;
const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);
const BACKOFF_MIN: Duration = Duration::from_millis(50);
const BACKOFF_MAX: Duration = Duration::from_secs(1);
/// The largest raft message a member accepts from a peer (entries are
/// bounded by max_size_per_msg; snapshots travel out of band).
pub const MAX_PEER_MESSAGE_BYTES: usize = 64 * 1024 * 1024;

struct PeerQueue {
    tx: mpsc::Sender<Vec<u8>>,
}

/// Sends raft messages to peers. Cheap to share; one task per peer.
pub struct PeerTransport {
    id: u64,
    peers: RwLock<HashMap<u64, PeerQueue>>,
    dropped: AtomicU64,
}

impl PeerTransport {
    /// `peers`: every other member's ID and peer URL. Tasks run on `runtime`.
    pub fn new(
        id: u64,
        cluster_id: u64,
        peers: &[(u64, String)],
        runtime: &tokio::runtime::Handle,
    ) -> Arc<PeerTransport> {
        let transport = Arc::new(PeerTransport { id, peers: RwLock::new(HashMap::new()), dropped: AtomicU64::new(0) });
        for (peer, url) in peers {
            if *peer == id {
                continue;
            }
            let (tx, rx) = mpsc::channel(PEER_QUEUE_CAPACITY);
            transport.peers.write().insert(*peer, PeerQueue { tx });
            runtime.spawn(run_peer(id, *peer, url.clone(), cluster_id, rx));
        }
        transport
    }

    /// Messages dropped because a peer's queue was full.
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }
}

impl Transport for PeerTransport {
    fn send(&self, msgs: Vec<eraftpb::Message>) {
        let peers = self.peers.read();
        for msg in msgs {
            let Some(peer) = peers.get(&msg.to) else {
                tracing::debug!(from = self.id, to = msg.to, "raft: message to an unknown peer dropped");
                continue;
            };
            let bytes = match msg.write_to_bytes() {
                Ok(b) => b,
                Err(e) => {
                    tracing::error!(error = %e, "raft: cannot encode a message");
                    continue;
                }
            };
            if peer.tx.try_send(bytes).is_err() {
                self.dropped.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}

/// One peer's sender: connect, stream batches, reconnect with back-off.
async fn run_peer(from: u64, to: u64, url: String, cluster_id: u64, mut queue: mpsc::Receiver<Vec<u8>>) {
    let mut backoff = BACKOFF_MIN;
    let mut was_connected = false;
    loop {
        let endpoint = match tonic::transport::Endpoint::from_shared(url.clone()) {
            Ok(e) => e.connect_timeout(CONNECT_TIMEOUT).tcp_nodelay(true),
            Err(e) => {
                tracing::error!(peer = %format!("{to:x}"), url = %url, error = %e, "invalid peer URL");
                return;
            }
        };
        let channel = match endpoint.connect().await {
            Ok(c) => c,
            Err(_) => {
                if was_connected {
                    tracing::warn!(peer = %format!("{to:x}"), "lost TCP streaming connection with remote peer");
                    was_connected = false;
                }
                // Messages queued while the peer is unreachable are stale.
                while queue.try_recv().is_ok() {}
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(BACKOFF_MAX);
                continue;
            }
        };
        let mut client = PeerClient::new(channel).max_encoding_message_size(MAX_PEER_MESSAGE_BYTES);
        let (batches, wire) = mpsc::channel::<RaftBatch>(STREAM_WINDOW);
        let call = tokio::spawn(async move { client.stream(ReceiverStream::new(wire)).await });
        if !was_connected {
            tracing::info!(peer = %format!("{to:x}"), "established TCP streaming connection with remote peer");
            was_connected = true;
        }
        backoff = BACKOFF_MIN;
        loop {
            let Some(first) = queue.recv().await else {
                call.abort();
                return; // the transport is gone: the member is stopping
            };
            let mut messages = vec![first];
            while messages.len() < MAX_BATCH_MESSAGES {
                match queue.try_recv() {
                    Ok(m) => messages.push(m),
                    Err(_) => break,
                }
            }
            let batch = RaftBatch { cluster_id, from, to, messages: messages.into_iter().map(Into::into).collect() };
            if call.is_finished() || batches.send(batch).await.is_err() {
                break;
            }
        }
        call.abort();
        tokio::time::sleep(backoff).await;
    }
}

/// The receiving side: steps every message into the local raft node.
pub struct PeerService {
    cluster_id: u64,
    id: u64,
    raft: RaftHandle,
}

impl PeerService {
    pub fn server(id: u64, cluster_id: u64, raft: RaftHandle) -> PeerServer<PeerService> {
        PeerServer::new(PeerService { cluster_id, id, raft })
            .max_decoding_message_size(MAX_PEER_MESSAGE_BYTES)
    }
}

#[tonic::async_trait]
impl Peer for PeerService {
    async fn stream(&self, request: Request<Streaming<RaftBatch>>) -> Result<Response<StreamAck>, Status> {
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
            for bytes in batch.messages {
                let msg = eraftpb::Message::parse_from_bytes(&bytes)
                    .map_err(|e| Status::invalid_argument(format!("bad raft message: {e}")))?;
                self.raft.step(msg).await.map_err(|e| Status::unavailable(e.to_string()))?;
            }
        }
        Ok(Response::new(StreamAck {}))
    }
}
