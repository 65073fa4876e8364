//! Differential test: the same etcdctl 3.4 session against oxcd and against
//! a reference etcd (Debian's 3.4.23); every output must be identical once
//! the member-specific header fields (cluster, member, term) are masked.

use std::io::Write;
use std::process::{Command, Stdio};

use regex::Regex;
use testkit::Process;

struct Step {
    args: Vec<String>,
    stdin: Option<String>,
}

fn step(args: &[&str]) -> Step {
    Step {
        args: args.iter().map(|s| s.to_string()).collect(),
        stdin: None,
    }
}

fn txn(args: &[&str], stdin: &str) -> Step {
    Step {
        args: args.iter().map(|s| s.to_string()).collect(),
        stdin: Some(stdin.to_string()),
    }
}

fn session() -> Vec<Step> {
    let too_many: String = (0..129).map(|i| format!("put k{i} v\n")).collect();
    vec![
        step(&["put", "foo", "bar"]),
        step(&["put", "foo2", "baz"]),
        step(&["put", "foo", "bar2", "--prev-kv"]),
        step(&["get", "foo"]),
        step(&["get", "--prefix", "foo", "-w", "json"]),
        step(&["get", "foo", "--rev=1"]),
        step(&["get", "foo", "--rev=2", "-w", "json"]),
        step(&["get", "foo", "--rev=100"]),
        step(&["put", "", "x"]),
        step(&["get", ""]),
        txn(
            &["txn"],
            "value(\"foo\") = \"bar2\"\n\nput foo 1\nput foo 2\n\n\n",
        ),
        txn(
            &["txn", "-w", "json"],
            "mod(\"foo\") > \"0\"\n\nput t1 1\nget foo\n\nput t2 2\n\n",
        ),
        txn(
            &["txn"],
            "value(\"foo\") = \"nope\"\n\nput t3 1\n\nput t4 2\nget t1\n\n",
        ),
        txn(
            &["txn", "-w", "json"],
            "version(\"t1\") = \"1\"\ncreate(\"t1\") > \"1\"\n\ndel t1 --prev-kv\n\n\n",
        ),
        txn(&["txn"], &format!("\n{too_many}\n\n")),
        step(&["get", "", "--from-key", "--keys-only"]),
        step(&[
            "get",
            "foo",
            "--prefix",
            "--sort-by=MODIFY",
            "--order=DESCEND",
            "--limit",
            "1",
            "-w",
            "json",
        ]),
        step(&["get", "", "--prefix", "--sort-by=VALUE", "--order=ASCEND"]),
        step(&[
            "get",
            "",
            "--prefix",
            "--sort-by=CREATE",
            "--order=DESCEND",
            "--keys-only",
        ]),
        step(&["get", "", "--prefix", "--sort-by=VERSION"]),
        step(&["get", "", "--prefix", "--limit", "2", "-w", "json"]),
        step(&["get", "", "--prefix", "--count-only", "-w", "json"]),
        step(&["get", "foo", "--print-value-only"]),
        step(&["get", "", "--prefix", "-w", "fields"]),
        step(&["put", "leased", "v", "--lease=123"]),
        step(&["get", "a", "z"]),
        step(&["get", "z", "a"]),
        step(&["del", "foo", "--prev-kv"]),
        step(&["del", "nothing"]),
        step(&["del", "t", "--prefix", "-w", "json"]),
        step(&["put", "foo", "again"]),
        step(&["get", "foo", "-w", "json"]),
        step(&["compact", "4"]),
        step(&["get", "foo", "--rev=3"]),
        step(&["get", "foo2", "--rev=4", "-w", "json"]),
        step(&["compact", "4"]),
        step(&["compact", "1000"]),
        step(&["put", "x", "y", "--ignore-value"]),
        step(&["put", "foo2", "--ignore-value"]),
        step(&["get", "foo2", "-w", "json"]),
        step(&["get", "", "--prefix", "-w", "simple"]),
    ]
}

/// Lease commands. `{L1}`/`{L2}` stand for the IDs the two `lease grant`s
/// return on each server; the IDs (hex and decimal) are masked back in the
/// outputs, as are remaining TTLs (a second may tick between servers).
fn lease_session() -> Vec<Step> {
    vec![
        step(&["lease", "grant", "600"]),
        step(&["lease", "grant", "300"]),
        step(&["put", "lk1", "v", "--lease={L1}"]),
        step(&["put", "lk2", "v", "--lease={L1}"]),
        step(&["put", "lk3", "v", "--lease={L2}"]),
        step(&["lease", "timetolive", "{L1}"]),
        // One key: etcd lists several in Go map order (random).
        step(&["lease", "timetolive", "--keys", "{L2}"]),
        step(&["lease", "timetolive", "--keys", "{L2}", "-w", "json"]),
        step(&["lease", "list"]),
        step(&["lease", "keep-alive", "--once", "{L1}"]),
        step(&["lease", "keep-alive", "--once", "1234"]),
        step(&["get", "lk", "--prefix", "-w", "json"]),
        step(&["lease", "revoke", "{L2}"]),
        step(&["lease", "revoke", "{L2}"]),
        step(&["lease", "timetolive", "{L2}"]),
        step(&["lease", "timetolive", "{L2}", "-w", "json"]),
        step(&["get", "lk", "--prefix"]),
        step(&["put", "lk4", "v", "--lease=ffff"]),
        step(&["lease", "grant", "10000000000"]),
        step(&["lease", "revoke", "{L1}"]),
        step(&["get", "lk", "--prefix", "--count-only", "-w", "json"]),
        step(&["lease", "list"]),
    ]
}

fn etcdctl(etcdctl: &str, endpoint: &str, s: &Step) -> String {
    let mut cmd = Command::new(etcdctl);
    cmd.env("ETCDCTL_API", "3")
        .args(["--endpoints", endpoint, "--command-timeout", "10s"])
        .args(&s.args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = cmd
        .spawn()
        .expect("etcdctl is installed (apt-get install etcd-client)");
    let mut stdin = child.stdin.take().expect("piped");
    if let Some(input) = &s.stdin {
        stdin
            .write_all(input.as_bytes())
            .expect("write etcdctl stdin");
    }
    drop(stdin);
    let out = child.wait_with_output().expect("etcdctl runs");
    let stderr: String = String::from_utf8_lossy(&out.stderr)
        .lines()
        // clientv3's retry warnings carry timestamps and random target names.
        .filter(|l| !l.starts_with("{\"level\":"))
        .map(|l| format!("{l}\n"))
        .collect();
    format!(
        "exit={:?}\n{}{}",
        out.status.code(),
        String::from_utf8_lossy(&out.stdout),
        stderr
    )
}

fn mask(s: &str) -> String {
    let json = Regex::new(r#""(cluster_id|member_id|raft_term)":\d+"#).unwrap();
    let fields = Regex::new(r#""(ClusterID|MemberID|RaftTerm)" : \d+"#).unwrap();
    let remaining = Regex::new(r#"remaining\(\d+s\)|"ttl":\d+"#).unwrap();
    let s = json.replace_all(s, "\"$1\":N");
    let s = remaining.replace_all(&s, "TTL");
    fields.replace_all(&s, "\"$1\" : N").into_owned()
}

/// Lease IDs a session has granted on one server, in grant order.
#[derive(Default)]
struct Leases(Vec<u64>);

impl Leases {
    fn substitute(&self, step: &Step) -> Step {
        let mut args = step.args.clone();
        for arg in &mut args {
            for (i, id) in self.0.iter().enumerate() {
                *arg = arg.replace(&format!("{{L{}}}", i + 1), &format!("{id:x}"));
            }
        }
        Step {
            args,
            stdin: step.stdin.clone(),
        }
    }

    /// Records the ID a `lease grant` printed and masks known IDs.
    fn observe(&mut self, output: &str) -> String {
        let granted = Regex::new(r"lease ([0-9a-f]+) granted").unwrap();
        if let Some(id) = granted
            .captures(output)
            .and_then(|c| u64::from_str_radix(&c[1], 16).ok())
        {
            self.0.push(id);
        }
        let mut out = output.to_string();
        for (i, id) in self.0.iter().enumerate() {
            out = out
                .replace(&format!("{id:016x}"), &format!("{{L{}}}", i + 1))
                .replace(&format!("{id:x}"), &format!("{{L{}}}", i + 1))
                .replace(&id.to_string(), &format!("{{L{}}}", i + 1));
        }
        out
    }
}

/// Runs the session with `reference`'s etcdctl against `reference` and
/// against oxcd, and compares every output.
fn session_matches(reference: (&str, &str)) {
    steps_match(reference, session());
}

fn steps_match(reference: (&str, &str), steps: Vec<Step>) {
    let (etcd_bin, etcdctl_bin) = reference;
    let ref_dir = tempfile::tempdir().unwrap();
    let etcd = testkit::start_reference_etcd(etcd_bin, ref_dir.path())
        .unwrap_or_else(|| panic!("{etcd_bin} is installed (.ci/run installs it)"));
    let ox_dir = tempfile::tempdir().unwrap();
    let oxcd = Process::start_oxcd(&testkit::oxcd_bin(), ox_dir.path(), &[]);

    let mut mismatches = Vec::new();
    let (mut etcd_leases, mut oxcd_leases) = (Leases::default(), Leases::default());
    for s in &steps {
        let want = etcd_leases.observe(&etcdctl(
            etcdctl_bin,
            etcd.host_port(),
            &etcd_leases.substitute(s),
        ));
        let got = oxcd_leases.observe(&etcdctl(
            etcdctl_bin,
            oxcd.host_port(),
            &oxcd_leases.substitute(s),
        ));
        let (want, got) = (mask(&want), mask(&got));
        if want != got {
            mismatches.push(format!(
                "etcdctl {:?}\n--- etcd:\n{want}--- oxcd:\n{got}",
                s.args
            ));
        }
    }
    assert!(
        mismatches.is_empty(),
        "{} of {} steps differ:\n{}",
        mismatches.len(),
        steps.len(),
        mismatches.join("\n")
    );
}

#[test]
fn etcdctl_34_session_matches_etcd_34() {
    session_matches(testkit::ETCD_34);
}

#[test]
fn etcdctl_35_session_matches_etcd_35() {
    session_matches(testkit::ETCD_35);
}

#[test]
fn etcdctl_34_lease_session_matches_etcd_34() {
    steps_match(testkit::ETCD_34, lease_session());
}

#[test]
fn etcdctl_35_lease_session_matches_etcd_35() {
    steps_match(testkit::ETCD_35, lease_session());
}

#[test]
fn etcdctl_endpoint_status_and_health() {
    let dir = tempfile::tempdir().unwrap();
    let oxcd = Process::start_oxcd(&testkit::oxcd_bin(), dir.path(), &[]);
    let run = |args: &[&str]| {
        let out = Command::new("etcdctl")
            .env("ETCDCTL_API", "3")
            .args(["--endpoints", oxcd.host_port()])
            .args(args)
            .output()
            .expect("etcdctl is installed");
        assert!(
            out.status.success(),
            "etcdctl {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        // etcdctl prints some results (endpoint health) on stderr.
        String::from_utf8(out.stdout).unwrap() + &String::from_utf8(out.stderr).unwrap()
    };
    run(&["put", "a", "1"]);
    let status: serde_json::Value =
        serde_json::from_str(run(&["endpoint", "status", "-w", "json"]).trim()).unwrap();
    let st = &status[0]["Status"];
    assert_eq!(st["version"], "3.5.16");
    assert_eq!(st["leader"], st["header"]["member_id"]);
    assert!(st["raftIndex"].as_u64().unwrap() >= 2);
    assert_eq!(st["raftIndex"], st["raftAppliedIndex"]);
    assert!(st["raftTerm"].as_u64().unwrap() >= 1);
    assert!(st["dbSize"].as_u64().unwrap() > 0);
    assert_eq!(st["header"]["revision"], 2);

    let table = run(&["endpoint", "status", "-w", "table"]);
    assert!(
        table.contains("ENDPOINT") && table.contains("RAFT APPLIED INDEX"),
        "{table}"
    );
    assert!(
        table.contains("3.5.16") && table.contains("true"),
        "{table}"
    );
    let health = run(&["endpoint", "health"]);
    assert!(
        health.contains("is healthy: successfully committed proposal"),
        "{health}"
    );
    let members = run(&["member", "list", "-w", "json"]);
    assert!(members.contains("\"name\":\"default\""), "{members}");
}
