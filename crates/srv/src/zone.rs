//! A DNS server of fixed records, for tests that bootstrap members from SRV
//! records: [`Zone`] answers a query (no I/O), [`Server`] serves a zone
//! over UDP and TCP on one address until dropped.
//!
//! It answers authoritatively and says recursion is available (as the
//! recursive servers a resolv.conf names do): the records of the name and
//! type asked, NXDOMAIN for a name it has no record of. An answer larger
//! than the client takes over UDP (512 bytes, or its EDNS0 size) goes out
//! truncated, so that the client asks again over TCP.

use std::io::{self, Read, Write};
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use crate::wire::{self, Header, Message, RData, Record, SrvData};

/// The UDP payload of a client that does not say (RFC 1035 §4.2.1).
const DEFAULT_UDP_BYTES: usize = 512;
/// How often the serving threads look whether they should stop.
const STOP_POLL: Duration = Duration::from_millis(50);
/// A TCP client's time to send its query.
const TCP_READ_TIMEOUT: Duration = Duration::from_secs(2);
/// Questions remembered for a test to look at.
const MAX_QUESTIONS_KEPT: usize = 4096;

#[derive(Clone, Debug, Default)]
pub struct Zone {
    records: Vec<Record>,
}

impl Zone {
    pub fn new() -> Zone {
        Zone::default()
    }

    fn with(mut self, owner: &str, rtype: u16, data: RData) -> Zone {
        self.records.push(Record {
            name: rooted(owner),
            rtype,
            class: wire::CLASS_INET,
            ttl: 60,
            data,
        });
        self
    }

    pub fn with_srv(
        self,
        owner: &str,
        priority: u16,
        weight: u16,
        port: u16,
        target: &str,
    ) -> Zone {
        let data = RData::Srv(SrvData {
            priority,
            weight,
            port,
            target: rooted(target),
        });
        self.with(owner, wire::TYPE_SRV, data)
    }

    pub fn with_a(self, owner: &str, ip: Ipv4Addr) -> Zone {
        self.with(owner, wire::TYPE_A, RData::A(ip))
    }

    pub fn with_aaaa(self, owner: &str, ip: Ipv6Addr) -> Zone {
        self.with(owner, wire::TYPE_AAAA, RData::Aaaa(ip))
    }

    /// The response to `query`, at most `max_bytes` long (else truncated,
    /// without answers); None for what is not a query.
    pub fn answer(&self, query: &[u8], max_bytes: usize) -> Option<Vec<u8>> {
        let parsed = wire::parse(query).ok()?;
        if parsed.header.response || parsed.questions.len() != 1 {
            return None;
        }
        let question = parsed.questions[0].clone();
        let known = self
            .records
            .iter()
            .any(|r| wire::same_name(&r.name, &question.name));
        let mut response = Message {
            header: Header {
                id: parsed.header.id,
                response: true,
                opcode: parsed.header.opcode,
                authoritative: true,
                recursion_desired: parsed.header.recursion_desired,
                recursion_available: true,
                rcode: if known {
                    wire::RCODE_SUCCESS
                } else {
                    wire::RCODE_NAME_ERROR
                },
                ..Header::default()
            },
            answers: self
                .records
                .iter()
                .filter(|r| wire::same_name(&r.name, &question.name) && r.rtype == question.qtype)
                .cloned()
                .collect(),
            questions: vec![question],
            authorities: Vec::new(),
            additionals: Vec::new(),
        };
        let bytes = response.encode().ok()?;
        if bytes.len() <= max_bytes {
            return Some(bytes);
        }
        response.answers.clear();
        response.header.truncated = true;
        response.encode().ok()
    }

    /// The UDP payload `query` says its sender takes.
    fn udp_limit(query: &[u8]) -> usize {
        wire::parse(query)
            .ok()
            .and_then(|p| {
                p.additionals
                    .iter()
                    .find(|r| r.rtype == wire::TYPE_OPT)
                    .map(|r| r.class)
            })
            .map_or(DEFAULT_UDP_BYTES, |size| {
                usize::from(size).max(DEFAULT_UDP_BYTES)
            })
    }
}

fn rooted(name: &str) -> String {
    if name.ends_with('.') {
        name.to_string()
    } else {
        format!("{name}.")
    }
}

/// A zone served over UDP and TCP on one address; stops when dropped.
pub struct Server {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    questions: Arc<Mutex<Vec<(String, u16)>>>,
    threads: Vec<JoinHandle<()>>,
}

/// A UDP socket and a TCP listener on the same port. Port 0 picks one
/// free for UDP, which a TCP socket may hold (a CI run's outgoing
/// connection): another is tried then.
fn bind_both(addr: SocketAddr) -> io::Result<(UdpSocket, TcpListener)> {
    let mut attempts = 0;
    loop {
        let udp = UdpSocket::bind(addr)?;
        match TcpListener::bind(udp.local_addr()?) {
            Ok(tcp) => return Ok((udp, tcp)),
            Err(e) if addr.port() == 0 && e.kind() == io::ErrorKind::AddrInUse && attempts < 20 => {
                attempts += 1;
            }
            Err(e) => return Err(e),
        }
    }
}

impl Server {
    /// Serves `zone` on `addr` (port 0: one free port for both).
    pub fn start(addr: SocketAddr, zone: Zone) -> io::Result<Server> {
        let (udp, tcp) = bind_both(addr)?;
        let addr = udp.local_addr()?;
        udp.set_read_timeout(Some(STOP_POLL))?;
        tcp.set_nonblocking(true)?;
        let stop = Arc::new(AtomicBool::new(false));
        let questions = Arc::new(Mutex::new(Vec::new()));
        let zone = Arc::new(zone);
        let udp_thread = {
            let (zone, stop, questions) = (zone.clone(), stop.clone(), questions.clone());
            std::thread::spawn(move || serve_udp(&udp, &zone, &stop, &questions))
        };
        let tcp_thread = {
            let (stop, questions) = (stop.clone(), questions.clone());
            std::thread::spawn(move || serve_tcp(&tcp, &zone, &stop, &questions))
        };
        Ok(Server {
            addr,
            stop,
            questions,
            threads: vec![udp_thread, tcp_thread],
        })
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The names and types asked so far, oldest first.
    pub fn questions(&self) -> Vec<(String, u16)> {
        self.questions.lock().map(|q| q.clone()).unwrap_or_default()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for thread in self.threads.drain(..) {
            let _ = thread.join();
        }
    }
}

fn note(questions: &Mutex<Vec<(String, u16)>>, query: &[u8]) {
    let Ok(parsed) = wire::parse(query) else {
        return;
    };
    if let (Ok(mut kept), Some(q)) = (questions.lock(), parsed.questions.first()) {
        if kept.len() < MAX_QUESTIONS_KEPT {
            kept.push((q.name.clone(), q.qtype));
        }
    }
}

fn serve_udp(
    socket: &UdpSocket,
    zone: &Zone,
    stop: &AtomicBool,
    questions: &Mutex<Vec<(String, u16)>>,
) {
    let mut buf = [0u8; 4096];
    while !stop.load(Ordering::Relaxed) {
        let Ok((n, from)) = socket.recv_from(&mut buf) else {
            continue;
        };
        note(questions, &buf[..n]);
        if let Some(response) = zone.answer(&buf[..n], Zone::udp_limit(&buf[..n])) {
            let _ = socket.send_to(&response, from);
        }
    }
}

fn serve_tcp(
    listener: &TcpListener,
    zone: &Zone,
    stop: &AtomicBool,
    questions: &Mutex<Vec<(String, u16)>>,
) {
    while !stop.load(Ordering::Relaxed) {
        match listener.accept() {
            Ok((stream, _)) => {
                let _ = answer_tcp(stream, zone, questions);
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => std::thread::sleep(STOP_POLL),
            Err(_) => std::thread::sleep(STOP_POLL),
        }
    }
}

fn answer_tcp(
    mut stream: TcpStream,
    zone: &Zone,
    questions: &Mutex<Vec<(String, u16)>>,
) -> io::Result<()> {
    stream.set_nonblocking(false)?;
    stream.set_read_timeout(Some(TCP_READ_TIMEOUT))?;
    let mut length = [0u8; 2];
    stream.read_exact(&mut length)?;
    let mut query = vec![0u8; usize::from(u16::from_be_bytes(length))];
    stream.read_exact(&mut query)?;
    note(questions, &query);
    if let Some(response) = zone.answer(&query, usize::from(u16::MAX)) {
        stream.write_all(&(response.len() as u16).to_be_bytes())?;
        stream.write_all(&response)?;
    }
    Ok(())
}
