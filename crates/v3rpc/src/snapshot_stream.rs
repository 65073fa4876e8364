//! Maintenance.Snapshot: a consistent copy of the backend, streamed to a
//! client as etcd 3.5 streams it (api/v3rpc/maintenance.go `Snapshot`).
//!
//! The copy is etcd 3.5's own backend, a bbolt file with etcd's buckets
//! ([`mvcc::Store::etcd_backend_copy`], from one redb read transaction, so
//! it holds exactly one revision): etcdctl, etcdutl and etcd read it as one
//! of etcd's. It is laid out first (its size, which every chunk's
//! `remaining_bytes` counts down from, and its meta pages), then written
//! straight into the stream, meta pages first: no file is written, and
//! the first chunk goes out as soon as the layout is done. The body is the
//! file plus its padding (see [`mvcc::snapshot_file`]), sent in chunks of
//! [`SNAPSHOT_SEND_BUFFER_SIZE`] each with the bytes that remain; a last
//! message carries the sha256 of the whole body. The first message also
//! carries a response header.
//!
//! Memory and backpressure: the copy is written on a blocking thread that
//! hands chunks to the gRPC stream through a channel of
//! [`SNAPSHOT_STREAM_QUEUE`] chunks, and to a thread that hashes them
//! through one of [`HASH_QUEUE`]. A slow client slows that thread, and
//! the read transaction stays open until the copy is sent (as etcd's bolt
//! transaction): a defragmentation waits for it, writes do not.

use std::io::Write;
use std::sync::Arc;

use api::etcdserverpb::{ResponseHeader, SnapshotResponse};
use mvcc::snapshot_file::{padding_for, SNAPSHOT_SEND_BUFFER_SIZE};
use sha2::{Digest, Sha256};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::Status;

use etcdserver::EtcdServer;

/// Chunks queued between the copy and the gRPC stream (256 KiB): enough
/// to keep the stream busy, small enough that a stalled client pins almost
/// no memory.
pub(crate) const SNAPSHOT_STREAM_QUEUE: usize = 8;

type Item = Result<SnapshotResponse, Status>;

/// Starts copying the backend and returns the stream of responses.
pub(crate) fn start(server: Arc<EtcdServer>) -> ReceiverStream<Item> {
    let (tx, rx) = mpsc::channel(SNAPSHOT_STREAM_QUEUE);
    tokio::task::spawn_blocking(move || {
        remove_stale_copies(&server.cfg.member_dir().join("snap"));
        let timer = server.metrics.ops.snapshot_started();
        match send_snapshot(&server, &tx) {
            Ok(()) => timer.finish(),
            Err(status) => {
                let _ = tx.blocking_send(Err(status));
            }
        }
    });
    ReceiverStream::new(rx)
}

/// Copies an earlier oxcd left in the snap dir: it wrote each copy to a
/// file there before sending it, and one that crashed while copying left
/// the file behind (`client-snapshot-<pid>-<n>.db.tmp`).
fn remove_stale_copies(snap_dir: &std::path::Path) {
    let Ok(entries) = std::fs::read_dir(snap_dir) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().to_string();
        if name.starts_with("client-snapshot-") && name.ends_with(".db.tmp") {
            tracing::warn!(path = %entry.path().display(), "removing a snapshot copy left by a previous run");
            let _ = std::fs::remove_file(entry.path());
        }
    }
}

/// Chunks queued for the sha256 thread (512 KiB).
const HASH_QUEUE: usize = 16;

/// The body's sha256, computed by a thread of its own from the chunks as
/// they go out: the copy's thread lays out and fills the pages, and
/// hashing there too made it the stream's bottleneck. Inline when no
/// thread starts.
enum BodyHash {
    Thread {
        chunks: std::sync::mpsc::SyncSender<prost::bytes::Bytes>,
        worker: std::thread::JoinHandle<Vec<u8>>,
    },
    Inline(Sha256),
}

impl BodyHash {
    fn start() -> BodyHash {
        let (chunks, queued) = std::sync::mpsc::sync_channel::<prost::bytes::Bytes>(HASH_QUEUE);
        let spawned = std::thread::Builder::new()
            .name("snapshot-sha256".into())
            .spawn(move || {
                let mut hasher = Sha256::new();
                for chunk in queued {
                    hasher.update(&chunk);
                }
                hasher.finalize().to_vec()
            });
        match spawned {
            Ok(worker) => BodyHash::Thread { chunks, worker },
            Err(e) => {
                tracing::warn!(error = %e, "cannot start the snapshot's sha256 thread; hashing inline");
                BodyHash::Inline(Sha256::new())
            }
        }
    }

    fn update(&mut self, chunk: &prost::bytes::Bytes) {
        match self {
            // the worker ends only when this sender is dropped (finish)
            BodyHash::Thread { chunks, .. } => {
                let _ = chunks.send(chunk.clone());
            }
            BodyHash::Inline(hasher) => hasher.update(chunk),
        }
    }

    fn finish(self) -> Result<Vec<u8>, Status> {
        match self {
            BodyHash::Thread { chunks, worker } => {
                drop(chunks);
                worker
                    .join()
                    .map_err(|_| Status::internal("the snapshot's sha256 failed"))
            }
            BodyHash::Inline(hasher) => Ok(hasher.finalize().to_vec()),
        }
    }
}

/// The body as chunks of [`SNAPSHOT_SEND_BUFFER_SIZE`] into the stream,
/// hashed as they go.
struct Chunks<'a> {
    tx: &'a mpsc::Sender<Item>,
    header: Option<ResponseHeader>,
    hasher: BodyHash,
    total: u64,
    sent: u64,
    blob: Vec<u8>,
    /// Set once the client went away.
    gone: bool,
}

impl Chunks<'_> {
    fn send_blob(&mut self) -> std::io::Result<()> {
        let blob: prost::bytes::Bytes = std::mem::replace(
            &mut self.blob,
            Vec::with_capacity(SNAPSHOT_SEND_BUFFER_SIZE),
        )
        .into();
        self.hasher.update(&blob);
        self.sent += blob.len() as u64;
        let response = SnapshotResponse {
            header: self.header.take(),
            remaining_bytes: self.total.saturating_sub(self.sent),
            blob,
        };
        if self.tx.blocking_send(Ok(response)).is_err() {
            self.gone = true;
            return Err(std::io::ErrorKind::BrokenPipe.into());
        }
        Ok(())
    }
}

impl Write for Chunks<'_> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = buf.len().min(SNAPSHOT_SEND_BUFFER_SIZE - self.blob.len());
        self.blob.extend_from_slice(&buf[..n]);
        if self.blob.len() == SNAPSHOT_SEND_BUFFER_SIZE {
            self.send_blob()?;
        }
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Fails with the status to send when the copy cannot be made or read;
/// returns Ok when the client went away (nobody to tell).
fn send_snapshot(server: &EtcdServer, tx: &mpsc::Sender<Item>) -> Result<(), Status> {
    // A lower bound of the copy's revision: the copy is taken after it.
    let header: ResponseHeader = server.header(server.store.current_revision());
    let raft = {
        let members = server.members.list();
        mvcc::etcd_backend::RaftMeta {
            term: server.raft.status().term,
            voters: members
                .iter()
                .filter(|m| !m.is_learner)
                .map(|m| m.id)
                .collect(),
            learners: members
                .iter()
                .filter(|m| m.is_learner)
                .map(|m| m.id)
                .collect(),
        }
    };
    let copy = server
        .store
        .etcd_backend_copy(&raft)
        .map_err(|e| Status::internal(format!("cannot copy the backend: {e}")))?;
    let db_len = copy.size();
    let padding = padding_for(db_len);
    let total = db_len + padding.len() as u64;
    tracing::info!("total-bytes" = total, size = %mvcc::snapshot_file::humanize_bytes(total),
        "sending database snapshot to client");
    let mut chunks = Chunks {
        tx,
        header: Some(header),
        hasher: BodyHash::start(),
        total,
        sent: 0,
        blob: Vec::with_capacity(SNAPSHOT_SEND_BUFFER_SIZE),
        gone: false,
    };
    // the file, then its padding, then what is left of the last chunk
    let written = copy
        .write_to(&mut chunks)
        .map_err(|e| e.to_string())
        .and_then(|_| chunks.write_all(&padding).map_err(|e| e.to_string()))
        .and_then(|()| match chunks.blob.is_empty() {
            true => Ok(()),
            false => chunks.send_blob().map_err(|e| e.to_string()),
        });
    if chunks.gone {
        tracing::warn!("snapshot client went away before the end of the snapshot");
        return Ok(());
    }
    written.map_err(|e| Status::internal(format!("cannot copy the backend: {e}")))?;
    let Chunks {
        hasher, mut header, ..
    } = chunks;
    let sha = hasher.finish()?;
    tracing::info!(
        "total-bytes" = total,
        "checksum-size" = sha.len(),
        "sending database sha256 checksum to client"
    );
    let last = SnapshotResponse {
        header: header.take(),
        remaining_bytes: 0,
        blob: sha.into(),
    };
    if tx.blocking_send(Ok(last)).is_ok() {
        tracing::info!(
            "total-bytes" = total,
            "successfully sent database snapshot to client"
        );
    }
    Ok(())
}
