//! Backend snapshots for a follower too far behind: streamed out of band
//! over the `Peer.Snapshot` RPC in chunks, never inside a raft message.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use api::oxcdpeerpb::peer_client::PeerClient;
use api::oxcdpeerpb::SnapshotChunk;
use protobuf::Message as _;
use raft::eraftpb::{self};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

use super::link::CONNECT_TIMEOUT;
use super::{PeerQueue, PeerTransport, SnapshotSource, MAX_PEER_MESSAGE_BYTES};
use crate::RaftHandle;

/// Bytes of backend per snapshot chunk.
pub const SNAPSHOT_CHUNK_BYTES: usize = 64 * 1024;

impl PeerTransport {
    /// One snapshot per peer at a time; raft asks again if this one fails.
    pub(super) fn start_snapshot(&self, peer: &PeerQueue, msg: eraftpb::Message) {
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
            tls: self.client_tls(&peer.url),
            raft: raft.clone(),
            source: source.clone(),
            in_flight: peer.snapshot_in_flight.clone(),
            observer: self.observer.clone(),
        };
        self.runtime.spawn(job.run(msg));
    }
}

struct SnapshotJob {
    cluster_id: u64,
    url: String,
    tls: Option<Arc<rustls::ClientConfig>>,
    raft: RaftHandle,
    source: Arc<dyn SnapshotSource>,
    in_flight: Arc<AtomicBool>,
    observer: Arc<dyn super::NetworkObserver>,
}

impl SnapshotJob {
    async fn run(self, msg: eraftpb::Message) {
        let to = msg.to;
        let index = msg.get_snapshot().get_metadata().index;
        tracing::info!(to = %format!("{to:x}"), index, "sending database snapshot to a member");
        self.observer.snapshot_sending(to, true);
        let started = std::time::Instant::now();
        let result = self.send(msg).await;
        self.observer
            .snapshot_sent(to, result.is_ok().then(|| started.elapsed()));
        self.observer.snapshot_sending(to, false);
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
        match self.stream_records(&msg).await {
            Err(Sent::Unimplemented) => {
                tracing::info!(to = %format!("{:x}", msg.to), index,
                    "the member takes no record stream; sending a copy of the database file");
            }
            Err(Sent::Failed(e)) => return Err(e),
            Ok(sent) => return Ok(sent),
        }
        let path = self.source.backend_snapshot(index).await?;
        let sent = self.stream_file(&msg, &path).await;
        let _ = tokio::fs::remove_file(&path).await;
        sent
    }

    /// The header chunk: the raft message, no data.
    fn header(&self, msg: &eraftpb::Message) -> Result<SnapshotChunk, String> {
        Ok(SnapshotChunk {
            cluster_id: self.cluster_id,
            from: msg.from,
            to: msg.to,
            message: msg.write_to_bytes().map_err(|e| e.to_string())?.into(),
            data: Default::default(),
            last: false,
        })
    }

    /// Sends the backend as the records the leader reads (`SnapshotRecords`).
    async fn stream_records(&self, msg: &eraftpb::Message) -> Result<u64, Sent> {
        let index = msg.get_snapshot().get_metadata().index;
        let writer = self.source.backend_records(index).await?;
        let channel = super::channel(&self.url, CONNECT_TIMEOUT, self.tls.as_ref()).await?;
        let mut client = PeerClient::new(channel).max_encoding_message_size(MAX_PEER_MESSAGE_BYTES);
        let (chunks, wire) = mpsc::channel::<SnapshotChunk>(SEND_QUEUE_CHUNKS);
        let call =
            tokio::spawn(async move { client.snapshot_records(ReceiverStream::new(wire)).await });
        if chunks.send(self.header(msg)?).await.is_err() {
            return Err(Sent::of(call.await));
        }
        let write = tokio::task::spawn_blocking(move || {
            let mut sent = 0u64;
            let mut failed = None;
            let written = writer(&mut |piece| match send_piece(piece, &chunks) {
                Ok(()) => {
                    sent += piece.len() as u64;
                    true
                }
                Err(e) => {
                    failed = Some(e);
                    false
                }
            });
            match (written, failed) {
                (_, Some(e)) | (Err(e), None) => Err(e),
                (Ok(_), None) => send_last(&chunks).map(|()| sent),
            }
        });
        let sent = write.await.map_err(|e| e.to_string())?;
        match call.await {
            Ok(Ok(_)) => Ok(sent?),
            // the writer's own failure, or else the receiver's answer
            answer => Err(match sent {
                Err(e) if e != GONE => Sent::Failed(e),
                _ => Sent::of(answer),
            }),
        }
    }

    async fn stream_file(
        &self,
        msg: &eraftpb::Message,
        path: &std::path::Path,
    ) -> Result<u64, String> {
        let file =
            std::fs::File::open(path).map_err(|e| format!("open {}: {e}", path.display()))?;
        let channel = super::channel(&self.url, CONNECT_TIMEOUT, self.tls.as_ref()).await?;
        let mut client = PeerClient::new(channel).max_encoding_message_size(MAX_PEER_MESSAGE_BYTES);
        let (chunks, wire) = mpsc::channel::<SnapshotChunk>(SEND_QUEUE_CHUNKS);
        let call = tokio::spawn(async move { client.snapshot(ReceiverStream::new(wire)).await });
        if chunks.send(self.header(msg)?).await.is_err() {
            return Err(answer_of(call.await));
        }
        // One blocking task reads the file in large blocks (a blocking-pool
        // hop per 64 KiB chunk made sending CPU-bound), cut into chunks.
        let read = tokio::task::spawn_blocking(move || read_chunks(file, &chunks));
        let sent = read.await.map_err(|e| e.to_string())?;
        match call.await {
            Ok(Ok(_)) => sent,
            answer => Err(sent.err().unwrap_or_else(|| answer_of(answer))),
        }
    }
}

/// Chunks queued for the wire while a snapshot is sent.
const SEND_QUEUE_CHUNKS: usize = 16;
/// Bytes read from a snapshot file, or written to a received one, at a time.
pub(super) const FILE_IO_BYTES: usize = 1 << 20;

type CallAnswer = Result<
    Result<tonic::Response<api::oxcdpeerpb::StreamAck>, tonic::Status>,
    tokio::task::JoinError,
>;

/// Why the receiver's call ended without success.
fn answer_of(answer: CallAnswer) -> String {
    match answer {
        Ok(Ok(_)) => "the receiver ended the stream early".to_string(),
        Ok(Err(status)) => status.message().to_string(),
        Err(e) => e.to_string(),
    }
}

/// A send's error when the receiver ended the stream (its answer says why).
const GONE: &str = "the receiver went away";

/// Why a record stream was not sent.
enum Sent {
    /// The member does not know `SnapshotRecords` (an older oxcd).
    Unimplemented,
    Failed(String),
}

impl From<String> for Sent {
    fn from(e: String) -> Sent {
        Sent::Failed(e)
    }
}

impl Sent {
    fn of(answer: CallAnswer) -> Sent {
        if is_unimplemented(&answer) {
            Sent::Unimplemented
        } else {
            Sent::Failed(answer_of(answer))
        }
    }
}

fn is_unimplemented(answer: &CallAnswer) -> bool {
    matches!(answer, Ok(Err(status)) if status.code() == tonic::Code::Unimplemented)
}

/// Queues `piece` for the wire in chunks.
fn send_piece(piece: &[u8], chunks: &mpsc::Sender<SnapshotChunk>) -> Result<(), String> {
    for data in piece.chunks(SNAPSHOT_CHUNK_BYTES) {
        let chunk = SnapshotChunk {
            data: data.to_vec().into(),
            ..Default::default()
        };
        if chunks.blocking_send(chunk).is_err() {
            return Err(GONE.to_string());
        }
    }
    // Part of the backend is on its way: a crash or a failed send here
    // leaves the receiver with a partial snapshot. `return` fails the
    // send, which raft is told of and retries.
    crate::fail_point!("raftDuringSendSnapshot", |_| Err(
        "failpoint raftDuringSendSnapshot".to_string()
    ));
    Ok(())
}

/// The last chunk: empty and marked.
fn send_last(chunks: &mpsc::Sender<SnapshotChunk>) -> Result<(), String> {
    let last = SnapshotChunk {
        last: true,
        ..Default::default()
    };
    chunks.blocking_send(last).map_err(|_| GONE.to_string())
}

/// Reads `file` to its end into chunks on `chunks`, the last one empty and
/// marked; the bytes sent.
fn read_chunks(
    mut file: std::fs::File,
    chunks: &mpsc::Sender<SnapshotChunk>,
) -> Result<u64, String> {
    use std::io::Read;
    let mut buf = vec![0u8; FILE_IO_BYTES];
    let mut sent = 0u64;
    loop {
        let n = file.read(&mut buf).map_err(|e| e.to_string())?;
        if n == 0 {
            return send_last(chunks).map(|()| sent);
        }
        send_piece(&buf[..n], chunks)?;
        sent += n as u64;
    }
}
