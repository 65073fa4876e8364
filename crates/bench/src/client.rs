//! What every workload shares: gRPC connections, etcd-style error strings,
//! the progress bar, the closed-loop request driver and the output.

use std::future::Future;
use std::io::{IsTerminal, Write};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tonic::transport::{Channel, Endpoint};

use crate::auth::{authenticate, Connection, Credentials, TokenInterceptor};
use crate::limiter::{self, RateLimiter};
use crate::report::{Precision, Recorder, Stats};

/// The global flags, as etcd's benchmark has them.
#[derive(Clone, Debug)]
pub struct Settings {
    pub endpoints: Vec<String>,
    pub conns: usize,
    pub clients: usize,
    pub precision: Precision,
    pub json: bool,
    pub dial_timeout: Option<Duration>,
    /// `--cacert`, `--cert`, `--key`: TLS to every endpoint.
    pub tls: Option<Arc<rustls::ClientConfig>>,
    /// `--user`, `--password`: every connection authenticates once as this user.
    pub credentials: Option<Credentials>,
}

fn endpoint_url(endpoint: &str, tls: bool) -> String {
    let endpoint = endpoint.trim();
    if endpoint.contains("://") {
        endpoint.to_string()
    } else if tls {
        format!("https://{endpoint}")
    } else {
        format!("http://{endpoint}")
    }
}

/// One gRPC channel to `endpoint` (over TLS with `tls`), dialled now so
/// that a wrong address fails before the benchmark starts (as etcd's "dial
/// error").
pub async fn dial(
    endpoint: &str,
    timeout: Option<Duration>,
    tls: Option<&Arc<rustls::ClientConfig>>,
) -> Result<Channel, String> {
    let url = endpoint_url(endpoint, tls.is_some());
    let mut builder = Endpoint::from_shared(url.clone())
        .map_err(|e| format!("bad endpoint {endpoint:?}: {e}"))?
        .tcp_nodelay(true);
    if let Some(timeout) = timeout {
        builder = builder.connect_timeout(timeout);
    }
    let connected = match tls {
        Some(config) => {
            builder
                .connect_with_connector(tls::TlsDialer::new(config.clone()))
                .await
        }
        None => builder.connect().await,
    };
    connected.map_err(|e| format!("dial error: {url}: {e}"))
}

impl Settings {
    /// `--conns` connections spread round-robin over the endpoints, then
    /// `--clients` handles spread round-robin over the connections (etcd's
    /// `mustCreateClients`).
    pub async fn clients(&self) -> Result<Vec<Connection>, String> {
        let conns = self.conns.max(1);
        let mut connections = Vec::with_capacity(conns);
        for i in 0..conns {
            let endpoint = &self.endpoints[i % self.endpoints.len()];
            connections.push(self.connect(endpoint, self.dial_timeout).await?);
        }
        Ok((0..self.clients.max(1))
            .map(|i| connections[i % conns].clone())
            .collect())
    }

    /// One more connection of its own (etcd's `mustCreateConn`).
    pub async fn connection(&self) -> Result<Connection, String> {
        self.connect(&self.endpoints[0], self.dial_timeout).await
    }

    /// Dial `endpoint` and, with `--user`, authenticate on it, within
    /// `timeout` each (clientv3 bounds its Authenticate by the dial timeout).
    /// A refused Authenticate fails as etcd's benchmark does: "dial error:
    /// etcdserver: authentication failed, invalid user ID or password".
    pub async fn connect(
        &self,
        endpoint: &str,
        timeout: Option<Duration>,
    ) -> Result<Connection, String> {
        let channel = dial(endpoint, timeout, self.tls.as_ref()).await?;
        let token = match &self.credentials {
            None => None,
            Some(credentials) => {
                let authenticating = authenticate(&channel, credentials);
                let authenticated = match timeout {
                    Some(timeout) => tokio::time::timeout(timeout, authenticating)
                        .await
                        .unwrap_or_else(|_| {
                            Err(tonic::Status::deadline_exceeded(
                                "context deadline exceeded",
                            ))
                        }),
                    None => authenticating.await,
                };
                authenticated.map_err(|s| format!("dial error: {}", status_message(&s)))?
            }
        };
        Ok(Connection::new(channel, TokenInterceptor::new(token)))
    }

    pub fn output(&self) -> Output {
        Output {
            json: self.json,
            precision: self.precision,
        }
    }

    pub fn progress(&self, total: u64) -> Progress {
        Progress::start(total, !self.json && std::io::stdout().is_terminal())
    }
}

/// The error text etcd's clientv3 would show: etcd's own errors by their
/// message alone ("etcdserver: request timed out"), anything else in grpc-go's
/// "rpc error: code = X desc = Y" form.
pub fn status_message(status: &tonic::Status) -> String {
    let message = status.message();
    const ETCD_PREFIXES: [&str; 4] = ["etcdserver: ", "mvcc: ", "auth: ", "lease: "];
    if ETCD_PREFIXES.iter().any(|p| message.starts_with(p)) {
        return message.to_string();
    }
    let code = match status.code() {
        tonic::Code::Ok => "OK".to_string(),
        tonic::Code::Cancelled => "Canceled".to_string(),
        other => format!("{other:?}"),
    };
    format!("rpc error: code = {code} desc = {message}")
}

/// Hands out request indexes 0..total to whichever client is free, as etcd's
/// request channel does, without a channel.
#[derive(Debug)]
pub struct Dispenser {
    next: AtomicU64,
    total: u64,
}

impl Dispenser {
    pub fn new(total: u64) -> Self {
        Dispenser {
            next: AtomicU64::new(0),
            total,
        }
    }

    pub fn take(&self) -> Option<u64> {
        let i = self.next.fetch_add(1, Ordering::Relaxed);
        (i < self.total).then_some(i)
    }
}

/// Run `total` requests over `clients` concurrent loops; `op(client, i)`
/// performs request `i`. Returns the merged results and the wall time.
pub async fn drive<C, F, Fut>(
    clients: Vec<C>,
    total: u64,
    limiter: Option<RateLimiter>,
    progress: &Progress,
    op: F,
) -> Stats
where
    C: Send + 'static,
    F: Fn(&mut C, u64) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<(), String>> + Send,
{
    let dispenser = Arc::new(Dispenser::new(total));
    let limiter = Arc::new(limiter);
    let op = Arc::new(op);
    let per_client = (total as usize / clients.len().max(1)) + 1;
    let start = Instant::now();
    let mut tasks = Vec::with_capacity(clients.len());
    for mut client in clients {
        let dispenser = dispenser.clone();
        let limiter = limiter.clone();
        let op = op.clone();
        let counter = progress.counter();
        tasks.push(tokio::spawn(async move {
            let mut recorder = Recorder::with_capacity(per_client);
            while let Some(i) = dispenser.take() {
                limiter::wait(limiter.as_ref().as_ref()).await;
                let st = Instant::now();
                let result = op(&mut client, i).await;
                recorder.record(st, Instant::now(), result);
                counter.fetch_add(1, Ordering::Relaxed);
            }
            recorder
        }));
    }
    let mut all = Recorder::with_capacity(total as usize);
    for task in tasks {
        match task.await {
            Ok(recorder) => all.merge(recorder),
            Err(e) => all.error(format!("client task failed: {e}")),
        }
    }
    all.finish(start.elapsed())
}

/// A progress bar on stdout, drawn only when stdout is a terminal.
#[derive(Debug)]
pub struct Progress {
    done: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
    drawer: Option<tokio::task::JoinHandle<()>>,
}

/// How often the bar is redrawn.
const PROGRESS_INTERVAL: Duration = Duration::from_millis(200);
const PROGRESS_WIDTH: u64 = 50;

impl Progress {
    fn start(total: u64, draw: bool) -> Progress {
        let done = Arc::new(AtomicU64::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let drawer = draw.then(|| {
            let done = done.clone();
            let stop = stop.clone();
            tokio::spawn(async move {
                let started = Instant::now();
                loop {
                    let finished = stop.load(Ordering::Relaxed);
                    draw_bar(done.load(Ordering::Relaxed), total, started.elapsed());
                    if finished {
                        println!();
                        return;
                    }
                    tokio::time::sleep(PROGRESS_INTERVAL).await;
                }
            })
        });
        Progress { done, stop, drawer }
    }

    /// A counter that draws nothing.
    pub fn hidden() -> Progress {
        Progress::start(0, false)
    }

    pub fn counter(&self) -> Arc<AtomicU64> {
        self.done.clone()
    }

    pub fn add(&self, n: u64) {
        self.done.fetch_add(n, Ordering::Relaxed);
    }

    pub async fn finish(self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(drawer) = self.drawer {
            let _ = drawer.await;
        }
    }
}

fn draw_bar(done: u64, total: u64, elapsed: Duration) {
    let total = total.max(1);
    let filled = (done.min(total) * PROGRESS_WIDTH / total) as usize;
    let bar = format!(
        "{}{}{}",
        "=".repeat(filled.saturating_sub(1)),
        if filled > 0 { ">" } else { "" },
        "-".repeat(PROGRESS_WIDTH as usize - filled)
    );
    let mut out = std::io::stdout().lock();
    let _ = write!(
        out,
        "\r{done} / {total} [{bar}] {:.2}% {}s",
        done as f64 * 100.0 / total as f64,
        elapsed.as_secs()
    );
    let _ = out.flush();
}

/// Where results go: etcd's text on stdout, or one JSON object with `--json`.
#[derive(Clone, Copy, Debug)]
pub struct Output {
    pub json: bool,
    pub precision: Precision,
}

impl Output {
    /// Free text that etcd's benchmark prints (suppressed under `--json`).
    pub fn text(&self, text: &str) {
        if !self.json {
            print!("{text}");
            let _ = std::io::stdout().flush();
        }
    }

    /// etcd's `fmt.Printf("<before>%s<after>", report)`.
    pub fn report(&self, before: &str, stats: &Stats, after: &str) {
        self.text(&format!("{before}{}{after}", stats.render(self.precision)));
    }

    /// Under `--json`, print `primary`'s summary with the other phases nested.
    pub fn json(&self, primary: &Stats, phases: &[(&str, &Stats)]) {
        self.json_with(primary, phases, &[]);
    }

    /// [`Output::json`] with extra top-level figures.
    pub fn json_with(&self, primary: &Stats, phases: &[(&str, &Stats)], figures: &[(&str, f64)]) {
        if !self.json {
            return;
        }
        let mut value = primary.to_json();
        if let Some(object) = value.as_object_mut() {
            for (name, stats) in phases {
                object.insert((*name).to_string(), stats.to_json());
            }
            for (name, figure) in figures {
                object.insert((*name).to_string(), serde_json::json!(figure));
            }
        }
        println!("{value}");
    }
}
