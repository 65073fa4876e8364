//! Go's pure stub resolver (net/dnsclient_unix.go, dnsconfig.go, hosts.go)
//! for the two calls etcd's SRV bootstrap makes: `net.LookupSRV` and
//! `net.ResolveTCPAddr`.
//!
//! * `/etc/resolv.conf` as Go reads it: at most three `nameserver`s (IP
//!   addresses, port 53; none: `127.0.0.1` and `::1`), `search` / `domain`
//!   (none: the host name's domain), `options ndots: timeout: attempts:
//!   rotate use-vc`. A name with at least `ndots` dots is tried as is
//!   first, then with each search domain; a rooted one only as is.
//! * Each name is asked of each server in turn, `attempts` rounds, over
//!   UDP with EDNS0 (1232 bytes), again over TCP when the answer is
//!   truncated; each exchange has `timeout`. A response that does not
//!   answer the query (ID, question) is ignored and the wait goes on, as
//!   Go does. NXDOMAIN, or an answer without a record of the type asked,
//!   ends the name (`no such host`); a failing server passes to the next.
//! * Host names: `/etc/hosts` first, then A and AAAA (Go's usual
//!   `files,dns` order); `ResolveTCPAddr` takes the first IPv4 address.
//!   Go sorts addresses by RFC 6724 first, which keeps the answer's order
//!   among reachable IPv4 addresses; it is not done here.
//! * Errors read as Go's `*net.DNSError`: `lookup NAME on SERVER: no such
//!   host`.

use std::fmt;
use std::io::{self, Read, Write};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpStream, UdpSocket};
use std::path::Path;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use crate::wire::{self, Header, Message, Parsed, Question, RData, Record};
use crate::{is_domain_name, Lookup, Srv};

mod conf;

pub use conf::{Hosts, ResolvConf, MAX_NAMESERVERS};

/// Go's maxDNSPacketSize (dnsflagday.net/2020): the UDP payload advertised
/// with EDNS0 and the most read from one datagram.
pub const MAX_UDP_BYTES: usize = 1232;

const NO_SUCH_HOST: &str = "no such host";
const SERVER_MISBEHAVING: &str = "server misbehaving";
const LAME_REFERRAL: &str = "lame referral";
const CANNOT_UNMARSHAL: &str = "cannot unmarshal DNS message";
const CANNOT_MARSHAL: &str = "cannot marshal DNS message";
const INVALID_RESPONSE: &str = "invalid DNS response";
const NO_ANSWER: &str = "no answer from DNS server";
/// Go's errMalformedDNSRecordsDetail.
const MALFORMED_RECORDS: &str = "DNS response contained records which contain invalid names";

/// Go's `*net.DNSError`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DnsError {
    pub err: String,
    pub name: String,
    pub server: Option<SocketAddr>,
}

impl DnsError {
    pub fn new(err: impl Into<String>, name: &str, server: Option<SocketAddr>) -> DnsError {
        DnsError {
            err: err.into(),
            name: name.to_string(),
            server,
        }
    }

    pub fn not_found(name: &str, server: Option<SocketAddr>) -> DnsError {
        DnsError::new(NO_SUCH_HOST, name, server)
    }
}

impl fmt::Display for DnsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "lookup {}", self.name)?;
        if let Some(server) = self.server {
            write!(f, " on {server}")?;
        }
        write!(f, ": {}", self.err)
    }
}

impl std::error::Error for DnsError {}

/// Go's resolver over a resolv.conf and a hosts file.
#[derive(Debug)]
pub struct Resolver {
    conf: ResolvConf,
    hosts: Hosts,
    /// The next first server with `options rotate`.
    server_offset: AtomicU32,
}

impl Resolver {
    /// The system's: `/etc/resolv.conf` and `/etc/hosts`, read now.
    pub fn system() -> Resolver {
        Resolver::new(
            ResolvConf::read(Path::new("/etc/resolv.conf")),
            Hosts::read(Path::new("/etc/hosts")),
        )
    }

    pub fn new(conf: ResolvConf, hosts: Hosts) -> Resolver {
        Resolver {
            conf,
            hosts,
            server_offset: AtomicU32::new(0),
        }
    }

    /// Go's `net.LookupSRV`: the SRV records of `_service._proto.name`
    /// (of `name` when both are empty), ordered by priority and, within
    /// one, drawn by weight (RFC 2782). A target that is not a valid host
    /// name fails the whole look-up, as Go's answer then carries an error.
    pub fn lookup_srv(&self, service: &str, proto: &str, name: &str) -> Result<Vec<Srv>, DnsError> {
        let target = if service.is_empty() && proto.is_empty() {
            name.to_string()
        } else {
            format!("_{service}._{proto}.{name}")
        };
        let (answers, _) = self.lookup(&target, wire::TYPE_SRV)?;
        let mut owner = None;
        let mut srvs = Vec::new();
        for record in answers {
            if let (wire::TYPE_SRV, RData::Srv(data)) = (record.rtype, record.data) {
                owner.get_or_insert(record.name);
                srvs.push(Srv {
                    target: data.target,
                    port: data.port,
                    priority: data.priority,
                    weight: data.weight,
                });
            }
        }
        sort_by_priority_weight(&mut srvs);
        if owner.is_some_and(|owner| !is_domain_name(&owner)) {
            return Err(DnsError::new("SRV header name is invalid", name, None));
        }
        if !srvs.iter().all(|srv| is_domain_name(&srv.target)) {
            return Err(DnsError::new(MALFORMED_RECORDS, name, None));
        }
        Ok(srvs)
    }

    /// The addresses of `host`: an IP address itself, else `/etc/hosts`,
    /// else A and AAAA records (IPv4 first).
    pub fn lookup_ip(&self, host: &str) -> Result<Vec<IpAddr>, DnsError> {
        if let Ok(ip) = host.parse::<IpAddr>() {
            return Ok(vec![ip]);
        }
        let listed = self.hosts.lookup(host);
        if !listed.is_empty() {
            return Ok(listed.to_vec());
        }
        if !is_domain_name(host) {
            return Err(DnsError::not_found(host, None));
        }
        let mut addrs = Vec::new();
        let mut last_error: Option<DnsError> = None;
        let original = format!("{host}.");
        for fqdn in self.conf.name_list(host) {
            for qtype in [wire::TYPE_A, wire::TYPE_AAAA] {
                match self.try_one_name(&fqdn, qtype) {
                    Ok((answers, _)) => {
                        addrs.extend(answers.into_iter().filter_map(|r| match r.data {
                            RData::A(ip) if r.rtype == wire::TYPE_A => Some(IpAddr::V4(ip)),
                            RData::Aaaa(ip) if r.rtype == wire::TYPE_AAAA => Some(IpAddr::V6(ip)),
                            _ => None,
                        }));
                    }
                    // Go prefers the error for the name as given
                    Err(e) if last_error.is_none() || fqdn == original => last_error = Some(e),
                    Err(_) => {}
                }
            }
            if !addrs.is_empty() {
                return Ok(addrs);
            }
        }
        let mut error = last_error.unwrap_or_else(|| DnsError::not_found(host, None));
        error.name = host.to_string();
        Err(error)
    }

    /// Go's `net.ResolveTCPAddr("tcp", host_port)`: an IP address as is, a
    /// host name's first IPv4 address (else its first), an IPv4-mapped
    /// IPv6 address as IPv4 (Go prints them alike).
    pub fn resolve_tcp_addr(&self, host_port: &str) -> Result<SocketAddr, String> {
        let (host, port) = split_host_port(host_port)?;
        let port: u16 = match port {
            "" => 0,
            port => port
                .parse()
                .map_err(|_| format!("lookup tcp/{port}: unknown port"))?,
        };
        if host.is_empty() {
            return Ok(SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), port));
        }
        let ips = self.lookup_ip(host).map_err(|e| e.to_string())?;
        let want_v6 = host_port.contains('[');
        let ip = ips
            .iter()
            .find(|ip| ip.is_ipv6() == want_v6)
            .or(ips.first())
            .ok_or_else(|| DnsError::not_found(host, None).to_string())?;
        Ok(SocketAddr::new(ip.to_canonical(), port))
    }

    /// The answers for `name` (tried with the search list), and the server
    /// that gave them.
    fn lookup(&self, name: &str, qtype: u16) -> Result<(Vec<Record>, SocketAddr), DnsError> {
        if !is_domain_name(name) {
            return Err(DnsError::not_found(name, None));
        }
        let mut last_error = None;
        for fqdn in self.conf.name_list(name) {
            match self.try_one_name(&fqdn, qtype) {
                Ok(found) => return Ok(found),
                Err(e) => last_error = Some(e),
            }
        }
        // Go names the name as asked, not a suffixed one
        let mut error = last_error.unwrap_or_else(|| DnsError::not_found(name, None));
        error.name = name.to_string();
        Err(error)
    }

    /// Go's `tryOneName`: `fqdn` asked of each server, `attempts` rounds.
    fn try_one_name(&self, fqdn: &str, qtype: u16) -> Result<(Vec<Record>, SocketAddr), DnsError> {
        let servers = &self.conf.servers;
        let offset = if self.conf.rotate {
            self.server_offset.fetch_add(1, Ordering::Relaxed) as usize
        } else {
            0
        };
        let question = Question {
            name: fqdn.to_string(),
            qtype,
            class: wire::CLASS_INET,
        };
        let mut last_error = None;
        for _ in 0..self.conf.attempts {
            for j in 0..servers.len() {
                let server = servers[(offset + j) % servers.len()];
                let failed = |err: &str| Some(DnsError::new(err, fqdn, Some(server)));
                let parsed = match self.exchange(server, &question) {
                    Ok(parsed) => parsed,
                    Err(e) => {
                        last_error = failed(&e);
                        continue;
                    }
                };
                let (rcode, has_additional) = parsed.extended_rcode();
                if rcode == wire::RCODE_NAME_ERROR {
                    // the name does not exist: another server will not help
                    return Err(DnsError::not_found(fqdn, Some(server)));
                }
                let Ok(answers) = parsed.answers else {
                    last_error = failed(CANNOT_UNMARSHAL);
                    continue;
                };
                let header = &parsed.header;
                if rcode == wire::RCODE_SUCCESS
                    && !header.authoritative
                    && !header.recursion_available
                    && answers.is_empty()
                    && !has_additional
                {
                    // libresolv goes on to the next server too
                    last_error = failed(LAME_REFERRAL);
                    continue;
                }
                if rcode != wire::RCODE_SUCCESS {
                    last_error = failed(SERVER_MISBEHAVING);
                    continue;
                }
                if !answers.iter().any(|r| r.rtype == qtype) {
                    return Err(DnsError::not_found(fqdn, Some(server)));
                }
                return Ok((answers, server));
            }
        }
        Err(last_error.unwrap_or_else(|| DnsError::new(NO_ANSWER, fqdn, None)))
    }

    /// Go's `exchange`: the query over UDP, then over TCP if the answer is
    /// truncated (only TCP with `use-vc`); an error in Go's words.
    fn exchange(&self, server: SocketAddr, question: &Question) -> Result<Parsed, String> {
        let id = fastrand::u16(..);
        let query = Message {
            header: Header {
                id,
                recursion_desired: true,
                ..Header::default()
            },
            questions: vec![question.clone()],
            answers: Vec::new(),
            authorities: Vec::new(),
            additionals: vec![Record::opt(MAX_UDP_BYTES as u16)],
        }
        .encode()
        .map_err(|_| CANNOT_MARSHAL.to_string())?;
        if !self.conf.use_tcp {
            let parsed = udp_round_trip(server, id, question, &query, self.conf.timeout)?;
            if !parsed.header.truncated {
                return checked_questions(parsed);
            }
        }
        let parsed = tcp_round_trip(server, id, question, &query, self.conf.timeout)?;
        checked_questions(parsed)
    }
}

impl Lookup for Resolver {
    fn lookup_srv(&self, service: &str, proto: &str, name: &str) -> Result<Vec<Srv>, DnsError> {
        Resolver::lookup_srv(self, service, proto, name)
    }

    fn resolve_tcp_addr(&self, host_port: &str) -> Result<SocketAddr, String> {
        Resolver::resolve_tcp_addr(self, host_port)
    }
}

/// Go's `checkResponse`: a response, to this ID, about this question.
fn answers_query(parsed: &Parsed, id: u16, question: &Question) -> bool {
    let header = &parsed.header;
    header.response
        && header.id == id
        && parsed.questions.first().is_some_and(|q| {
            q.qtype == question.qtype
                && q.class == question.class
                && wire::same_name(&q.name, &question.name)
        })
}

/// Go refuses a response that carries more than the one question.
fn checked_questions(parsed: Parsed) -> Result<Parsed, String> {
    if parsed.questions.len() != 1 {
        return Err(INVALID_RESPONSE.into());
    }
    Ok(parsed)
}

fn udp_round_trip(
    server: SocketAddr,
    id: u16,
    question: &Question,
    query: &[u8],
    timeout: Duration,
) -> Result<Parsed, String> {
    let deadline = Instant::now() + timeout;
    let unspecified: SocketAddr = if server.is_ipv4() {
        (Ipv4Addr::UNSPECIFIED, 0).into()
    } else {
        (Ipv6Addr::UNSPECIFIED, 0).into()
    };
    let dial_error = |e: io::Error| format!("dial udp {server}: {}", go_io_text(&e));
    let socket = UdpSocket::bind(unspecified).map_err(dial_error)?;
    socket.connect(server).map_err(dial_error)?;
    let local = socket
        .local_addr()
        .map_or_else(|_| unspecified.to_string(), |a| a.to_string());
    let op_error = |op: &str, e: io::Error| match e.kind() {
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => {
            format!("{op} udp {local}->{server}: i/o timeout")
        }
        _ => format!("{op} udp {local}->{server}: {op}: {}", go_io_text(&e)),
    };
    socket.send(query).map_err(|e| op_error("write", e))?;
    let mut buf = vec![0u8; MAX_UDP_BYTES];
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(format!("read udp {local}->{server}: i/o timeout"));
        }
        socket
            .set_read_timeout(Some(left))
            .map_err(|e| op_error("read", e))?;
        let n = socket.recv(&mut buf).map_err(|e| op_error("read", e))?;
        // Ignore invalid responses as they may be malicious forgery
        // attempts; wait on until the deadline (golang.org/issue/13281).
        match wire::parse(&buf[..n]) {
            Ok(parsed) if answers_query(&parsed, id, question) => return Ok(parsed),
            _ => continue,
        }
    }
}

fn tcp_round_trip(
    server: SocketAddr,
    id: u16,
    question: &Question,
    query: &[u8],
    timeout: Duration,
) -> Result<Parsed, String> {
    let deadline = Instant::now() + timeout;
    let mut stream = TcpStream::connect_timeout(&server, timeout).map_err(|e| match e.kind() {
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => {
            format!("dial tcp {server}: i/o timeout")
        }
        _ => format!("dial tcp {server}: connect: {}", go_io_text(&e)),
    })?;
    let local = stream
        .local_addr()
        .map_or_else(|_| "?".to_string(), |a| a.to_string());
    let op_error = |op: &str, e: io::Error| match e.kind() {
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => {
            format!("{op} tcp {local}->{server}: i/o timeout")
        }
        io::ErrorKind::UnexpectedEof => "unexpected EOF".to_string(),
        _ => format!("{op} tcp {local}->{server}: {op}: {}", go_io_text(&e)),
    };
    let mut framed = Vec::with_capacity(query.len() + 2);
    framed.extend_from_slice(&(query.len() as u16).to_be_bytes());
    framed.extend_from_slice(query);
    let left = || {
        let left = deadline.saturating_duration_since(Instant::now());
        Some(left.max(Duration::from_millis(1)))
    };
    stream
        .set_write_timeout(left())
        .and_then(|()| stream.write_all(&framed))
        .map_err(|e| op_error("write", e))?;
    let mut length = [0u8; 2];
    stream
        .set_read_timeout(left())
        .and_then(|()| stream.read_exact(&mut length))
        .map_err(|e| match e.kind() {
            io::ErrorKind::UnexpectedEof => "EOF".to_string(),
            _ => op_error("read", e),
        })?;
    // a u16 length: at most 64 KiB, whatever the server says
    let mut message = vec![0u8; usize::from(u16::from_be_bytes(length))];
    stream
        .set_read_timeout(left())
        .and_then(|()| stream.read_exact(&mut message))
        .map_err(|e| op_error("read", e))?;
    let parsed = wire::parse(&message).map_err(|_| CANNOT_UNMARSHAL.to_string())?;
    if parsed.questions.is_empty() {
        return Err(CANNOT_UNMARSHAL.into());
    }
    if !answers_query(&parsed, id, question) {
        return Err(INVALID_RESPONSE.into());
    }
    Ok(parsed)
}

/// An OS error as Go prints a syscall's: `connection refused`.
fn go_io_text(e: &io::Error) -> String {
    let text = e.to_string();
    let text = text.split(" (os error").next().unwrap_or(&text);
    let mut chars = text.chars();
    match chars.next() {
        Some(first) => first.to_lowercase().chain(chars).collect(),
        None => String::new(),
    }
}

/// Go's `SplitHostPort`, with its errors.
fn split_host_port(host_port: &str) -> Result<(&str, &str), String> {
    let error = |why: &str| format!("address {host_port}: {why}");
    let Some(colon) = host_port.rfind(':') else {
        return Err(error("missing port in address"));
    };
    let (host, port) = (&host_port[..colon], &host_port[colon + 1..]);
    if let Some(inner) = host.strip_prefix('[') {
        let Some(inner) = inner.strip_suffix(']') else {
            return Err(error("missing ']' in address"));
        };
        if inner.contains(['[', ']']) {
            return Err(error("unexpected '[' in address"));
        }
        return Ok((inner, port));
    }
    if host.contains(':') {
        return Err(error("too many colons in address"));
    }
    if host.contains(['[', ']']) {
        return Err(error("unexpected '[' in address"));
    }
    Ok((host, port))
}

/// Go's `byPriorityWeight.sort`: ascending priority (then weight), each
/// priority's records drawn in turn with odds by weight (RFC 2782).
fn sort_by_priority_weight(srvs: &mut [Srv]) {
    srvs.sort_by_key(|s| (s.priority, s.weight));
    let mut start = 0;
    while start < srvs.len() {
        let end = srvs[start..]
            .iter()
            .position(|s| s.priority != srvs[start].priority)
            .map_or(srvs.len(), |n| start + n);
        shuffle_by_weight(&mut srvs[start..end]);
        start = end;
    }
}

fn shuffle_by_weight(mut srvs: &mut [Srv]) {
    let mut sum: u64 = srvs.iter().map(|s| u64::from(s.weight)).sum();
    while sum > 0 && srvs.len() > 1 {
        let n = fastrand::u64(..sum);
        let mut running = 0;
        for i in 0..srvs.len() {
            running += u64::from(srvs[i].weight);
            if running > n {
                srvs.swap(0, i);
                break;
            }
        }
        sum -= u64::from(srvs[0].weight);
        srvs = &mut srvs[1..];
    }
}

#[cfg(test)]
mod tests;
