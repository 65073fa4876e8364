//! The member as a process: flags, signals, restarts, and refusing data it
//! must not open.

use std::fs;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use testkit::Process;

fn etcdctl(endpoint: &str, args: &[&str]) -> (bool, String) {
    let out = Command::new("etcdctl")
        .env("ETCDCTL_API", "3")
        .args(["--endpoints", endpoint, "--command-timeout", "5s"])
        .args(args)
        .output()
        .expect("etcdctl is installed (apt-get install etcd-client)");
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    (out.status.success(), text)
}

fn run_oxcd(args: &[&str]) -> std::process::Output {
    Command::new(testkit::oxcd_bin())
        .args(args)
        .output()
        .expect("oxcd runs")
}

#[test]
fn sigterm_exits_zero_and_a_restart_resumes() {
    let dir = tempfile::tempdir().unwrap();
    let mut m = Process::start_oxcd(&testkit::oxcd_bin(), dir.path(), &[]);
    assert!(etcdctl(m.host_port(), &["put", "k", "v1"]).0);
    let status = m
        .terminate(Duration::from_secs(20))
        .expect("oxcd exits after SIGTERM");
    assert!(
        status.success(),
        "exit status {status:?}; log:\n{}",
        m.log_text()
    );
    assert!(m.log_text().contains("received signal; shutting down"));

    let m = Process::start_oxcd(&testkit::oxcd_bin(), dir.path(), &[]);
    let (ok, out) = etcdctl(m.host_port(), &["get", "k", "--print-value-only"]);
    assert!(ok && out.trim() == "v1", "{out}");
    assert!(m.log_text().contains("restarting local member"));
}

#[test]
fn sigint_exits_zero() {
    let dir = tempfile::tempdir().unwrap();
    let mut m = Process::start_oxcd(&testkit::oxcd_bin(), dir.path(), &[]);
    // SAFETY: signalling our own child.
    unsafe {
        libc_kill(m.pid(), 2);
    }
    let status = m.terminate(Duration::from_secs(20)).expect("oxcd exits");
    assert!(status.success(), "{status:?}");
}

unsafe fn libc_kill(pid: u32, sig: i32) {
    extern "C" {
        fn kill(pid: i32, sig: i32) -> i32;
    }
    kill(pid as i32, sig);
}

#[test]
fn logs_are_etcd_shaped_json() {
    let dir = tempfile::tempdir().unwrap();
    let m = Process::start_oxcd(&testkit::oxcd_bin(), dir.path(), &[]);
    let lines = m.log_lines();
    assert!(!lines.is_empty());
    for line in &lines {
        let v: serde_json::Value =
            serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}"));
        for field in ["level", "ts", "caller", "msg"] {
            assert!(v.get(field).is_some(), "{field} missing in {line}");
        }
    }
    for msg in [
        "became leader at term",
        "published local member to cluster through raft",
        "enabled capabilities for version",
        "ready to serve client requests",
    ] {
        assert!(lines.iter().any(|l| l.contains(msg)), "no {msg:?} line");
    }
}

#[test]
fn unknown_flags_and_bad_values_get_a_clear_error() {
    // Go's flag package's words, exit status 2
    let out = run_oxcd(&["--no-such-flag"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr)
        .contains("flag provided but not defined: -no-such-flag"));
    let out = run_oxcd(&["--snapshot-count", "many"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("snapshot-count"));
    // zap's words; etcd panics with them (exit status 2)
    let out = run_oxcd(&["--log-level", "loud"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("unrecognized level: \"loud\""));
}

#[test]
fn version_and_help() {
    let out = run_oxcd(&["--version"]);
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("oxcd Version:") && text.contains("etcd API Version: 3.5.16"),
        "{text}"
    );
    let out = run_oxcd(&["--help"]);
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    for flag in [
        "--data-dir",
        "--listen-client-urls",
        "--initial-cluster",
        "--snapshot-count",
        "--max-request-bytes",
        "--max-txn-ops",
        "--quota-backend-bytes",
        "--max-concurrent-streams",
        "--log-level",
    ] {
        assert!(text.contains(flag), "{flag} not in --help");
    }
}

#[test]
fn etcd_env_vars_configure_the_member() {
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(testkit::oxcd_bin())
        .env("ETCD_NAME", "from-env")
        .env("ETCD_DATA_DIR", dir.path())
        .env("ETCD_INITIAL_CLUSTER", "someone-else=http://127.0.0.1:1")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("couldn't find local name \"from-env\""),
        "{err}"
    );
}

#[test]
fn a_data_dir_holding_etcds_bbolt_files_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let snap = dir.path().join("member").join("snap");
    fs::create_dir_all(&snap).unwrap();
    // A bbolt file: a page header then the meta magic 0xED0CDAED.
    let mut page = vec![0u8; 4096];
    page[16..20].copy_from_slice(&0xED0C_DAEDu32.to_le_bytes());
    fs::write(snap.join("db"), &page).unwrap();
    let out = run_oxcd(&[
        "--data-dir",
        dir.path().to_str().unwrap(),
        "--listen-client-urls",
        "http://127.0.0.1:0",
        "--advertise-client-urls",
        "http://127.0.0.1:0",
    ]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("not an oxcd backend"), "{err}");
    // it names the command that converts the dir
    let convert = format!("oxctl migrate --data-dir {}", dir.path().display());
    assert!(err.contains(&convert), "{err}");
    assert_eq!(
        fs::read(snap.join("db")).unwrap(),
        page,
        "the etcd file was modified"
    );
}

fn wal_segments(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut v: Vec<_> = fs::read_dir(dir.join("member").join("wal"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "wal"))
        .collect();
    v.sort();
    v
}

#[test]
fn a_torn_wal_tail_is_repaired_and_mid_log_corruption_refuses_to_start() {
    let dir = tempfile::tempdir().unwrap();
    let mut m = Process::start_oxcd(&testkit::oxcd_bin(), dir.path(), &[]);
    for i in 0..20 {
        assert!(etcdctl(m.host_port(), &["put", &format!("k{i}"), "v"]).0);
    }
    m.kill9();
    let segment = wal_segments(dir.path()).pop().expect("a WAL segment");
    let mut bytes = fs::read(&segment).unwrap();

    // A torn tail: the last few bytes of the last record never made it
    // (segments are preallocated: the data ends before the zero tail).
    let end = bytes.iter().rposition(|b| *b != 0).expect("records") + 1;
    bytes[end - 3..end].fill(0);
    fs::write(&segment, &bytes).unwrap();
    let mut m = Process::start_oxcd(&testkit::oxcd_bin(), dir.path(), &[]);
    assert!(
        m.log_text().contains("repairing torn tail"),
        "{}",
        m.log_text()
    );
    let (ok, out) = etcdctl(m.host_port(), &["get", "k", "--prefix", "--keys-only"]);
    // The record cut off was the last acknowledged put's (or raft's own
    // bookkeeping after it): at least the 19 before it are there.
    assert!(
        ok && out.lines().filter(|l| l.starts_with('k')).count() >= 19,
        "{out}"
    );
    m.kill9();

    // A flipped byte in the middle of the log: refuse, with file and offset.
    bytes = fs::read(&segment).unwrap();
    let end = bytes.iter().rposition(|b| *b != 0).expect("records") + 1;
    let middle = end / 2;
    bytes[middle] ^= 0xff;
    fs::write(&segment, &bytes).unwrap();
    let out = run_oxcd(&[
        "--data-dir",
        dir.path().to_str().unwrap(),
        "--listen-client-urls",
        "http://127.0.0.1:0",
        "--advertise-client-urls",
        "http://127.0.0.1:0",
    ]);
    assert!(!out.status.success(), "started on a corrupt WAL");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(segment.file_name().unwrap().to_str().unwrap()),
        "{err}"
    );
}

/// Appends a committed normal entry whose payload no member can decode to a
/// stopped member's WAL; returns its index.
fn commit_an_undecodable_entry(data_dir: &Path) -> u64 {
    use consensus::raft::eraftpb::{Entry, EntryType};
    use consensus::wal::{Wal, WalOptions};
    let wal_dir = data_dir.join("member/wal");
    let (mut wal, contents) = Wal::open(&wal_dir, WalOptions::default()).unwrap();
    let last = contents.entries.last().map_or(0, |e| e.index);
    let mut entry = Entry {
        index: last + 1,
        term: contents.hard_state.term,
        // field 1 with wire type 7: no protobuf decoder takes it
        data: vec![0x0f, 0xff, 0xff].into(),
        ..Default::default()
    };
    entry.set_entry_type(EntryType::EntryNormal);
    let mut hard_state = contents.hard_state.clone();
    hard_state.commit = entry.index;
    wal.append(&[entry], Some(&hard_state));
    wal.sync().unwrap();
    last + 1
}

#[test]
fn a_committed_entry_that_cannot_be_applied_stops_the_member_and_is_never_skipped() {
    let dir = tempfile::tempdir().unwrap();
    let mut m = Process::start_oxcd(&testkit::oxcd_bin(), dir.path(), &[]);
    assert!(etcdctl(m.host_port(), &["put", "k", "v1"]).0);
    assert!(m
        .terminate(Duration::from_secs(20))
        .is_some_and(|s| s.success()));
    let index = commit_an_undecodable_entry(dir.path());
    // Every start meets the entry again and stops on it, naming it.
    for attempt in 0..2 {
        let mut m = Process::launch_oxcd(&testkit::oxcd_bin(), dir.path(), &[]);
        let status = m
            .wait_exit(Duration::from_secs(30))
            .unwrap_or_else(|| panic!("start {attempt} did not exit; log:\n{}", m.log_text()));
        let log = m.log_text();
        assert_eq!(status.code(), Some(1), "start {attempt}; log:\n{log}");
        let wanted = format!("cannot decode the committed entry at index {index}");
        let last = m.log_lines().last().cloned().unwrap_or_default();
        assert!(
            last.contains(&wanted),
            "start {attempt}: last line {last:?}; log:\n{log}"
        );
        assert!(!log.contains("skipping"), "{log}");
    }
}

/// Starts oxcd on `dir` and waits a few seconds: Some(exit status and the
/// last log line) if it refused to start, None if it started (then killed).
fn start_on_damaged(dir: &Path) -> Option<(i32, String)> {
    let mut p = Process::launch_oxcd(&testkit::oxcd_bin(), dir, &[]);
    let status = p.wait_exit(Duration::from_secs(5));
    let log = p.log_text();
    assert!(!log.contains("panicked"), "a panic:\n{log}");
    let last = p.log_lines().last().cloned().unwrap_or_default();
    status.map(|s| (s.code().unwrap_or(-1), last))
}

#[test]
fn a_damaged_backend_file_is_refused_with_a_message_naming_it_never_a_panic() {
    let dir = tempfile::tempdir().unwrap();
    let m = Process::start_oxcd(&testkit::oxcd_bin(), dir.path(), &[]);
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let mut c = etcd_client::Client::connect([m.endpoint.clone()], None)
            .await
            .unwrap();
        for i in 0..300 {
            let value = format!("value-{i}-{}", "x".repeat(300));
            c.put(format!("key{i:03}"), value, None).await.unwrap();
        }
    });
    let mut m = m;
    assert!(m
        .terminate(Duration::from_secs(20))
        .is_some_and(|s| s.success()));
    let db = dir.path().join("member/snap/db");
    let original = fs::read(&db).unwrap();
    let len = original.len();
    let names_the_file = |last: &str| last.contains(db.to_str().unwrap());
    // The file a clean stop left opens without redb's page check, which the
    // member makes while it serves; a start that did not finish that check
    // leaves this marker, and the next start checks every page. Each
    // damaged file is started as the clean stop left it, without it.
    let unchecked = dir.path().join("member/snap/db.unchecked");
    let damage = |bytes: &[u8]| {
        let _ = fs::remove_file(&unchecked);
        fs::write(&db, bytes).unwrap();
    };

    // 64 bytes overwritten anywhere: in the first page (magic), in tree
    // pages, or in free space (harmless): never a panic, and a refusal
    // names the file.
    for offset in [0, 4096, len / 3, len / 2, 2 * len / 3, len - 8192] {
        let mut damaged = original.clone();
        for (i, b) in damaged[offset..offset + 64].iter_mut().enumerate() {
            *b = (i as u8).wrapping_mul(37) ^ 0xa5;
        }
        damage(&damaged);
        match start_on_damaged(dir.path()) {
            Some((code, last)) => {
                assert_eq!(code, 1, "offset {offset}: {last}");
                assert!(names_the_file(&last), "offset {offset}: {last}");
            }
            None => assert_ne!(offset, 0, "a file without redb's magic started"),
        }
    }

    // 10 bytes of a stored value overwritten (etcd serves such a value):
    // the record's checksum refuses the file. Every copy of the value is
    // damaged (copy-on-write leaves stale ones in free pages).
    for key in [10, 150, 299] {
        let marker = format!("value-{key}-");
        let mut damaged = original.clone();
        let mut copies = 0;
        let mut at = 0;
        while let Some(found) = damaged[at..]
            .windows(marker.len())
            .position(|w| w == marker.as_bytes())
        {
            let start = at + found;
            damaged[start..start + 10].copy_from_slice(b"0123456789");
            copies += 1;
            at = start + 10;
        }
        assert!(copies > 0, "{marker} is not in the file");
        damage(&damaged);
        // the deferred check finds it and stops the member, as a refused
        // start does; the next start refuses it before serving
        for check in ["deferred", "at open"] {
            let (code, last) = start_on_damaged(dir.path()).expect("a damaged value is refused");
            assert_eq!(code, 1, "{check}: {last}");
            assert!(
                names_the_file(&last) && last.contains("fails its checksum"),
                "{check}: {last}"
            );
            assert!(unchecked.exists(), "{check}");
        }
    }

    damage(&original);
    let m = Process::start_oxcd(&testkit::oxcd_bin(), dir.path(), &[]);
    let (ok, out) = etcdctl(m.host_port(), &["get", "key150", "--print-value-only"]);
    assert!(ok && out.starts_with("value-150-"), "{out}");
}

#[test]
fn a_clean_stop_saves_the_key_index_and_the_restart_reads_it_leases_and_all() {
    let dir = tempfile::tempdir().unwrap();
    let mut m = Process::start_oxcd(&testkit::oxcd_bin(), dir.path(), &[]);
    let ep = m.host_port().to_string();
    let (ok, out) = etcdctl(&ep, &["lease", "grant", "600"]);
    assert!(ok, "{out}");
    let lease = out.split_whitespace().nth(1).unwrap().to_string();
    for i in 0..20 {
        assert!(
            etcdctl(
                &ep,
                &["put", &format!("leased{i:02}"), "v", "--lease", &lease]
            )
            .0
        );
        assert!(etcdctl(&ep, &["put", &format!("plain{i:02}"), "v1"]).0);
        assert!(etcdctl(&ep, &["put", &format!("plain{i:02}"), "v2"]).0);
    }
    assert!(etcdctl(&ep, &["del", "plain0", "--prefix"]).0);
    let (_, revision) = etcdctl(&ep, &["get", "x", "-w", "json"]);
    let status = m.terminate(Duration::from_secs(20)).expect("exits");
    assert!(status.success());
    assert!(
        m.log_text().contains("saved the key index checkpoint"),
        "{}",
        m.log_text()
    );

    let m = Process::start_oxcd(&testkit::oxcd_bin(), dir.path(), &[]);
    let ep = m.host_port().to_string();
    let (_, after) = etcdctl(&ep, &["get", "x", "-w", "json"]);
    assert!(
        m.log_text()
            .contains("read the key index checkpoint of a clean stop"),
        "{}",
        m.log_text()
    );
    let rev = |json: &str| {
        let at = json.find("\"revision\":").unwrap() + 11;
        json[at..]
            .split(|c: char| !c.is_ascii_digit())
            .next()
            .unwrap()
            .to_string()
    };
    assert_eq!(rev(&after), rev(&revision));
    let (ok, out) = etcdctl(&ep, &["get", "plain", "--prefix", "--keys-only"]);
    assert!(ok && out.split_whitespace().count() == 10, "{out}");
    // history survives too: the first version of a key still there
    let (ok, out) = etcdctl(&ep, &["get", "plain15", "--rev", "4", "-w", "json"]);
    assert!(ok, "{out}");
    // the lease still owns its keys: revoking it deletes them
    let (ok, out) = etcdctl(&ep, &["lease", "timetolive", &lease, "--keys"]);
    assert!(
        ok && out.contains("attached keys") && out.contains("leased19"),
        "{out}"
    );
    assert!(etcdctl(&ep, &["lease", "revoke", &lease]).0);
    let (ok, out) = etcdctl(&ep, &["get", "leased", "--prefix", "--keys-only"]);
    assert!(ok && out.trim().is_empty(), "{out}");
    // the page check skipped at open is made while the member serves
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while !m
        .log_text()
        .contains("checked every record of the backend a clean stop left")
    {
        assert!(
            std::time::Instant::now() < deadline,
            "no deferred check: {}",
            m.log_text()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(!dir.path().join("member/snap/db.unchecked").exists());
}
