//! The JSON gateway on the client port (grpc-gateway's routes), whose
//! answers are compared with etcd 3.4.23's for the same requests, and with
//! etcd 3.5.1's answers (checked with curl) where 3.4 differs.

use std::time::{Duration, Instant};

use regex::Regex;
use serde_json::Value;
use testkit::http::{self, LineStream};
use testkit::Process;

/// Polling interval while waiting for a condition (never a settle time).
const POLL: Duration = Duration::from_millis(50);

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

    // The gateway forwards what our gRPC answers: Downgrade is not built.
    let (status, text) = answer(
        endpoint,
        "/v3/maintenance/downgrade",
        r#"{"action":"VALIDATE","version":"3.4"}"#,
    );
    assert_eq!(status, 501, "{text}");
    assert_eq!(parse(&text)["code"], 12, "{text}");
    // Member changes: a learner (it counts for no quorum) added and removed.
    let added = http::post(
        endpoint,
        "/v3/cluster/member/add",
        r#"{"peerURLs":["http://127.0.0.1:1"],"isLearner":true}"#,
    )
    .unwrap();
    let text = added.body;
    assert_eq!(added.status, 200, "{text}");
    let added = parse(&text);
    assert_eq!(added["member"]["isLearner"], true, "{text}");
    assert_eq!(added["members"].as_array().map(Vec::len), Some(2), "{text}");
    let id = added["member"]["ID"]
        .as_str()
        .expect("the ID, a string")
        .to_string();
    let (status, text) = answer(
        endpoint,
        "/v3/cluster/member/remove",
        &format!(r#"{{"ID":"{id}"}}"#),
    );
    assert_eq!(status, 200, "{text}");
    for (path, body) in [
        ("/v3/cluster/member/remove", r#"{"ID":"5"}"#),
        ("/v3/cluster/member/update", r#"{"ID":"5","peerURLs":[]}"#),
        ("/v3/cluster/member/promote", r#"{"ID":"5"}"#),
    ] {
        let (status, text) = answer(endpoint, path, body);
        assert_eq!(
            (status, text.as_str()),
            (
                404,
                r#"{"error":"etcdserver: member not found","code":5,"message":"etcdserver: member not found"}"#
            ),
            "{path}"
        );
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

/// A txn `levels` deep in the gateway's JSON, one op a level, a put of
/// `key` at the bottom.
fn json_txn_chain(levels: usize, key: &str) -> String {
    let key = base64::Engine::encode(&base64::engine::general_purpose::STANDARD, key);
    let mut txn = format!(r#"{{"success":[{{"request_put":{{"key":"{key}","value":"dg=="}}}}]}}"#);
    for _ in 1..levels {
        txn = format!(r#"{{"success":[{{"request_txn":{txn}}}]}}"#);
    }
    txn
}

#[test]
fn gateway_nested_txns_follow_etcds_op_budget() {
    let dir = tempfile::tempdir().unwrap();
    let oxcd = Process::start_oxcd(&testkit::oxcd_bin(), dir.path(), &[]);
    let endpoint = oxcd.endpoint.as_str();
    // serde_json's own limit (128 levels of JSON) stopped at 42 txn levels.
    let (status, body) = answer(endpoint, "/v3/kv/txn", &json_txn_chain(128, "deep"));
    assert_eq!(status, 200, "{body}");
    assert!(body.contains(r#""succeeded":true"#), "{body}");
    let (status, body) = answer(endpoint, "/v3/kv/txn", &json_txn_chain(129, "deeper"));
    let too_many = "etcdserver: too many operations in txn request";
    assert_eq!(
        (status, body),
        (
            400,
            format!(r#"{{"error":"{too_many}","code":3,"message":"{too_many}"}}"#)
        )
    );
    // Far past anything the decoder takes: refused before it is parsed.
    let (status, body) = answer(endpoint, "/v3/kv/txn", &"[".repeat(100_000));
    assert_eq!(status, 400, "{body}");
    let (_, body) = answer(endpoint, "/v3/kv/range", r#"{"key":"ZGVlcA=="}"#);
    assert!(body.contains(r#""count":"1""#), "{body}");
}

/// A put of `value_bytes` through the gateway: its status, gRPC code and
/// message.
fn gateway_put(endpoint: &str, value_bytes: usize) -> (u16, i64, String) {
    use base64::Engine;
    let value = base64::engine::general_purpose::STANDARD.encode(vec![b'x'; value_bytes]);
    let body = format!(r#"{{"key":"aw==","value":"{value}"}}"#);
    let response = http::post(endpoint, "/v3/kv/put", &body).unwrap();
    let parsed = parse(&response.body);
    (
        response.status,
        parsed["code"].as_i64().unwrap_or(0),
        parsed["message"].as_str().unwrap_or("").to_string(),
    )
}

/// etcd's gateway hands a request to grpc-go over a loopback connection:
/// above `--max-request-bytes` and gRPC's 512 KiB more, grpc-go's
/// ResourceExhausted (429), counted on the message, not its JSON; above
/// `--max-request-bytes` alone, etcd's "request is too large".
#[test]
fn gateway_requests_meet_grpcs_size_limits_as_etcd_3_5() {
    let flags = ["--max-request-bytes", "1024"];
    let dir = tempfile::tempdir().unwrap();
    let oxcd = Process::start_oxcd(&testkit::oxcd_bin(), dir.path(), &flags);
    let ref_dir = tempfile::tempdir().unwrap();
    let etcd = ["/opt/etcd-3.5.16/etcd", testkit::ETCD_35.0]
        .into_iter()
        .find(|bin| std::path::Path::new(bin).exists())
        .and_then(|bin| testkit::start_reference_etcd_with(bin, ref_dir.path(), "http", &flags));
    let limit = 1024 + 512 * 1024;
    // a 420 KiB value: its JSON (560 KiB) is above the gRPC limit, its
    // message below; 600 KB: the message (600007 bytes) above
    let cases = [
        (900, (200, 0, String::new())),
        (
            1100,
            (400, 3, "etcdserver: request is too large".to_string()),
        ),
        (
            420 * 1024,
            (400, 3, "etcdserver: request is too large".to_string()),
        ),
        (
            600_000,
            (
                429,
                8,
                format!("grpc: received message larger than max (600007 vs. {limit})"),
            ),
        ),
    ];
    for (size, expected) in cases {
        assert_eq!(gateway_put(&oxcd.endpoint, size), expected, "{size} bytes");
        if let Some(etcd) = &etcd {
            assert_eq!(
                gateway_put(&etcd.endpoint, size),
                expected,
                "etcd, {size} bytes"
            );
        }
    }
    // JSON beyond twice the limit is refused unread, with grpc-go's code
    let (status, code, message) = gateway_put(&oxcd.endpoint, 900 * 1024);
    assert_eq!((status, code), (429, 8));
    assert!(
        message.starts_with("grpc: received message larger than max (")
            && message.ends_with(&format!(" vs. {limit})")),
        "{message}"
    );
}
