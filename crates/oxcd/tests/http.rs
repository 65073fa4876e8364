//! Plain HTTP on the client port next to gRPC, as etcd serves it: /health,
//! /version, /metrics (also on --listen-metrics-urls) and the JSON gateway,
//! whose answers are compared with etcd 3.4.23's for the same requests.

use std::time::{Duration, Instant};

use regex::Regex;
use serde_json::Value;
use testkit::http::{self, LineStream};
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

/// The value of the sample `series` (name plus labels, exactly as printed).
fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|line| line.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
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
        sample(&before, "etcd_server_version{server_version=\"3.5.13\"}"),
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
    assert_eq!(parsed["etcdserver"], "3.5.13");
    assert_eq!(parsed["etcdcluster"], "3.5.0");
    assert!(parsed["oxcd"].is_string(), "{}", version.body);
    assert!(version
        .body
        .starts_with(r#"{"etcdserver":"3.5.13","etcdcluster":"3.5.0""#));

    let missing = http::get(endpoint, "/nope").unwrap();
    assert_eq!(missing.status, 404);
    assert_eq!(missing.body, "404 page not found\n");
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
    let text = metrics(&cluster.endpoint(survivor));
    assert_eq!(sample(&text, "etcd_server_has_leader"), Some(0.0));
    assert!(sample(&text, "etcd_server_health_failures").unwrap() >= 1.0);
}

/// IDs, terms, ports, sizes and backend hashes differ between two members;
/// the rest must not.
fn mask(text: &str) -> String {
    let ids = Regex::new(r#""(cluster_id|member_id|raft_term|leader|ID|raftTerm)":"\d+""#).unwrap();
    let urls = Regex::new(r#"http://127\.0\.0\.1:\d+"#).unwrap();
    let hashes = Regex::new(r#""hash":\d+"#).unwrap();
    let text = ids.replace_all(text, "\"$1\":\"N\"");
    let text = hashes.replace_all(&text, "\"hash\":N");
    urls.replace_all(&text, "http://127.0.0.1:PORT")
        .into_owned()
}

struct Step {
    method: &'static str,
    path: &'static str,
    body: &'static str,
}

const fn post(path: &'static str, body: &'static str) -> Step {
    Step {
        method: "POST",
        path,
        body,
    }
}

fn gateway_session() -> Vec<Step> {
    vec![
        post("/v3/kv/put", r#"{"key":"Zm9v","value":"YmFy"}"#),
        post(
            "/v3/kv/put",
            r#"{"key":"Zm9v","value":"YmF6","prev_kv":true}"#,
        ),
        post("/v3/kv/range", r#"{"key":"Zm9v"}"#),
        post("/v3/kv/range", r#"{"key":"Zm9v","count_only":true}"#),
        post("/v3/kv/range", r#"{"key":"AA==","range_end":"AA=="}"#),
        post(
            "/v3/kv/range",
            r#"{"key":"Zm9v","keysOnly":true,"limit":"1"}"#,
        ),
        post("/v3/kv/range", r#"{}"#),
        post("/v3/kv/put", r#"{}"#),
        post("/v3/kv/range", r#"{"key":"bm9uZQ=="}"#),
        post("/v3/kv/put", r#"{"key":"Zm9vMQ==","value":"MQ=="}"#),
        post("/v3/kv/put", r#"{"key":"Zm9vMg==","value":"Mg=="}"#),
        post(
            "/v3/kv/range",
            r#"{"key":"Zm9v","range_end":"Zm9w","sort_order":"DESCEND","sort_target":"KEY","limit":2}"#,
        ),
        post(
            "/v3/kv/deleterange",
            r#"{"key":"Zm9vMQ==","range_end":"Zm9vMw==","prev_kv":true}"#,
        ),
        post(
            "/v3/kv/txn",
            r#"{"compare":[{"key":"Zm9v","target":"VERSION","result":"EQUAL","version":"0"}],"success":[{"request_put":{"key":"Zm9v","value":"MQ=="}}],"failure":[{"request_range":{"key":"Zm9v"}}]}"#,
        ),
        post(
            "/v3/kv/txn",
            r#"{"compare":[{"key":"Zm9v","target":"VALUE","result":"EQUAL","value":"YmF6"}],"success":[{"request_delete_range":{"key":"Zm9v"}}],"failure":[{"request_range":{"key":"Zm9v"}},{"request_put":{"key":"YmFy","value":"MQ==","prev_kv":true}}]}"#,
        ),
        post("/v3/kv/deleterange", r#"{"key":"Zm9v","prev_kv":true}"#),
        post("/v3/kv/compaction", r#"{"revision":"3"}"#),
        post("/v3/kv/compaction", r#"{"revision":"200"}"#),
        post("/v3/kv/range", r#"{"key":"Zm9v","revision":"2"}"#),
        post("/v3/kv/range", r#"{"key":"Zm9v","revision":"1000"}"#),
        post("/v3beta/kv/range", r#"{"key":"YmFy"}"#),
        post("/v3alpha/kv/range", r#"{"key":"YmFy"}"#),
        post("/v3/lease/grant", r#"{"TTL":60,"ID":1234}"#),
        post(
            "/v3/kv/put",
            r#"{"key":"bGs=","value":"dg==","lease":"1234"}"#,
        ),
        post("/v3/kv/lease/leases", r#"{}"#),
        // One keep-alive stream per request here (the body ends it); see
        // gateway_keep_alive_stream_renews_in_order for a long one.
        post("/v3/lease/keepalive", r#"{"ID":1234}"#),
        post("/v3/lease/keepalive", r#"{"ID":"1234"} {"ID":5}"#),
        post("/v3beta/lease/keepalive", r#"{"ID":"1234"}"#),
        post("/v3/lease/keepalive", ""),
        post("/v3/lease/keepalive", "[1]"),
        post("/v3/lease/keepalive", "xx"),
        post("/v3/lease/keepalive", r#"{"ID":"1234"} xx"#),
        post("/v3/kv/range", r#"{"key":"Zm9v"} xx"#),
        post("/v3/kv/range", "[1,]"),
        post("/v3/watch", "[1]"),
        Step {
            method: "GET",
            path: "/v3/lease/keepalive",
            body: "",
        },
        post("/v3/lease/revoke", r#"{"ID":"1234"}"#),
        post("/v3/kv/lease/revoke", r#"{"ID":1234}"#),
        post("/v3/lease/timetolive", r#"{"ID":1234,"keys":true}"#),
        post("/v3/cluster/member/list", r#"{}"#),
        post("/v3/maintenance/hash", r#"{}"#),
        post("/v3/maintenance/defragment", r#"{}"#),
        post("/v3beta/maintenance/defragment", ""),
        post("/v3/maintenance/hashkv", r#"{}"#),
        post("/v3/lock/unlock", r#"{}"#),
        post("/v3/lock/lock", r#"{"name":"bGs=","lease":"999"}"#),
        post("/v3/election/leader", r#"{"name":"bm9uZQ=="}"#),
        post("/v3/election/proclaim", r#"{}"#),
        post("/v3/election/resign", r#"{}"#),
        post(
            "/v3/election/proclaim",
            r#"{"leader":{"name":"ZWw=","key":"ZWwvNGQ=","rev":"1","lease":"1234"},"value":"djI="}"#,
        ),
        Step {
            method: "GET",
            path: "/v3/kv/range",
            body: "",
        },
    ]
}

fn run(endpoint: &str, step: &Step) -> http::Response {
    http::request(endpoint, step.method, step.path, Some(step.body))
        .unwrap_or_else(|e| panic!("{} {}: {e}", step.method, step.path))
}

/// Compares one answer: status, then the body byte for byte when it
/// succeeded (errors: the same fields and values; etcd 3.5 orders them
/// differently from 3.4 and we answer as 3.5).
fn compare(step: &Step, want: &http::Response, got: &http::Response) -> Option<String> {
    let same_body = if want.status == 200 {
        mask(&want.body) == mask(&got.body)
    } else {
        match (
            serde_json::from_str::<Value>(&want.body),
            serde_json::from_str::<Value>(&got.body),
        ) {
            (Ok(w), Ok(g)) => w == g,
            _ => want.body == got.body,
        }
    };
    (want.status != got.status || !same_body).then(|| {
        format!(
            "{} {} {}\n--- etcd: {} {}\n--- oxcd: {} {}",
            step.method, step.path, step.body, want.status, want.body, got.status, got.body
        )
    })
}

#[test]
fn gateway_answers_match_etcd_3_4() {
    let ref_dir = tempfile::tempdir().unwrap();
    let etcd = testkit::start_reference_etcd(testkit::ETCD_34.0, ref_dir.path())
        .expect("etcd 3.4.23 is installed (.ci/run installs it)");
    let ox_dir = tempfile::tempdir().unwrap();
    let oxcd = Process::start_oxcd(&testkit::oxcd_bin(), ox_dir.path(), &[]);

    let mut mismatches = Vec::new();
    for step in gateway_session() {
        let want = run(&etcd.endpoint, &step);
        let got = run(&oxcd.endpoint, &step);
        assert_eq!(
            got.header("access-control-allow-origin"),
            Some("*"),
            "{}",
            step.path
        );
        if want.status == 200 {
            assert_eq!(
                got.header("content-type"),
                want.header("content-type"),
                "{}",
                step.path
            );
        }
        mismatches.extend(compare(&step, &want, &got));
    }

    // A body that is not JSON: the same status and code (we word the
    // common syntax errors as Go does, not this one).
    let want = http::post(&etcd.endpoint, "/v3/kv/range", "not json").unwrap();
    let got = http::post(&oxcd.endpoint, "/v3/kv/range", "not json").unwrap();
    assert_eq!((want.status, got.status), (400, 400));
    let code = |r: &http::Response| serde_json::from_str::<Value>(&r.body).unwrap()["code"].clone();
    assert_eq!(code(&want), code(&got));

    // Status: the same fields (their values are each member's own).
    let keys = |endpoint: &str| {
        let r = http::post(endpoint, "/v3/maintenance/status", "{}").unwrap();
        assert_eq!(r.status, 200, "{}", r.body);
        let parsed: Value = serde_json::from_str(&r.body).unwrap();
        let mut keys: Vec<String> = parsed.as_object().unwrap().keys().cloned().collect();
        keys.sort();
        keys
    };
    assert_eq!(keys(&etcd.endpoint), keys(&oxcd.endpoint));

    // Watch: the stream of results for the same writes.
    let watch = |endpoint: &str| {
        let mut stream = LineStream::open(
            endpoint,
            "/v3/watch",
            r#"{"create_request":{"key":"d2F0Y2g=","prev_kv":true}}"#,
        )
        .unwrap();
        assert_eq!(stream.status, 200);
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut lines = vec![stream.next_line(deadline).expect("created")];
        for body in [
            r#"{"key":"d2F0Y2g=","value":"MQ=="}"#,
            r#"{"key":"d2F0Y2g=","value":"Mg=="}"#,
        ] {
            assert_eq!(
                http::post(endpoint, "/v3/kv/put", body).unwrap().status,
                200
            );
        }
        let delete = http::post(endpoint, "/v3/kv/deleterange", r#"{"key":"d2F0Y2g="}"#);
        assert_eq!(delete.unwrap().status, 200);
        for _ in 0..3 {
            lines.push(stream.next_line(deadline).expect("an event"));
        }
        mask(&lines.join("\n"))
    };
    let want = watch(&etcd.endpoint);
    let got = watch(&oxcd.endpoint);
    if want != got {
        mismatches.push(format!("watch\n--- etcd:\n{want}\n--- oxcd:\n{got}"));
    }

    assert!(
        mismatches.is_empty(),
        "{} answers differ:\n{}",
        mismatches.len(),
        mismatches.join("\n")
    );
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

/// POSTs one request; its status and masked body.
fn answer(endpoint: &str, path: &str, body: &str) -> (u16, String) {
    let response = http::post(endpoint, path, body).unwrap_or_else(|e| panic!("{path}: {e}"));
    (response.status, mask(&response.body))
}

fn parse(text: &str) -> Value {
    serde_json::from_str(text).unwrap_or_else(|e| panic!("{e}: {text}"))
}

/// The length of what standard base64 `text` encodes.
fn base64_len(text: &str) -> u64 {
    let padding = text.bytes().rev().take_while(|b| *b == b'=').count();
    (text.len() / 4 * 3 - padding) as u64
}

/// Where etcd 3.4.23 answers differently from 3.5.1, our answers are
/// 3.5.1's (checked with curl), or our gRPC's where we do not implement
/// the method: 3.4 answers Alarm without a header, maps FailedPrecondition
/// to 412, and serves no downgrade route.
#[test]
fn gateway_maintenance_and_cluster_answer_as_etcd_3_5() {
    let dir = tempfile::tempdir().unwrap();
    let oxcd = Process::start_oxcd(&testkit::oxcd_bin(), dir.path(), &[]);
    let endpoint = oxcd.endpoint.as_str();
    let header = r#""header":{"cluster_id":"N","member_id":"N","revision":"1","raft_term":"N"}"#;

    let alarm = "/v3/maintenance/alarm";
    let none = (200, format!("{{{header}}}"));
    let nospace = (
        200,
        format!(r#"{{{header},"alarms":[{{"memberID":"1","alarm":"NOSPACE"}}]}}"#),
    );
    assert_eq!(answer(endpoint, alarm, "{}"), none);
    let activate = r#"{"action":"ACTIVATE","memberID":"1","alarm":"NOSPACE"}"#;
    assert_eq!(answer(endpoint, alarm, activate), nospace);
    assert_eq!(answer(endpoint, alarm, r#"{"action":"GET"}"#), nospace);
    let deactivate = r#"{"action":"DEACTIVATE","memberID":"1","alarm":1}"#;
    assert_eq!(answer(endpoint, alarm, deactivate), nospace);
    assert_eq!(answer(endpoint, alarm, r#"{"action":0}"#), none);
    // 3.4.23 names the enum etcdserverpb.AlarmRequest_AlarmAction.
    let bogus = r#"unknown value \"\\\"BOGUS\\\"\" for enum etcdserverpb.AlarmRequest.AlarmAction"#;
    assert_eq!(
        answer(endpoint, alarm, r#"{"action":"BOGUS"}"#),
        (
            400,
            format!(r#"{{"error":"{bogus}","code":3,"message":"{bogus}"}}"#)
        )
    );

    let transfer = answer(
        endpoint,
        "/v3/maintenance/transfer-leadership",
        r#"{"targetID":"5"}"#,
    );
    assert_eq!(
        transfer,
        (
            400,
            r#"{"error":"etcdserver: bad leader transferee","code":9,"message":"etcdserver: bad leader transferee"}"#
                .to_string()
        )
    );

    // The gateway forwards what our gRPC answers (etcd 3.5.1 implements
    // these; on one member it refuses to add or remove).
    for (path, body) in [
        (
            "/v3/maintenance/downgrade",
            r#"{"action":"VALIDATE","version":"3.4"}"#,
        ),
        (
            "/v3/cluster/member/add",
            r#"{"peerURLs":["http://127.0.0.1:1"]}"#,
        ),
        ("/v3/cluster/member/remove", r#"{"ID":"5"}"#),
        ("/v3/cluster/member/update", r#"{"ID":"5","peerURLs":[]}"#),
        ("/v3/cluster/member/promote", r#"{"ID":"5"}"#),
    ] {
        let (status, text) = answer(endpoint, path, body);
        assert_eq!(status, 501, "{path}: {text}");
        assert_eq!(parse(&text)["code"], 12, "{path}: {text}");
    }

    // Snapshot: result lines, each chunk telling how many bytes follow it,
    // then the sha256 of the whole.
    let snapshot = http::post(endpoint, "/v3/maintenance/snapshot", "{}").unwrap();
    assert_eq!(snapshot.status, 200);
    assert_eq!(snapshot.header("content-type"), Some("application/json"));
    let lines: Vec<Value> = snapshot.body.lines().map(parse).collect();
    assert!(lines.len() >= 2, "{}", snapshot.body);
    let chunks: Vec<(u64, u64)> = lines
        .iter()
        .map(|line| {
            let result = &line["result"];
            let remaining = result["remaining_bytes"]
                .as_str()
                .map_or(0, |n| n.parse().unwrap());
            (base64_len(result["blob"].as_str().unwrap()), remaining)
        })
        .collect();
    let (digest, data) = chunks.split_last().unwrap();
    assert_eq!(*digest, (32, 0));
    let total: u64 = data.iter().map(|(size, _)| size).sum();
    let mut sent = 0;
    for (size, remaining) in data {
        sent += size;
        assert_eq!(*remaining, total - sent, "{chunks:?}");
    }
    assert!(total > 0);
}

fn time_to_live(endpoint: &str, id: i64) -> i64 {
    let (status, body) = answer(
        endpoint,
        "/v3/lease/timetolive",
        &format!("{{\"ID\":{id}}}"),
    );
    assert_eq!(status, 200, "{body}");
    parse(&body)["TTL"]
        .as_str()
        .map_or(0, |ttl| ttl.parse().unwrap())
}

/// One `{"result":LeaseKeepAliveResponse}` line: its ID and TTL.
fn keep_alive_line(line: Option<String>) -> (String, String) {
    let line = line.expect("a keep-alive answer");
    let result = parse(&line)["result"].clone();
    let field = |name: &str| result[name].as_str().unwrap_or("").to_string();
    (field("ID"), field("TTL"))
}

/// Two renewals on one open stream, answered in order, each resetting the
/// lease's TTL; the stream ends when the client ends its body.
fn keep_alive_renews_in_order(endpoint: &str) {
    for id in [4660, 4661] {
        let grant = answer(
            endpoint,
            "/v3/lease/grant",
            &format!("{{\"ID\":{id},\"TTL\":60}}"),
        );
        assert_eq!(grant.0, 200, "{}", grant.1);
    }
    let mut stream =
        LineStream::open_chunked(endpoint, "/v3/lease/keepalive", r#"{"ID":4660}"#).unwrap();
    assert_eq!(stream.status, 200);
    let deadline = Instant::now() + Duration::from_secs(20);
    assert_eq!(
        keep_alive_line(stream.next_line(deadline)),
        ("4660".into(), "60".into())
    );

    // TTL is whole seconds left, rounded down: 58 means the renewal
    // above is two seconds old, and one now shows as 59 or 60.
    let wait_expiring = || loop {
        let ttl = time_to_live(endpoint, 4660);
        if ttl <= 58 {
            return ttl;
        }
        assert!(Instant::now() < deadline, "TTL still {ttl}");
        std::thread::sleep(POLL);
    };
    wait_expiring();
    stream.send(r#"{"ID":4660} {"ID":"4661"}"#).unwrap();
    assert_eq!(
        keep_alive_line(stream.next_line(deadline)),
        ("4660".into(), "60".into())
    );
    assert_eq!(
        keep_alive_line(stream.next_line(deadline)),
        ("4661".into(), "60".into())
    );
    assert!(time_to_live(endpoint, 4660) >= 59, "renewed");

    wait_expiring();
    stream.send(r#"{"ID":4660}"#).unwrap();
    assert_eq!(
        keep_alive_line(stream.next_line(deadline)),
        ("4660".into(), "60".into())
    );
    assert!(time_to_live(endpoint, 4660) >= 59, "renewed again");

    stream.finish().unwrap();
    assert_eq!(stream.next_line(deadline), None);
    assert!(Instant::now() < deadline, "the stream ends with the body");
}

#[test]
fn gateway_keep_alive_stream_renews_in_order() {
    let ref_dir = tempfile::tempdir().unwrap();
    let etcd = testkit::start_reference_etcd(testkit::ETCD_34.0, ref_dir.path())
        .expect("etcd 3.4.23 is installed (.ci/run installs it)");
    let ox_dir = tempfile::tempdir().unwrap();
    let oxcd = Process::start_oxcd(&testkit::oxcd_bin(), ox_dir.path(), &[]);
    // The same steps hold on etcd, so the test checks what etcd does.
    keep_alive_renews_in_order(&etcd.endpoint);
    keep_alive_renews_in_order(&oxcd.endpoint);
}

/// Campaign, leader, observe, proclaim, a second candidate waiting, resign,
/// lock and unlock, all through the gateway; the answers, masked.
fn election_transcript(endpoint: &str) -> String {
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut lines = Vec::new();
    let mut call = |path: &str, body: &str| {
        let (status, text) = answer(endpoint, path, body);
        lines.push(format!("{path} {status} {text}"));
        text
    };
    for id in [77, 78] {
        call("/v3/lease/grant", &format!("{{\"ID\":{id},\"TTL\":60}}"));
    }
    let campaign = call(
        "/v3/election/campaign",
        r#"{"name":"ZWw=","lease":"77","value":"djE="}"#,
    );
    let leader = parse(&campaign)["leader"].clone();
    assert_eq!(leader["key"], "ZWwvNGQ=", "{campaign}");
    call("/v3/election/leader", r#"{"name":"ZWw="}"#);

    let mut observe =
        LineStream::open(endpoint, "/v3/election/observe", r#"{"name":"ZWw="}"#).expect("observe");
    let mut observed = vec![observe.next_line(deadline).expect("the leader")];

    // A second candidate waits behind the leader.
    let second = {
        let endpoint = endpoint.to_string();
        std::thread::spawn(move || {
            let body = r#"{"name":"ZWw=","lease":"78","value":"djM="}"#;
            answer(&endpoint, "/v3/election/campaign", body)
        })
    };
    loop {
        let (_, range) = answer(endpoint, "/v3/kv/range", r#"{"key":"ZWwvNGU="}"#);
        if parse(&range)["count"] == "1" {
            break;
        }
        assert!(Instant::now() < deadline, "the second candidate's key");
        std::thread::sleep(POLL);
    }

    let proclaim = serde_json::json!({ "leader": leader, "value": "djI=" });
    call("/v3/election/proclaim", &proclaim.to_string());
    observed.push(observe.next_line(deadline).expect("the proclaimed value"));
    call("/v3/election/leader", r#"{"name":"ZWw="}"#);
    call(
        "/v3/election/resign",
        &serde_json::json!({ "leader": leader }).to_string(),
    );
    let second = second.join().unwrap();
    observed.push(observe.next_line(deadline).expect("the next leader"));

    let lock = call("/v3/lock/lock", r#"{"name":"bGs=","lease":"77"}"#);
    let key = parse(&lock)["key"].clone();
    assert_eq!(key, "bGsvNGQ=", "{lock}");
    call(
        "/v3/lock/unlock",
        &serde_json::json!({ "key": key }).to_string(),
    );
    lines.push(format!("second campaign {} {}", second.0, second.1));
    lines.extend(
        observed
            .iter()
            .map(|line| format!("observe {}", mask(line))),
    );
    lines.join("\n")
}

#[test]
fn gateway_election_and_lock_match_etcd_3_4() {
    let ref_dir = tempfile::tempdir().unwrap();
    let etcd = testkit::start_reference_etcd(testkit::ETCD_34.0, ref_dir.path())
        .expect("etcd 3.4.23 is installed (.ci/run installs it)");
    let ox_dir = tempfile::tempdir().unwrap();
    let oxcd = Process::start_oxcd(&testkit::oxcd_bin(), ox_dir.path(), &[]);
    let want = election_transcript(&etcd.endpoint);
    let got = election_transcript(&oxcd.endpoint);
    assert!(
        want == got,
        "election answers differ\n--- etcd:\n{want}\n--- oxcd:\n{got}"
    );
}
