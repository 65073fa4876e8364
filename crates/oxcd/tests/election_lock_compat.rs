//! Differential test: the same Election and Lock calls (through the
//! `etcd-client` crate) against oxcd and against etcd 3.5.1; every answer,
//! success or error (gRPC code and message), must be identical once the
//! member-specific header fields (cluster, member, term) are left out.
//! Skipped when etcd 3.5.1 is not installed (`../shared/tools/ref-etcd --bin 3.5`).

use std::time::Duration;

use etcd_client::{
    Client, LeaderKey, LeaseGrantOptions, LockOptions, ProclaimOptions, ResignOptions,
};
use testkit::Process;

const DEADLINE: Duration = Duration::from_secs(20);
/// Lease IDs chosen by the client, so that keys are the same on both.
const LEASE_A: i64 = 0x1000;
const LEASE_B: i64 = 0x2000;

fn outcome<T>(r: Result<T, etcd_client::Error>, ok: impl FnOnce(T) -> String) -> String {
    match r {
        Ok(v) => ok(v),
        Err(etcd_client::Error::GRpcStatus(s)) => {
            format!("error code={:?} message={:?}", s.code(), s.message())
        }
        Err(other) => format!("client error {other}"),
    }
}

fn rev(h: Option<&etcd_client::ResponseHeader>) -> i64 {
    h.map_or(-1, |h| h.revision())
}

fn leader_key(l: Option<&LeaderKey>) -> String {
    match l {
        Some(l) => format!(
            "name={} key={} rev={} lease={:x}",
            String::from_utf8_lossy(l.name()),
            String::from_utf8_lossy(l.key()),
            l.rev(),
            l.lease()
        ),
        None => "none".into(),
    }
}

fn kv(kv: Option<&etcd_client::KeyValue>) -> String {
    match kv {
        Some(kv) => format!(
            "{}={} create={} mod={} version={} lease={:x}",
            String::from_utf8_lossy(kv.key()),
            String::from_utf8_lossy(kv.value()),
            kv.create_revision(),
            kv.mod_revision(),
            kv.version(),
            kv.lease()
        ),
        None => "none".into(),
    }
}

async fn session(endpoint: &str) -> Vec<String> {
    let mut c = Client::connect([endpoint], None).await.expect("connect");
    let mut out = Vec::new();
    let mut log = |step: &str, line: String| out.push(format!("{step}: {line}"));

    log(
        "leader of an empty election",
        outcome(c.leader("e").await, |r| kv(r.kv())),
    );
    log(
        "proclaim without leader",
        outcome(c.proclaim("x", None).await, |r| rev(r.header()).to_string()),
    );
    log(
        "resign without leader",
        outcome(c.resign(None).await, |r| rev(r.header()).to_string()),
    );
    log(
        "campaign with unknown lease",
        outcome(c.campaign("e", "v", 0x5555).await, |r| {
            leader_key(r.leader())
        }),
    );
    log(
        "lock with unknown lease",
        outcome(
            c.lock("l", Some(LockOptions::new().with_lease(0x5555)))
                .await,
            |r| String::from_utf8_lossy(r.key()).into_owned(),
        ),
    );
    log(
        "unlock empty key",
        outcome(c.unlock("").await, |r| rev(r.header()).to_string()),
    );
    log(
        "unlock missing key",
        outcome(c.unlock("l/1").await, |r| rev(r.header()).to_string()),
    );
    for id in [LEASE_A, LEASE_B] {
        let r = c
            .lease_grant(60, Some(LeaseGrantOptions::new().with_id(id)))
            .await;
        log("grant", outcome(r, |r| format!("{:x}", r.id())));
    }

    let r = c.campaign("e", "v1", LEASE_A).await;
    let mut leader = None;
    log(
        "campaign",
        outcome(r, |r| {
            leader = r.leader().cloned();
            format!("rev={} {}", rev(r.header()), leader_key(r.leader()))
        }),
    );
    let leader = leader.unwrap_or_else(LeaderKey::new);
    log(
        "leader",
        outcome(c.leader("e").await, |r| {
            format!("rev={} {}", rev(r.header()), kv(r.kv()))
        }),
    );
    log(
        "proclaim",
        outcome(
            c.proclaim(
                "v2",
                Some(ProclaimOptions::new().with_leader(leader.clone())),
            )
            .await,
            |r| rev(r.header()).to_string(),
        ),
    );
    log(
        "campaign again, same lease, new value",
        outcome(c.campaign("e", "v3", LEASE_A).await, |r| {
            format!("rev={} {}", rev(r.header()), leader_key(r.leader()))
        }),
    );
    let stale = leader.clone().with_rev(leader.rev() + 100);
    log(
        "proclaim with a wrong revision",
        outcome(
            c.proclaim(
                "v4",
                Some(ProclaimOptions::new().with_leader(stale.clone())),
            )
            .await,
            |r| rev(r.header()).to_string(),
        ),
    );
    log(
        "resign with a wrong revision",
        outcome(
            c.resign(Some(ResignOptions::new().with_leader(stale)))
                .await,
            |r| rev(r.header()).to_string(),
        ),
    );

    // A second candidate waits; the first resigns; the second wins.
    let mut other = c.clone();
    let second = tokio::spawn(async move { other.campaign("e", "w", LEASE_B).await });
    let wait_for_second_key = async {
        loop {
            let r = c
                .get("e/", Some(etcd_client::GetOptions::new().with_prefix()))
                .await;
            if r.map(|r| r.kvs().len() == 2).unwrap_or(false) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    };
    if tokio::time::timeout(DEADLINE, wait_for_second_key)
        .await
        .is_err()
    {
        second.abort();
        log("second candidate", "never queued".into());
        return out;
    }
    log(
        "resign",
        outcome(
            c.resign(Some(ResignOptions::new().with_leader(leader)))
                .await,
            |r| rev(r.header()).to_string(),
        ),
    );
    match tokio::time::timeout(DEADLINE, second).await {
        Ok(won) => log(
            "second campaign",
            outcome(won.expect("task"), |r| {
                format!("rev={} {}", rev(r.header()), leader_key(r.leader()))
            }),
        ),
        Err(_) => {
            log("second campaign", "never won".into());
            return out;
        }
    }
    log(
        "leader after resign",
        outcome(c.leader("e").await, |r| {
            format!("rev={} {}", rev(r.header()), kv(r.kv()))
        }),
    );

    let r = c
        .lock("l", Some(LockOptions::new().with_lease(LEASE_A)))
        .await;
    log(
        "lock",
        outcome(r, |r| {
            format!(
                "rev={} key={}",
                rev(r.header()),
                String::from_utf8_lossy(r.key())
            )
        }),
    );
    log(
        "unlock",
        outcome(c.unlock(format!("l/{LEASE_A:x}")).await, |r| {
            rev(r.header()).to_string()
        }),
    );

    // Observe the current leader, then its proclaim. (etcd sends the
    // stream's headers with its first message: observe() returns only once
    // there is a leader.)
    let r = c.campaign("o", "o1", LEASE_B).await;
    let mut leader = LeaderKey::new();
    log(
        "campaign o",
        outcome(r, |r| {
            leader = r.leader().cloned().unwrap_or_default();
            leader_key(r.leader())
        }),
    );
    let mut observer = tokio::time::timeout(DEADLINE, c.observe("o"))
        .await
        .expect("observe answers")
        .expect("observe");
    for round in 0..2 {
        if round == 1 {
            c.proclaim(
                "o2",
                Some(ProclaimOptions::new().with_leader(leader.clone())),
            )
            .await
            .expect("proclaim o");
        }
        let seen = tokio::time::timeout(DEADLINE, observer.message()).await;
        let line = match seen {
            Ok(r) => outcome(r, |r| match r {
                Some(r) => format!("rev={} {}", rev(r.header()), kv(r.kv())),
                None => "end".into(),
            }),
            Err(_) => "nothing".into(),
        };
        log("observed", line);
    }
    out
}

#[tokio::test]
async fn election_and_lock_answer_as_etcd_3_5() {
    let etcd_dir = tempfile::tempdir().unwrap();
    let Some(reference) = testkit::start_reference_etcd(testkit::ETCD_35.0, etcd_dir.path()) else {
        eprintln!("etcd 3.5.1 not installed; skipping");
        return;
    };
    let oxcd_dir = tempfile::tempdir().unwrap();
    let oxcd = Process::start_oxcd(&testkit::oxcd_bin(), oxcd_dir.path(), &[]);

    let expected = session(&reference.endpoint).await;
    eprintln!("etcd 3.5.1:\n{}", expected.join("\n"));
    let got = session(&oxcd.endpoint).await;
    eprintln!("oxcd:\n{}", got.join("\n"));
    for (e, g) in expected.iter().zip(&got) {
        assert_eq!(g, e, "\nall of etcd's:\n{}", expected.join("\n"));
    }
    assert_eq!(got.len(), expected.len());
}
