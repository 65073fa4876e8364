//! Network partitions for real: each member runs in a network namespace of
//! its own, joined to the others by a bridge in a "switch" namespace; taking
//! a member's bridge port down cuts it off both ways. Test clients run in a
//! "client" namespace on the same bridge whose port never goes down.
//!
//! Everything lives in namespaces this harness creates and deletes; no
//! packet leaves them. Needs root and iproute2 (`ip`), as CI has.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::tmpfs::Tmpfs;
use crate::{oxcd_bin, Process, START_DEADLINE};

/// The subnet the namespaces use among themselves (never routed anywhere:
/// it exists only on the veths of the namespaces made here).
const SUBNET_PREFIX: &str = "10.213";

fn ip(args: &[&str]) {
    let out = Command::new("ip")
        .args(args)
        .output()
        .expect("iproute2 `ip` is installed");
    assert!(
        out.status.success(),
        "ip {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
}

pub struct NetnsCluster {
    tag: String,
    subnet: String,
    pub members: Vec<Option<Process>>,
    pub names: Vec<String>,
    /// How members find each other: `--initial-cluster` by default.
    bootstrap: Vec<String>,
    dir: tempfile::TempDir,
    namespaces: Vec<String>,
    /// The `/etc/netns/<ns>` dirs written for the namespaces' resolv.conf.
    netns_etc: Vec<PathBuf>,
    extra: Vec<String>,
    /// Members whose data dir is a tmpfs of its own (for full disks).
    volumes: Vec<Option<Tmpfs>>,
}

impl NetnsCluster {
    pub fn start(n: usize, extra: &[&str]) -> NetnsCluster {
        NetnsCluster::start_with_volumes(n, extra, &[], "")
    }

    /// [`NetnsCluster::start`] with the data dirs of `on_volumes` each on a
    /// tmpfs of `size` (mount(8)'s syntax), so a test can fill it.
    pub fn start_with_volumes(
        n: usize,
        extra: &[&str],
        on_volumes: &[usize],
        size: &str,
    ) -> NetnsCluster {
        let mut c = NetnsCluster::build(n, extra, on_volumes, size);
        c.start_members();
        c
    }

    /// The namespaces and their network, no member started yet: the test
    /// prepares what members need ([`NetnsCluster::set_resolv_conf`], a
    /// DNS server in the client namespace, [`NetnsCluster::set_bootstrap`])
    /// and then calls [`NetnsCluster::start_members`].
    pub fn network(n: usize, extra: &[&str]) -> NetnsCluster {
        NetnsCluster::build(n, extra, &[], "")
    }

    fn build(n: usize, extra: &[&str], on_volumes: &[usize], size: &str) -> NetnsCluster {
        let seed = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos() ^ std::process::id())
            .unwrap_or(0);
        let tag = format!("{:04x}", seed & 0xffff);
        let subnet = format!("{SUBNET_PREFIX}.{}", seed % 250 + 1);
        let names: Vec<String> = (1..=n).map(|i| format!("m{i}")).collect();
        let initial_cluster = (1..=n)
            .map(|i| format!("m{i}=http://{subnet}.{i}:2380"))
            .collect::<Vec<_>>()
            .join(",");
        let mut c = NetnsCluster {
            tag,
            subnet,
            members: (0..n).map(|_| None).collect(),
            names,
            bootstrap: vec!["--initial-cluster".into(), initial_cluster],
            dir: tempfile::tempdir().expect("temp dir"),
            namespaces: Vec::new(),
            netns_etc: Vec::new(),
            extra: extra.iter().map(|s| s.to_string()).collect(),
            volumes: (0..n)
                .map(|i| {
                    on_volumes
                        .contains(&i)
                        .then(|| Tmpfs::mount(size).expect("a tmpfs (needs root)"))
                })
                .collect(),
        };
        c.build_network(n);
        c
    }

    /// Starts every member; waits until all are ready.
    pub fn start_members(&mut self) {
        for i in 0..self.members.len() {
            self.members[i] = Some(self.spawn(i));
        }
        for i in 0..self.members.len() {
            self.wait_ready(i);
        }
    }

    /// The flags that bootstrap members started from now on, instead of
    /// `--initial-cluster` naming them all (`--discovery-srv ...`).
    pub fn set_bootstrap(&mut self, args: &[&str]) {
        self.bootstrap = args.iter().map(|s| s.to_string()).collect();
    }

    /// Member `i`'s address (`10.213.x.<i+1>`).
    pub fn member_ip(&self, i: usize) -> String {
        format!("{}.{}", self.subnet, i + 1)
    }

    /// The client namespace's address, where a test runs its servers.
    pub fn client_ip(&self) -> String {
        format!("{}.200", self.subnet)
    }

    /// Gives every namespace this resolv.conf: `ip netns exec` mounts
    /// `/etc/netns/<ns>/resolv.conf` over `/etc/resolv.conf` for what it
    /// runs (members, [`NetnsCluster::launch_in_client_ns`]); removed on
    /// drop.
    pub fn set_resolv_conf(&mut self, text: &str) {
        for ns in &self.namespaces {
            let dir = PathBuf::from("/etc/netns").join(ns);
            std::fs::create_dir_all(&dir)
                .unwrap_or_else(|e| panic!("create {}: {e}", dir.display()));
            std::fs::write(dir.join("resolv.conf"), text)
                .unwrap_or_else(|e| panic!("write {}/resolv.conf: {e}", dir.display()));
            if !self.netns_etc.contains(&dir) {
                self.netns_etc.push(dir);
            }
        }
    }

    /// Starts `program` with `args` inside the client namespace (with its
    /// resolv.conf), its stderr captured as a log; waits for nothing.
    pub fn launch_in_client_ns(&self, program: &Path, args: &[&str], data_dir: &Path) -> Process {
        self.launch_in(&self.ns("c"), program, args, data_dir)
    }

    /// [`NetnsCluster::launch_in_client_ns`] in member `i`'s namespace
    /// (another binary in the member's place, while it is not running).
    pub fn launch_in_member_ns(
        &self,
        i: usize,
        program: &Path,
        args: &[&str],
        data_dir: &Path,
    ) -> Process {
        self.launch_in(&self.ns(&format!("{}", i + 1)), program, args, data_dir)
    }

    fn launch_in(&self, ns: &str, program: &Path, args: &[&str], data_dir: &Path) -> Process {
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", ns]).arg(program).args(args);
        Process::spawn(cmd, data_dir)
    }

    fn wait_ready(&self, i: usize) {
        if let Err(log) = self.ready(i) {
            panic!("m{} did not become ready; log:\n{log}", i + 1);
        }
    }

    /// Waits until member `i` is ready; its log when it is not.
    fn ready(&self, i: usize) -> Result<(), String> {
        let p = self.members[i].as_ref().expect("started");
        match p.wait_for_log("ready to serve client requests", START_DEADLINE) {
            Some(_) => Ok(()),
            None => Err(p.log_text()),
        }
    }

    /// Starts a stopped member again on its data dir; waits until ready.
    pub fn restart(&mut self, i: usize) {
        if let Err(log) = self.try_restart(i) {
            panic!("m{} did not become ready; log:\n{log}", i + 1);
        }
    }

    /// [`NetnsCluster::restart`] that answers with the member's log when it
    /// does not become ready (the process is reaped then).
    pub fn try_restart(&mut self, i: usize) -> Result<(), String> {
        assert!(self.members[i].is_none(), "m{} is running", i + 1);
        self.members[i] = Some(self.spawn(i));
        let ready = self.ready(i);
        if ready.is_err() {
            self.kill9(i);
        }
        ready
    }

    /// Starts a stopped member with `env` set, without waiting for it to
    /// become ready (it may be meant to crash on the way).
    pub fn spawn_with_env(&mut self, i: usize, env: &[(&str, &str)]) {
        assert!(self.members[i].is_none(), "m{} is running", i + 1);
        self.members[i] = Some(self.spawn_env(i, env));
    }

    /// Whether member `i` has a process (running, paused or exited).
    pub fn has_process(&self, i: usize) -> bool {
        self.members[i].is_some()
    }

    /// Whether member `i`'s process has exited by itself; its handle is
    /// dropped then, so that [`NetnsCluster::restart`] can start it again.
    pub fn reap_if_exited(&mut self, i: usize) -> bool {
        let exited = self.members[i].as_mut().is_some_and(|p| p.has_exited());
        if exited {
            self.members[i] = None;
        }
        exited
    }

    /// SIGSTOP / SIGCONT.
    pub fn pause(&self, i: usize) {
        self.signal(i, libc::SIGSTOP);
    }

    pub fn resume(&self, i: usize) {
        self.signal(i, libc::SIGCONT);
    }

    fn signal(&self, i: usize, signal: libc::c_int) {
        if let Some(p) = &self.members[i] {
            // SAFETY: signalling our own child process by pid.
            unsafe {
                libc::kill(p.pid() as libc::pid_t, signal);
            }
        }
    }

    /// Member `i`'s tmpfs, when it has one.
    pub fn volume(&self, i: usize) -> Option<&Tmpfs> {
        self.volumes[i].as_ref()
    }

    /// The last lines of member `i`'s log.
    pub fn log_tail(&self, i: usize, lines: usize) -> String {
        self.members[i].as_ref().map_or_else(String::new, |p| {
            let all = p.log_lines();
            all[all.len().saturating_sub(lines)..].join("\n")
        })
    }

    fn ns(&self, host: &str) -> String {
        format!("ox{}{}", self.tag, host)
    }

    fn build_network(&mut self, n: usize) {
        let switch = self.ns("s");
        ip(&["netns", "add", &switch]);
        self.namespaces.push(switch.clone());
        ip(&["-n", &switch, "link", "add", "br0", "type", "bridge"]);
        ip(&["-n", &switch, "link", "set", "br0", "up"]);
        // Hosts 1..=n are members, 200 is the client.
        let hosts: Vec<(String, u32)> = (1..=n as u32)
            .map(|i| (format!("{i}"), i))
            .chain([("c".to_string(), 200)])
            .collect();
        for (host, octet) in hosts {
            let ns = self.ns(&host);
            ip(&["netns", "add", &ns]);
            self.namespaces.push(ns.clone());
            let (a, b) = (
                format!("v{}{}a", self.tag, host),
                format!("v{}{}b", self.tag, host),
            );
            ip(&["link", "add", &a, "type", "veth", "peer", "name", &b]);
            ip(&["link", "set", &a, "netns", &ns, "name", "eth0"]);
            ip(&["link", "set", &b, "netns", &switch]);
            ip(&["-n", &switch, "link", "set", &b, "master", "br0", "up"]);
            ip(&[
                "-n",
                &ns,
                "addr",
                "add",
                &format!("{}.{octet}/24", self.subnet),
                "dev",
                "eth0",
            ]);
            ip(&["-n", &ns, "link", "set", "eth0", "up"]);
            ip(&["-n", &ns, "link", "set", "lo", "up"]);
        }
    }

    fn spawn(&self, i: usize) -> Process {
        self.spawn_env(i, &[])
    }

    fn spawn_env(&self, i: usize, env: &[(&str, &str)]) -> Process {
        let addr = format!("{}.{}", self.subnet, i + 1);
        let data_dir = self.data_dir(i);
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", &self.ns(&format!("{}", i + 1))])
            .arg(oxcd_bin())
            .args(["--name", &self.names[i]])
            .arg("--data-dir")
            .arg(&data_dir)
            .args(["--listen-client-urls", &format!("http://{addr}:2379")])
            .args(["--advertise-client-urls", &format!("http://{addr}:2379")])
            .args(["--listen-peer-urls", &format!("http://{addr}:2380")])
            .args([
                "--initial-advertise-peer-urls",
                &format!("http://{addr}:2380"),
            ])
            .args(&self.bootstrap)
            .args(&self.extra)
            .envs(env.iter().copied());
        let mut p = Process::spawn(cmd, &data_dir);
        p.endpoint = format!("http://{addr}:2379");
        p
    }

    pub fn data_dir(&self, i: usize) -> PathBuf {
        match &self.volumes[i] {
            Some(volume) => volume.path().join(&self.names[i]),
            None => self.dir.path().join(&self.names[i]),
        }
    }

    pub fn endpoint(&self, i: usize) -> String {
        format!("http://{}.{}:2379", self.subnet, i + 1)
    }

    pub fn endpoints(&self) -> Vec<String> {
        (0..self.members.len()).map(|i| self.endpoint(i)).collect()
    }

    /// Cuts member `i` off from every other member and from the clients.
    pub fn isolate(&self, i: usize) {
        ip(&[
            "-n",
            &self.ns("s"),
            "link",
            "set",
            &format!("v{}{}b", self.tag, i + 1),
            "down",
        ]);
    }

    pub fn heal(&self, i: usize) {
        ip(&[
            "-n",
            &self.ns("s"),
            "link",
            "set",
            &format!("v{}{}b", self.tag, i + 1),
            "up",
        ]);
    }

    /// Runs `f` on a thread inside the client namespace: sockets it opens
    /// reach the members (build a tokio runtime inside `f`).
    pub fn in_client_ns<R: Send + 'static>(&self, f: impl FnOnce() -> R + Send + 'static) -> R {
        self.in_ns(&self.ns("c"), f)
    }

    /// Runs `f` inside member `i`'s namespace (a client on the member's own
    /// side of a partition).
    pub fn in_member_ns<R: Send + 'static>(
        &self,
        i: usize,
        f: impl FnOnce() -> R + Send + 'static,
    ) -> R {
        self.in_ns(&self.ns(&format!("{}", i + 1)), f)
    }

    fn in_ns<R: Send + 'static>(&self, ns: &str, f: impl FnOnce() -> R + Send + 'static) -> R {
        Self::spawn_in(ns, f)
            .join()
            .unwrap_or_else(|e| std::panic::resume_unwind(e))
    }

    /// Like `in_client_ns`, without waiting.
    pub fn spawn_in_client_ns<R: Send + 'static>(
        &self,
        f: impl FnOnce() -> R + Send + 'static,
    ) -> std::thread::JoinHandle<R> {
        Self::spawn_in(&self.ns("c"), f)
    }

    /// Like `in_member_ns`, without waiting: for a client that must stay
    /// connected while the test changes the network.
    pub fn spawn_in_member_ns<R: Send + 'static>(
        &self,
        i: usize,
        f: impl FnOnce() -> R + Send + 'static,
    ) -> std::thread::JoinHandle<R> {
        Self::spawn_in(&self.ns(&format!("{}", i + 1)), f)
    }

    fn spawn_in<R: Send + 'static>(
        ns: &str,
        f: impl FnOnce() -> R + Send + 'static,
    ) -> std::thread::JoinHandle<R> {
        let path = format!("/var/run/netns/{ns}");
        std::thread::spawn(move || {
            let file = std::fs::File::open(&path).unwrap_or_else(|e| panic!("open {path}: {e}"));
            use std::os::fd::AsRawFd;
            // SAFETY: setns on this thread only, with a valid namespace fd.
            let rc = unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) };
            assert_eq!(rc, 0, "setns {path}: {}", std::io::Error::last_os_error());
            f()
        })
    }

    pub fn kill9(&mut self, i: usize) {
        if let Some(mut p) = self.members[i].take() {
            p.kill9();
        }
    }
}

impl Drop for NetnsCluster {
    fn drop(&mut self) {
        for i in 0..self.members.len() {
            // SIGKILL ends a stopped process too; SIGCONT first all the same
            self.resume(i);
            self.kill9(i);
        }
        for ns in &self.namespaces {
            let _ = Command::new("ip").args(["netns", "del", ns]).output();
        }
        for dir in &self.netns_etc {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}
