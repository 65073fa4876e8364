//! Plain HTTP on the client port next to gRPC, as etcd serves it: /health,
//! /version and /metrics (also on --listen-metrics-urls). The JSON gateway
//! has its own tests (gateway.rs).

use std::time::{Duration, Instant};

use serde_json::Value;
use testkit::http;
use testkit::http::sample;
use testkit::{Cluster, Process};

/// Elections here: 100 ms heartbeats, 1 s election timeout (etcd's defaults).
const ELECTION_DEADLINE: Duration = Duration::from_secs(15);
/// Polling interval while waiting for a condition (never a settle time).
const POLL: Duration = Duration::from_millis(50);

fn metrics(endpoint: &str) -> String {
    let response = http::get(endpoint, "/metrics").expect("GET /metrics");
    assert_eq!(response.status, 200, "{}", response.body);
    response.body
}

const REQUIRED_METRICS: &[&str] = &[
    "etcd_disk_wal_fsync_duration_seconds",
    "etcd_disk_backend_commit_duration_seconds",
    "etcd_server_has_leader",
    "etcd_server_is_leader",
    "etcd_server_leader_changes_seen_total",
    "etcd_server_proposals_committed_total",
    "etcd_server_proposals_applied_total",
    "etcd_server_proposals_pending",
    "etcd_server_proposals_failed_total",
    "etcd_mvcc_db_total_size_in_bytes",
    "etcd_mvcc_db_total_size_in_use_in_bytes",
    "etcd_debugging_mvcc_keys_total",
    "etcd_server_version",
    "etcd_cluster_version",
    "grpc_server_handled_total",
    "grpc_server_started_total",
    "grpc_server_msg_received_total",
    "grpc_server_msg_sent_total",
    "etcd_network_client_grpc_received_bytes_total",
    "etcd_network_client_grpc_sent_bytes_total",
    "etcd_mvcc_put_total",
    "etcd_mvcc_delete_total",
    "etcd_mvcc_range_total",
    "etcd_mvcc_txn_total",
    "etcd_server_apply_duration_seconds",
    "etcd_server_slow_apply_total",
    "etcd_disk_backend_defrag_duration_seconds",
    "etcd_disk_defrag_inflight",
    "etcd_disk_backend_snapshot_duration_seconds",
    "etcd_mvcc_hash_duration_seconds",
    "etcd_mvcc_hash_rev_duration_seconds",
    "etcd_debugging_mvcc_watcher_total",
    "etcd_debugging_mvcc_watch_stream_total",
    "etcd_debugging_mvcc_slow_watcher_total",
    "etcd_debugging_lease_granted_total",
    "etcd_debugging_server_lease_expired_total",
    "etcd_server_read_indexes_failed_total",
    "process_resident_memory_bytes",
    "process_cpu_seconds_total",
    "process_open_fds",
    "process_start_time_seconds",
];

#[test]
fn metrics_have_etcds_names_and_move_with_writes() {
    let dir = tempfile::tempdir().unwrap();
    let metrics_port = testkit::free_port();
    let metrics_url = format!("http://127.0.0.1:{metrics_port}");
    let oxcd = Process::start_oxcd(
        &testkit::oxcd_bin(),
        dir.path(),
        &["--listen-metrics-urls", &metrics_url],
    );
    let endpoint = &oxcd.endpoint;

    let before = metrics(endpoint);
    for name in REQUIRED_METRICS {
        assert!(
            before.contains(&format!("# TYPE {name} ")),
            "{name} is missing from /metrics:\n{before}"
        );
    }
    // etcd's buckets: 1 ms doubling 14 times.
    assert!(before.contains("etcd_disk_wal_fsync_duration_seconds_bucket{le=\"0.001\"}"));
    assert!(before.contains("etcd_disk_wal_fsync_duration_seconds_bucket{le=\"8.192\"}"));
    assert_eq!(sample(&before, "etcd_server_has_leader"), Some(1.0));
    assert_eq!(sample(&before, "etcd_server_is_leader"), Some(1.0));
    assert_eq!(
        sample(&before, "etcd_server_version{server_version=\"3.5.16\"}"),
        Some(1.0)
    );
    let fsyncs = sample(&before, "etcd_disk_wal_fsync_duration_seconds_count").unwrap();
    let range_ok = "grpc_server_handled_total{grpc_code=\"OK\",grpc_method=\"Range\",grpc_service=\"etcdserverpb.KV\",grpc_type=\"unary\"}";
    let ranges = sample(&before, range_ok).expect("series created up front");
    let watch_sent = "grpc_server_msg_sent_total{grpc_method=\"Watch\",grpc_service=\"etcdserverpb.Watch\",grpc_type=\"bidi_stream\"}";
    let watch_received = "grpc_server_msg_received_total{grpc_method=\"Watch\",grpc_service=\"etcdserverpb.Watch\",grpc_type=\"bidi_stream\"}";
    assert_eq!(sample(&before, watch_sent), Some(0.0));
    let sent_bytes = "etcd_network_client_grpc_sent_bytes_total";
    let received_bytes = "etcd_network_client_grpc_received_bytes_total";
    // Only `--metrics extensive` has the handling time histograms.
    assert!(!before.contains("grpc_server_handling_seconds"));

    // "key0" .. "key9", twice each.
    for round in 0..2 {
        for digit in ["MA", "MQ", "Mg", "Mw", "NA", "NQ", "Ng", "Nw", "OA", "OQ"] {
            let body = format!("{{\"key\":\"a2V5{digit}==\",\"value\":\"dg==\"}}");
            let put = http::post(endpoint, "/v3/kv/put", &body).unwrap();
            assert_eq!(put.status, 200, "round {round}: {}", put.body);
        }
    }
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let mut client = etcd_client::Client::connect([endpoint.as_str()], None)
            .await
            .unwrap();
        client.get("key", None).await.unwrap();
        // One watch stream: one create request, then the created response
        // and one response per event.
        let mut stream = client.watch("w", None).await.unwrap();
        for _ in 0..3 {
            client.put("w", "v", None).await.unwrap();
        }
        let mut events = 0;
        while events < 3 {
            let response = stream.message().await.unwrap().unwrap();
            events += response.events().len();
        }
        client.defragment().await.unwrap();
        client.hash_kv(0).await.unwrap();
    });

    let after = metrics(endpoint);
    let fsyncs_after = sample(&after, "etcd_disk_wal_fsync_duration_seconds_count").unwrap();
    assert!(
        fsyncs_after >= fsyncs + 1.0,
        "fsync count {fsyncs} -> {fsyncs_after}"
    );
    assert!(sample(&after, range_ok).unwrap() >= ranges + 1.0);
    assert_eq!(sample(&after, watch_received), Some(1.0));
    assert_eq!(sample(&after, "etcd_mvcc_put_total"), Some(23.0));
    assert_eq!(
        sample(&after, "etcd_disk_backend_defrag_duration_seconds_count"),
        Some(1.0)
    );
    assert_eq!(sample(&after, "etcd_disk_defrag_inflight"), Some(0.0));
    assert_eq!(
        sample(&after, "etcd_mvcc_hash_rev_duration_seconds_count"),
        Some(1.0)
    );
    assert!(sample(&after, "etcd_mvcc_range_total").unwrap() >= 1.0);
    assert!(
        sample(
            &after,
            "etcd_server_apply_duration_seconds_count{op=\"Put\",success=\"true\",version=\"v3\"}"
        )
        .unwrap()
            >= 23.0,
        "{after}"
    );
    assert!(
        sample(&after, watch_sent).unwrap() >= 2.0,
        "created + events: {after}"
    );
    // The range answered at least one empty header (~20 bytes) each way.
    assert!(sample(&after, sent_bytes).unwrap() > sample(&before, sent_bytes).unwrap() + 20.0);
    assert!(
        sample(&after, received_bytes).unwrap() > sample(&before, received_bytes).unwrap() + 3.0
    );
    assert!(sample(&after, "etcd_debugging_mvcc_keys_total").unwrap() >= 10.0);
    assert!(
        sample(&after, "etcd_server_proposals_applied_total").unwrap()
            > sample(&before, "etcd_server_proposals_applied_total").unwrap()
    );
    assert!(sample(&after, "etcd_disk_backend_commit_duration_seconds_count").is_some());

    // --listen-metrics-urls: /metrics and /health, nothing else.
    let extra = metrics(&metrics_url);
    assert!(extra.contains("# TYPE etcd_server_has_leader gauge"));
    let health = http::get(&metrics_url, "/health").unwrap();
    assert_eq!(health.status, 200);
    assert_eq!(http::get(&metrics_url, "/version").unwrap().status, 404);
}

#[test]
fn extensive_metrics_add_grpc_handling_time_histograms() {
    let dir = tempfile::tempdir().unwrap();
    let oxcd = Process::start_oxcd(
        &testkit::oxcd_bin(),
        dir.path(),
        &["--metrics", "extensive"],
    );
    let put = "grpc_server_handling_seconds_count{grpc_method=\"Put\",grpc_service=\"etcdserverpb.KV\",grpc_type=\"unary\"}";
    let before = metrics(&oxcd.endpoint);
    assert!(before.contains("# TYPE grpc_server_handling_seconds histogram"));
    assert!(before.contains("grpc_server_handling_seconds_bucket{grpc_method=\"Put\",grpc_service=\"etcdserverpb.KV\",grpc_type=\"unary\",le=\"0.005\"} 0"));
    assert_eq!(sample(&before, put), Some(0.0));
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let mut client = etcd_client::Client::connect([oxcd.endpoint.as_str()], None)
            .await
            .unwrap();
        client.put("k", "v", None).await.unwrap();
        client.put("k", "v", None).await.unwrap();
    });
    assert_eq!(sample(&metrics(&oxcd.endpoint), put), Some(2.0));
}

#[test]
fn health_and_version_answer_as_etcd_3_5() {
    let dir = tempfile::tempdir().unwrap();
    let oxcd = Process::start_oxcd(&testkit::oxcd_bin(), dir.path(), &[]);
    let endpoint = &oxcd.endpoint;

    let health = http::get(endpoint, "/health").unwrap();
    assert_eq!(health.status, 200);
    assert_eq!(health.body, r#"{"health":"true","reason":""}"#);
    assert_eq!(health.header("access-control-allow-origin"), Some("*"));
    let excluded = http::get(endpoint, "/health?exclude=NOSPACE&serializable=true").unwrap();
    assert_eq!(excluded.status, 200);
    let post = http::post(endpoint, "/health", "").unwrap();
    assert_eq!(post.status, 405);
    assert_eq!(post.header("allow"), Some("GET"));

    let version = http::get(endpoint, "/version").unwrap();
    assert_eq!(version.status, 200);
    assert_eq!(version.header("content-type"), Some("application/json"));
    let parsed: Value = serde_json::from_str(&version.body).unwrap();
    assert_eq!(parsed["etcdserver"], "3.5.16");
    assert_eq!(parsed["etcdcluster"], "3.5.0");
    assert!(parsed["oxcd"].is_string(), "{}", version.body);
    assert!(version
        .body
        .starts_with(r#"{"etcdserver":"3.5.16","etcdcluster":"3.5.0""#));

    let missing = http::get(endpoint, "/nope").unwrap();
    assert_eq!(missing.status, 404);
    assert_eq!(missing.body, "404 page not found\n");

    // Failpoints are armed only in a build with them (tests/failpoints.rs).
    if cfg!(not(feature = "failpoints")) {
        let list = http::get(endpoint, "/debug/failpoints").unwrap();
        assert_eq!(
            (list.status, list.body.as_str()),
            (404, "404 page not found\n")
        );
        let put = http::request(
            endpoint,
            "PUT",
            "/debug/failpoints/raftAfterSave",
            Some("panic"),
        );
        assert_eq!(put.unwrap().status, 404);
    }
}

/// Every sample whose series starts with `prefix`: (series, value).
fn series<'a>(text: &'a str, prefix: &'a str) -> impl Iterator<Item = (&'a str, f64)> + 'a {
    text.lines().filter_map(move |line| {
        if !line.starts_with(prefix) {
            return None;
        }
        let (name, value) = line.rsplit_once(' ')?;
        Some((name, value.parse().ok()?))
    })
}

/// Polls `/metrics` of member `i` until `check` accepts it.
fn wait_metrics(cluster: &Cluster, i: usize, what: &str, check: impl Fn(&str) -> bool) -> String {
    let deadline = Instant::now() + ELECTION_DEADLINE;
    loop {
        if let Ok(response) = http::get(&cluster.endpoint(i), "/metrics") {
            if check(&response.body) {
                return response.body;
            }
        }
        assert!(Instant::now() < deadline, "member {i}: {what}");
        std::thread::sleep(POLL);
    }
}

#[test]
fn leader_changes_are_counted_and_health_fails_without_leader() {
    let mut cluster = Cluster::start(3, &[]);
    let deadline = Instant::now() + ELECTION_DEADLINE;
    let leader = loop {
        let found = (0..3).find(|i| {
            http::get(&cluster.endpoint(*i), "/metrics")
                .is_ok_and(|r| sample(&r.body, "etcd_server_is_leader") == Some(1.0))
        });
        if let Some(i) = found {
            break i;
        }
        assert!(Instant::now() < deadline, "no member reports leading");
        std::thread::sleep(POLL);
    };
    let survivor = (leader + 1) % 3;
    // /debug/vars: the leader's raft status has every member's progress, a
    // follower's none, as etcd's
    let vars = |i: usize| -> Value {
        serde_json::from_str(&http::get(&cluster.endpoint(i), "/debug/vars").unwrap().body).unwrap()
    };
    let leading = vars(leader);
    assert_eq!(leading["raft.status"]["raftState"], "StateLeader");
    assert_eq!(
        leading["raft.status"]["progress"]
            .as_object()
            .unwrap()
            .len(),
        3,
        "{leading}"
    );
    let following = vars(survivor);
    assert_eq!(following["raft.status"]["raftState"], "StateFollower");
    assert_eq!(
        following["raft.status"]["lead"],
        leading["raft.status"]["id"]
    );
    assert!(following["raft.status"]["progress"]
        .as_object()
        .unwrap()
        .is_empty());
    // Peer network metrics: the leader's two peers connected, probed, sent to.
    let text = wait_metrics(&cluster, leader, "both peers probed", |text| {
        series(text, "etcd_network_peer_round_trip_time_seconds_count{")
            .filter(|(_, n)| *n >= 1.0)
            .count()
            == 2
    });
    let active: Vec<_> = series(&text, "etcd_network_active_peers{").collect();
    assert_eq!(active.len(), 2, "{text}");
    assert!(active.iter().all(|(_, n)| *n == 1.0), "{active:?}");
    assert!(
        series(&text, "etcd_network_peer_sent_bytes_total{").all(|(_, n)| n > 0.0),
        "{text}"
    );
    assert!(text.contains("etcd_network_peer_round_trip_time_seconds_bucket{To=\""));
    assert!(
        text.contains(",le=\"3.2768\"}"),
        "etcd 3.5's 16 RTT buckets"
    );
    let seen = sample(
        &metrics(&cluster.endpoint(survivor)),
        "etcd_server_leader_changes_seen_total",
    )
    .unwrap();
    assert!(seen >= 1.0);

    cluster.kill9(leader);
    wait_metrics(&cluster, survivor, "a new leader is counted", |text| {
        sample(text, "etcd_server_leader_changes_seen_total").is_some_and(|n| n > seen)
            && sample(text, "etcd_server_has_leader") == Some(1.0)
    });
    let healthy = http::get(&cluster.endpoint(survivor), "/health").unwrap();
    assert_eq!(healthy.status, 200, "{}", healthy.body);
    wait_metrics(
        &cluster,
        survivor,
        "the dead leader's link is down",
        |text| {
            series(text, "etcd_network_active_peers{").any(|(_, n)| n == 0.0)
                && series(text, "etcd_network_disconnected_peers_total{").any(|(_, n)| n >= 1.0)
        },
    );

    // Two of three gone: no quorum, no leader, /health says so (on the
    // way there a read in flight may fail first: "RANGE ERROR:...").
    cluster.kill9((leader + 2) % 3);
    let deadline = Instant::now() + 2 * ELECTION_DEADLINE;
    let unhealthy = loop {
        let response = http::get(&cluster.endpoint(survivor), "/health").unwrap();
        if response.status == 503 && response.body.contains("RAFT NO LEADER") {
            break response;
        }
        assert!(
            Instant::now() < deadline,
            "still healthy: {}",
            response.body
        );
        std::thread::sleep(POLL);
    };
    assert_eq!(
        unhealthy.body,
        "{\"health\":\"false\",\"reason\":\"RAFT NO LEADER\"}\n"
    );
    assert_eq!(
        unhealthy.header("content-type"),
        Some("text/plain; charset=utf-8")
    );
    // /readyz needs a read through raft, /livez a local one (etcd 3.5.16)
    let readyz = http::get(&cluster.endpoint(survivor), "/readyz").unwrap();
    assert_eq!(readyz.status, 503, "{}", readyz.body);
    assert!(
        readyz.body.contains("[-]linearizable_read failed: ")
            && readyz.body.contains("[+]serializable_read ok\n"),
        "{}",
        readyz.body
    );
    assert_eq!(
        http::get(&cluster.endpoint(survivor), "/livez")
            .unwrap()
            .status,
        200
    );
    let text = metrics(&cluster.endpoint(survivor));
    assert_eq!(sample(&text, "etcd_server_has_leader"), Some(0.0));
    assert!(sample(&text, "etcd_server_health_failures").unwrap() >= 1.0);
}

#[test]
fn health_reports_an_active_alarm_unless_excluded() {
    let dir = tempfile::tempdir().unwrap();
    let oxcd = Process::start_oxcd(&testkit::oxcd_bin(), dir.path(), &[]);
    let endpoint = oxcd.endpoint.clone();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let alarm = |action| {
        runtime.block_on(async {
            let mut client = etcd_client::Client::connect([endpoint.as_str()], None)
                .await
                .unwrap();
            let member = client.status().await.unwrap().header().unwrap().member_id();
            let mut options = etcd_client::AlarmOptions::new();
            options.with_member(member);
            client
                .alarm(action, etcd_client::AlarmType::Nospace, Some(options))
                .await
                .unwrap();
        })
    };
    alarm(etcd_client::AlarmAction::Activate);

    let unhealthy = http::get(&endpoint, "/health").unwrap();
    assert_eq!(unhealthy.status, 503);
    assert_eq!(
        unhealthy.body,
        "{\"health\":\"false\",\"reason\":\"ALARM NOSPACE\"}\n"
    );
    let excluded = http::get(&endpoint, "/health?exclude=NOSPACE").unwrap();
    assert_eq!(excluded.status, 200, "{}", excluded.body);

    alarm(etcd_client::AlarmAction::Deactivate);
    assert_eq!(http::get(&endpoint, "/health").unwrap().status, 200);
}

/// etcd 3.5.16's families that oxcd does not have, each with its reason
/// (README, "What works"; docs/ARCHITECTURE.md, Metrics).
const ABSENT_FAMILIES: &[&str] = &[
    // bbolt's commit phases: redb commits in one call, with no rebalance,
    // spill or separate write phase to time
    "etcd_debugging_disk_backend_commit_rebalance_duration_seconds",
    "etcd_debugging_disk_backend_commit_spill_duration_seconds",
    "etcd_debugging_disk_backend_commit_write_duration_seconds",
    // the v2 store, which oxcd does not have (v2 is not served)
    "etcd_debugging_store_expires_total",
    "etcd_debugging_store_reads_total",
    "etcd_debugging_store_watch_requests_total",
    "etcd_debugging_store_watchers",
    "etcd_debugging_store_writes_total",
    // the gRPC proxy's cache (etcd registers them in the server, always 0)
    "etcd_grpc_proxy_cache_hits_total",
    "etcd_grpc_proxy_cache_keys_total",
    "etcd_grpc_proxy_cache_misses_total",
    "etcd_grpc_proxy_events_coalescing_total",
    "etcd_grpc_proxy_watchers_coalescing_total",
    // no Go runtime
    "etcd_server_go_version",
];

/// A family as /metrics shows it: type, label names (le aside), bucket
/// bounds, help.
#[derive(Debug, Default, PartialEq)]
struct Family {
    kind: String,
    labels: std::collections::BTreeSet<String>,
    buckets: Vec<f64>,
    help: String,
}

/// Every family in `text`.
fn families(text: &str) -> std::collections::BTreeMap<String, Family> {
    let mut families = std::collections::BTreeMap::<String, Family>::new();
    let label = regex::Regex::new(r#"([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)""#).unwrap();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# HELP ") {
            let (name, help) = rest.split_once(' ').unwrap_or((rest, ""));
            families.entry(name.into()).or_default().help = help.into();
        } else if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').unwrap();
            families.entry(name.into()).or_default().kind = kind.into();
        } else if !line.is_empty() && !line.starts_with('#') {
            let series = line.split(' ').next().unwrap();
            let (metric, labels) = series.split_once('{').unwrap_or((series, ""));
            let name = ["_bucket", "_sum", "_count"]
                .iter()
                .find_map(|suffix| {
                    metric
                        .strip_suffix(suffix)
                        .filter(|base| families.contains_key(*base))
                })
                .unwrap_or(metric)
                .to_string();
            let family = families.entry(name).or_default();
            for found in label.captures_iter(labels) {
                match &found[1] {
                    "le" => {
                        let bound: f64 = found[2].replace("+Inf", "inf").parse().unwrap();
                        if !family.buckets.contains(&bound) {
                            family.buckets.push(bound);
                        }
                    }
                    name => {
                        family.labels.insert(name.to_string());
                    }
                }
            }
        }
    }
    for family in families.values_mut() {
        family.buckets.sort_by(f64::total_cmp);
    }
    families
}

#[test]
fn metric_families_are_etcd_3_5_16s() {
    let fixture = include_str!("fixtures/etcd-3.5.16-metric-families.tsv");
    let dir = tempfile::tempdir().unwrap();
    let oxcd = Process::start_oxcd(&testkit::oxcd_bin(), dir.path(), &[]);
    // a labeled family shows once it has a series: one request for
    // etcd_server_client_requests_total
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let mut client = etcd_client::Client::connect([oxcd.endpoint.as_str()], None)
            .await
            .unwrap();
        client.put("k", "v", None).await.unwrap();
    });
    let ours = families(&metrics(&oxcd.endpoint));
    let mut missing = Vec::new();
    for line in fixture.lines().filter(|l| !l.starts_with('#')) {
        let fields: Vec<&str> = line.splitn(5, '\t').collect();
        let [name, kind, labels, buckets, help] = fields[..] else {
            panic!("a fixture line has five fields: {line}");
        };
        if ABSENT_FAMILIES.contains(&name) {
            assert!(!ours.contains_key(name), "{name} is listed as absent");
            continue;
        }
        let Some(family) = ours.get(name) else {
            missing.push(name.to_string());
            continue;
        };
        let expected = Family {
            kind: kind.into(),
            labels: labels
                .split(',')
                .filter(|l| !l.is_empty())
                .map(String::from)
                .collect(),
            buckets: buckets
                .split(',')
                .filter(|b| !b.is_empty())
                .map(|b| b.replace("+Inf", "inf").parse().unwrap())
                .collect(),
            help: help.into(),
        };
        assert_eq!(family, &expected, "{name}");
    }
    assert!(
        missing.is_empty(),
        "etcd 3.5.16's families missing: {missing:?}"
    );
}

#[test]
fn debug_vars_has_etcds_keys_and_takes_get_only() {
    let dir = tempfile::tempdir().unwrap();
    let oxcd = Process::start_oxcd(&testkit::oxcd_bin(), dir.path(), &[]);
    let response = http::get(&oxcd.endpoint, "/debug/vars").unwrap();
    assert_eq!(response.status, 200, "{}", response.body);
    let vars: Value = serde_json::from_str(&response.body).unwrap();
    let keys: Vec<&str> = vars
        .as_object()
        .unwrap()
        .keys()
        .map(|k| k.as_str())
        .collect();
    assert_eq!(
        keys,
        [
            "cmdline",
            "file_descriptor_limit",
            "memstats",
            "raft.status"
        ]
    );
    assert!(vars["cmdline"][0].as_str().unwrap().ends_with("oxcd"));
    assert!(vars["file_descriptor_limit"].as_u64().unwrap() > 0);
    for key in [
        "Alloc",
        "TotalAlloc",
        "Sys",
        "HeapAlloc",
        "NumGC",
        "PauseNs",
        "BySize",
    ] {
        assert!(vars["memstats"].get(key).is_some(), "memstats.{key}");
    }
    let raft = &vars["raft.status"];
    let id = raft["id"].as_str().unwrap();
    assert_eq!(raft["lead"].as_str(), Some(id));
    assert_eq!(raft["vote"].as_str(), Some(id));
    assert_eq!(raft["raftState"], "StateLeader");
    assert_eq!(raft["leadtransferee"], "0");
    assert!(raft["term"].as_u64().unwrap() >= 1);
    assert!(raft["commit"].as_u64().unwrap() >= raft["applied"].as_u64().unwrap());
    assert_eq!(raft["progress"][id]["state"], "StateReplicate");
    assert!(
        raft["progress"][id]["next"].as_u64().unwrap()
            > raft["progress"][id]["match"].as_u64().unwrap()
    );
    let post = http::post(&oxcd.endpoint, "/debug/vars", "").unwrap();
    assert_eq!(post.status, 405);
    // pprof is off without --enable-pprof or --log-level=debug
    assert_eq!(
        http::get(&oxcd.endpoint, "/debug/pprof/").unwrap().status,
        404
    );
}

/// One GET with the raw answer: (status, body bytes). The body of a
/// profile is binary; `Connection: close` ends it.
fn get_bytes(endpoint: &str, path: &str) -> (u16, Vec<u8>) {
    use std::io::{Read, Write};
    let address = endpoint.trim_start_matches("http://");
    let mut stream = std::net::TcpStream::connect(address).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: {address}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut answer = Vec::new();
    stream.read_to_end(&mut answer).unwrap();
    let split = answer
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .expect("a header block");
    let head = String::from_utf8_lossy(&answer[..split]).to_string();
    assert!(
        !head
            .to_ascii_lowercase()
            .contains("transfer-encoding: chunked"),
        "{head}"
    );
    let status = head.split(' ').nth(1).unwrap().parse().unwrap();
    (status, answer[split + 4..].to_vec())
}

#[test]
fn pprof_serves_a_cpu_profile_and_a_heap_summary_with_enable_pprof() {
    use pprof::protos::Message;
    use std::io::Read;
    let dir = tempfile::tempdir().unwrap();
    let oxcd = Process::start_oxcd(&testkit::oxcd_bin(), dir.path(), &["--enable-pprof"]);
    let (status, gzipped) = get_bytes(&oxcd.endpoint, "/debug/pprof/profile?seconds=1");
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&gzipped));
    assert_eq!(&gzipped[..2], &[0x1f, 0x8b], "gzip's magic");
    let mut raw = Vec::new();
    flate2::read::GzDecoder::new(&gzipped[..])
        .read_to_end(&mut raw)
        .unwrap();
    let profile = pprof::protos::Profile::decode(&raw[..]).unwrap();
    let types: Vec<&str> = profile
        .sample_type
        .iter()
        .map(|t| profile.string_table[t.ty as usize].as_str())
        .collect();
    // Go's CPU profiles: samples/count and cpu/nanoseconds
    assert_eq!(types, ["samples", "cpu"]);
    assert!(profile.duration_nanos >= 1_000_000_000);
    let heap = http::get(&oxcd.endpoint, "/debug/pprof/heap").unwrap();
    assert_eq!(heap.status, 200);
    assert!(heap.body.contains("VmRSS:"), "{}", heap.body);
    assert_eq!(
        http::get(&oxcd.endpoint, "/debug/pprof/goroutine")
            .unwrap()
            .status,
        404
    );
    assert_eq!(
        http::get(&oxcd.endpoint, "/debug/pprof/").unwrap().status,
        200
    );
    assert_eq!(
        http::post(&oxcd.endpoint, "/debug/pprof/heap", "")
            .unwrap()
            .status,
        405
    );
}

/// etcd serves /debug/pprof at a debug log level too (embed/etcd.go).
#[test]
fn pprof_is_served_at_a_debug_log_level() {
    let dir = tempfile::tempdir().unwrap();
    let oxcd = Process::start_oxcd(&testkit::oxcd_bin(), dir.path(), &["--log-level", "debug"]);
    assert_eq!(
        http::get(&oxcd.endpoint, "/debug/pprof/heap")
            .unwrap()
            .status,
        200
    );
}
