//! Against the real tools: etcdutl 3.5.16 (bbolt v1.3.11) reads our files,
//! and our reader reads a snapshot saved by a real etcd 3.5.16. Skipped,
//! with a note, when /opt/etcd-3.5.16 is missing (install it with
//! `REF_ETCD=3.5.16 ../shared/tools/ref-etcd --bin 3.5.16`). Only loopback.

mod common;

use std::io::Write;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use bbolt::{snapshot_status, Reader, SnapshotStatus, Writer, WriterOptions};
use common::{etcd_like, Db};
use sha2::{Digest, Sha256};

const ETCD_DIR: &str = "/opt/etcd-3.5.16";

fn tool(name: &str) -> Option<PathBuf> {
    let path = Path::new(ETCD_DIR).join(name);
    if path.is_file() {
        Some(path)
    } else {
        eprintln!(
            "skipped: {} is missing (REF_ETCD=3.5.16 ../shared/tools/ref-etcd --bin 3.5.16)",
            path.display()
        );
        None
    }
}

/// Appends etcd's trailing sha256 of the body, as `snapshot save` does.
fn with_sha256(mut body: Vec<u8>) -> Vec<u8> {
    let digest = Sha256::digest(&body);
    body.extend_from_slice(&digest);
    assert_eq!(
        body.len() % 512,
        32,
        "etcd finds the hash by size % 512 == 32"
    );
    body
}

fn etcdutl_status(etcdutl: &Path, file: &Path) -> SnapshotStatus {
    let output = Command::new(etcdutl)
        .args(["snapshot", "status", "-w", "json"])
        .arg(file)
        .output()
        .expect("run etcdutl");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "etcdutl snapshot status failed: {stdout} {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let json: serde_json::Value = serde_json::from_str(stdout.trim()).expect("etcdutl prints JSON");
    let field = |name: &str| {
        json[name]
            .as_i64()
            .unwrap_or_else(|| panic!("field {name} in {json}"))
    };
    SnapshotStatus {
        hash: field("hash") as u32,
        revision: field("revision"),
        total_key: field("totalKey") as u64,
        total_size: field("totalSize") as u64,
    }
}

fn our_status(file: &Path) -> SnapshotStatus {
    let mut reader = Reader::open(file).expect("open");
    snapshot_status(&mut reader).expect("status")
}

fn write_file(dir: &Path, name: &str, db: &Db, options: WriterOptions) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, with_sha256(common::write(db, options))).expect("write file");
    path
}

#[test]
fn etcdutl_snapshot_status_accepts_our_file_with_etcds_buckets() {
    let Some(etcdutl) = tool("etcdutl") else {
        return;
    };
    let dir = tempfile::tempdir().expect("tempdir");
    for persist_freelist in [true, false] {
        let db = etcd_like(40, 30);
        let options = WriterOptions {
            persist_freelist,
            ..WriterOptions::default()
        };
        let file = write_file(
            dir.path(),
            &format!("small-{persist_freelist}.db"),
            &db,
            options,
        );
        let theirs = etcdutl_status(&etcdutl, &file);
        let ours = our_status(&file);
        assert_eq!(theirs, ours, "freelist persisted: {persist_freelist}");
        assert_eq!(ours.revision, 41, "last revision key");
        assert_eq!(ours.total_key, 40 + 5, "every entry of every bucket");
        assert_eq!(
            ours.total_size + 32,
            std::fs::metadata(&file).expect("stat").len()
        );
    }
}

#[test]
fn etcdutl_snapshot_status_accepts_multi_level_trees_and_overflow_pages() {
    let Some(etcdutl) = tool("etcdutl") else {
        return;
    };
    let dir = tempfile::tempdir().expect("tempdir");
    let mut db = etcd_like(30_000, 120);
    // Big values (overflow pages) and 32 KiB keys (branch pages spanning
    // overflow pages) in a bucket after etcd's.
    let mut big = Vec::new();
    for index in 0..40u32 {
        let mut key = vec![b'k'; bbolt::MAX_KEY_SIZE];
        key[bbolt::MAX_KEY_SIZE - 4..].copy_from_slice(&index.to_be_bytes());
        let value = vec![(index % 251) as u8; (index as usize % 5) * 5000];
        big.push((key, value));
    }
    big.push((vec![b'z'], vec![7u8; 3 << 20]));
    db.push((b"zz_big".to_vec(), big));
    for (persist_freelist, page_size) in [(true, 4096), (false, 4096), (false, 16384)] {
        let options = WriterOptions {
            persist_freelist,
            page_size,
            ..WriterOptions::default()
        };
        let file = write_file(
            dir.path(),
            &format!("big-{persist_freelist}-{page_size}.db"),
            &db,
            options,
        );
        let theirs = etcdutl_status(&etcdutl, &file);
        assert_eq!(
            theirs,
            our_status(&file),
            "freelist persisted: {persist_freelist}, page size {page_size}"
        );
        assert_eq!(theirs.revision, 30_001);
        assert_eq!(theirs.total_key, 30_000 + 5 + 41);
    }
}

/// A process killed and reaped when dropped.
struct Guard(Child);

impl Drop for Guard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .expect("bind")
        .local_addr()
        .expect("addr")
        .port()
}

/// Starts etcd on `data_dir` with loopback URLs; returns it once it serves.
fn start_etcd(
    etcd: &Path,
    etcdctl: &Path,
    data_dir: &Path,
    name: &str,
    peer_port: u16,
) -> (Guard, String) {
    let client = format!("http://127.0.0.1:{}", free_port());
    let peer = format!("http://127.0.0.1:{peer_port}");
    let log = std::fs::File::create(data_dir.with_extension("log")).expect("log file");
    let child = Command::new(etcd)
        .args(["--name", name, "--log-level", "error"])
        .arg("--data-dir")
        .arg(data_dir)
        .args([
            "--listen-client-urls",
            &client,
            "--advertise-client-urls",
            &client,
        ])
        .args([
            "--listen-peer-urls",
            &peer,
            "--initial-advertise-peer-urls",
            &peer,
        ])
        .args(["--initial-cluster", &format!("{name}={peer}")])
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .expect("start etcd");
    let guard = Guard(child);
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let health = Command::new(etcdctl)
            .args([
                "--endpoints",
                &client,
                "--command-timeout",
                "2s",
                "endpoint",
                "health",
            ])
            .output()
            .expect("run etcdctl");
        if health.status.success() {
            return (guard, client);
        }
        assert!(
            Instant::now() < deadline,
            "etcd did not become healthy: {}",
            String::from_utf8_lossy(&health.stderr)
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn etcdctl(etcdctl: &Path, endpoint: &str, args: &[&str]) -> String {
    let output = Command::new(etcdctl)
        .args(["--endpoints", endpoint])
        .args(args)
        .output()
        .expect("run etcdctl");
    assert!(
        output.status.success(),
        "etcdctl {args:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

#[test]
fn reads_a_real_etcd_snapshot_and_etcd_restores_our_copy_of_it() {
    let (Some(etcd), Some(etcdctl_bin), Some(etcdutl)) =
        (tool("etcd"), tool("etcdctl"), tool("etcdutl"))
    else {
        return;
    };
    let dir = tempfile::tempdir().expect("tempdir");
    let snapshot = dir.path().join("etcd.snapshot");
    {
        let (_etcd, endpoint) = start_etcd(
            &etcd,
            &etcdctl_bin,
            &dir.path().join("etcd-data"),
            "one",
            free_port(),
        );
        for index in 0..5 {
            etcdctl(
                &etcdctl_bin,
                &endpoint,
                &[
                    "put",
                    &format!("user-key-{index}"),
                    &format!("value-{index}"),
                ],
            );
        }
        etcdctl(&etcdctl_bin, &endpoint, &["del", "user-key-0"]);
        etcdctl(
            &etcdctl_bin,
            &endpoint,
            &["snapshot", "save", snapshot.to_str().expect("utf-8 path")],
        );
    } // etcd stops here

    // etcd's file: body + sha256. Our reader on the body alone.
    let saved = std::fs::read(&snapshot).expect("read snapshot");
    assert_eq!(saved.len() % 512, 32, "etcd appends a sha256");
    let body = &saved[..saved.len() - 32];
    assert_eq!(Sha256::digest(body).as_slice(), &saved[saved.len() - 32..]);
    let mut reader = Reader::new(std::io::Cursor::new(body)).expect("open etcd's snapshot");
    reader.check().expect("etcd's snapshot passes the check");
    eprintln!(
        "etcd snapshot: {} bytes, page size {}, freelist {:#x}, txid {}",
        body.len(),
        reader.page_size(),
        reader.meta().freelist,
        reader.meta().txid
    );
    let db = common::read_from(&mut reader).expect("read etcd's snapshot");
    let names: Vec<String> = db
        .iter()
        .map(|(name, _)| String::from_utf8_lossy(name).into_owned())
        .collect();
    assert_eq!(
        names,
        [
            "alarm",
            "auth",
            "authRoles",
            "authUsers",
            "cluster",
            "key",
            "lease",
            "members",
            "members_removed",
            "meta"
        ]
    );
    let (_, keys) = &db[5];
    assert_eq!(keys.len(), 6, "5 puts and a tombstone");
    for (index, (revision_key, value)) in keys.iter().enumerate() {
        assert_eq!(
            revision_key[..8],
            (index as u64 + 2).to_be_bytes(),
            "revisions 2..=7 in order"
        );
        let user_key = format!("user-key-{}", index % 5);
        assert!(
            value
                .windows(user_key.len())
                .any(|window| window == user_key.as_bytes()),
            "{user_key} in its KeyValue"
        );
    }
    assert_eq!(
        keys[5].0.len(),
        18,
        "the delete is a tombstone revision key"
    );
    let (_, auth) = &db[1];
    assert!(auth.iter().any(|(key, _)| key == b"authRevision"));

    // The same status as etcdutl, on etcd's own file (sha256 included).
    let theirs = etcdutl_status(&etcdutl, &snapshot);
    assert_eq!(theirs, our_status(&snapshot));
    assert_eq!(theirs.revision, 7);

    // Our copy of it: the same status, and etcd restores and serves it.
    let copy = dir.path().join("copy.snapshot");
    let mut out = std::fs::File::create(&copy).expect("create copy");
    let mut writer = Writer::new(&mut out, 4096).expect("writer");
    for (name, entries) in &db {
        writer.begin_bucket(name).expect("bucket");
        for (key, value) in entries {
            writer.put(key, value).expect("put");
        }
    }
    writer.finish().expect("finish");
    drop(out);
    let copied_body = std::fs::read(&copy).expect("read copy");
    std::fs::File::create(&copy)
        .and_then(|mut file| file.write_all(&with_sha256(copied_body)))
        .expect("write copy");
    let copied = etcdutl_status(&etcdutl, &copy);
    assert_eq!(
        (copied.hash, copied.revision, copied.total_key),
        (theirs.hash, theirs.revision, theirs.total_key)
    );

    // A bigger history in etcd's format (20k puts, some values spanning
    // overflow pages) on top of it: etcd restores it, serves it, and writes
    // into our layout.
    const BULK: u64 = 20_000;
    let mut bulk_db = db.clone();
    let (_, keys) = &mut bulk_db[5];
    for index in 0..BULK {
        let revision = 8 + index;
        let value = vec![b'v'; if index % 5000 == 0 { 200_000 } else { 1000 }];
        let kv = key_value(format!("bulk-{index:06}").as_bytes(), revision, &value);
        keys.push((common::revision_key(revision, 0), kv));
    }
    let bulk = write_file(
        dir.path(),
        "bulk.snapshot",
        &bulk_db,
        WriterOptions::default(),
    );
    assert_eq!(etcdutl_status(&etcdutl, &bulk).revision, 7 + BULK as i64);

    let restored = dir.path().join("restored-data");
    let peer_port = free_port();
    let peer = format!("http://127.0.0.1:{peer_port}");
    let output = Command::new(&etcdutl)
        .args(["snapshot", "restore"])
        .arg(&bulk)
        .arg("--data-dir")
        .arg(&restored)
        .args(["--name", "two", "--initial-cluster", &format!("two={peer}")])
        .args(["--initial-advertise-peer-urls", &peer])
        .output()
        .expect("run etcdutl restore");
    assert!(
        output.status.success(),
        "restore: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let (_etcd, endpoint) = start_etcd(&etcd, &etcdctl_bin, &restored, "two", peer_port);
    let got = etcdctl(
        &etcdctl_bin,
        &endpoint,
        &["get", "user-key", "--prefix", "-w", "json"],
    );
    let json: serde_json::Value = serde_json::from_str(got.trim()).expect("json");
    assert_eq!(
        json["kvs"].as_array().map(Vec::len),
        Some(4),
        "user-key-1..4 survive: {got}"
    );
    assert_eq!(
        json["header"]["revision"].as_i64(),
        Some(7 + BULK as i64),
        "{got}"
    );
    let got = etcdctl(
        &etcdctl_bin,
        &endpoint,
        &["get", "bulk-", "--prefix", "--count-only", "-w", "fields"],
    );
    let count = got
        .lines()
        .find_map(|line| line.strip_prefix("\"Count\" : "));
    assert_eq!(count, Some(BULK.to_string().as_str()), "{got}");
    let got = etcdctl(
        &etcdctl_bin,
        &endpoint,
        &["get", "bulk-015000", "--print-value-only"],
    );
    assert_eq!(got.trim().len(), 200_000, "a value from overflow pages");
    for index in 0..50 {
        etcdctl(
            &etcdctl_bin,
            &endpoint,
            &["put", &format!("bulk-{:06}", index * 7), "new"],
        );
    }
    let got = etcdctl(
        &etcdctl_bin,
        &endpoint,
        &["get", "bulk-000343", "--print-value-only"],
    );
    assert_eq!(got.trim(), "new");
}

/// A marshalled `mvccpb.KeyValue{key, create_revision, mod_revision, version: 1, value}`.
fn key_value(key: &[u8], revision: u64, value: &[u8]) -> Vec<u8> {
    fn varint(mut number: u64, out: &mut Vec<u8>) {
        while number >= 0x80 {
            out.push(number as u8 | 0x80);
            number >>= 7;
        }
        out.push(number as u8);
    }
    let mut out = Vec::with_capacity(key.len() + value.len() + 32);
    out.push(0x0a);
    varint(key.len() as u64, &mut out);
    out.extend_from_slice(key);
    for tag in [0x10, 0x18] {
        out.push(tag);
        varint(revision, &mut out);
    }
    out.extend_from_slice(&[0x20, 1, 0x2a]);
    varint(value.len() as u64, &mut out);
    out.extend_from_slice(value);
    out
}
