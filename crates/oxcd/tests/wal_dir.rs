//! `--wal-dir` and `--max-wals`, as etcd 3.5: the WAL segments live in the
//! dedicated directory alone (no `member/wal`), a restart finds them there
//! and nowhere else, `oxctl snapshot restore --wal-dir` writes a member that
//! starts with the same flag, and the segments a snapshot released are
//! purged, oldest first, while there are more than `--max-wals` of them.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use testkit::Process;

fn etcdctl(endpoint: &str, args: &[&str]) -> String {
    let out = Command::new("etcdctl")
        .env("ETCDCTL_API", "3")
        .args(["--endpoints", endpoint, "--command-timeout", "10s"])
        .args(args)
        .output()
        .expect("etcdctl is installed (apt-get install etcd-client)");
    assert!(
        out.status.success(),
        "etcdctl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Runs `oxctl` in process: its output, or its error.
fn oxctl(args: &[&str]) -> Result<String, String> {
    let mut out = Vec::new();
    let argv = std::iter::once("oxctl").chain(args.iter().copied());
    match oxctl::run(argv, &mut out) {
        Ok(()) => Ok(String::from_utf8(out).expect("utf-8 output")),
        Err(e) => Err(e.to_string()),
    }
}

fn put_keys(m: &Process, prefix: &str, n: usize) {
    for i in 0..n {
        etcdctl(m.host_port(), &["put", &format!("{prefix}{i:03}"), "v"]);
    }
}

/// The keys and the revision the member serves.
fn keys_and_revision(m: &Process) -> (Vec<String>, i64) {
    let out = etcdctl(m.host_port(), &["get", "", "--prefix", "-w", "json"]);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let keys = v["kvs"]
        .as_array()
        .map(|kvs| {
            kvs.iter()
                .map(|kv| {
                    use base64::Engine as _;
                    let key = base64::engine::general_purpose::STANDARD
                        .decode(kv["key"].as_str().unwrap())
                        .unwrap();
                    String::from_utf8(key).unwrap()
                })
                .collect()
        })
        .unwrap_or_default();
    (keys, v["header"]["revision"].as_i64().unwrap())
}

/// Segment files (`*.wal`) of `dir`, sorted (none if it is missing).
fn segments(dir: &Path) -> Vec<PathBuf> {
    let Ok(entries) = fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut v: Vec<PathBuf> = entries
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "wal"))
        .collect();
    v.sort();
    v
}

fn snap_files(data: &Path) -> usize {
    fs::read_dir(data.join("member/snap"))
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().ends_with(".snap"))
        .count()
}

/// Waits until the member saved a snapshot (`--snapshot-count` reached).
fn wait_for_a_snapshot(data: &Path, more_than: usize) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while snap_files(data) <= more_than {
        assert!(Instant::now() < deadline, "no snapshot was saved");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn stop(m: &mut Process) {
    let status = m.terminate(Duration::from_secs(20));
    assert!(
        status.is_some_and(|s| s.success()),
        "{status:?}; log:\n{}",
        m.log_text()
    );
}

/// Starts oxcd expecting it to refuse with `reason`: the line saying so.
fn refused(data: &Path, flags: &[&str], reason: &str) -> String {
    let mut p = Process::launch_oxcd(&testkit::oxcd_bin(), data, flags);
    let status = p
        .wait_exit(Duration::from_secs(30))
        .unwrap_or_else(|| panic!("oxcd {flags:?} started; log:\n{}", p.log_text()));
    assert!(!status.success(), "{status:?}");
    p.wait_for_log(reason, Duration::from_secs(10))
        .unwrap_or_else(|| panic!("oxcd {flags:?} refused otherwise; log:\n{}", p.log_text()))
}

fn mode(path: &Path) -> u32 {
    fs::metadata(path).unwrap().permissions().mode() & 0o777
}

#[test]
fn a_member_with_wal_dir_keeps_its_log_there_restarts_from_it_and_nowhere_else() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    let wal = tmp.path().join("fast").join("wal");
    let wal_flag = wal.to_str().unwrap();
    let flags = ["--wal-dir", wal_flag, "--snapshot-count", "10"];
    let mut m = Process::start_oxcd(&testkit::oxcd_bin(), &data, &flags);
    let started = m
        .wait_for_log("starting an etcd server", Duration::ZERO)
        .unwrap();
    assert_eq!(
        testkit::json_field(&started, "wal-dir-dedicated").as_deref(),
        Some(wal_flag)
    );
    put_keys(&m, "k", 25);
    wait_for_a_snapshot(&data, 0);
    let (keys, revision) = keys_and_revision(&m);
    assert_eq!(keys.len(), 25);
    let snapshot = tmp.path().join("backup.db");
    etcdctl(
        m.host_port(),
        &["snapshot", "save", snapshot.to_str().unwrap()],
    );
    stop(&mut m);

    // etcd's layout: the segments in the --wal-dir, created as private as
    // the data dir's; nothing WAL-like under the data dir
    assert!(!data.join("member/wal").exists());
    let files = segments(&wal);
    assert!(!files.is_empty());
    assert_eq!(mode(&wal), 0o700);
    assert_eq!(mode(wal.parent().unwrap()), 0o700);
    for f in &files {
        assert_eq!(mode(f), 0o600, "{}", f.display());
    }

    // the same flags: every key, at the same revision
    let mut m = Process::start_oxcd(&testkit::oxcd_bin(), &data, &flags);
    assert!(m.log_text().contains("restarting local member"));
    assert_eq!(keys_and_revision(&m), (keys.clone(), revision));
    stop(&mut m);

    // without --wal-dir, or with another one, the log is not found: the
    // member refuses instead of starting a new log under its data
    let member_wal = data.join("member").join("wal");
    refused(
        &data,
        &[],
        &format!("{} holds no WAL", member_wal.display()),
    );
    let elsewhere = tmp.path().join("elsewhere");
    let flag = ["--wal-dir", elsewhere.to_str().unwrap()];
    refused(
        &data,
        &flag,
        &format!("{} holds no WAL", elsewhere.display()),
    );
    assert!(segments(&elsewhere).is_empty(), "a new WAL was created");
    // and it still starts with its own
    let mut m = Process::start_oxcd(&testkit::oxcd_bin(), &data, &flags);
    assert_eq!(keys_and_revision(&m).0, keys);
    stop(&mut m);

    // the offline tools read the WAL from the --wal-dir too
    let data_flag = data.to_str().unwrap();
    let checked = oxctl(&["check", "--data-dir", data_flag, "--wal-dir", wal_flag]).unwrap();
    assert!(checked.contains("ok: a start replays"), "{checked}");
    assert!(oxctl(&["check", "--data-dir", data_flag]).is_err());
    let backup = tmp.path().join("backup");
    let backup_wal = tmp.path().join("backup-wal");
    oxctl(&[
        "backup",
        "--data-dir",
        data_flag,
        "--wal-dir",
        wal_flag,
        "--backup-dir",
        backup.to_str().unwrap(),
        "--backup-wal-dir",
        backup_wal.to_str().unwrap(),
    ])
    .unwrap();
    assert!(!backup.join("member/wal").exists());
    let mut m = Process::start_oxcd(
        &testkit::oxcd_bin(),
        &backup,
        &[
            "--wal-dir",
            backup_wal.to_str().unwrap(),
            "--force-new-cluster",
        ],
    );
    assert_eq!(keys_and_revision(&m), (keys.clone(), revision));
    stop(&mut m);

    // oxctl snapshot restore --wal-dir: a member started with the same
    // --wal-dir starts from it and serves the keys
    let restored = tmp.path().join("restored");
    let restored_wal = tmp.path().join("restored-wal");
    oxctl(&[
        "snapshot",
        "restore",
        snapshot.to_str().unwrap(),
        "--data-dir",
        restored.to_str().unwrap(),
        "--wal-dir",
        restored_wal.to_str().unwrap(),
    ])
    .unwrap();
    assert!(!restored.join("member/wal").exists());
    let mut m = Process::start_oxcd(
        &testkit::oxcd_bin(),
        &restored,
        &["--wal-dir", restored_wal.to_str().unwrap()],
    );
    assert!(m.log_text().contains("restarting local member"));
    assert_eq!(keys_and_revision(&m).0, keys);
    stop(&mut m);
    assert!(!restored.join("member/wal").exists());
}

#[test]
fn wal_dir_given_while_the_wal_is_in_the_data_dir_is_refused_naming_both() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    let mut m = Process::start_oxcd(&testkit::oxcd_bin(), &data, &[]);
    put_keys(&m, "k", 3);
    stop(&mut m);
    let wal = tmp.path().join("wal");
    let member_wal = data.join("member").join("wal");
    let reason = format!(
        "--wal-dir {} holds no WAL but {} does",
        wal.display(),
        member_wal.display()
    );
    refused(&data, &["--wal-dir", wal.to_str().unwrap()], &reason);
    // a member told to join a running cluster is refused the same way,
    // before it asks any peer
    let joining = [
        "--wal-dir",
        wal.to_str().unwrap(),
        "--initial-cluster-state",
        "existing",
    ];
    refused(&data, &joining, &reason);
    assert!(!wal.exists(), "nothing is created on a refusal");
    // moved there, as an operator moves it, the member starts from it
    fs::rename(&member_wal, &wal).unwrap();
    let mut m = Process::start_oxcd(
        &testkit::oxcd_bin(),
        &data,
        &["--wal-dir", wal.to_str().unwrap()],
    );
    assert_eq!(keys_and_revision(&m).0.len(), 3);
    stop(&mut m);
}

/// Splits a stopped member's WAL into more segments, as a member whose
/// segments were small would have cut them: records of the WAL's own
/// format, written by its own code (each sync cuts a segment).
fn cut_segments(wal_dir: &Path, count: usize) {
    use consensus::wal::{Wal, WalOptions};
    let options = WalOptions {
        segment_bytes: 1,
        ..Default::default()
    };
    let (mut wal, contents) = Wal::open(wal_dir, options).unwrap();
    for _ in 0..count {
        wal.append(&[], Some(&contents.hard_state));
        wal.sync().unwrap();
    }
}

#[test]
fn max_wals_purges_released_segments_beyond_it_and_zero_keeps_them_all() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    let wal = tmp.path().join("wal");
    let flags = |max: &'static str| {
        vec![
            "--wal-dir".to_string(),
            wal.to_str().unwrap().to_string(),
            "--snapshot-count".to_string(),
            "10".to_string(),
            "--max-wals".to_string(),
            max.to_string(),
        ]
    };
    let start = |max: &'static str| {
        let f = flags(max);
        let f: Vec<&str> = f.iter().map(String::as_str).collect();
        Process::start_oxcd(&testkit::oxcd_bin(), &data, &f)
    };
    let mut m = start("0");
    assert!(
        m.wait_for_log("\"suffix\":\"wal\"", Duration::ZERO)
            .is_none(),
        "--max-wals 0 starts no purge, as etcd"
    );
    put_keys(&m, "a", 5);
    stop(&mut m);
    cut_segments(&wal, 4);
    let all = segments(&wal);
    assert_eq!(all.len(), 5, "{all:?}");

    // a snapshot after the cuts releases the older segments; 0 keeps them
    let mut m = start("0");
    let snaps = snap_files(&data);
    put_keys(&m, "b", 15);
    wait_for_a_snapshot(&data, snaps);
    stop(&mut m);
    for f in &all {
        assert!(f.exists(), "--max-wals 0 deleted {}", f.display());
    }
    assert!(!m.log_text().contains("\"msg\":\"purged\""));

    // --max-wals 2: the released segments go, oldest first, down to 2
    let mut m = start("2");
    let purge = m
        .wait_for_log("\"suffix\":\"wal\"", Duration::ZERO)
        .expect("etcd's purge start line");
    assert!(purge.contains("\"max\":2"), "{purge}");
    let left = segments(&wal);
    assert_eq!(left.len(), 2, "{left:?}");
    assert_eq!(left[..], all[all.len() - 2..], "the newest stay");
    let purged: Vec<String> = m
        .log_lines()
        .into_iter()
        .filter(|l| l.contains("\"msg\":\"purged\""))
        .collect();
    assert_eq!(purged.len(), 3, "{purged:?}");
    for (line, file) in purged.iter().zip(&all) {
        assert_eq!(
            testkit::json_field(line, "path").as_deref(),
            file.to_str(),
            "oldest first"
        );
    }
    let (keys, _) = keys_and_revision(&m);
    assert_eq!(keys.len(), 20);
    stop(&mut m);
}

/// The runbook for an etcd 3.5.16 member with a dedicated WAL dir: stopped,
/// migrated with its --wal-dir, started as oxcd with etcd's flags (the
/// same --wal-dir, where oxcd's WAL now is; etcd's is kept beside it).
#[test]
fn an_etcd_member_with_wal_dir_is_migrated_and_starts_with_the_same_flags() {
    const ETCD: &str = "/opt/etcd-3.5.16/etcd";
    if !Path::new(ETCD).exists() {
        eprintln!("skipped: {ETCD} is not installed");
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("etcd");
    let wal = tmp.path().join("etcd-wal");
    let wal_flag = wal.to_str().unwrap();
    let mut etcd =
        testkit::start_reference_etcd_with(ETCD, &data, "http", &["--wal-dir", wal_flag])
            .expect("etcd 3.5.16");
    put_keys(&etcd, "e", 5);
    let (keys, revision) = keys_and_revision(&etcd);
    // etcd re-raises SIGTERM once stopped: the status says signal 15
    etcd.terminate(Duration::from_secs(20)).expect("etcd stops");
    assert!(!data.join("member/wal").exists(), "etcd's layout");

    let report = oxctl(&[
        "migrate",
        "--data-dir",
        data.to_str().unwrap(),
        "--wal-dir",
        wal_flag,
    ])
    .unwrap();
    assert!(
        report.contains("start oxcd with the same --wal-dir"),
        "{report}"
    );
    let kept = tmp.path().join("etcd-wal.etcd");
    assert!(!segments(&kept).is_empty(), "etcd's WAL is kept");
    let mut m = Process::start_oxcd(&testkit::oxcd_bin(), &data, &["--wal-dir", wal_flag]);
    assert!(m.log_text().contains("restarting local member"));
    assert_eq!(keys_and_revision(&m), (keys, revision));
    stop(&mut m);
    assert!(!data.join("member/wal").exists());
}
