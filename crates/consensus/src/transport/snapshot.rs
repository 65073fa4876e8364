//! Backend snapshots for a follower too far behind: streamed out of band
//! over the `Peer.Snapshot` RPC in chunks, never inside a raft message.
//!
//! The leader first offers its file's image (`Peer.SnapshotImage`), then,
//! to a member that answers UNIMPLEMENTED, its records
//! (`Peer.SnapshotRecords`), then a copy of its file (`Peer.Snapshot`).
//!
//! An image or a record stream is not sent through tonic's
//! client: the writer's thread frames each chunk as gRPC does, a few bytes
//! of prefix and field key, then the chunk's data as it is ([`framed`]),
//! and [`call_framed`] posts them over the channel as the request's body.
//! tonic's encoder copied every chunk into its buffer once more on the
//! runtime's thread. The receiver is tonic's server, as before.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use api::oxcdpeerpb::peer_client::PeerClient;
use api::oxcdpeerpb::{SnapshotChunk, StreamAck};
use bytes::Bytes;
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
        // each refused as by an older member: the next
        for (stream, refused) in [
            (
                Stream::Image,
                "the member takes no image of the database file; sending its records",
            ),
            (
                Stream::Records,
                "the member takes no record stream; sending a copy of the database file",
            ),
        ] {
            match self.stream_framed(&msg, stream).await {
                Err(Sent::Unimplemented) => {
                    tracing::info!(to = %format!("{:x}", msg.to), index, "{refused}");
                }
                Err(Sent::Failed(e)) => return Err(e),
                Ok(sent) => return Ok(sent),
            }
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

    /// Sends the backend as a stream the leader writes as it reads it: its
    /// file's image (`SnapshotImage`) or its records (`SnapshotRecords`).
    async fn stream_framed(&self, msg: &eraftpb::Message, stream: Stream) -> Result<u64, Sent> {
        let index = msg.get_snapshot().get_metadata().index;
        let (writer, path) = match stream {
            Stream::Image => (self.source.backend_image(index).await?, SNAPSHOT_IMAGE_PATH),
            Stream::Records => (
                self.source.backend_records(index).await?,
                SNAPSHOT_RECORDS_PATH,
            ),
        };
        let channel = super::channel(&self.url, CONNECT_TIMEOUT, self.tls.as_ref()).await?;
        // a chunk is two pieces: its prefix and key, its data
        let (pieces, wire) = mpsc::channel::<Bytes>(2 * SEND_QUEUE_CHUNKS);
        let call = tokio::spawn(call_framed(channel, path, wire));
        let header = framed(self.header(msg)?);
        for piece in header.into_iter().flatten() {
            if pieces.send(piece).await.is_err() {
                return Err(Sent::of(call.await));
            }
        }
        let chunks = Chunks::Framed(pieces);
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
        let chunks = Chunks::Messages(chunks);
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

/// `Peer.SnapshotRecords` and `Peer.SnapshotImage`, which [`call_framed`]
/// posts to.
const SNAPSHOT_RECORDS_PATH: &str = "/oxcdpeerpb.Peer/SnapshotRecords";
const SNAPSHOT_IMAGE_PATH: &str = "/oxcdpeerpb.Peer/SnapshotImage";

/// What a framed stream carries.
#[derive(Clone, Copy)]
enum Stream {
    Image,
    Records,
}

/// Where a sender's chunks go.
enum Chunks {
    /// To tonic's client, as messages.
    Messages(mpsc::Sender<SnapshotChunk>),
    /// Framed here, to [`call_framed`]'s body.
    Framed(mpsc::Sender<Bytes>),
}

impl Chunks {
    /// Queues `chunk`; Err once the call ended.
    fn blocking_send(&self, chunk: SnapshotChunk) -> Result<(), ()> {
        match self {
            Chunks::Messages(tx) => tx.blocking_send(chunk).map_err(drop),
            Chunks::Framed(tx) => {
                for piece in framed(chunk).into_iter().flatten() {
                    tx.blocking_send(piece).map_err(drop)?;
                }
                Ok(())
            }
        }
    }
}

/// `chunk` as a gRPC message (no compression), in at most three pieces
/// that together are byte for byte what tonic writes: the prefix with
/// every field before `data`, then `data` as it is, then the fields after
/// it (`last`). A chunk without data is one piece.
fn framed(mut chunk: SnapshotChunk) -> [Option<Bytes>; 3] {
    use prost::Message as _;
    let data = std::mem::take(&mut chunk.data);
    if data.is_empty() {
        let message = chunk.encode_to_vec();
        let mut whole = Vec::with_capacity(5 + message.len());
        whole.push(0);
        whole.extend_from_slice(&(message.len() as u32).to_be_bytes());
        whole.extend_from_slice(&message);
        return [Some(whole.into()), None, None];
    }
    let last = std::mem::take(&mut chunk.last);
    let before = chunk.encoded_len();
    let data_field = 1 + prost::length_delimiter_len(data.len()) + data.len();
    let after = if last { 2 } else { 0 };
    let mut head = Vec::with_capacity(5 + before + 11);
    head.push(0);
    // a chunk is far below 4 GiB (MAX_PEER_MESSAGE_BYTES)
    head.extend_from_slice(&((before + data_field + after) as u32).to_be_bytes());
    chunk
        .encode(&mut head)
        .expect("a Vec grows as the message needs");
    head.push(DATA_KEY);
    prost::encode_length_delimiter(data.len(), &mut head).expect("a Vec grows as needed");
    let tail = last.then(|| Bytes::from_static(&[LAST_KEY, 1]));
    [Some(head.into()), Some(data), tail]
}

/// `SnapshotChunk.data`'s key (field 5, length-delimited) and `last`'s
/// (field 6, varint).
const DATA_KEY: u8 = (5 << 3) | 2;
const LAST_KEY: u8 = 6 << 3;

/// The request body of [`call_framed`]: the pieces queued, then its end.
struct FramedBody(mpsc::Receiver<Bytes>);

impl http_body::Body for FramedBody {
    type Data = Bytes;
    type Error = tonic::Status;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Bytes>, tonic::Status>>> {
        self.0
            .poll_recv(cx)
            .map(|piece| piece.map(|data| Ok(http_body::Frame::data(data))))
    }
}

/// The largest answer [`call_framed`] reads (a `StreamAck` is a few bytes).
const MAX_ANSWER_BYTES: usize = 64 * 1024;

/// A client-streaming call to `path` whose messages come framed on
/// `pieces` (see [`framed`]): the answer as tonic's client gives it.
async fn call_framed(
    mut channel: tonic::transport::Channel,
    path: &'static str,
    pieces: mpsc::Receiver<Bytes>,
) -> Result<tonic::Response<StreamAck>, tonic::Status> {
    use http_body_util::BodyExt;
    use prost::Message as _;
    use tonic::Status;
    use tower_service::Service;
    let request = http::Request::builder()
        .method(http::Method::POST)
        .uri(path)
        .header(http::header::CONTENT_TYPE, "application/grpc")
        .header(http::header::TE, "trailers")
        .body(tonic::body::Body::new(FramedBody(pieces)))
        .map_err(|e| Status::internal(e.to_string()))?;
    std::future::poll_fn(|cx| channel.poll_ready(cx))
        .await
        .map_err(|e| Status::unavailable(e.to_string()))?;
    let response = channel
        .call(request)
        .await
        .map_err(|e| Status::unavailable(e.to_string()))?;
    // trailers-only: the status is in the headers (UNIMPLEMENTED from an
    // older member)
    if let Some(status) = Status::from_header_map(response.headers()) {
        if status.code() != tonic::Code::Ok {
            return Err(status);
        }
    }
    if response.status() != http::StatusCode::OK {
        return Err(Status::unknown(format!(
            "HTTP status {}",
            response.status()
        )));
    }
    let mut body = response.into_body();
    let mut answer = Vec::new();
    let mut status = None;
    while let Some(frame) = body.frame().await {
        match frame?.into_data() {
            Ok(data) if answer.len() + data.len() <= MAX_ANSWER_BYTES => {
                answer.extend_from_slice(&data)
            }
            Ok(_) => return Err(Status::resource_exhausted("the answer is too long")),
            Err(frame) => {
                if let Ok(trailers) = frame.into_trailers() {
                    status = Status::from_header_map(&trailers);
                }
            }
        }
    }
    match status {
        Some(status) if status.code() == tonic::Code::Ok => {}
        Some(status) => return Err(status),
        None => return Err(Status::internal("the answer has no grpc-status")),
    }
    match answer.split_first_chunk::<5>() {
        Some(([0, length @ ..], message))
            if u32::from_be_bytes(*length) as usize == message.len() =>
        {
            StreamAck::decode(message)
                .map(tonic::Response::new)
                .map_err(|e| Status::internal(format!("the answer: {e}")))
        }
        _ => Err(Status::internal("the answer is not one gRPC message")),
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
fn send_piece(piece: &[u8], chunks: &Chunks) -> Result<(), String> {
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
fn send_last(chunks: &Chunks) -> Result<(), String> {
    let last = SnapshotChunk {
        last: true,
        ..Default::default()
    };
    chunks.blocking_send(last).map_err(|()| GONE.to_string())
}

/// Reads `file` to its end into chunks on `chunks`, the last one empty and
/// marked; the bytes sent.
fn read_chunks(mut file: std::fs::File, chunks: &Chunks) -> Result<u64, String> {
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

#[cfg(test)]
mod framing_tests {
    use super::*;
    use prost::Message as _;

    #[test]
    fn a_chunk_framed_here_is_what_tonic_writes() {
        let data = |n: usize| Bytes::from((0..n).map(|i| (i * 13) as u8).collect::<Vec<u8>>());
        for chunk in [
            SnapshotChunk {
                cluster_id: u64::MAX,
                from: 1,
                to: 2,
                message: data(300),
                ..Default::default()
            },
            SnapshotChunk {
                data: data(SNAPSHOT_CHUNK_BYTES),
                ..Default::default()
            },
            SnapshotChunk {
                data: data(1),
                ..Default::default()
            },
            SnapshotChunk {
                data: data(127),
                last: true,
                ..Default::default()
            },
            SnapshotChunk {
                last: true,
                ..Default::default()
            },
            SnapshotChunk {
                cluster_id: 9,
                data: data(128),
                ..Default::default()
            },
            SnapshotChunk::default(),
        ] {
            let message = chunk.encode_to_vec();
            let mut want = vec![0];
            want.extend_from_slice(&(message.len() as u32).to_be_bytes());
            want.extend_from_slice(&message);
            let got: Vec<u8> = framed(chunk.clone())
                .into_iter()
                .flatten()
                .flat_map(|piece| piece.to_vec())
                .collect();
            assert_eq!(got, want, "{chunk:?}");
        }
    }
}
