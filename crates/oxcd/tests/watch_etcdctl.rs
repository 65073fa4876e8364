//! Differential test of `etcdctl watch`: the same history is written to oxcd
//! and to a reference etcd, then each watch session runs as a child process
//! against both, and their outputs must be identical once member-specific
//! header fields are masked. Every session replays history (`--rev`) and
//! ends on a known last event, so no output depends on timing; one live
//! session checks that events written after the watch started arrive.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use regex::Regex;
use testkit::Process;

const DEADLINE: Duration = Duration::from_secs(20);
/// The value of the last event of the history; base64 in JSON output.
const END: &str = "END";
const END_BASE64: &str = "RU5E";

fn etcdctl(bin: &str, endpoint: &str, args: &[&str]) -> String {
    let out = Command::new(bin)
        .env("ETCDCTL_API", "3")
        .args(["--endpoints", endpoint])
        .args(args)
        .output()
        .expect("etcdctl is installed");
    String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr)
}

/// A running `etcdctl watch`, its stdout read line by line.
struct Watch {
    child: Child,
    lines: mpsc::Receiver<String>,
}

impl Watch {
    fn start(bin: &str, endpoint: &str, args: &[&str]) -> Watch {
        let mut child = Command::new(bin)
            .env("ETCDCTL_API", "3")
            .args(["--endpoints", endpoint, "watch"])
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("etcdctl is installed");
        let (tx, lines) = mpsc::channel();
        for pipe in [
            child
                .stdout
                .take()
                .map(|s| Box::new(s) as Box<dyn std::io::Read + Send>),
            child
                .stderr
                .take()
                .map(|s| Box::new(s) as Box<dyn std::io::Read + Send>),
        ]
        .into_iter()
        .flatten()
        {
            let tx = tx.clone();
            std::thread::spawn(move || {
                for line in BufReader::new(pipe).lines().map_while(Result::ok) {
                    if tx.send(line).is_err() {
                        return;
                    }
                }
            });
        }
        Watch { child, lines }
    }

    /// Lines until one contains `until` (or the process ends), with a deadline.
    fn read_until(&mut self, until: &str) -> Vec<String> {
        let deadline = Instant::now() + DEADLINE;
        let mut got = Vec::new();
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) => {
                    let done = line.contains(until);
                    got.push(line);
                    if done {
                        return got;
                    }
                }
                Err(mpsc::RecvTimeoutError::Disconnected) => return got,
                Err(mpsc::RecvTimeoutError::Timeout) => {
                    panic!("etcdctl watch gave no {until:?} in time; so far: {got:?}")
                }
            }
        }
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn mask(s: &str) -> String {
    let json = Regex::new(r#""(cluster_id|member_id|raft_term)":\d+"#).unwrap();
    json.replace_all(s, "\"$1\":N").into_owned()
}

/// The same history on any member: revisions 2..=8, ending with foo=END.
fn write_history(bin: &str, endpoint: &str) {
    for args in [
        &["put", "foo", "1"][..],
        &["put", "foo/a", "x"],
        &["put", "foo", "2"],
        &["del", "foo"],
        &["put", "bar", "z"],
        &["put", "foo/b", "y"],
        &["put", "foo", END],
    ] {
        etcdctl(bin, endpoint, args);
    }
}

fn sessions() -> Vec<Vec<&'static str>> {
    vec![
        vec!["foo", "--rev=1"],
        vec!["foo", "--prefix", "--rev=2"],
        vec!["foo", "--rev=3", "--prev-kv"],
        vec!["foo", "--rev=2", "-w", "json"],
        vec!["foo", "--prefix", "--rev=4", "--prev-kv", "-w", "json"],
        vec![
            "foo",
            "--rev=2",
            "--",
            "sh",
            "-c",
            "echo cmd $ETCD_WATCH_EVENT_TYPE $ETCD_WATCH_KEY $ETCD_WATCH_VALUE $ETCD_WATCH_REVISION",
        ],
    ]
}

fn run_sessions(etcdctl_bin: &str, endpoint: &str) -> Vec<String> {
    write_history(etcdctl_bin, endpoint);
    let mut outputs = Vec::new();
    for args in sessions() {
        let until = if args.contains(&"json") {
            END_BASE64
        } else {
            END
        };
        let mut watch = Watch::start(etcdctl_bin, endpoint, &args);
        let mut lines = watch.read_until(until);
        if args.contains(&"--") {
            // The command's own line follows the event's (etcdctl quotes
            // the values it exports).
            lines.extend(watch.read_until(&format!("\"foo\" \"{END}\"")));
        }
        outputs.push(format!("watch {args:?}\n{}\n", mask(&lines.join("\n"))));
    }
    // A watch from a compacted revision is canceled and etcdctl exits.
    etcdctl(etcdctl_bin, endpoint, &["compact", "5"]);
    let mut compacted = Watch::start(etcdctl_bin, endpoint, &["foo", "--rev=2"]);
    let lines = compacted.read_until("compacted");
    outputs.push(format!("compacted\n{}\n", lines.join("\n")));
    // The compacted revision itself is still watchable.
    let mut at = Watch::start(etcdctl_bin, endpoint, &["foo", "--rev=5"]);
    outputs.push(format!("at compacted\n{}\n", at.read_until(END).join("\n")));
    outputs
}

/// `older`: an etcd older than 3.5.16, whose compaction drops a tombstone
/// at exactly the compact revision (3.5.16 keeps it, and so does oxcd: a
/// watch from the compact revision sees that delete there, not here).
fn matches_reference(reference: (&str, &str), older: bool) {
    let (etcd_bin, etcdctl_bin) = reference;
    if !std::path::Path::new(etcd_bin).exists() {
        eprintln!("{etcd_bin} is not installed: skipped");
        return;
    }
    let ref_dir = tempfile::tempdir().unwrap();
    let etcd = testkit::start_reference_etcd(etcd_bin, ref_dir.path())
        .unwrap_or_else(|| panic!("{etcd_bin} is installed"));
    let ox_dir = tempfile::tempdir().unwrap();
    let oxcd = Process::start_oxcd(&testkit::oxcd_bin(), ox_dir.path(), &[]);
    let want = run_sessions(etcdctl_bin, etcd.host_port());
    let mut got = run_sessions(etcdctl_bin, oxcd.host_port());
    if older {
        for session in &mut got {
            *session = session.replace("at compacted\nDELETE\nfoo\n\n", "at compacted\n");
        }
    }
    assert_eq!(want.len(), got.len());
    let diffs: Vec<String> = want
        .iter()
        .zip(&got)
        .filter(|(w, g)| w != g)
        .map(|(w, g)| format!("--- etcd:\n{w}--- oxcd:\n{g}"))
        .collect();
    assert!(diffs.is_empty(), "{}", diffs.join("\n"));
}

#[test]
fn etcdctl_35_watch_sessions_match_etcd_35() {
    matches_reference(testkit::ETCD_35, true);
}

#[test]
fn etcdctl_34_watch_sessions_match_etcd_34() {
    matches_reference(testkit::ETCD_34, true);
}

#[test]
fn etcdctl_3516_watch_sessions_match_etcd_3516() {
    matches_reference(("/opt/etcd-3.5.16/etcd", "/opt/etcd-3.5.16/etcdctl"), false);
}

/// `etcdctl watch KEY` from now: events written after it started arrive,
/// in order. The watch's start is learnt from a sentinel write it sees.
#[test]
fn etcdctl_watch_streams_live_events() {
    let dir = tempfile::tempdir().unwrap();
    let oxcd = Process::start_oxcd(&testkit::oxcd_bin(), dir.path(), &[]);
    let (bin, endpoint) = ("/usr/bin/etcdctl", oxcd.host_port());
    let mut watch = Watch::start(bin, endpoint, &["live", "--prefix"]);
    let started = Instant::now();
    let (tx, ready) = mpsc::channel::<()>();
    let sentinel = {
        let endpoint = endpoint.to_string();
        std::thread::spawn(move || {
            // Until the watcher reports a sentinel, keep writing one.
            while ready.recv_timeout(Duration::from_millis(50)).is_err() {
                if started.elapsed() > DEADLINE {
                    return;
                }
                etcdctl(bin, &endpoint, &["put", "live/sentinel", "s"]);
            }
        })
    };
    watch.read_until("live/sentinel");
    let _ = tx.send(());
    sentinel.join().unwrap();
    for (k, v) in [("live/a", "1"), ("live/b", "2"), ("live/a", END)] {
        etcdctl(bin, endpoint, &["put", k, v]);
    }
    let lines = watch.read_until(END);
    let tail: Vec<&str> = lines
        .iter()
        .map(String::as_str)
        .skip_while(|l| *l != "live/a")
        .collect();
    let want = vec!["live/a", "1", "PUT", "live/b", "2", "PUT", "live/a", END];
    assert_eq!(tail, want, "all output: {lines:?}");
}
