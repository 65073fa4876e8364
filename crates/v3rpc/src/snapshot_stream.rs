//! Maintenance.Snapshot: a consistent copy of the backend, streamed to a
//! client as etcd 3.5 streams it (api/v3rpc/maintenance.go `Snapshot`).
//!
//! The copy is etcd 3.5's own backend, a bbolt file with etcd's buckets
//! ([`mvcc::Store::write_etcd_backend`], from one redb read transaction, so
//! it holds exactly one revision), written to a temporary file in the
//! member's snap dir: etcdctl, etcdutl and etcd read it as one of etcd's. The file is unlinked as soon as it is opened, so a client
//! that goes away, an error, or a crash after that point leave nothing
//! behind. The body is the file plus its padding (see
//! [`mvcc::snapshot_file`]), sent in chunks of
//! [`SNAPSHOT_SEND_BUFFER_SIZE`] each with the bytes that remain; a last
//! message carries the sha256 of the whole body. The first message also
//! carries a response header.
//!
//! Memory and backpressure: the file is read chunk by chunk on a blocking
//! thread that hands chunks to the gRPC stream through a channel of
//! [`SNAPSHOT_STREAM_QUEUE`] chunks. A slow client only slows that thread:
//! the read transaction ended with the copy, so writes never wait for it.

use std::fs::File;
use std::io::Read;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use api::etcdserverpb::{ResponseHeader, SnapshotResponse};
use mvcc::snapshot_file::{padding_for, SNAPSHOT_SEND_BUFFER_SIZE};
use sha2::{Digest, Sha256};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::Status;

use etcdserver::EtcdServer;

/// Chunks queued between the file reader and the gRPC stream (256 KiB):
/// enough to keep the stream busy, small enough that a stalled client pins
/// almost no memory.
pub(crate) const SNAPSHOT_STREAM_QUEUE: usize = 8;

/// Tells concurrent snapshots' temporary files apart.
static NEXT_SNAPSHOT: AtomicU64 = AtomicU64::new(0);

type Item = Result<SnapshotResponse, Status>;

/// Starts copying the backend and returns the stream of responses.
pub(crate) fn start(server: Arc<EtcdServer>) -> ReceiverStream<Item> {
    let (tx, rx) = mpsc::channel(SNAPSHOT_STREAM_QUEUE);
    let temp = server.cfg.member_dir().join("snap").join(format!(
        "{TEMP_PREFIX}{}-{}{TEMP_SUFFIX}",
        std::process::id(),
        NEXT_SNAPSHOT.fetch_add(1, Ordering::Relaxed)
    ));
    tokio::task::spawn_blocking(move || {
        if let Some(snap_dir) = temp.parent() {
            remove_stale_copies(snap_dir);
        }
        let timer = server.metrics.ops.snapshot_started();
        match send_snapshot(&server, &temp, &tx) {
            Ok(()) => timer.finish(),
            Err(status) => {
                let _ = tx.blocking_send(Err(status));
            }
        }
        let _ = std::fs::remove_file(&temp);
    });
    ReceiverStream::new(rx)
}

const TEMP_PREFIX: &str = "client-snapshot-";
const TEMP_SUFFIX: &str = ".db.tmp";

/// Copies a previous process left behind (it crashed while copying: a copy
/// is unlinked as soon as it is complete). Copies of this process may be
/// in progress and are left alone.
fn remove_stale_copies(snap_dir: &std::path::Path) {
    let Ok(entries) = std::fs::read_dir(snap_dir) else {
        return;
    };
    let own = format!("{TEMP_PREFIX}{}-", std::process::id());
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().to_string();
        if name.starts_with(TEMP_PREFIX) && name.ends_with(TEMP_SUFFIX) && !name.starts_with(&own) {
            tracing::warn!(path = %entry.path().display(), "removing a snapshot copy left by a previous run");
            let _ = std::fs::remove_file(entry.path());
        }
    }
}

/// Fails with the status to send when the copy cannot be made or read;
/// returns Ok when the client went away (nobody to tell).
fn send_snapshot(
    server: &EtcdServer,
    temp: &PathBuf,
    tx: &mpsc::Sender<Item>,
) -> Result<(), Status> {
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
    server
        .store
        .write_etcd_backend(temp, &raft)
        .map_err(|e| Status::internal(format!("cannot copy the backend: {e}")))?;
    let mut file = File::open(temp)
        .map_err(|e| Status::internal(format!("cannot open the backend copy: {e}")))?;
    let _ = std::fs::remove_file(temp);
    let db_len = file
        .metadata()
        .map_err(|e| Status::internal(format!("cannot stat the backend copy: {e}")))?
        .len();
    let padding = padding_for(db_len);
    let total = db_len + padding.len() as u64;
    tracing::info!("total-bytes" = total, size = %mvcc::snapshot_file::humanize_bytes(total),
        "sending database snapshot to client");

    let mut hasher = Sha256::new();
    let mut header = Some(header);
    let mut sent = 0u64;
    let mut from_file = 0u64;
    while sent < total {
        let n = (total - sent).min(SNAPSHOT_SEND_BUFFER_SIZE as u64) as usize;
        let mut blob = vec![0u8; n];
        // File bytes first, then the padding.
        let file_part = (db_len - from_file).min(n as u64) as usize;
        file.read_exact(&mut blob[..file_part])
            .map_err(|e| Status::internal(format!("cannot read the backend copy: {e}")))?;
        from_file += file_part as u64;
        if file_part < n {
            let pad_start = (sent + file_part as u64 - db_len) as usize;
            blob[file_part..].copy_from_slice(&padding[pad_start..pad_start + n - file_part]);
        }
        hasher.update(&blob);
        sent += n as u64;
        let response = SnapshotResponse {
            header: header.take(),
            remaining_bytes: total - sent,
            blob: blob.into(),
        };
        if tx.blocking_send(Ok(response)).is_err() {
            tracing::warn!("snapshot client went away before the end of the snapshot");
            return Ok(());
        }
    }
    let sha = hasher.finalize().to_vec();
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
