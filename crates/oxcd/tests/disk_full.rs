//! A member on a small or full volume: it starts on 64 MiB (etcd's WAL
//! segment is 64,000,000 bytes and fits; ours is the same), serves until the
//! volume fills, then stops and exits non-zero with the cause as its last
//! log line; restarted on the still-full volume it refuses at once without
//! writing anything; given room again it comes back with every
//! acknowledged write. Needs root (a tmpfs mount): skipped, saying so,
//! without it.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime};

use testkit::tmpfs::Tmpfs;
use testkit::Process;

/// Size and modification time of every file under `dir`.
fn files(dir: &Path) -> BTreeMap<PathBuf, (u64, SystemTime)> {
    let mut out = BTreeMap::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).unwrap().flatten() {
            let meta = entry.metadata().unwrap();
            if meta.is_dir() {
                stack.push(entry.path());
            } else {
                out.insert(entry.path(), (meta.len(), meta.modified().unwrap()));
            }
        }
    }
    out
}

#[test]
fn a_member_on_a_full_volume_exits_non_zero_and_refuses_to_restart_until_there_is_room() {
    let Some(volume) = Tmpfs::mount("64m") else {
        eprintln!("skipped: cannot mount a tmpfs here (needs root)");
        return;
    };
    let data = volume.path().join("data");
    let mut m = Process::start_oxcd(&testkit::oxcd_bin(), &data, &[]);
    assert!(
        m.log_text().contains("too small to be safe"),
        "no warning about the small volume:\n{}",
        m.log_text()
    );
    let endpoint = m.endpoint.clone();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let value = "v".repeat(32 * 1024);
    // Write until the member fails a request; remember what it acknowledged.
    let acknowledged: Vec<String> = runtime.block_on(async {
        let mut c = etcd_client::Client::connect([endpoint], None)
            .await
            .unwrap();
        let mut acked = Vec::new();
        for i in 0..10_000 {
            let key = format!("k{i:05}");
            match c.put(key.clone(), value.clone(), None).await {
                Ok(_) => acked.push(key),
                Err(_) => break,
            }
        }
        acked
    });
    assert!(
        acknowledged.len() > 100,
        "only {} writes before the volume filled",
        acknowledged.len()
    );
    let status = m.wait_exit(Duration::from_secs(30)).unwrap_or_else(|| {
        panic!(
            "the member did not exit on a full volume; log:\n{}",
            m.log_text()
        )
    });
    assert_eq!(status.code(), Some(1), "log:\n{}", m.log_text());
    let last = m.log_lines().last().cloned().unwrap_or_default();
    assert!(
        last.contains("No space left on device"),
        "last line: {last}"
    );

    // Restarted on the full volume: refused at once, nothing written.
    let before = files(&data);
    let started = Instant::now();
    let mut again = Process::launch_oxcd(&testkit::oxcd_bin(), &data, &[]);
    let status = again
        .wait_exit(Duration::from_secs(30))
        .expect("a restart on a full volume exits");
    assert_eq!(status.code(), Some(1), "log:\n{}", again.log_text());
    assert!(
        again.log_text().contains("no space left on device"),
        "log:\n{}",
        again.log_text()
    );
    assert!(started.elapsed() < Duration::from_secs(10));
    assert_eq!(
        files(&data),
        before,
        "a refused restart wrote to the data dir"
    );

    // With room again, every acknowledged write is there.
    volume.resize("256m");
    let m = Process::start_oxcd(&testkit::oxcd_bin(), &data, &[]);
    let endpoint = m.endpoint.clone();
    runtime.block_on(async {
        let mut c = etcd_client::Client::connect([endpoint], None)
            .await
            .unwrap();
        let got = c
            .get(
                "k",
                Some(
                    etcd_client::GetOptions::new()
                        .with_prefix()
                        .with_keys_only(),
                ),
            )
            .await
            .unwrap();
        let keys: Vec<String> = got
            .kvs()
            .iter()
            .map(|kv| kv.key_str().unwrap().to_string())
            .collect();
        for key in &acknowledged {
            assert!(keys.contains(key), "acknowledged {key} is lost");
        }
        c.put("after", "room", None).await.unwrap();
    });
    drop(m);
}
