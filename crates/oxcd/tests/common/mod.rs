//! Helpers shared by the process-cluster tests.
#![allow(dead_code)]

use std::time::{Duration, Instant};

use etcd_client::{Client, ConnectOptions, GetOptions};
use testkit::Cluster;

/// Elections here: 100 ms heartbeats, 1 s election timeout (etcd's defaults).
pub const ELECTION_DEADLINE: Duration = Duration::from_secs(10);

pub async fn client(endpoints: &[String]) -> Client {
    Client::connect(endpoints, None).await.expect("connect")
}

pub async fn require_leader_client(endpoint: &str) -> Client {
    Client::connect(
        [endpoint],
        Some(ConnectOptions::new().with_require_leader(true)),
    )
    .await
    .expect("connect")
}

/// The index of the member every running member agrees leads, waiting for
/// an election if needed.
pub async fn leader(cluster: &Cluster) -> usize {
    let deadline = Instant::now() + ELECTION_DEADLINE;
    loop {
        let mut seen = Vec::new();
        for (i, endpoint) in (0..cluster.members.len())
            .filter(|i| cluster.members[*i].is_some())
            .map(|i| (i, cluster.endpoint(i)))
        {
            let Ok(mut c) = Client::connect([endpoint], None).await else {
                continue;
            };
            if let Ok(s) = c.status().await {
                seen.push((
                    i,
                    s.header().map(|h| h.member_id()).unwrap_or(0),
                    s.leader(),
                ));
            }
        }
        let leaders: Vec<u64> = seen.iter().map(|s| s.2).collect();
        if !leaders.is_empty() && leaders[0] != 0 && leaders.iter().all(|l| *l == leaders[0]) {
            if let Some((i, _, _)) = seen.iter().find(|(_, id, _)| *id == leaders[0]) {
                return *i;
            }
        }
        assert!(Instant::now() < deadline, "no agreed leader: {seen:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Runs etcdctl 3.4 against `endpoints` (comma-separated); (success, stdout
/// + stderr without clientv3's retry warnings).
pub fn etcdctl(endpoints: &str, args: &[&str], stdin: Option<&[u8]>) -> (bool, String) {
    use std::io::Write;
    let mut child = std::process::Command::new("etcdctl")
        .env("ETCDCTL_API", "3")
        .args(["--endpoints", endpoints, "--command-timeout", "20s"])
        .args(args)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("etcdctl is installed (apt-get install etcd-client)");
    let mut input = child.stdin.take().expect("piped");
    if let Some(bytes) = stdin {
        input.write_all(bytes).expect("etcdctl stdin");
    }
    drop(input);
    let out = child.wait_with_output().expect("etcdctl runs");
    let text: String = String::from_utf8_lossy(&out.stdout).into_owned()
        + &String::from_utf8_lossy(&out.stderr)
            .lines()
            .filter(|l| !l.starts_with("{\"level\""))
            .map(|l| format!("{l}\n"))
            .collect::<String>();
    (out.status.success(), text)
}

/// Waits until every running member has the same revision and HashKV.
pub async fn hashes_converge(cluster: &Cluster) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let mut hashes = Vec::new();
        for endpoint in cluster.endpoints() {
            let mut c = client(&[endpoint]).await;
            let rev = c
                .get(
                    "",
                    Some(GetOptions::new().with_all_keys().with_serializable()),
                )
                .await
                .unwrap();
            let r = c.hash_kv(0).await.unwrap();
            hashes.push((rev.header().unwrap().revision(), r.hash()));
        }
        if hashes.iter().all(|h| *h == hashes[0]) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "members do not converge: {hashes:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
