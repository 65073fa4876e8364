//! `etcdctl lock` and `etcdctl elect` against oxcd, with etcdctl 3.4.23 and
//! 3.5.1 (whichever is installed). These run clientv3's concurrency recipes
//! on the client (KV, leases, keep-alives and watch), not the server-side
//! Lock and Election services: a lock passes on when its holder is killed,
//! a candidate wins when the leader steps down, observers see both leaders.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use testkit::Process;

const DEADLINE: Duration = Duration::from_secs(30);

fn etcdctls() -> Vec<&'static str> {
    [testkit::ETCD_34.1, testkit::ETCD_35.1]
        .into_iter()
        .filter(|p| std::path::Path::new(p).exists())
        .collect()
}

/// A running etcdctl, its stdout and stderr read line by line.
struct Running {
    child: Child,
    lines: mpsc::Receiver<String>,
    seen: Vec<String>,
}

impl Running {
    fn start(bin: &str, endpoint: &str, args: &[&str]) -> Running {
        let mut child = Command::new(bin)
            .env("ETCDCTL_API", "3")
            .args(["--endpoints", endpoint])
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("etcdctl is installed");
        let (tx, lines) = mpsc::channel();
        let pipes: [Option<Box<dyn std::io::Read + Send>>; 2] = [
            child.stdout.take().map(|s| Box::new(s) as _),
            child.stderr.take().map(|s| Box::new(s) as _),
        ];
        for pipe in pipes.into_iter().flatten() {
            let tx = tx.clone();
            std::thread::spawn(move || {
                for line in BufReader::new(pipe).lines().map_while(Result::ok) {
                    if tx.send(line).is_err() {
                        return;
                    }
                }
            });
        }
        Running {
            child,
            lines,
            seen: Vec::new(),
        }
    }

    /// Waits for a line containing `needle`; returns it.
    fn wait_line(&mut self, needle: &str) -> String {
        if let Some(line) = self.seen.iter().find(|l| l.contains(needle)) {
            return line.clone();
        }
        let deadline = Instant::now() + DEADLINE;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) => {
                    self.seen.push(line.clone());
                    if line.contains(needle) {
                        return line;
                    }
                }
                Err(_) => panic!("no line with {needle:?}; got {:?}", self.seen),
            }
        }
    }

    /// Lines seen so far, without waiting.
    fn drain(&mut self) -> &[String] {
        while let Ok(line) = self.lines.try_recv() {
            self.seen.push(line);
        }
        &self.seen
    }

    fn signal(&self, signal: &str) {
        let status = Command::new("kill")
            .args([signal, &self.child.id().to_string()])
            .status()
            .expect("kill");
        assert!(status.success());
    }

    /// Waits for the process to exit; returns whether it succeeded.
    fn wait_exit(&mut self) -> bool {
        let deadline = Instant::now() + DEADLINE;
        loop {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                return status.success();
            }
            assert!(Instant::now() < deadline, "etcdctl did not exit");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Waits until `prefix` holds `n` keys (the lock's queue).
fn wait_for_keys(bin: &str, endpoint: &str, prefix: &str, n: usize) {
    let deadline = Instant::now() + DEADLINE;
    loop {
        let out = Command::new(bin)
            .env("ETCDCTL_API", "3")
            .args([
                "--endpoints",
                endpoint,
                "get",
                "--prefix",
                "--keys-only",
                prefix,
            ])
            .output()
            .expect("etcdctl get");
        let keys = String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter(|l| !l.is_empty())
            .count();
        if keys == n {
            return;
        }
        assert!(Instant::now() < deadline, "{prefix} never held {n} keys");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn etcdctl_lock_runs_the_command_and_passes_on_when_the_holder_is_killed() {
    let dir = tempfile::tempdir().unwrap();
    let oxcd = Process::start_oxcd(&testkit::oxcd_bin(), dir.path(), &[]);
    for (i, bin) in etcdctls().into_iter().enumerate() {
        let name = format!("lock{i}");
        let mut once = Running::start(bin, oxcd.host_port(), &["lock", &name, "echo", "ok"]);
        once.wait_line("ok");
        assert!(once.wait_exit(), "{bin}: {:?}", once.drain());

        // A holder (no command: it holds until stopped) is killed; its
        // session lease (TTL 2 s) expires and the next locker gets in.
        let mut holder = Running::start(bin, oxcd.host_port(), &["lock", "--ttl", "2", &name]);
        holder.wait_line(&format!("{name}/"));
        let mut next = Running::start(
            bin,
            oxcd.host_port(),
            &["lock", "--ttl", "2", &name, "echo", "next"],
        );
        wait_for_keys(bin, oxcd.host_port(), &format!("{name}/"), 2);
        assert!(
            !next.drain().iter().any(|l| l.contains("next")),
            "{bin}: two holders"
        );
        holder.signal("-KILL");
        next.wait_line("next");
        assert!(next.wait_exit(), "{bin}: {:?}", next.drain());
    }
}

#[test]
fn etcdctl_elect_campaigns_observes_and_hands_over_on_interrupt() {
    let dir = tempfile::tempdir().unwrap();
    let oxcd = Process::start_oxcd(&testkit::oxcd_bin(), dir.path(), &[]);
    for (i, bin) in etcdctls().into_iter().enumerate() {
        let name = format!("elect{i}");
        let mut first = Running::start(bin, oxcd.host_port(), &["elect", &name, "v1"]);
        first.wait_line(&format!("{name}/"));
        first.wait_line("v1");

        let mut observer = Running::start(bin, oxcd.host_port(), &["elect", "-l", &name]);
        observer.wait_line("v1");

        let mut second = Running::start(bin, oxcd.host_port(), &["elect", &name, "v2"]);
        // Interrupted, the leader resigns; the waiting candidate wins and
        // the observer sees it.
        first.signal("-INT");
        first.wait_exit();
        second.wait_line("v2");
        observer.wait_line("v2");
        second.signal("-INT");
        second.wait_exit();
    }
}
