//! The oxctl binary: `snapshot status` in etcdutl's four formats and
//! `snapshot restore` (what it writes, what it refuses, its exit status).

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use api::etcdserverpb::PutRequest;
use mvcc::snapshot_file::{write_snapshot, SnapshotFile};
use mvcc::{SideTable, Store};

fn oxctl(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_oxctl"))
        .args(args)
        .output()
        .expect("run oxctl")
}

/// A snapshot file of a store with `keys` keys (one lease, an old member).
fn snapshot_file(dir: &Path, keys: u64) -> (PathBuf, i64) {
    let store = Store::open(&dir.join("source.db")).unwrap();
    store.put_member(5, Some(b"old".to_vec()), 1);
    store.put_side(SideTable::Leases, 42, Some(b"lease".to_vec()), 1);
    for i in 0..keys {
        let mut w = store.write(i + 2);
        w.put(&PutRequest {
            key: format!("key{i}").into_bytes().into(),
            value: b"value".to_vec().into(),
            ..Default::default()
        })
        .unwrap();
        w.end();
    }
    let copy = dir.join("copy.db");
    store.backup_to(&copy).unwrap();
    let path = dir.join("snapshot.db");
    write_snapshot(&copy, &mut File::create(&path).unwrap()).unwrap();
    (path, store.current_revision())
}

fn stdout(out: &Output) -> String {
    assert!(
        out.status.success(),
        "oxctl failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout.clone()).unwrap()
}

#[test]
fn snapshot_status_prints_etcdutls_four_formats() {
    let dir = tempfile::tempdir().unwrap();
    let (path, revision) = snapshot_file(dir.path(), 3);
    let p = path.to_str().unwrap();
    let status = SnapshotFile::open(&path, false).unwrap().status().unwrap();
    assert_eq!(status.revision, revision);
    // 3 key records, 2 meta (consistent index, format version), 1 member, 1 lease.
    assert_eq!(status.total_key, 7);
    let hash = format!("{:x}", status.hash);
    let size = mvcc::snapshot_file::humanize_bytes(status.total_size);

    assert_eq!(
        stdout(&oxctl(&["snapshot", "status", p])),
        format!("{hash}, {revision}, 7, {size}\n")
    );
    assert_eq!(
        stdout(&oxctl(&["snapshot", "status", p, "-w", "json"])),
        format!(
            "{{\"hash\":{},\"revision\":{revision},\"totalKey\":7,\"totalSize\":{}}}\n",
            status.hash, status.total_size
        )
    );
    assert_eq!(
        stdout(&oxctl(&["-w", "fields", "snapshot", "status", p])),
        format!(
            "\"Hash\" : {}\n\"Revision\" : {revision}\n\"Keys\" : 7\n\"Size\" : {}\n",
            status.hash, status.total_size
        )
    );
    // tablewriter's layout, as etcdutl 3.5.1 prints it.
    let table = stdout(&oxctl(&["snapshot", "status", p, "--write-out", "table"]));
    let lines: Vec<&str> = table.lines().collect();
    assert_eq!(lines.len(), 5, "{table}");
    let hash_width = hash.len().max(4);
    let border = format!(
        "+{}+----------+------------+------------+",
        "-".repeat(hash_width + 2)
    );
    assert_eq!(lines[0], border);
    assert_eq!(lines[2], border);
    assert_eq!(lines[4], border);
    assert!(
        lines[1].ends_with("| REVISION | TOTAL KEYS | TOTAL SIZE |"),
        "{table}"
    );
    assert_eq!(
        lines[3],
        format!(
            "| {hash:>hash_width$} | {revision:>8} | {:>10} | {size:>10} |",
            7
        )
    );
}

#[test]
fn etcdutls_table_layout_is_reproduced_for_its_own_example() {
    // etcdutl 3.5.1 on a fresh etcd with one key: hash 456a48e, rev 3, 8 keys, 24576 bytes.
    let status = mvcc::snapshot_file::SnapshotStatus {
        hash: 0x456a48e,
        revision: 3,
        total_key: 8,
        total_size: 24576,
    };
    let table = oxctl::snapshot::format_status(&status, oxctl::OutputFormat::Table);
    assert_eq!(
        table,
        "+---------+----------+------------+------------+\n\
         |  HASH   | REVISION | TOTAL KEYS | TOTAL SIZE |\n\
         +---------+----------+------------+------------+\n\
         | 456a48e |        3 |          8 |      25 kB |\n\
         +---------+----------+------------+------------+\n"
    );
    assert_eq!(
        oxctl::snapshot::format_status(&status, oxctl::OutputFormat::Simple),
        "456a48e, 3, 8, 25 kB\n"
    );
    assert_eq!(
        oxctl::snapshot::format_status(&status, oxctl::OutputFormat::Json),
        "{\"hash\":72787086,\"revision\":3,\"totalKey\":8,\"totalSize\":24576}\n"
    );
}

#[test]
fn restore_writes_a_new_members_db_and_wal() {
    let dir = tempfile::tempdir().unwrap();
    let (path, revision) = snapshot_file(dir.path(), 20);
    let data = dir.path().join("m2.oxcd");
    let cluster = "m1=http://10.0.0.1:2380,m2=http://10.0.0.2:2380,m3=http://10.0.0.3:2380";
    let out = oxctl(&[
        "snapshot",
        "restore",
        path.to_str().unwrap(),
        "--name",
        "m2",
        "--data-dir",
        data.to_str().unwrap(),
        "--initial-cluster",
        cluster,
        "--initial-cluster-token",
        "tok",
        "--initial-advertise-peer-urls",
        "http://10.0.0.2:2380",
    ]);
    stdout(&out);
    let ids: Vec<u64> = (1..=3)
        .map(|i| schema::members::member_id(&[format!("http://10.0.0.{i}:2380")], "tok"))
        .collect();
    let meta = consensus::wal::Wal::read_metadata(&data.join("member/wal"))
        .unwrap()
        .expect("a WAL");
    assert_eq!(meta.node_id, ids[1]);
    assert_eq!(meta.cluster_id, schema::members::cluster_id(&ids));
    assert_eq!(meta.initial_voters, ids);

    let store = Store::open(&data.join("member/snap/db")).unwrap();
    assert_eq!(store.current_revision(), revision);
    assert_eq!(store.consistent_index(), 0);
    let members = store.members().unwrap();
    assert_eq!(members.keys().copied().collect::<Vec<_>>(), {
        let mut sorted = ids.clone();
        sorted.sort();
        sorted
    });
    let m2 = schema::members::decode(&members[&ids[1]]).unwrap();
    assert_eq!(m2.name, "m2");
    assert_eq!(m2.peer_urls, vec!["http://10.0.0.2:2380".to_string()]);
    assert_eq!(store.side_records(SideTable::Leases).unwrap().len(), 1);
}

#[test]
fn restore_refuses_damaged_files_and_bad_flags_with_etcdutls_errors() {
    let dir = tempfile::tempdir().unwrap();
    let (path, _) = snapshot_file(dir.path(), 5);
    let mut bytes = std::fs::read(&path).unwrap();
    let at = bytes.len() / 2;
    bytes[at] ^= 0xff;
    let damaged = dir.path().join("damaged.db");
    std::fs::write(&damaged, &bytes).unwrap();
    let data = dir.path().join("out");
    let d = data.to_str().unwrap();

    let out = oxctl(&[
        "snapshot",
        "restore",
        damaged.to_str().unwrap(),
        "--data-dir",
        d,
    ]);
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("Error: expected sha256 ["), "{stderr}");
    assert!(!data.exists());

    let bare = dir.path().join("bare.db");
    std::fs::write(&bare, &bytes[..bytes.len() - 32]).unwrap();
    let out = oxctl(&[
        "snapshot",
        "restore",
        bare.to_str().unwrap(),
        "--data-dir",
        d,
    ]);
    assert!(String::from_utf8_lossy(&out.stderr)
        .contains("Error: snapshot missing hash but --skip-hash-check=false"));

    let out = oxctl(&[
        "snapshot",
        "restore",
        path.to_str().unwrap(),
        "--data-dir",
        d,
        "--name",
        "nobody",
    ]);
    assert!(String::from_utf8_lossy(&out.stderr).contains(
        "Error: couldn't find local name \"nobody\" in the initial cluster configuration"
    ));
    assert!(!data.exists());

    // The undamaged file restores, then the same data dir is refused.
    stdout(&oxctl(&[
        "snapshot",
        "restore",
        path.to_str().unwrap(),
        "--data-dir",
        d,
    ]));
    let out = oxctl(&[
        "snapshot",
        "restore",
        path.to_str().unwrap(),
        "--data-dir",
        d,
    ]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("not empty or could not be read"));
}

#[test]
fn restore_refuses_a_file_that_holds_no_oxcd_database() {
    // An etcd (bbolt) snapshot, or anything else, with a valid sha256.
    let dir = tempfile::tempdir().unwrap();
    let junk = dir.path().join("junk");
    std::fs::write(&junk, vec![0x5au8; 8192]).unwrap();
    let path = dir.path().join("etcd-snapshot.db");
    write_snapshot(&junk, &mut File::create(&path).unwrap()).unwrap();
    let data = dir.path().join("out");
    let out = oxctl(&[
        "snapshot",
        "restore",
        path.to_str().unwrap(),
        "--data-dir",
        data.to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("Error: snapshot file is not an oxcd snapshot"),
        "{stderr}"
    );
    assert!(!data.exists(), "a failed restore leaves no data dir");
    let out = oxctl(&["snapshot", "status", path.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    let out = oxctl(&["snapshot", "status", "/nonexistent/snap.db"]);
    assert!(String::from_utf8_lossy(&out.stderr)
        .contains("Error: stat /nonexistent/snap.db: no such file or directory"));
}

/// A stopped member's data dir whose backend holds `keys` keys.
fn data_dir_with(dir: &Path, keys: u64) -> (PathBuf, u32) {
    let data = dir.join("member-data");
    let snap = data.join("member").join("snap");
    std::fs::create_dir_all(&snap).unwrap();
    let store = Store::open(&snap.join("db")).unwrap();
    for i in 0..keys {
        let mut w = store.write(i + 1);
        w.put(&PutRequest {
            key: format!("key{i}").into_bytes().into(),
            value: b"value".to_vec().into(),
            ..Default::default()
        })
        .unwrap();
        w.end();
    }
    store.commit(true).unwrap();
    let (hash, _, _) = store.hash_kv(0).unwrap();
    (data, hash)
}

#[test]
fn defrag_hashkv_and_check_work_on_a_stopped_members_data_dir() {
    let dir = tempfile::tempdir().unwrap();
    let (data, hash) = data_dir_with(dir.path(), 50);
    let data_arg = data.to_str().unwrap();
    let out = stdout(&oxctl(&["hashkv", "--data-dir", data_arg, "-w", "json"]));
    assert_eq!(
        out,
        format!("{{\"hash\":{hash},\"hashRevision\":51,\"compactRevision\":-1}}\n")
    );
    let out = stdout(&oxctl(&["defrag", "--data-dir", data_arg]));
    assert_eq!(
        out,
        format!("Finished defragmenting etcd data[0] ({data_arg})\n")
    );
    // the same history after the defrag
    let out = stdout(&oxctl(&["hashkv", "--data-dir", data_arg]));
    assert_eq!(out, format!("{hash}, 51, -1\n"));
    assert!(stdout(&oxctl(&["version"])).contains("API version: 3.5"));
    // without a WAL, check says what is missing and fails
    let failed = oxctl(&["check", "--data-dir", data_arg]);
    assert_eq!(failed.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&failed.stderr).contains("WAL in"));
    // a data dir that does not exist
    let missing = oxctl(&["hashkv", "--data-dir", "/nonexistent/dir"]);
    assert_eq!(missing.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&missing.stderr).contains("no such file or directory"));
}

#[test]
fn restore_takes_etcdutl_3_5_16s_wal_dir_and_revision_bump_flags() {
    let dir = tempfile::tempdir().unwrap();
    let (path, revision) = snapshot_file(dir.path(), 3);
    let file = path.to_str().unwrap();
    let data = dir.path().join("data");
    let wal = dir.path().join("wal-disk").join("wal");
    std::fs::create_dir_all(wal.parent().unwrap()).unwrap();
    let restore = |extra: &[&str]| {
        let mut args = vec![
            "snapshot",
            "restore",
            file,
            "--data-dir",
            data.to_str().unwrap(),
        ];
        args.extend_from_slice(extra);
        oxctl(&args)
    };
    // etcdutl's flag pair, each refused alone, with its message
    for extra in [&["--bump-revision", "10"][..], &["--mark-compacted"][..]] {
        let out = restore(extra);
        assert_eq!(out.status.code(), Some(1));
        assert!(
            String::from_utf8_lossy(&out.stderr)
                .contains("Error: --mark-compacted required if --revision-bump > 0"),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(!data.exists());
    }
    stdout(&restore(&[
        "--wal-dir",
        wal.to_str().unwrap(),
        "--bump-revision",
        "10",
        "--mark-compacted",
        "--initial-memory-map-size",
        "1000000",
    ]));
    // the WAL in its own dir, none under the data dir
    assert!(std::fs::read_dir(&wal).unwrap().any(|e| e
        .unwrap()
        .file_name()
        .to_string_lossy()
        .ends_with(".wal")));
    assert!(!data.join("member/wal").exists());
    // the bumped revision, compacted on the first open
    let store = Store::open(&data.join("member/snap/db")).unwrap();
    assert_eq!(store.current_revision(), revision + 10);
    assert_eq!(store.compact_revision(), revision + 10);
    drop(store);
    // an existing WAL dir is refused, as etcdutl refuses it
    let other = dir.path().join("other");
    let out = oxctl(&[
        "snapshot",
        "restore",
        file,
        "--data-dir",
        other.to_str().unwrap(),
        "--wal-dir",
        wal.to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr)
        .contains(&format!("wal-dir {:?} exists", wal.display().to_string())));
    assert!(!other.exists());
}
