//! The raft links: one long-lived framed TCP stream per (sender,
//! receiver), opened by the sender with [`RAFT_MAGIC`] and a hello, then u32
//! little-endian length-prefixed raft messages; the receiver never writes.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use api::oxcdpeerpb::peer_client::PeerClient;
use api::oxcdpeerpb::ProbeRequest;
use protobuf::Message as _;
use raft::eraftpb::{self};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::mpsc;

use super::{NetworkObserver, PeerTransport, MAX_BATCH_MESSAGES};
use crate::RaftHandle;

/// Opens a raft link on a peer listener, before the hello's cluster ID,
/// sender and receiver (u64 little-endian each); then each message is a
/// u32 little-endian length and an encoded raft `Message`.
pub const RAFT_MAGIC: &[u8; 8] = b"OXRAFT01";
/// The ALPN protocol a raft link offers over TLS: the peer listener reads
/// it from the ClientHello before the handshake, so that the link is
/// handshaken and served on the raft thread's runtime.
pub const RAFT_ALPN: &[u8] = b"oxcd-raft";
const RAFT_HELLO_LEN: usize = 8 + 3 * 8;
/// The one byte a member writes on a raft link from a member removed from
/// the cluster before closing it (etcd answers such a stream HTTP 410
/// `removed member`): the sender learns it was removed, and stops.
pub const REMOVED_MARK: u8 = b'R';
/// A raft link whose peer does not take a batch within this is dropped and
/// reconnected (etcd's ConnWriteTimeout).
const WRITE_TIMEOUT: Duration = Duration::from_secs(5);
/// An accepted connection must say what it is within this.
const HELLO_TIMEOUT: Duration = Duration::from_secs(5);
pub(super) const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);
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
/// How often a connected peer's round trip is measured (etcd's
/// proberInterval: ConnReadTimeout - 1 s).
pub const PROBE_INTERVAL: Duration = Duration::from_secs(4);
/// A probe not answered in time is not observed (the stream's own failure
/// shows the peer is gone).
const PROBE_TIMEOUT: Duration = Duration::from_secs(5);

/// One direction between two members.
#[derive(Clone)]
pub(super) struct Link {
    pub(super) from: u64,
    pub(super) to: u64,
    pub(super) cluster_id: u64,
    pub(super) observer: Arc<dyn NetworkObserver>,
    /// Where probes run: the main runtime, not the raft thread's.
    pub(super) probes: tokio::runtime::Handle,
    /// TLS to the peer (its URL is `https://`): what to verify it with and
    /// which certificate to present.
    pub(super) tls: Option<Arc<rustls::ClientConfig>>,
    pub(super) state: Arc<super::LinkState>,
    /// Notified when the peer opens a link to us: dial again now.
    pub(super) redial: Arc<tokio::sync::Notify>,
}

/// A raft link's stream: TCP, or TLS over it.
pub(crate) trait LinkIo:
    tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send
{
}
impl<T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send> LinkIo for T {}

/// One peer's sender: connect, stream batches, reconnect with back-off.
pub(super) async fn run_peer(link: Link, url: String, mut queue: mpsc::Receiver<Vec<u8>>) {
    let to = link.to;
    let Some(addr) = host_port(&url) else {
        tracing::error!(peer = %format!("{to:x}"), url = %url, "invalid peer URL");
        return;
    };
    // Probes ride a gRPC channel of their own to the same listener, served
    // by the main runtime.
    let probe_channel = {
        let _main = link.probes.enter();
        super::lazy_channel(&url, CONNECT_TIMEOUT, link.tls.as_ref())
    };
    let probe_channel = match probe_channel {
        Ok(channel) => channel,
        Err(e) => {
            tracing::error!(peer = %format!("{to:x}"), url = %url, error = %e, "invalid peer URL");
            return;
        }
    };
    let mut backoff = BACKOFF_MIN;
    let mut was_connected = false;
    let mut failure = DialFailure::default();
    loop {
        let stream = match tokio::time::timeout(CONNECT_TIMEOUT, connect_raft(&addr, &link)).await {
            Ok(Ok(stream)) => stream,
            dialed => {
                if let Ok(Err(e)) = &dialed {
                    failure.report(to, e);
                }
                if was_connected {
                    tracing::warn!(peer = %format!("{to:x}"), "lost TCP streaming connection with remote peer");
                    link.observer.connection(to, false);
                    link.state.active_since.lock().remove(&to);
                    was_connected = false;
                }
                if drop_stale(&link, &mut queue) {
                    return; // the peer was removed or its URL changed
                }
                tokio::select! {
                    _ = tokio::time::sleep(backoff) => {
                        backoff = (backoff * 2).min(BACKOFF_MAX);
                    }
                    _ = link.redial.notified() => backoff = BACKOFF_MIN,
                }
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
            link.state
                .active_since
                .lock()
                .insert(to, std::time::Instant::now());
            was_connected = true;
        }
        let streamed = stream_batches(&link, &mut queue, stream).await;
        prober.abort();
        match streamed {
            Streamed::Stopping => {
                if was_connected {
                    link.observer.connection(to, false);
                    link.state.active_since.lock().remove(&to);
                }
                return;
            }
            Streamed::Removed => {
                tracing::error!(
                    "remote-peer-id" = %format!("{to:x}"),
                    "the member has been permanently removed from the cluster (a peer refused its stream)"
                );
                link.state.removed.send_replace(true);
                link.state.active_since.lock().remove(&to);
                return;
            }
            Streamed::Broken { carried, error } => {
                if carried {
                    failure = DialFailure::default();
                }
                if let Some(e) = error {
                    failure.report(to, &e);
                }
                // Only a link that carried messages resets the back-off:
                // one the peer refuses at once must not be retried in a
                // tight loop.
                if carried {
                    backoff = BACKOFF_MIN;
                }
            }
        }
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(BACKOFF_MAX);
    }
}

/// Why the link to a peer fails, logged when it changes (not at every
/// retry), in Go's words for TLS: a member whose certificate its peer
/// refuses logs `remote error: tls: bad certificate`, as etcd's does.
#[derive(Default)]
struct DialFailure {
    last: Option<String>,
}

impl DialFailure {
    fn report(&mut self, to: u64, error: &std::io::Error) {
        let text = tls::go_error_chain_text(error);
        if self.last.as_deref() != Some(text.as_str()) {
            tracing::warn!(
                "remote-peer-id" = %format!("{to:x}"),
                error = %text,
                "failed to dial remote peer"
            );
            self.last = Some(text);
        }
    }
}

/// Messages queued while the peer is unreachable are stale: dropped
/// (raft retransmits), and counted as failed sends. True when the queue
/// is closed: the peer is gone from the transport.
fn drop_stale(link: &Link, queue: &mut mpsc::Receiver<Vec<u8>>) -> bool {
    let mut stale = 0;
    let closed = loop {
        match queue.try_recv() {
            Ok(_) => stale += 1,
            Err(mpsc::error::TryRecvError::Empty) => break false,
            Err(mpsc::error::TryRecvError::Disconnected) => break true,
        }
    };
    if stale > 0 {
        link.observer.send_failed(link.to, stale);
    }
    closed
}

/// How one connection's streaming ended.
enum Streamed {
    /// The transport is gone (the member is stopping), or this peer was
    /// dropped from it.
    Stopping,
    /// The peer refused the link: this member was removed from the cluster.
    Removed,
    /// The connection failed or the peer closed it; `carried` if any batch
    /// went through first; the failure, unless the peer closed it cleanly.
    Broken {
        carried: bool,
        error: Option<std::io::Error>,
    },
}

/// Streams the queue's messages to the peer in batches (up to
/// `MAX_BATCH_MESSAGES` framed together, one write) until the connection
/// fails.
async fn stream_batches(
    link: &Link,
    queue: &mut mpsc::Receiver<Vec<u8>>,
    stream: Box<dyn LinkIo>,
) -> Streamed {
    let to = link.to;
    let (mut reader, mut writer) = tokio::io::split(stream);
    let mut frames = Vec::new();
    let mut eof = [0u8; 1];
    let mut carried = false;
    loop {
        // The peer never writes on this connection: a read that returns
        // means it closed (died, or refused us), noticed at once rather
        // than at the next message (a follower may send nothing to this
        // peer for a long time).
        let first = tokio::select! {
            first = queue.recv() => first,
            read = reader.read(&mut eof) => {
                if matches!(read, Ok(1)) && eof[0] == REMOVED_MARK {
                    return Streamed::Removed;
                }
                return Streamed::Broken { carried, error: read.err() };
            }
        };
        let Some(first) = first else {
            return Streamed::Stopping;
        };
        frames.clear();
        push_frame(&mut frames, &first);
        let mut count = 1u64;
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
            written => {
                link.observer.send_failed(to, count);
                return Streamed::Broken {
                    carried,
                    error: written.ok().and_then(Result::err),
                };
            }
        }
        link.observer.sent(to, (frames.len() as u64) - 4 * count);
        carried = true;
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

/// Opens a raft link: TCP (then TLS, verifying the peer for the URL's
/// host), then the hello naming cluster and members.
async fn connect_raft(addr: &str, link: &Link) -> std::io::Result<Box<dyn LinkIo>> {
    let tcp = tokio::net::TcpStream::connect(addr).await?;
    tcp.set_nodelay(true)?;
    let mut stream: Box<dyn LinkIo> = match &link.tls {
        Some(config) => {
            let mut config = (**config).clone();
            config.alpn_protocols = vec![RAFT_ALPN.to_vec()];
            let host = addr.rsplit_once(':').map_or(addr, |(host, _)| host);
            let host = host.trim_start_matches('[').trim_end_matches(']');
            let name = rustls::pki_types::ServerName::try_from(host.to_string()).map_err(|e| {
                std::io::Error::new(std::io::ErrorKind::InvalidInput, format!("{host}: {e}"))
            })?;
            let tls = tokio_rustls::TlsConnector::from(Arc::new(config))
                .connect(name, tcp)
                .await?;
            Box::new(tls)
        }
        None => Box::new(tcp),
    };
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
/// the caller's runtime until the raft thread has started). Over TLS
/// (`tls`), the connection moves untouched (its ClientHello was only peeked
/// at) and is handshaken there. `guard` is held while the link lasts (the
/// listener's connection permit).
pub async fn adopt_raft_link(
    stream: tokio::net::TcpStream,
    tls: Option<Arc<rustls::ServerConfig>>,
    transport: Arc<PeerTransport>,
    raft: RaftHandle,
    guard: impl Send + 'static,
) {
    let io = raft.io_runtime();
    let serve = |stream: tokio::net::TcpStream| async move {
        match tls {
            None => transport.serve_raft_link(stream, raft).await,
            Some(config) => {
                let tls = super::listener::accept_peer_tls(stream, config, &transport).await;
                if let Some(tls) = tls {
                    transport.serve_raft_link(tls, raft).await;
                }
            }
        }
        drop(guard);
    };
    let Some(io) = io else {
        serve(stream).await;
        return;
    };
    let Ok(stream) = stream.into_std() else {
        return;
    };
    io.spawn(async move {
        if let Ok(stream) = tokio::net::TcpStream::from_std(stream) {
            serve(stream).await;
        }
    });
}

/// Why an inbound raft link was closed by this member.
#[derive(Debug, thiserror::Error)]
pub(crate) enum LinkError {
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
pub(crate) struct LinkBytes<'a> {
    total: &'a AtomicUsize,
    held: usize,
}

impl<'a> LinkBytes<'a> {
    pub(crate) fn new(total: &'a AtomicUsize) -> Self {
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
pub(crate) async fn read_frame<R: tokio::io::AsyncRead + Unpin>(
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
    pub(crate) async fn serve_raft_link<
        S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send,
    >(
        self: Arc<Self>,
        stream: S,
        raft: RaftHandle,
    ) {
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
        if self.is_removed(from) {
            tracing::warn!(
                "local-member-id" = %format!("{:x}", self.id),
                "remote-peer-id" = %format!("{from:x}"),
                "rejected stream from remote peer because it was removed"
            );
            let _ = tokio::time::timeout(WRITE_TIMEOUT, reader.write_all(&[REMOVED_MARK])).await;
            let _ = reader.shutdown().await;
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

    struct Unobserved;

    impl NetworkObserver for Unobserved {
        fn round_trip(&self, _: u64, _: Duration) {}
        fn sent(&self, _: u64, _: u64) {}
        fn received(&self, _: u64, _: u64) {}
        fn send_failed(&self, _: u64, _: u64) {}
        fn connection(&self, _: u64, _: bool) {}
    }

    /// The failure of a raft link to a peer whose listener refuses this
    /// member's certificate (its CN is not the allowed one), over `max`.
    async fn refused_link_error(max: &str) -> std::io::Error {
        use testkit::pki::{TestCa, Usage};
        let dir = tempfile::tempdir().unwrap();
        let mut ca = TestCa::new(dir.path(), "ca");
        let peer = ca.issue("peer", "m2", &["127.0.0.1"], Usage::Peer);
        let member = ca.issue("member", "m1", &["127.0.0.1"], Usage::Peer);
        let server = tls::TlsInfo {
            cert_file: Some(peer.cert.clone()),
            key_file: Some(peer.key.clone()),
            trusted_ca_file: Some(ca.ca_file()),
            allowed_cns: vec!["m3".into()],
            max_version: Some(max.into()),
            ..Default::default()
        }
        .server_config()
        .unwrap();
        let mut server = (*server).clone();
        server.alpn_protocols = vec![RAFT_ALPN.to_vec()];
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(server));
        let serve = tokio::spawn(async move {
            let (tcp, _) = listener.accept().await.unwrap();
            let _ = acceptor.accept(tcp).await;
        });
        let client = tls::TlsInfo {
            cert_file: Some(member.cert.clone()),
            key_file: Some(member.key.clone()),
            trusted_ca_file: Some(ca.ca_file()),
            ..Default::default()
        }
        .client_config()
        .unwrap();
        let link = Link {
            from: 1,
            to: 2,
            cluster_id: 7,
            observer: Arc::new(Unobserved),
            probes: tokio::runtime::Handle::current(),
            tls: Some(client),
            state: Default::default(),
            redial: Default::default(),
        };
        let error = match connect_raft(&addr, &link).await {
            Err(e) => e,
            // TLS 1.3: the handshake is over for the client before the
            // peer has looked at its certificate; the alert comes next
            Ok(stream) => {
                let (_tx, mut queue) = mpsc::channel(1);
                match stream_batches(&link, &mut queue, stream).await {
                    Streamed::Broken {
                        error: Some(e),
                        carried: false,
                    } => e,
                    _ => panic!("{max}: the link was not refused"),
                }
            }
        };
        serve.await.unwrap();
        error
    }

    #[tokio::test]
    async fn a_refused_member_sees_remote_error_tls_bad_certificate_as_etcds_does() {
        for max in ["TLS1.2", "TLS1.3"] {
            let error = refused_link_error(max).await;
            assert_eq!(
                tls::go_error_chain_text(&error),
                "remote error: tls: bad certificate",
                "{max}"
            );
        }
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
