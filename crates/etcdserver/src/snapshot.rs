//! Raft snapshots of the backend, both ways: the leader makes a consistent
//! copy of its store for a follower too far behind its log (the transport
//! streams it out of band), and a follower installs the copy it received.

use std::future::Future;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use consensus::transport::{RecordReceiver, RecordWriter, SnapshotSource};
use mvcc::Store;
use tokio::sync::watch;

/// How long a snapshot waits for this member to apply up to the snapshot's
/// index before giving up (raft asks again later).
const APPLY_WAIT: Duration = Duration::from_secs(30);

pub struct BackendSnapshots {
    pub store: Arc<Store>,
    pub applied: watch::Receiver<u64>,
    pub snap_dir: PathBuf,
}

impl SnapshotSource for BackendSnapshots {
    fn backend_snapshot(
        &self,
        index: u64,
    ) -> Pin<Box<dyn Future<Output = Result<PathBuf, String>> + Send>> {
        let store = self.store.clone();
        let mut applied = self.applied.clone();
        let path = self.snap_dir.join(format!("{index:016x}.snap.db.send"));
        Box::pin(async move {
            applied_up_to(&mut applied, index).await?;
            let dest = path.clone();
            let covered = tokio::task::spawn_blocking(move || store.backup_to(&dest))
                .await
                .map_err(|e| e.to_string())?
                .map_err(|e| e.to_string())?;
            if covered < index {
                let _ = std::fs::remove_file(&path);
                return Err(format!("backend copy covers index {covered} < {index}"));
            }
            Ok(path)
        })
    }

    fn backend_records(
        &self,
        index: u64,
    ) -> Pin<Box<dyn Future<Output = Result<RecordWriter, String>> + Send>> {
        self.stream_writer(index, "records", |store, out| store.write_records(out))
    }

    fn records_receiver(&self, path: &Path) -> Result<Box<dyn RecordReceiver>, String> {
        let builder =
            mvcc::record_stream::RecordsBuilder::create(path).map_err(|e| e.to_string())?;
        Ok(Box::new(ReceivedRecords(builder)))
    }

    fn backend_image(
        &self,
        index: u64,
    ) -> Pin<Box<dyn Future<Output = Result<RecordWriter, String>> + Send>> {
        self.stream_writer(index, "image", |store, out| store.write_image(out))
    }

    fn image_receiver(&self, path: &Path) -> Result<Box<dyn RecordReceiver>, String> {
        let builder = mvcc::image_stream::ImageBuilder::create(path).map_err(|e| e.to_string())?;
        Ok(Box::new(ReceivedImage(builder)))
    }
}

/// Writes a backend stream to a sink, the consistent index it covers.
type WriteStream = fn(&Store, &mut dyn FnMut(&[u8]) -> bool) -> Result<u64, mvcc::MvccError>;

impl BackendSnapshots {
    /// The writer of the stream `write` makes, once this member applied up
    /// to `index`.
    fn stream_writer(
        &self,
        index: u64,
        what: &'static str,
        write: WriteStream,
    ) -> Pin<Box<dyn Future<Output = Result<RecordWriter, String>> + Send>> {
        let store = self.store.clone();
        let mut applied = self.applied.clone();
        Box::pin(async move {
            applied_up_to(&mut applied, index).await?;
            let writer: RecordWriter = Box::new(move |out| {
                let covered = write(&store, out).map_err(|e| e.to_string())?;
                // the stream ends with what covers it: a receiver would
                // install it, so this cannot happen after the wait above
                // (the store's consistent index only grows)
                if covered < index {
                    return Err(format!("backend {what} cover index {covered} < {index}"));
                }
                Ok(covered)
            });
            Ok(writer)
        })
    }
}

/// Waits until this member applied up to `index`: a copy or a record
/// stream must cover the raft snapshot's index, or the follower would skip
/// entries it never applied.
async fn applied_up_to(applied: &mut watch::Receiver<u64>, index: u64) -> Result<(), String> {
    tokio::time::timeout(APPLY_WAIT, applied.wait_for(|a| *a >= index))
        .await
        .map_err(|_| format!("not applied up to {index} in time"))?
        .map_err(|_| "member stopping".to_string())?;
    Ok(())
}

/// A record stream from the leader becoming a backend file.
struct ReceivedRecords(mvcc::record_stream::RecordsBuilder);

impl RecordReceiver for ReceivedRecords {
    fn feed(&mut self, chunks: &[bytes::Bytes]) -> Result<(), String> {
        self.0.feed_parts(chunks).map_err(|e| e.to_string())
    }

    fn finish(self: Box<Self>) -> Result<(), String> {
        self.0.finish().map(|_| ()).map_err(|e| e.to_string())
    }
}

/// An image stream from the leader becoming a backend file.
struct ReceivedImage(mvcc::image_stream::ImageBuilder);

impl RecordReceiver for ReceivedImage {
    fn feed(&mut self, chunks: &[bytes::Bytes]) -> Result<(), String> {
        self.0.feed_parts(chunks).map_err(|e| e.to_string())
    }

    fn finish(self: Box<Self>) -> Result<(), String> {
        self.0.finish().map(|_| ()).map_err(|e| e.to_string())
    }
}

/// A member that crashed after raft saved a snapshot from the leader (its
/// `.snap` file and WAL marker) but before the received backend replaced
/// its own restarts with the backend behind that snapshot, which raft
/// refuses. The received file is still in `snap_dir` (it is removed only
/// once installed): it is installed now, before anything reads the
/// backend, as etcd's recoverSnapshotBackend does. The snapshot's index
/// when one was installed.
pub fn install_received_backend(
    store: &Store,
    snap_dir: &Path,
) -> Result<Option<u64>, mvcc::MvccError> {
    let newest = match consensus::snap::load_newest(snap_dir) {
        Ok(newest) => newest,
        // raft's own start reads the snap dir again and says what is wrong
        Err(_) => return Ok(None),
    };
    let Some(index) = newest.map(|s| s.get_metadata().index) else {
        return Ok(None);
    };
    let received = consensus::transport::received_backend_path(snap_dir, index);
    if store.consistent_index() >= index || !received.exists() {
        return Ok(None);
    }
    store.restore_from(&received)?;
    let _ = std::fs::remove_file(&received);
    Ok(Some(index))
}
