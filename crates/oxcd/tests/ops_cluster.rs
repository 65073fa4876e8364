//! Operations on a 3-member process cluster: move-leader with etcdctl,
//! hashes equal across members, defrag of every member with `--cluster`.

mod common;
use common::{client, leader};

fn etcdctl(endpoints: &[String], args: &[&str]) -> (bool, String) {
    common::etcdctl(&endpoints.join(","), args, None)
}

use std::time::{Duration, Instant};

use testkit::Cluster;

async fn member_id(endpoint: &str) -> u64 {
    let mut c = client(&[endpoint.to_string()]).await;
    c.status().await.unwrap().header().unwrap().member_id()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcdctl_move_leader_hands_leadership_to_the_named_member() {
    let cluster = Cluster::start(3, &[]);
    let old = leader(&cluster).await;
    let target = (old + 1) % 3;
    let target_id = member_id(&cluster.endpoint(target)).await;
    let old_id = member_id(&cluster.endpoint(old)).await;

    // Only the leader moves leadership (etcdctl itself looks for the leader
    // among its endpoints, so ask a follower directly), and only to a member.
    let mut follower = client(&[cluster.endpoint(target)]).await;
    match follower.move_leader(old_id).await {
        Err(etcd_client::Error::GRpcStatus(s)) => {
            assert_eq!(s.message(), "etcdserver: not leader")
        }
        other => panic!("move-leader on a follower: {other:?}"),
    }
    let (ok, out) = etcdctl(&[cluster.endpoint(old)], &["move-leader", "1234"]);
    assert!(
        !ok && out.contains("etcdserver: bad leader transferee"),
        "{out}"
    );

    let (ok, out) = etcdctl(
        &cluster.endpoints(),
        &["move-leader", &format!("{target_id:x}")],
    );
    assert!(ok, "{out}");
    assert!(
        out.contains(&format!(
            "Leadership transferred from {old_id:x} to {target_id:x}"
        )),
        "{out}"
    );
    assert_eq!(leader(&cluster).await, target);
    // The cluster goes on committing under its new leader.
    let mut c = client(&cluster.endpoints()).await;
    c.put("after-move", "v", None).await.unwrap();
    // And back, through the API: etcd's answer carries no header (the
    // etcd-client crate's own test_move_leader asserts it).
    let mut new_leader = client(&[cluster.endpoint(target)]).await;
    let moved = new_leader.move_leader(old_id).await.unwrap();
    assert!(moved.header().is_none(), "{moved:?}");
    assert_eq!(leader(&cluster).await, old);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hashes_agree_across_members_and_defrag_cluster_keeps_them() {
    let cluster = Cluster::start(3, &[]);
    let mut c = client(&cluster.endpoints()).await;
    for i in 0..300 {
        c.put(format!("h/{i:03}"), vec![b'x'; 1024], None)
            .await
            .unwrap();
    }
    c.delete("h/1", Some(etcd_client::DeleteOptions::new().with_prefix()))
        .await
        .unwrap();
    let revision = c.put("h/last", "v", None).await.unwrap();
    let revision = revision.header().unwrap().revision();
    c.compact(
        revision - 1,
        Some(etcd_client::CompactionOptions::new().with_physical()),
    )
    .await
    .unwrap();

    // Every member: same revision, same Hash, same HashKV at a past revision.
    let hashes = |expect_revision: i64| {
        let endpoints = cluster.endpoints();
        async move {
            let deadline = Instant::now() + Duration::from_secs(20);
            loop {
                let mut seen = Vec::new();
                let mut behind = Vec::new();
                for endpoint in &endpoints {
                    let mut m = client(std::slice::from_ref(endpoint)).await;
                    let hash = m.hash().await.unwrap();
                    // A follower not at the revision yet answers "future
                    // revision": not yet, not a failure.
                    match m.hash_kv(expect_revision).await {
                        Ok(kv) => seen.push((
                            hash.header().unwrap().revision(),
                            hash.hash(),
                            kv.hash(),
                            kv.header().unwrap().revision() > 0,
                        )),
                        Err(e) if e.to_string().contains("future revision") => {
                            behind.push(endpoint.clone())
                        }
                        Err(e) => panic!("{endpoint}: {e}"),
                    }
                }
                if behind.is_empty()
                    && seen[0].0 == expect_revision
                    && seen.iter().all(|s| *s == seen[0])
                {
                    return seen[0];
                }
                assert!(
                    Instant::now() < deadline,
                    "members disagree: {seen:?}, behind: {behind:?}"
                );
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    };
    let before = hashes(revision).await;

    let (ok, out) = etcdctl(&cluster.endpoints(), &["defrag", "--cluster"]);
    assert!(ok, "{out}");
    assert_eq!(
        out.matches("Finished defragmenting etcd member").count(),
        3,
        "{out}"
    );
    assert_eq!(hashes(revision).await, before, "defrag changed the data");
}

/// Flips a byte of every copy of the value `needle` in a stopped member's
/// backend file: damage on disk, which the checksums catch.
fn flip_bytes_in_db(db: &std::path::Path, needle: &[u8]) -> usize {
    let mut bytes = std::fs::read(db).unwrap();
    let mut flipped = 0;
    let mut at = 0;
    while let Some(pos) = bytes[at..].windows(needle.len()).position(|w| w == needle) {
        let pos = at + pos;
        bytes[pos] ^= 0x20;
        flipped += 1;
        at = pos + needle.len();
    }
    std::fs::write(db, bytes).unwrap();
    flipped
}

/// Rewrites, through redb, every record in the backend's key table whose
/// bytes hold `needle`: one bit of it flipped and the record's checksum
/// sealed again, so the file is sound and only the data diverges (a bug,
/// not the disk: redb's page checksums, checked at open, stay right).
fn diverge_record_in_db(db: &std::path::Path, needle: &[u8]) -> usize {
    const KEY_TABLE: redb::TableDefinition<&[u8], &[u8]> = redb::TableDefinition::new("key");
    let database = redb::Database::open(db).unwrap();
    let txn = database.begin_write().unwrap();
    let mut rewritten = 0;
    {
        use redb::ReadableTable;
        let mut table = txn.open_table(KEY_TABLE).unwrap();
        let mut updates = Vec::new();
        for entry in table.iter().unwrap() {
            let (key, value) = entry.unwrap();
            let mut record = value.value().to_vec();
            let Some(pos) = record.windows(needle.len()).position(|w| w == needle) else {
                continue;
            };
            record[pos] ^= 0x20;
            // KeyValue fields, then 0x7d and the CRC-32 of everything before
            let n = record.len();
            assert_eq!(record[n - 5], 0x7d, "a sealed record");
            let crc = crc32fast::hash(&record[..n - 5]);
            record[n - 4..].copy_from_slice(&crc.to_le_bytes());
            updates.push((key.value().to_vec(), record));
        }
        for (key, record) in updates {
            table.insert(key.as_slice(), record.as_slice()).unwrap();
            rewritten += 1;
        }
    }
    txn.commit().unwrap();
    rewritten
}

/// Starts member `i` with `flags`, which must refuse to start; its log.
fn refused_start(cluster: &mut Cluster, i: usize, flags: &[&str]) -> String {
    let p = cluster.spawn_with(i, flags);
    let status = p.wait_exit(Duration::from_secs(30));
    let log = p.log_text();
    assert!(
        status.is_some_and(|s| !s.success()),
        "a corrupted member started: {log}"
    );
    cluster.members[i] = None;
    log
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn corrupted_member_is_refused_at_start_and_flagged_by_the_leader() {
    let mut cluster = Cluster::start(3, &["--experimental-corrupt-check-time=1s"]);
    let mut c = client(&cluster.endpoints()).await;
    for i in 0..20 {
        c.put(format!("c/{i}"), format!("precious-value-{i:04}"), None)
            .await
            .unwrap();
    }
    let leader_index = leader(&cluster).await;
    let victim = (leader_index + 1) % 3;
    // Wait until the victim applied everything, then stop it cleanly.
    let revision = c
        .get("c/0", None)
        .await
        .unwrap()
        .header()
        .unwrap()
        .revision();
    let mut v = client(&[cluster.endpoint(victim)]).await;
    let deadline = Instant::now() + Duration::from_secs(10);
    while v
        .get(
            "c/0",
            Some(etcd_client::GetOptions::new().with_serializable()),
        )
        .await
        .unwrap()
        .header()
        .unwrap()
        .revision()
        < revision
    {
        assert!(Instant::now() < deadline, "victim never caught up");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    cluster.stop(victim);
    let db = cluster.data_dir(victim).join("member/snap/db");
    let original = std::fs::read(&db).unwrap();

    // Damage the record checksum catches: refused at start, with or
    // without the initial check, naming the file and the record.
    assert!(flip_bytes_in_db(&db, b"precious-value-0007") > 0);
    let log = refused_start(&mut cluster, victim, &[]);
    assert!(log.contains("fails its checksum"), "{log}");

    // A divergent but well-formed record (a bug, not the disk): with the
    // initial check it refuses to start.
    std::fs::write(&db, &original).unwrap();
    assert!(diverge_record_in_db(&db, b"precious-value-0007") > 0);
    let log = refused_start(
        &mut cluster,
        victim,
        &["--experimental-initial-corrupt-check"],
    );
    assert!(log.contains("found data inconsistency with peers"), "{log}");

    // Without it, it starts, and the leader's periodic check raises CORRUPT
    // for it; then every member refuses writes.
    cluster.restart(victim);
    let victim_id = member_id(&cluster.endpoint(victim)).await;
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let alarms = c
            .alarm(
                etcd_client::AlarmAction::Get,
                etcd_client::AlarmType::None,
                None,
            )
            .await
            .unwrap();
        if let Some(alarm) = alarms.alarms().first() {
            assert_eq!(alarm.member_id(), victim_id);
            assert_eq!(alarm.alarm(), etcd_client::AlarmType::Corrupt);
            break;
        }
        assert!(Instant::now() < deadline, "the leader never raised CORRUPT");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    match c.put("after", "v", None).await {
        Err(etcd_client::Error::GRpcStatus(s)) => {
            assert_eq!(s.message(), "etcdserver: corrupt cluster")
        }
        other => panic!("a write on a corrupt cluster: {other:?}"),
    }
}
