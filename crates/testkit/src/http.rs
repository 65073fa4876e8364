//! A minimal blocking HTTP/1.1 client for tests of /health, /metrics,
//! /version and the JSON gateway, so that they need neither curl nor an
//! async client: one request per connection (`Connection: close`), chunked
//! bodies decoded (trailers dropped), and a line reader for streams.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

/// How long a plain request may take before the test fails.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

#[derive(Debug, Clone)]
pub struct Response {
    pub status: u16,
    /// Header names lowercased, in the order received.
    pub headers: Vec<(String, String)>,
    pub body: String,
}

impl Response {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == &name.to_ascii_lowercase())
            .map(|(_, v)| v.as_str())
    }
}

fn host_port(endpoint: &str) -> &str {
    endpoint.trim_start_matches("http://").trim_end_matches('/')
}

fn send(
    endpoint: &str,
    method: &str,
    path: &str,
    body: Option<&str>,
    timeout: Duration,
) -> std::io::Result<BufReader<TcpStream>> {
    let address = host_port(endpoint);
    let stream = TcpStream::connect(address)?;
    stream.set_read_timeout(Some(timeout))?;
    stream.set_write_timeout(Some(timeout))?;
    let body = body.unwrap_or("");
    let request = format!(
        "{method} {path} HTTP/1.1\r\nHost: {address}\r\nConnection: close\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    (&stream).write_all(request.as_bytes())?;
    Ok(BufReader::new(stream))
}

fn read_head(reader: &mut BufReader<TcpStream>) -> std::io::Result<(u16, Vec<(String, String)>)> {
    let mut line = String::new();
    reader.read_line(&mut line)?;
    let status = line
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| std::io::Error::other(format!("bad status line {line:?}")))?;
    let mut headers = Vec::new();
    loop {
        line.clear();
        reader.read_line(&mut line)?;
        let trimmed = line.trim_end();
        if trimmed.is_empty() {
            break;
        }
        if let Some((name, value)) = trimmed.split_once(':') {
            headers.push((name.trim().to_ascii_lowercase(), value.trim().to_string()));
        }
    }
    Ok((status, headers))
}

fn is_chunked(headers: &[(String, String)]) -> bool {
    headers
        .iter()
        .any(|(n, v)| n == "transfer-encoding" && v.eq_ignore_ascii_case("chunked"))
}

/// Reads one chunk; None after the last (trailers are skipped).
fn read_chunk(reader: &mut BufReader<TcpStream>) -> std::io::Result<Option<Vec<u8>>> {
    let mut line = String::new();
    reader.read_line(&mut line)?;
    let size_text = line.trim().split(';').next().unwrap_or("");
    let size = usize::from_str_radix(size_text, 16)
        .map_err(|_| std::io::Error::other(format!("bad chunk size {line:?}")))?;
    if size == 0 {
        loop {
            line.clear();
            if reader.read_line(&mut line)? == 0 || line.trim().is_empty() {
                return Ok(None);
            }
        }
    }
    let mut data = vec![0; size];
    reader.read_exact(&mut data)?;
    line.clear();
    reader.read_line(&mut line)?;
    Ok(Some(data))
}

/// One request; the whole answer.
pub fn request(
    endpoint: &str,
    method: &str,
    path: &str,
    body: Option<&str>,
) -> std::io::Result<Response> {
    let mut reader = send(endpoint, method, path, body, REQUEST_TIMEOUT)?;
    let (status, headers) = read_head(&mut reader)?;
    let mut bytes = Vec::new();
    if is_chunked(&headers) {
        while let Some(chunk) = read_chunk(&mut reader)? {
            bytes.extend_from_slice(&chunk);
        }
    } else {
        reader.read_to_end(&mut bytes)?;
    }
    Ok(Response {
        status,
        headers,
        body: String::from_utf8_lossy(&bytes).into_owned(),
    })
}

/// The value of the sample `series` (name plus labels, exactly as printed)
/// in a Prometheus text page such as /metrics.
pub fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|line| line.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
}

pub fn get(endpoint: &str, path: &str) -> std::io::Result<Response> {
    request(endpoint, "GET", path, None)
}

pub fn post(endpoint: &str, path: &str, body: &str) -> std::io::Result<Response> {
    request(endpoint, "POST", path, Some(body))
}

/// A streaming answer (the gateway's /v3/watch), read line by line.
pub struct LineStream {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    reader: BufReader<TcpStream>,
    chunked: bool,
    pending: Vec<u8>,
}

impl LineStream {
    pub fn open(endpoint: &str, path: &str, body: &str) -> std::io::Result<LineStream> {
        let reader = send(endpoint, "POST", path, Some(body), REQUEST_TIMEOUT)?;
        LineStream::read_answer_head(reader)
    }

    /// Reads the answer's status line and headers; the body follows.
    fn read_answer_head(mut reader: BufReader<TcpStream>) -> std::io::Result<LineStream> {
        let (status, headers) = read_head(&mut reader)?;
        Ok(LineStream {
            status,
            chunked: is_chunked(&headers),
            headers,
            reader,
            pending: Vec::new(),
        })
    }

    /// A stream whose request body is sent in pieces (chunked transfer
    /// encoding), for the gateway's bidirectional streams: `first` goes
    /// out before the answer's head is read, later pieces with
    /// [`LineStream::send`], and [`LineStream::finish`] ends the body.
    pub fn open_chunked(endpoint: &str, path: &str, first: &str) -> std::io::Result<LineStream> {
        let address = host_port(endpoint);
        let stream = TcpStream::connect(address)?;
        stream.set_read_timeout(Some(REQUEST_TIMEOUT))?;
        stream.set_write_timeout(Some(REQUEST_TIMEOUT))?;
        let head = format!(
            "POST {path} HTTP/1.1\r\nHost: {address}\r\nConnection: close\r\nTransfer-Encoding: chunked\r\n\r\n"
        );
        (&stream).write_all(head.as_bytes())?;
        let reader = BufReader::new(stream);
        write_chunk(reader.get_ref(), first)?;
        LineStream::read_answer_head(reader)
    }

    /// Sends one more piece of the request body (open_chunked streams).
    pub fn send(&mut self, body: &str) -> std::io::Result<()> {
        write_chunk(self.reader.get_ref(), body)
    }

    /// Ends the request body (open_chunked streams).
    pub fn finish(&mut self) -> std::io::Result<()> {
        self.reader.get_ref().write_all(b"0\r\n\r\n")
    }

    /// The next complete line (without its newline), or None once
    /// `deadline` passes or the stream ends.
    pub fn next_line(&mut self, deadline: Instant) -> Option<String> {
        loop {
            if let Some(end) = self.pending.iter().position(|b| *b == b'\n') {
                let line: Vec<u8> = self.pending.drain(..=end).collect();
                return Some(String::from_utf8_lossy(&line[..line.len() - 1]).into_owned());
            }
            let left = deadline.checked_duration_since(Instant::now())?;
            self.reader
                .get_ref()
                .set_read_timeout(Some(left.max(Duration::from_millis(1))))
                .ok()?;
            if self.chunked {
                match read_chunk(&mut self.reader) {
                    Ok(Some(data)) => self.pending.extend_from_slice(&data),
                    _ => return None,
                }
            } else {
                let mut buf = [0u8; 4096];
                match self.reader.read(&mut buf) {
                    Ok(0) | Err(_) => return None,
                    Ok(n) => self.pending.extend_from_slice(&buf[..n]),
                }
            }
        }
    }
}

fn write_chunk(mut stream: &TcpStream, body: &str) -> std::io::Result<()> {
    if body.is_empty() {
        // An empty chunk would end the body.
        return Ok(());
    }
    write!(stream, "{:x}\r\n{body}\r\n", body.len())
}
