//! `--discovery-srv`: members bootstrapped from DNS SRV records, as etcd
//! 3.5 does it. Each member runs in a network namespace whose resolv.conf
//! (`/etc/netns/<ns>/resolv.conf`, which `ip netns exec` mounts) names a
//! DNS server the test runs in the client namespace; nothing reaches a
//! real resolver. Where etcd 3.5.16 is installed, it is asked the same
//! records and must say the same.
//!
//! And `--discovery` (etcd's v2 discovery service), which oxcd refuses,
//! saying what to use instead.

use std::net::{Ipv4Addr, SocketAddr};
use std::path::Path;
use std::time::{Duration, Instant};

use etcd_client::Client;
use srv::zone::{Server, Zone};
use testkit::netns::NetnsCluster;
use testkit::{oxcd_bin, Process};

const DOMAIN: &str = "oxcd.test";
const ETCD: &str = "/opt/etcd-3.5.16/etcd";
/// How long a member that must fail at start may take to exit.
const EXIT_DEADLINE: Duration = Duration::from_secs(30);

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// `_etcd-server._tcp.oxcd.test` naming each member `mN.oxcd.test:2380`,
/// and the members' addresses.
fn records(cluster: &NetnsCluster) -> Zone {
    let mut zone = Zone::new();
    for i in 0..cluster.names.len() {
        let host = format!("m{}.{DOMAIN}", i + 1);
        let ip: Ipv4Addr = cluster.member_ip(i).parse().unwrap();
        zone = zone
            .with_srv(&format!("_etcd-server._tcp.{DOMAIN}"), 0, 0, 2380, &host)
            .with_a(&host, ip);
    }
    zone
}

/// The network, a DNS server in the client namespace serving `zone`, and
/// every namespace's resolv.conf naming it.
fn network_with_dns(n: usize) -> (NetnsCluster, Server) {
    let mut cluster = NetnsCluster::network(n, &[]);
    let zone = records(&cluster);
    let addr: SocketAddr = format!("{}:53", cluster.client_ip()).parse().unwrap();
    let server = cluster
        .in_client_ns(move || Server::start(addr, zone))
        .expect("a DNS server in the client namespace");
    cluster.set_resolv_conf(&format!("nameserver {}\n", cluster.client_ip()));
    (cluster, server)
}

/// A string field of a JSON log line.
fn field(line: &str, name: &str) -> Option<String> {
    let value: serde_json::Value = serde_json::from_str(line).ok()?;
    value.get(name)?.as_str().map(str::to_string)
}

/// The `node` of each "got bootstrap from DNS for etcd-server" line.
fn bootstrap_nodes(log: &[String]) -> Vec<String> {
    log.iter()
        .filter(|line| line.contains("\"msg\":\"got bootstrap from DNS for etcd-server\""))
        .filter_map(|line| field(line, "node"))
        .collect()
}

/// The `error` of the "discovery failed" line of a member that exited 1.
fn discovery_failure(mut p: Process) -> String {
    let status = p.wait_exit(EXIT_DEADLINE).expect("exits");
    assert_eq!(status.code(), Some(1), "{}", p.log_text());
    let line = p
        .wait_for_log("\"msg\":\"discovery failed\"", EXIT_DEADLINE)
        .unwrap_or_else(|| panic!("no 'discovery failed'; log:\n{}", p.log_text()));
    field(&line, "error").expect("an error field")
}

/// Member `i`'s flags, as the cluster starts it, without the bootstrap.
fn member_args(cluster: &NetnsCluster, i: usize, data_dir: &Path) -> Vec<String> {
    let ip = cluster.member_ip(i);
    vec![
        "--name".into(),
        cluster.names[i].clone(),
        "--data-dir".into(),
        data_dir.display().to_string(),
        "--listen-client-urls".into(),
        format!("http://{ip}:2379"),
        "--advertise-client-urls".into(),
        format!("http://{ip}:2379"),
        "--listen-peer-urls".into(),
        format!("http://{ip}:2380"),
        "--initial-advertise-peer-urls".into(),
        format!("http://{ip}:2380"),
        "--discovery-srv".into(),
        DOMAIN.into(),
    ]
}

/// The lines etcd logs about the records (those of `GetDNSClusterNames`
/// and `PeerURLsMapAndToken`), without their time and caller.
fn discovery_lines(log: &[String]) -> Vec<serde_json::Value> {
    const MESSAGES: [&str; 4] = [
        "get cluster for etcd-server-ssl SRV",
        "get cluster for etcd-server SRV",
        "failed to resolve during SRV discovery",
        "got bootstrap from DNS for etcd-server",
    ];
    log.iter()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .filter(|line| MESSAGES.iter().any(|m| line["msg"] == *m))
        .map(|mut line| {
            if let Some(fields) = line.as_object_mut() {
                fields.remove("ts");
                fields.remove("caller");
            }
            line
        })
        .collect()
}

/// What etcd 3.5.16 makes of the records as member `i` (run in its place
/// before it starts, stopped once it has said): its discovery lines.
fn etcd_discovery_lines(cluster: &NetnsCluster, i: usize) -> Option<Vec<serde_json::Value>> {
    if !Path::new(ETCD).exists() {
        eprintln!("skipping the comparison with {ETCD}: not installed");
        return None;
    }
    let dir = tempfile::tempdir().unwrap();
    let data_dir = dir.path().join("etcd");
    let args = member_args(cluster, i, &data_dir);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut etcd = cluster.launch_in_member_ns(i, Path::new(ETCD), &args, &data_dir);
    // the line after etcd's lines about the records
    etcd.wait_for_log("\"msg\":\"starting an etcd server\"", EXIT_DEADLINE)
        .or_else(|| etcd.wait_for_log("discovery failed", Duration::ZERO))
        .unwrap_or_else(|| panic!("etcd did not get past discovery; log:\n{}", etcd.log_text()));
    let lines = discovery_lines(&etcd.log_lines());
    etcd.kill9();
    Some(lines)
}

#[test]
fn a_cluster_bootstraps_from_srv_records_as_etcd() {
    let (mut cluster, dns) = network_with_dns(3);
    let etcd_said = etcd_discovery_lines(&cluster, 1);
    cluster.set_bootstrap(&["--discovery-srv", DOMAIN]);
    cluster.start_members();

    // each member is itself among the records, the others numbered
    let m2_log = cluster.members[1].as_ref().unwrap().log_lines();
    let said = bootstrap_nodes(&m2_log);
    assert_eq!(
        said,
        [
            "0=http://m1.oxcd.test:2380",
            "m2=http://m2.oxcd.test:2380",
            "1=http://m3.oxcd.test:2380"
        ]
    );
    // etcd 3.5.16 logs the same lines for the same records, field by field
    // (the services asked, what each found, the https one's error)
    if let Some(etcd_said) = etcd_said {
        assert_eq!(etcd_said.len(), 6, "{etcd_said:#?}");
        assert_eq!(discovery_lines(&m2_log), etcd_said);
    }
    let said = bootstrap_nodes(&cluster.members[0].as_ref().unwrap().log_lines());
    assert_eq!(said[0], "m1=http://m1.oxcd.test:2380");
    // both services were asked, the https one first
    let asked: Vec<String> = dns
        .questions()
        .into_iter()
        .filter(|(_, qtype)| *qtype == srv::wire::TYPE_SRV)
        .map(|(name, _)| name)
        .collect();
    assert_eq!(
        asked[..2],
        [
            "_etcd-server-ssl._tcp.oxcd.test.".to_string(),
            "_etcd-server._tcp.oxcd.test.".to_string()
        ]
    );

    let endpoints = cluster.endpoints();
    let ips: Vec<String> = (0..3).map(|i| cluster.member_ip(i)).collect();
    cluster.in_client_ns(move || {
        runtime().block_on(async move {
            // the members have published their names once the list has them
            let deadline = Instant::now() + Duration::from_secs(30);
            let mut client = Client::connect([&endpoints[0]], None).await.unwrap();
            let members = loop {
                let list = client.member_list().await.unwrap();
                let mut members: Vec<(String, Vec<String>, Vec<String>)> = list
                    .members()
                    .iter()
                    .map(|m| {
                        (
                            m.name().to_string(),
                            m.peer_urls().to_vec(),
                            m.client_urls().to_vec(),
                        )
                    })
                    .collect();
                members.sort();
                if members.iter().all(|(name, ..)| !name.is_empty()) || Instant::now() > deadline {
                    break members;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            };
            let expected: Vec<(String, Vec<String>, Vec<String>)> = (0..3)
                .map(|i| {
                    (
                        format!("m{}", i + 1),
                        vec![format!("http://m{}.oxcd.test:2380", i + 1)],
                        vec![format!("http://{}:2379", ips[i])],
                    )
                })
                .collect();
            assert_eq!(members, expected);
            for (i, endpoint) in endpoints.iter().enumerate() {
                let mut client = Client::connect([endpoint], None).await.unwrap();
                let key = format!("srv/{i}");
                client.put(key.as_str(), "v", None).await.unwrap();
                for other in &endpoints {
                    let mut reader = Client::connect([other], None).await.unwrap();
                    let got = reader.get(key.as_str(), None).await.unwrap();
                    assert_eq!(got.kvs().len(), 1, "{key} via {other}");
                }
            }
        })
    });

    // a restarted member has its cluster in its data dir: no SRV record is
    // asked (its peers' host names still are), as etcd's
    // isMemberInitialized; the members it bootstrapped with survive a crash
    let srv_questions = |dns: &Server| {
        dns.questions()
            .iter()
            .filter(|(_, qtype)| *qtype == srv::wire::TYPE_SRV)
            .count()
    };
    let asked_before = srv_questions(&dns);
    cluster.kill9(0);
    cluster.restart(0);
    let log = cluster.members[0].as_ref().unwrap().log_lines();
    assert!(bootstrap_nodes(&log).is_empty(), "{log:?}");
    assert_eq!(srv_questions(&dns), asked_before);
    assert!(
        !log.iter()
            .any(|line| line.contains("peer URLs of a member are unknown")),
        "{log:?}"
    );
    let endpoint = cluster.endpoint(0);
    cluster.in_client_ns(move || {
        runtime().block_on(async move {
            let mut client = Client::connect([&endpoint], None).await.unwrap();
            client.put("srv/after-restart", "v", None).await.unwrap();
            let got = client.get("srv/0", None).await.unwrap();
            assert_eq!(got.kvs().len(), 1);
        })
    });
}

#[test]
fn a_member_missing_from_the_records_is_refused_as_etcd() {
    let (cluster, _dns) = network_with_dns(1);
    let dir = tempfile::tempdir().unwrap();
    let ip = cluster.client_ip();
    let run = |bin: &Path, name: &str, extra: &[&str]| {
        let data_dir = dir.path().join(name);
        let mut args = vec![
            "--name".to_string(),
            "m4".into(),
            "--data-dir".into(),
            data_dir.display().to_string(),
            "--listen-client-urls".into(),
            format!("http://{ip}:2379"),
            "--advertise-client-urls".into(),
            format!("http://{ip}:2379"),
            "--listen-peer-urls".into(),
            format!("http://{ip}:2380"),
            "--initial-advertise-peer-urls".into(),
            format!("http://{ip}:2380"),
            "--discovery-srv".into(),
            DOMAIN.into(),
        ];
        args.extend(extra.iter().map(|s| s.to_string()));
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let error = discovery_failure(cluster.launch_in_client_ns(bin, &args, &data_dir));
        (error, data_dir)
    };

    let (error, data_dir) = run(&oxcd_bin(), "oxcd-missing", &[]);
    assert_eq!(
        error,
        "error setting up initial cluster: cannot find local etcd member \"m4\" in SRV records"
    );
    assert!(!data_dir.exists(), "nothing of the member is written");
    let (no_records, _) = run(&oxcd_bin(), "oxcd-nope", &["--discovery-srv-name", "nope"]);
    let server = format!("{ip}:53");
    assert_eq!(
        no_records,
        format!(
            "error setting up initial cluster: error querying DNS SRV records for _etcd-server-ssl-nope \
             lookup _etcd-server-ssl-nope._tcp.oxcd.test on {server}: no such host; error querying DNS \
             SRV records for _etcd-server-nope lookup _etcd-server-nope._tcp.oxcd.test on {server}: no such host"
        )
    );
    if Path::new(ETCD).exists() {
        assert_eq!(run(Path::new(ETCD), "etcd-missing", &[]).0, error);
        let etcd = run(
            Path::new(ETCD),
            "etcd-nope",
            &["--discovery-srv-name", "nope"],
        )
        .0;
        assert_eq!(etcd, no_records);
    } else {
        eprintln!("skipping the comparison with {ETCD}: not installed");
    }
}

#[test]
fn the_v2_discovery_service_is_refused_naming_the_alternatives() {
    let dir = tempfile::tempdir().unwrap();
    let mut p = Process::launch_oxcd(
        &oxcd_bin(),
        dir.path(),
        &[
            "--discovery",
            "https://discovery.etcd.io/3e86b59982e49066c5d813af1c2e2579cbf573de",
        ],
    );
    let status = p.wait_exit(EXIT_DEADLINE).expect("exits");
    assert_eq!(status.code(), Some(1));
    let log = p.log_text();
    assert!(
        log.contains(
            "--discovery is not supported by oxcd: oxcd does not support etcd's v2 discovery \
             service (a discovery URL); bootstrap with --initial-cluster, or from DNS SRV records \
             with --discovery-srv"
        ),
        "{log}"
    );
    // with another bootstrap flag, etcd's own refusal comes first
    let mut p = Process::launch_oxcd(
        &oxcd_bin(),
        dir.path(),
        &[
            "--discovery",
            "https://d.example/x",
            "--discovery-srv",
            DOMAIN,
        ],
    );
    assert_eq!(p.wait_exit(EXIT_DEADLINE).and_then(|s| s.code()), Some(1));
    let log = p.log_text();
    assert!(
        log.contains("multiple discovery or bootstrap flags are set. Choose one of \\\"initial-cluster\\\", \\\"discovery\\\" or \\\"discovery-srv\\\""),
        "{log}"
    );
}
