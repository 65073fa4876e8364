//! The peer gRPC service: probes and received snapshots, from members only.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use api::oxcdpeerpb::peer_server::{Peer, PeerServer};
use api::oxcdpeerpb::{ProbeRequest, ProbeResponse, SnapshotChunk, StreamAck};
use protobuf::Message as _;
use raft::eraftpb::{self, MessageType};
use tokio::io::AsyncWriteExt;
use tonic::{Request, Response, Status, Streaming};

use super::{PeerTransport, SNAPSHOT_CHUNK_BYTES};
use crate::RaftHandle;

/// The largest gRPC message on the peer port: a snapshot chunk and its
/// framing; probes, lease and hash requests are far smaller. With the two
/// bounds above, gRPC on the peer port buffers at most
/// 128 × 16 × 128 KiB = 256 MiB, whatever the peers send.
pub const MAX_PEER_RPC_BYTES: usize = SNAPSHOT_CHUNK_BYTES + 64 * 1024;
/// A snapshot stream whose next chunk does not come within this is dropped
/// (and its partial file removed).
const SNAPSHOT_CHUNK_TIMEOUT: Duration = Duration::from_secs(30);

/// Where a backend received from the leader waits in `snap_dir` until the
/// apply side installs it (and removes it): etcd's `<index>.snap.db`. A
/// restart that finds the backend behind the newest raft snapshot installs
/// it from here.
pub fn received_backend_path(snap_dir: &Path, index: u64) -> PathBuf {
    snap_dir.join(format!("{index:016x}.snap.db"))
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
    observer: &'a dyn super::NetworkObserver,
    started: std::time::Instant,
    /// Set once raft has the snapshot: dropped before, the receive failed.
    received: bool,
}

impl Drop for SnapshotReceive<'_> {
    fn drop(&mut self) {
        if let Some(partial) = self.partial.take() {
            let _ = std::fs::remove_file(partial);
        }
        self.receiving.lock().remove(&self.from);
        self.observer
            .snapshot_received(self.from, self.received.then(|| self.started.elapsed()));
        self.observer.snapshot_receiving(self.from, false);
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
    pub(crate) fn server(
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
        self.receive(request, Kind::File).await
    }

    async fn snapshot_records(
        &self,
        request: Request<Streaming<SnapshotChunk>>,
    ) -> Result<Response<StreamAck>, Status> {
        // as an oxcd without this RPC answers: the leader sends a file
        crate::fail_point!("snapshotRecordsUnimplemented", |_| Err(
            Status::unimplemented("failpoint snapshotRecordsUnimplemented")
        ));
        self.receive(request, Kind::Records).await
    }

    async fn snapshot_image(
        &self,
        request: Request<Streaming<SnapshotChunk>>,
    ) -> Result<Response<StreamAck>, Status> {
        // as an oxcd without this RPC answers: the leader sends records
        crate::fail_point!("snapshotImageUnimplemented", |_| Err(
            Status::unimplemented("failpoint snapshotImageUnimplemented")
        ));
        self.receive(request, Kind::Image).await
    }
}

/// What a snapshot stream's data is.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// A copy of the leader's file (`Snapshot`).
    File,
    /// The leader's records (`SnapshotRecords`), written into a new file
    /// as they come.
    Records,
    /// The leader's file as one read transaction reaches it, and its key
    /// index (`SnapshotImage`), written as they come.
    Image,
}

/// Where a snapshot stream's data goes, in blocks of
/// [`super::snapshot::FILE_IO_BYTES`] (a write per 64 KiB chunk made
/// receiving CPU-bound: each is a blocking-pool hop): a block is the
/// chunks as received, copied into one buffer only for a file.
enum Sink {
    File {
        file: tokio::fs::File,
        /// The block's bytes, in one buffer (reused).
        joined: Vec<u8>,
    },
    Records {
        /// To the builder's thread, which feeds the chunks to it without
        /// joining them first. (Joining them here, into a new buffer per
        /// block, had the receiving thread fault in fresh memory for most
        /// of its time.)
        pieces: Option<tokio::sync::mpsc::Sender<Vec<bytes::Bytes>>>,
        /// Builds the file; the time its final commit took. Taken by
        /// [`Sink::end`].
        builder: Option<tokio::task::JoinHandle<Result<Duration, String>>>,
    },
}

fn io_status(e: std::io::Error) -> Status {
    Status::internal(format!("writing the received snapshot: {e}"))
}

impl Sink {
    async fn open(kind: Kind, partial: &Path, service: &PeerService) -> Result<Sink, Status> {
        match kind {
            Kind::File => {
                // 0600, as etcd's received snapshot databases (snap/db.go)
                let file = tokio::fs::OpenOptions::new()
                    .write(true)
                    .create(true)
                    .truncate(true)
                    .mode(crate::fileutil::PRIVATE_FILE_MODE)
                    .open(partial)
                    .await
                    .map_err(io_status)?;
                Ok(Sink::File {
                    file,
                    joined: Vec::with_capacity(super::snapshot::FILE_IO_BYTES),
                })
            }
            Kind::Records | Kind::Image => {
                let Some((_, source)) = service.transport.snapshots.get() else {
                    return Err(Status::unavailable("not ready for snapshots"));
                };
                let source = source.clone();
                let partial = partial.to_path_buf();
                let (pieces, mut received) = tokio::sync::mpsc::channel::<Vec<bytes::Bytes>>(4);
                let builder = tokio::task::spawn_blocking(move || {
                    let mut receiver = match kind {
                        Kind::Image => source.image_receiver(&partial)?,
                        _ => source.records_receiver(&partial)?,
                    };
                    while let Some(piece) = received.blocking_recv() {
                        receiver.feed(&piece)?;
                    }
                    let committing = std::time::Instant::now();
                    receiver.finish()?;
                    Ok(committing.elapsed())
                });
                Ok(Sink::Records {
                    pieces: Some(pieces),
                    builder: Some(builder),
                })
            }
        }
    }

    async fn write(&mut self, block: Vec<bytes::Bytes>) -> Result<(), Status> {
        match self {
            Sink::File { file, joined } => {
                joined.clear();
                for chunk in &block {
                    joined.extend_from_slice(chunk);
                }
                file.write_all(joined).await.map_err(io_status)
            }
            Sink::Records { pieces, .. } => {
                let sent = match pieces {
                    Some(pieces) => pieces.send(block).await.is_ok(),
                    None => false,
                };
                if sent {
                    return Ok(());
                }
                // the builder stopped: its error
                Err(self
                    .end()
                    .await
                    .err()
                    .unwrap_or_else(|| Status::internal("the received snapshot's builder stopped")))
            }
        }
    }

    /// The stream ended (whole or not): the file made durable, or the
    /// builder's verdict; the time of the final fsync or commit.
    async fn end(&mut self) -> Result<Duration, Status> {
        match self {
            Sink::File { file, .. } => {
                let syncing = std::time::Instant::now();
                file.sync_all().await.map_err(io_status)?;
                Ok(syncing.elapsed())
            }
            Sink::Records { pieces, builder } => {
                pieces.take();
                let Some(builder) = builder.take() else {
                    return Err(Status::internal("the received snapshot's builder ended"));
                };
                match builder.await {
                    Ok(Ok(took)) => Ok(took),
                    Ok(Err(e)) => Err(Status::invalid_argument(format!(
                        "the received snapshot is refused: {e}"
                    ))),
                    Err(e) => Err(Status::internal(e.to_string())),
                }
            }
        }
    }
}

impl PeerService {
    async fn receive(
        &self,
        request: Request<Streaming<SnapshotChunk>>,
        kind: Kind,
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
        self.transport.observer.snapshot_receiving(first.from, true);
        let mut receive = SnapshotReceive {
            receiving: &self.transport.receiving_snapshots,
            from: first.from,
            partial: None,
            observer: self.transport.observer.as_ref(),
            started: std::time::Instant::now(),
            received: false,
        };
        let mut msg = eraftpb::Message::parse_from_bytes(&first.message)
            .map_err(|e| Status::invalid_argument(format!("bad raft message: {e}")))?;
        if msg.get_msg_type() != MessageType::MsgSnapshot || msg.from != first.from {
            return Err(Status::invalid_argument(
                "the first chunk must carry the sender's MsgSnapshot",
            ));
        }
        let index = msg.get_snapshot().get_metadata().index;
        let path = received_backend_path(&self.snap_dir, index);
        let partial = self.snap_dir.join(format!("{index:016x}.snap.db.part"));
        receive.partial = Some(partial.clone());
        let saving = std::time::Instant::now();
        let mut sink = Sink::open(kind, &partial, self).await?;
        let mut received = 0u64;
        let streamed = async {
            let mut last = first.last;
            let mut block = Vec::new();
            let mut block_bytes = 0;
            while !last {
                let chunk = next_chunk(&mut stream)
                    .await?
                    .ok_or_else(|| Status::aborted("snapshot stream ended early"))?;
                received += chunk.data.len() as u64;
                last = chunk.last;
                if !chunk.data.is_empty() {
                    block_bytes += chunk.data.len();
                    block.push(chunk.data);
                }
                if block_bytes >= super::snapshot::FILE_IO_BYTES {
                    sink.write(std::mem::take(&mut block)).await?;
                    block_bytes = 0;
                }
            }
            sink.write(block).await
        }
        .await;
        if let Err(e) = streamed {
            // the builder of a record stream ends before the partial file
            // goes (it refuses the stream as incomplete)
            if kind != Kind::File {
                let _ = sink.end().await;
            }
            return Err(e);
        }
        let fsync = sink.end().await?;
        drop(sink);
        tokio::fs::rename(&partial, &path)
            .await
            .map_err(io_status)?;
        self.transport
            .observer
            .snapshot_db_saved(fsync, saving.elapsed());
        receive.partial = None;
        let stream = match kind {
            Kind::File => "file",
            Kind::Records => "records",
            Kind::Image => "image",
        };
        tracing::info!(from = %format!("{:x}", first.from), index, bytes = received, stream,
            "received database snapshot");
        msg.mut_snapshot()
            .set_data(path.to_string_lossy().as_bytes().to_vec().into());
        self.raft
            .step(msg)
            .await
            .map_err(|e| Status::unavailable(e.to_string()))?;
        receive.received = true;
        drop(receive);
        Ok(Response::new(StreamAck {}))
    }
}
