//! etcd's `--grpc-keepalive-min-time`: grpc-go's keepalive enforcement
//! policy on the client port (`MinTime`, `PermitWithoutStream: false`,
//! embed/etcd.go), kept by watching a connection's HTTP/2 frames as they
//! pass, below hyper.
//!
//! grpc-go's rule (internal/transport/http2_server.go, `handlePing`), which
//! etcd 3.5.16 answers to the letter (checked on loopback): a client PING
//! (not an ACK) is a strike when
//!
//! * no stream is open and the previous ping came less than 2 hours ago
//!   (pings without a stream are not permitted), or
//! * a stream is open and the previous ping came less than `MinTime` ago;
//!
//! unless the server has sent HEADERS or DATA since the previous ping (a
//! client's BDP pings follow the server's data): then the strikes go back
//! to 0 and that ping is not judged. The first ping is never a strike. On
//! the third strike the server acknowledges the ping, sends GOAWAY
//! `ENHANCE_YOUR_CALM` with the debug data `too_many_pings` and the highest
//! stream the client opened, and closes the connection.
//!
//! Why a wrapper around the connection's bytes rather than a patch to the
//! vendored h2: hyper builds h2's server from its own options, so a new h2
//! option would need hyper patched too (or a process-wide setting), and
//! every h2 upgrade would carry a second patch (vendor/h2.md wants the one
//! it has gone). Here the cost is a look at each 9-byte frame header as it
//! passes (payloads are skipped by length, never copied), and a connection
//! that does not open with HTTP/2's preface (HTTP/1.1) is passed through
//! untouched from its first bytes. The GOAWAY is written between two of
//! hyper's frames: a frame hyper has begun is let through to its end first.
//!
//! Which connections: etcd enforces the policy where grpc-go serves the
//! connection itself, on a plain (`http://`, `unix://`) listener serving
//! gRPC, and on a TLS listener serving gRPC alone (with
//! `--listen-client-http-urls`). On a TLS listener that also serves HTTP
//! (the default), etcd hands gRPC requests to grpc-go's `ServeHTTP` under
//! Go's HTTP/2 server, which has no such policy; oxcd does the same.

use std::collections::HashSet;
use std::io;
use std::ops::ControlFlow;
use std::pin::Pin;
use std::task::{ready, Context, Poll};
use std::time::{Duration, Instant};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tonic::transport::server::Connected;

/// grpc-go's `maxPingStrikes`: the strikes a connection may have.
const MAX_PING_STRIKES: u8 = 2;
/// grpc-go's `defaultPingTimeout`: how far apart pings must be on a
/// connection without streams.
const NO_STREAM_PING_INTERVAL: Duration = Duration::from_secs(2 * 60 * 60);
/// grpc-go's `defaultKeepalivePolicyMinTime`: the policy's `MinTime` when
/// etcd sets none (`--grpc-keepalive-min-time` of 0 or less).
pub const DEFAULT_MIN_TIME: Duration = Duration::from_secs(5 * 60);

/// HTTP/2's connection preface, which a client sends first.
const PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
const FRAME_HEADER_BYTES: usize = 9;
const DATA: u8 = 0x0;
const HEADERS: u8 = 0x1;
const RST_STREAM: u8 = 0x3;
const PING: u8 = 0x6;
const GOAWAY: u8 = 0x7;
/// PING's ACK flag.
const ACK: u8 = 0x1;
/// DATA's and HEADERS' END_STREAM flag.
const END_STREAM: u8 = 0x1;
const PING_PAYLOAD_BYTES: usize = 8;
const ENHANCE_YOUR_CALM: u32 = 0xb;
const TOO_MANY_PINGS: &[u8] = b"too_many_pings";

/// The strikes of one connection (I/O free: the caller says when).
#[derive(Debug)]
pub struct PingStrikes {
    min_time: Duration,
    last_ping: Option<Instant>,
    strikes: u8,
    /// The server sent HEADERS or DATA since the last ping.
    reset: bool,
}

impl PingStrikes {
    pub fn new(min_time: Duration) -> PingStrikes {
        PingStrikes {
            min_time,
            last_ping: None,
            strikes: 0,
            reset: false,
        }
    }

    /// The server wrote HEADERS or DATA (grpc-go's `setResetPingStrikes`).
    pub fn server_sent_headers_or_data(&mut self) {
        self.reset = true;
    }

    /// A client PING (not an ACK) received at `now` while `open_streams`
    /// streams are open; true when the client has pinged too often.
    pub fn ping(&mut self, now: Instant, open_streams: usize) -> bool {
        let last = self.last_ping.replace(now);
        if std::mem::take(&mut self.reset) {
            self.strikes = 0;
            return false;
        }
        let interval = if open_streams == 0 {
            NO_STREAM_PING_INTERVAL
        } else {
            self.min_time
        };
        if last.is_some_and(|last| now < last + interval) {
            self.strikes = self.strikes.saturating_add(1);
        }
        self.strikes > MAX_PING_STRIKES
    }
}

/// An HTTP/2 frame header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct FrameHeader {
    length: usize,
    kind: u8,
    flags: u8,
    stream: u32,
}

impl FrameHeader {
    fn parse(bytes: &[u8; FRAME_HEADER_BYTES]) -> FrameHeader {
        FrameHeader {
            length: usize::from(bytes[0]) << 16
                | usize::from(bytes[1]) << 8
                | usize::from(bytes[2]),
            kind: bytes[3],
            flags: bytes[4],
            stream: u32::from_be_bytes([bytes[5], bytes[6], bytes[7], bytes[8]]) & 0x7fff_ffff,
        }
    }

    fn write(self, out: &mut Vec<u8>) {
        let length = u32::try_from(self.length).expect("a frame we write is small");
        out.extend_from_slice(&length.to_be_bytes()[1..]);
        out.push(self.kind);
        out.push(self.flags);
        out.extend_from_slice(&self.stream.to_be_bytes());
    }
}

/// Where one direction of an HTTP/2 connection is: inside a frame header
/// or a payload. Fed the bytes as they pass, in pieces of any size.
#[derive(Debug, Default)]
struct FrameCursor {
    header: [u8; FRAME_HEADER_BYTES],
    /// Bytes of `header` received.
    have: usize,
    /// Payload bytes of the current frame still to pass.
    skip: usize,
}

impl FrameCursor {
    /// Passes over `bytes`, calling `on_header` with each frame header as
    /// it completes; a Break stops right after that header. Returns the
    /// bytes passed over.
    fn feed(
        &mut self,
        bytes: &[u8],
        mut on_header: impl FnMut(FrameHeader) -> ControlFlow<()>,
    ) -> usize {
        let mut at = 0;
        while at < bytes.len() {
            if self.skip > 0 {
                let n = self.skip.min(bytes.len() - at);
                self.skip -= n;
                at += n;
                continue;
            }
            let n = (FRAME_HEADER_BYTES - self.have).min(bytes.len() - at);
            self.header[self.have..self.have + n].copy_from_slice(&bytes[at..at + n]);
            self.have += n;
            at += n;
            if self.have == FRAME_HEADER_BYTES {
                self.have = 0;
                let header = FrameHeader::parse(&self.header);
                self.skip = header.length;
                if on_header(header).is_break() {
                    break;
                }
            }
        }
        at
    }

    /// How many of `next` bytes finish the frame under way (0 between
    /// frames); None if `next` does not reach its end.
    fn to_boundary(&self, next: &[u8]) -> Option<usize> {
        if self.have == 0 {
            return (self.skip <= next.len()).then_some(self.skip);
        }
        let missing = FRAME_HEADER_BYTES - self.have;
        let rest = next.get(..missing)?;
        let mut header = self.header;
        header[self.have..].copy_from_slice(rest);
        let end = missing + FrameHeader::parse(&header).length;
        (end <= next.len()).then_some(end)
    }
}

/// What the client sent so far.
#[derive(Debug)]
enum Incoming {
    /// Matching HTTP/2's preface: this many bytes so far.
    Preface(usize),
    Frames(FrameCursor),
}

/// What one look at the client's bytes found.
enum Scan {
    /// Go on.
    Pass,
    /// Not HTTP/2: no more looking.
    NotHttp2,
    /// A ping too many, whose header ends `header_end` bytes into the
    /// piece: what follows it is the client's no more.
    Calm { header_end: usize },
}

/// The connection's side of the policy.
#[derive(Debug)]
struct Policing {
    incoming: Incoming,
    outgoing: FrameCursor,
    strikes: PingStrikes,
    /// Streams the client opened that are not over: the server has not
    /// ended them (grpc-go deletes a stream when it writes its status) and
    /// neither side reset them.
    open_streams: HashSet<u32>,
    /// The highest stream the client opened (GOAWAY's last stream).
    last_client_stream: u32,
    closing: Option<Closing>,
}

/// Telling the client to calm down, then closing.
#[derive(Debug)]
struct Closing {
    /// The offending ping's payload, which the ACK echoes.
    payload: [u8; PING_PAYLOAD_BYTES],
    have: usize,
    /// The ACK and the GOAWAY, once the payload is in.
    frames: Vec<u8>,
    written: usize,
    /// Written, flushed and shut down.
    done: bool,
}

impl Policing {
    fn new(min_time: Duration) -> Policing {
        Policing {
            incoming: Incoming::Preface(0),
            outgoing: FrameCursor::default(),
            strikes: PingStrikes::new(min_time),
            open_streams: HashSet::new(),
            last_client_stream: 0,
            closing: None,
        }
    }

    fn scan_incoming(&mut self, bytes: &[u8]) -> Scan {
        let mut at = 0;
        if let Incoming::Preface(matched) = &mut self.incoming {
            let n = (PREFACE.len() - *matched).min(bytes.len());
            if bytes[..n] != PREFACE[*matched..*matched + n] {
                return Scan::NotHttp2;
            }
            *matched += n;
            at = n;
            if *matched < PREFACE.len() {
                return Scan::Pass;
            }
            self.incoming = Incoming::Frames(FrameCursor::default());
        }
        let Incoming::Frames(cursor) = &mut self.incoming else {
            unreachable!("the preface is matched")
        };
        let strikes = &mut self.strikes;
        let open_streams = &mut self.open_streams;
        let last_client_stream = &mut self.last_client_stream;
        let mut calm = false;
        let passed = cursor.feed(&bytes[at..], |header| {
            match header.kind {
                HEADERS if header.stream > *last_client_stream && header.stream % 2 == 1 => {
                    *last_client_stream = header.stream;
                    open_streams.insert(header.stream);
                }
                RST_STREAM => {
                    open_streams.remove(&header.stream);
                }
                // A malformed ping is h2's to refuse, as grpc-go's framer
                // refuses it before judging it.
                PING if header.flags & ACK == 0
                    && header.length == PING_PAYLOAD_BYTES
                    && header.stream == 0 =>
                {
                    calm = strikes.ping(Instant::now(), open_streams.len());
                }
                _ => {}
            }
            if calm {
                ControlFlow::Break(())
            } else {
                ControlFlow::Continue(())
            }
        });
        if calm {
            Scan::Calm {
                header_end: at + passed,
            }
        } else {
            Scan::Pass
        }
    }

    fn scan_outgoing(&mut self, bytes: &[u8]) {
        let strikes = &mut self.strikes;
        let open_streams = &mut self.open_streams;
        self.outgoing.feed(bytes, |header| {
            match header.kind {
                DATA | HEADERS => {
                    strikes.server_sent_headers_or_data();
                    if header.flags & END_STREAM != 0 {
                        open_streams.remove(&header.stream);
                    }
                }
                RST_STREAM => {
                    open_streams.remove(&header.stream);
                }
                _ => {}
            }
            ControlFlow::Continue(())
        });
    }

    /// Takes the offending ping's payload from `bytes` (the client's bytes
    /// after its header); once it is in, the frames to send are ready.
    fn take_payload(&mut self, bytes: &[u8]) {
        let last_stream = self.last_client_stream;
        let Some(closing) = &mut self.closing else {
            return;
        };
        let n = (PING_PAYLOAD_BYTES - closing.have).min(bytes.len());
        closing.payload[closing.have..closing.have + n].copy_from_slice(&bytes[..n]);
        closing.have += n;
        if closing.have == PING_PAYLOAD_BYTES && closing.frames.is_empty() {
            closing.frames = calm_down_frames(&closing.payload, last_stream);
        }
    }
}

/// grpc-go's answer to a ping too many: its ACK, then GOAWAY.
fn calm_down_frames(payload: &[u8; PING_PAYLOAD_BYTES], last_stream: u32) -> Vec<u8> {
    let mut out = Vec::with_capacity(2 * FRAME_HEADER_BYTES + 16 + TOO_MANY_PINGS.len());
    FrameHeader {
        length: PING_PAYLOAD_BYTES,
        kind: PING,
        flags: ACK,
        stream: 0,
    }
    .write(&mut out);
    out.extend_from_slice(payload);
    FrameHeader {
        length: 8 + TOO_MANY_PINGS.len(),
        kind: GOAWAY,
        flags: 0,
        stream: 0,
    }
    .write(&mut out);
    out.extend_from_slice(&last_stream.to_be_bytes());
    out.extend_from_slice(&ENHANCE_YOUR_CALM.to_be_bytes());
    out.extend_from_slice(TOO_MANY_PINGS);
    out
}

/// A client connection under the ping policy (or not: `None`, and after
/// the client's first bytes showed HTTP/1.x).
pub struct PingPoliced<IO> {
    inner: IO,
    policing: Option<Box<Policing>>,
}

impl<IO> PingPoliced<IO> {
    /// `min_time`: the policy's MinTime; None serves the connection as it
    /// is.
    pub fn new(inner: IO, min_time: Option<Duration>) -> PingPoliced<IO> {
        PingPoliced {
            inner,
            policing: min_time.map(|min_time| Box::new(Policing::new(min_time))),
        }
    }
}

impl<IO: AsyncWrite + Unpin> PingPoliced<IO> {
    /// Writes the ACK and GOAWAY (the outgoing bytes are between frames),
    /// flushes and shuts the connection's write side.
    fn poll_send_calm_down(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let Some(closing) = self.policing.as_mut().and_then(|p| p.closing.as_mut()) else {
            return Poll::Ready(Ok(()));
        };
        if closing.done {
            return Poll::Ready(Ok(()));
        }
        while closing.written < closing.frames.len() {
            let n = ready!(
                Pin::new(&mut self.inner).poll_write(cx, &closing.frames[closing.written..])
            )?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            closing.written += n;
        }
        ready!(Pin::new(&mut self.inner).poll_flush(cx))?;
        // the client may be gone already; the connection ends either way
        let _ = ready!(Pin::new(&mut self.inner).poll_shutdown(cx));
        closing.done = true;
        tracing::debug!("closed a client connection: too many pings");
        Poll::Ready(Ok(()))
    }
}

fn too_many_pings() -> io::Error {
    io::Error::new(
        io::ErrorKind::BrokenPipe,
        "got too many pings from the client",
    )
}

impl<IO: AsyncRead + AsyncWrite + Unpin> PingPoliced<IO> {
    /// Reading once the client pinged too often: its bytes are read (the
    /// ping's payload) but not handed on, and hyper sees the end once the
    /// GOAWAY is out.
    fn poll_read_closing(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        loop {
            let policing = self.policing.as_mut().expect("closing is policed");
            let closing = policing.closing.as_ref().expect("closing");
            if closing.have == PING_PAYLOAD_BYTES {
                break;
            }
            let mut scratch = [0u8; PING_PAYLOAD_BYTES];
            let mut missing = ReadBuf::new(&mut scratch[..PING_PAYLOAD_BYTES - closing.have]);
            ready!(Pin::new(&mut self.inner).poll_read(cx, &mut missing))?;
            if missing.filled().is_empty() {
                // the client left first
                return Poll::Ready(Ok(()));
            }
            policing.take_payload(missing.filled());
        }
        let policing = self.policing.as_mut().expect("closing is policed");
        if policing.outgoing.to_boundary(&[]) != Some(0) {
            // hyper is inside a frame: its next write finishes it and sends
            // the GOAWAY
            return Poll::Pending;
        }
        ready!(self.poll_send_calm_down(cx))?;
        Poll::Ready(Ok(()))
    }
}

impl<IO: AsyncRead + AsyncWrite + Unpin> AsyncRead for PingPoliced<IO> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let Some(policing) = this.policing.as_mut() else {
            return Pin::new(&mut this.inner).poll_read(cx, buf);
        };
        if policing.closing.is_some() {
            return this.poll_read_closing(cx);
        }
        let before = buf.filled().len();
        ready!(Pin::new(&mut this.inner).poll_read(cx, buf))?;
        let read = &buf.filled()[before..];
        match policing.scan_incoming(read) {
            Scan::Pass => Poll::Ready(Ok(())),
            Scan::NotHttp2 => {
                this.policing = None;
                Poll::Ready(Ok(()))
            }
            Scan::Calm { header_end } => {
                let after = read[header_end..].to_vec();
                policing.closing = Some(Closing {
                    payload: [0; PING_PAYLOAD_BYTES],
                    have: 0,
                    frames: Vec::new(),
                    written: 0,
                    done: false,
                });
                policing.take_payload(&after);
                // The ping (and what follows) is never hyper's; what came
                // before it in this piece is.
                let header_start = header_end.saturating_sub(FRAME_HEADER_BYTES);
                buf.set_filled(before + header_start);
                if header_start > 0 {
                    return Poll::Ready(Ok(()));
                }
                this.poll_read_closing(cx)
            }
        }
    }
}

impl<IO: AsyncRead + AsyncWrite + Unpin> AsyncWrite for PingPoliced<IO> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let Some(policing) = this.policing.as_mut() else {
            return Pin::new(&mut this.inner).poll_write(cx, buf);
        };
        let mut allowed = buf.len();
        if let Some(closing) = &policing.closing {
            if closing.done {
                return Poll::Ready(Err(too_many_pings()));
            }
            if !closing.frames.is_empty() {
                match policing.outgoing.to_boundary(buf) {
                    Some(0) => {
                        ready!(this.poll_send_calm_down(cx))?;
                        return Poll::Ready(Err(too_many_pings()));
                    }
                    // the end of the frame hyper has begun, no further
                    Some(end) => allowed = end,
                    None => {}
                }
            }
        }
        let n = ready!(Pin::new(&mut this.inner).poll_write(cx, &buf[..allowed]))?;
        policing.scan_outgoing(&buf[..n]);
        Poll::Ready(Ok(n))
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let Some(policing) = this.policing.as_mut() else {
            return Pin::new(&mut this.inner).poll_write_vectored(cx, bufs);
        };
        if policing.closing.is_some() {
            // one slice at a time, so that the GOAWAY goes in at a frame's end
            let first = bufs
                .iter()
                .find(|b| !b.is_empty())
                .map_or(&[][..], |b| &**b);
            return Pin::new(this).poll_write(cx, first);
        }
        let n = ready!(Pin::new(&mut this.inner).poll_write_vectored(cx, bufs))?;
        let mut left = n;
        for buf in bufs {
            if left == 0 {
                break;
            }
            let take = left.min(buf.len());
            policing.scan_outgoing(&buf[..take]);
            left -= take;
        }
        Poll::Ready(Ok(n))
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if this
            .policing
            .as_ref()
            .and_then(|p| p.closing.as_ref())
            .is_some_and(|c| c.done)
        {
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut this.inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if this
            .policing
            .as_ref()
            .and_then(|p| p.closing.as_ref())
            .is_some_and(|c| c.done)
        {
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut this.inner).poll_shutdown(cx)
    }
}

impl<IO: Connected> Connected for PingPoliced<IO> {
    type ConnectInfo = IO::ConnectInfo;

    fn connect_info(&self) -> IO::ConnectInfo {
        self.inner.connect_info()
    }
}

#[cfg(test)]
mod tests;
