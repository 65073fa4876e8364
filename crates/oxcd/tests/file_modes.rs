//! The data dir's file modes, as etcd's (client/pkg/fileutil): directories
//! the member creates are 0700, its WAL and backend files 0600; an existing
//! data dir with another mode is warned about, never refused nor changed.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::time::Duration;

use testkit::Process;

fn mode(path: &Path) -> u32 {
    fs::metadata(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .permissions()
        .mode()
        & 0o777
}

#[test]
fn a_new_data_dir_is_private_as_etcds() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    let mut m = Process::start_oxcd(&testkit::oxcd_bin(), &data, &[]);
    let member = data.join("member");
    for dir in [
        data.clone(),
        member.clone(),
        member.join("wal"),
        member.join("snap"),
    ] {
        assert_eq!(mode(&dir), 0o700, "{}", dir.display());
    }
    assert_eq!(mode(&member.join("snap").join("db")), 0o600);
    let segments: Vec<_> = fs::read_dir(member.join("wal"))
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .collect();
    assert!(!segments.is_empty());
    for segment in segments {
        assert_eq!(mode(&segment), 0o600, "{}", segment.display());
    }
    assert!(!m.log_text().contains("check file permission"));
    m.terminate(Duration::from_secs(20));
}

#[test]
fn an_existing_data_dir_with_another_mode_is_warned_about_not_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    fs::create_dir(&data).unwrap();
    fs::set_permissions(&data, fs::Permissions::from_mode(0o755)).unwrap();
    let mut m = Process::start_oxcd(&testkit::oxcd_bin(), &data, &[]);
    let warning = m
        .log_lines()
        .into_iter()
        .find(|l| l.contains("check file permission"))
        .unwrap_or_else(|| panic!("no permission warning; log:\n{}", m.log_text()));
    let v: serde_json::Value = serde_json::from_str(&warning).unwrap();
    assert_eq!(v["level"], "warn");
    assert_eq!(
        v["error"],
        format!(
            "directory {:?} exist, but the permission is \"drwxr-xr-x\". The recommended permission is \"-rwx------\" to prevent possible unprivileged access to the data",
            data.display().to_string()
        )
    );
    assert_eq!(mode(&data), 0o755, "the data dir's mode was changed");
    assert_eq!(mode(&data.join("member")), 0o700);
    m.terminate(Duration::from_secs(20));

    // member/ is checked too, and a dir at 0700 is not warned about
    fs::set_permissions(&data, fs::Permissions::from_mode(0o700)).unwrap();
    fs::set_permissions(data.join("member"), fs::Permissions::from_mode(0o750)).unwrap();
    let mut m = Process::start_oxcd(&testkit::oxcd_bin(), &data, &[]);
    let warnings: Vec<String> = m
        .log_lines()
        .into_iter()
        .filter(|l| l.contains("check file permission"))
        .collect();
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    assert!(warnings[0].contains("drwxr-x---"), "{}", warnings[0]);
    m.terminate(Duration::from_secs(20));
}

#[test]
fn a_restored_data_dir_is_private_as_etcdutls() {
    let tmp = tempfile::tempdir().unwrap();
    let mut m = Process::start_oxcd(&testkit::oxcd_bin(), &tmp.path().join("data"), &[]);
    let snapshot = tmp.path().join("snap.db");
    let out = std::process::Command::new("etcdctl")
        .env("ETCDCTL_API", "3")
        .args(["--endpoints", m.host_port(), "snapshot", "save"])
        .arg(&snapshot)
        .output()
        .expect("etcdctl is installed (apt-get install etcd-client)");
    assert!(out.status.success(), "{out:?}");
    m.terminate(Duration::from_secs(20));
    let restored = tmp.path().join("restored");
    let mut sink = Vec::new();
    let argv = [
        "oxctl",
        "snapshot",
        "restore",
        snapshot.to_str().unwrap(),
        "--data-dir",
        restored.to_str().unwrap(),
    ];
    oxctl::run(argv.iter().copied(), &mut sink).expect("restores");
    let member = restored.join("member");
    for dir in [
        restored.clone(),
        member.clone(),
        member.join("snap"),
        member.join("wal"),
    ] {
        assert_eq!(mode(&dir), 0o700, "{}", dir.display());
    }
    assert_eq!(mode(&member.join("snap").join("db")), 0o600);
}
