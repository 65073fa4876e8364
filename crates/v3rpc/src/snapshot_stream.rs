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
//!
//! On the client port the stream is not tonic's: [`SnapshotRoute`] serves
//! the method, and the copy's thread frames each message itself, a few
//! bytes of gRPC prefix and protobuf fields, then the chunk as it is
//! ([`framed`]), so that the chunk goes from the copy to the socket
//! without a copy. tonic's encoder copied every chunk into its buffer: a
//! third of the connection thread's time in a snapshot save. The same
//! checks run first (require-leader, admin), a failure is answered as
//! tonic answers it, and the gateway's local calls still go through
//! [`start`].

use std::io::Write;
use std::sync::Arc;

use api::etcdserverpb::{ResponseHeader, SnapshotResponse};
use mvcc::snapshot_file::{padding_for, SNAPSHOT_SEND_BUFFER_SIZE};
use prost::bytes::Bytes;
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
    copy_on_a_thread(server, Out::Messages(tx));
    ReceiverStream::new(rx)
}

fn copy_on_a_thread(server: Arc<EtcdServer>, out: Out) {
    tokio::task::spawn_blocking(move || {
        remove_stale_copies(&server.cfg.member_dir().join("snap"));
        let timer = server.metrics.ops.snapshot_started();
        match send_snapshot(&server, &out) {
            Ok(()) => {
                timer.finish();
                out.finish();
            }
            Err(status) => out.fail(status),
        }
    });
}

/// Where the copy's messages go.
enum Out {
    /// As messages, for tonic's encoder.
    Messages(mpsc::Sender<Item>),
    /// Framed here, for [`SnapshotBody`].
    Frames(mpsc::Sender<Piece>),
}

/// What the copy's thread hands [`SnapshotBody`].
enum Piece {
    Data(Bytes),
    /// The call's status: the last piece.
    End(Result<(), Status>),
}

/// The client went away.
struct Gone;

impl Out {
    fn send(&self, response: SnapshotResponse) -> Result<(), Gone> {
        match self {
            Out::Messages(tx) => tx.blocking_send(Ok(response)).map_err(|_| Gone),
            Out::Frames(tx) => {
                let (head, blob) = framed(response);
                tx.blocking_send(Piece::Data(head)).map_err(|_| Gone)?;
                if !blob.is_empty() {
                    tx.blocking_send(Piece::Data(blob)).map_err(|_| Gone)?;
                }
                Ok(())
            }
        }
    }

    fn fail(&self, status: Status) {
        let _ = match self {
            Out::Messages(tx) => tx.blocking_send(Err(status)).map_err(drop),
            Out::Frames(tx) => tx.blocking_send(Piece::End(Err(status))).map_err(drop),
        };
    }

    fn finish(&self) {
        if let Out::Frames(tx) = self {
            let _ = tx.blocking_send(Piece::End(Ok(())));
        }
    }
}

/// `response` as a gRPC message in two parts: the 5-byte prefix (not
/// compressed, the length) with every field but the blob, and the blob,
/// whose field is the last one (`blob = 3`): together, byte for byte what
/// tonic's encoder writes.
fn framed(mut response: SnapshotResponse) -> (Bytes, Bytes) {
    use prost::Message;
    let blob = std::mem::take(&mut response.blob);
    let fields = response.encoded_len();
    let blob_field = match blob.len() {
        0 => 0,
        n => 1 + prost::length_delimiter_len(n) + n,
    };
    let mut head = Vec::with_capacity(5 + fields + 11);
    head.push(0);
    // a chunk and its fields are far below 4 GiB
    head.extend_from_slice(&((fields + blob_field) as u32).to_be_bytes());
    response
        .encode(&mut head)
        .expect("a Vec grows as the message needs");
    if !blob.is_empty() {
        head.push(BLOB_KEY);
        prost::encode_length_delimiter(blob.len(), &mut head)
            .expect("a Vec grows as the message needs");
    }
    (head.into(), blob)
}

/// `SnapshotResponse.blob`'s key: field 3, length-delimited.
const BLOB_KEY: u8 = (3 << 3) | 2;

/// The path [`SnapshotRoute`] serves.
pub const SNAPSHOT_PATH: &str = "/etcdserverpb.Maintenance/Snapshot";

/// Maintenance.Snapshot on the client port (see the module doc).
#[derive(Clone)]
pub struct SnapshotRoute(Arc<EtcdServer>);

impl SnapshotRoute {
    pub fn new(server: Arc<EtcdServer>) -> SnapshotRoute {
        SnapshotRoute(server)
    }
}

impl<B> tower_service::Service<http::Request<B>> for SnapshotRoute {
    type Response = http::Response<SnapshotBody>;
    type Error = std::convert::Infallible;
    type Future = std::pin::Pin<
        Box<dyn std::future::Future<Output = Result<Self::Response, Self::Error>> + Send>,
    >;

    fn poll_ready(
        &mut self,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Self::Error>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        let server = self.0.clone();
        // the request's message (SnapshotRequest has no field) is not read
        let request = tonic::Request::from_http(request.map(drop));
        Box::pin(async move {
            let checked = match crate::check_require_leader(&server, &request) {
                Ok(()) => crate::auth::require_admin(&server, &request).await,
                Err(status) => Err(status),
            };
            if let Err(status) = checked {
                return Ok(status.into_http());
            }
            let (tx, rx) = mpsc::channel(2 * SNAPSHOT_STREAM_QUEUE);
            copy_on_a_thread(server, Out::Frames(tx));
            let mut response = http::Response::new(SnapshotBody { pieces: Some(rx) });
            response.headers_mut().insert(
                http::header::CONTENT_TYPE,
                http::HeaderValue::from_static("application/grpc"),
            );
            Ok(response)
        })
    }
}

/// The response body of [`SnapshotRoute`]: the pieces the copy's thread
/// framed, then the status as trailers. Empty by default (a response
/// whose status is in its headers).
#[derive(Default)]
pub struct SnapshotBody {
    /// None once the trailers went out.
    pieces: Option<mpsc::Receiver<Piece>>,
}

impl http_body::Body for SnapshotBody {
    type Data = Bytes;
    type Error = Status;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Bytes>, Status>>> {
        let Some(pieces) = self.pieces.as_mut() else {
            return std::task::Poll::Ready(None);
        };
        let status = match std::task::ready!(pieces.poll_recv(cx)) {
            Some(Piece::Data(data)) => {
                return std::task::Poll::Ready(Some(Ok(http_body::Frame::data(data))));
            }
            Some(Piece::End(Ok(()))) => Status::ok(""),
            Some(Piece::End(Err(status))) => status,
            // the copy's thread ended without a status: it panicked
            None => Status::internal("the snapshot copy stopped"),
        };
        self.pieces = None;
        let mut trailers = http::HeaderMap::new();
        if let Err(status) = status.add_header(&mut trailers) {
            trailers = http::HeaderMap::new();
            let _ = Status::internal(status.message().to_string()).add_header(&mut trailers);
        }
        std::task::Poll::Ready(Some(Ok(http_body::Frame::trailers(trailers))))
    }

    fn is_end_stream(&self) -> bool {
        self.pieces.is_none()
    }
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
    out: &'a Out,
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
        if self.out.send(response).is_err() {
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
fn send_snapshot(server: &EtcdServer, out: &Out) -> Result<(), Status> {
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
        out,
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
    if out.send(last).is_ok() {
        tracing::info!(
            "total-bytes" = total,
            "successfully sent database snapshot to client"
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use prost::Message;

    /// What tonic's encoder writes for `response`: the prefix, then the
    /// whole message.
    fn tonic_framing(response: &SnapshotResponse) -> Vec<u8> {
        let message = response.encode_to_vec();
        let mut framed = vec![0];
        framed.extend_from_slice(&(message.len() as u32).to_be_bytes());
        framed.extend_from_slice(&message);
        framed
    }

    #[test]
    fn a_message_framed_here_is_what_tonic_writes() {
        let header = ResponseHeader {
            cluster_id: 0x1234_5678_9abc_def0,
            member_id: 7,
            revision: 1 << 40,
            raft_term: 3,
        };
        for (header, remaining_bytes, blob_len) in [
            (Some(header), 1 << 33, 32 * 1024),
            (None, 12_345, 32 * 1024),
            (None, 0, 32),        // the sha256
            (None, 0, 0),         // nothing at all
            (Some(header), 0, 0), // a header alone
            (None, 1, 127),       // one byte of length
            (None, 1, 128),       // two
            (None, 1, 16_384),    // three
        ] {
            let response = SnapshotResponse {
                header,
                remaining_bytes,
                blob: (0..blob_len)
                    .map(|i| (i * 7) as u8)
                    .collect::<Vec<u8>>()
                    .into(),
            };
            let want = tonic_framing(&response);
            let (head, blob) = framed(response);
            let got = [head.as_ref(), blob.as_ref()].concat();
            assert_eq!(
                got, want,
                "{remaining_bytes} bytes left, a blob of {blob_len}"
            );
        }
    }

    /// Every piece, then the status as trailers; then nothing.
    #[tokio::test]
    async fn the_body_ends_with_the_status() {
        use http_body_util::BodyExt;
        for (end, code) in [
            (Some(Ok(())), "0"),
            (Some(Err(Status::resource_exhausted("too much"))), "8"),
            (None, "13"), // the copy's thread went away
        ] {
            let (tx, rx) = mpsc::channel(4);
            tx.send(Piece::Data(Bytes::from_static(b"abc"))).await.ok();
            tx.send(Piece::Data(Bytes::from_static(b"de"))).await.ok();
            if let Some(end) = end {
                tx.send(Piece::End(end)).await.ok();
            }
            drop(tx);
            let mut body = SnapshotBody { pieces: Some(rx) };
            let mut data = Vec::new();
            let mut trailers = None;
            while let Some(frame) = body.frame().await {
                let frame = frame.unwrap();
                assert!(trailers.is_none(), "a frame after the trailers");
                match frame.into_data() {
                    Ok(bytes) => data.extend_from_slice(&bytes),
                    Err(frame) => trailers = frame.into_trailers().ok(),
                }
            }
            assert_eq!(data, b"abcde");
            let trailers = trailers.expect("trailers");
            assert_eq!(trailers["grpc-status"], code);
            assert!(http_body::Body::is_end_stream(&body));
        }
        assert!(http_body::Body::is_end_stream(&SnapshotBody::default()));
    }
}
