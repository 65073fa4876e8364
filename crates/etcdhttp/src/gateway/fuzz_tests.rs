//! Fuzzing the JSON gateway's decoding: a body read as `serve_route` reads
//! it (`request_value`: the depth check, then serde_json), then mapped to
//! the route's request message (`FromJson`: JSON → descriptor-walked
//! message → the services' decoder); bodies of bidirectional streams split
//! into chunks as they arrive (`JsonValues`). Every /v3 route, with JSON
//! built from its message's descriptor (right and wrong kinds, both field
//! names, bad base64, bogus enums, numbers out of range), and damaged JSON
//! text: answered or refused, never a panic, never a stack overflow on a
//! request thread, allocation in proportion to the body.
//!
//! No socket is opened: the services behind the routes need a member, so
//! what is driven is everything up to the call.
//!
//! `FUZZ_SEED` / `FUZZ_RUNS` replay or lengthen a run:
//! `FUZZ_RUNS=50000 cargo test -p etcdhttp --lib fuzz_tests`.

#[path = "../../../api/tests/fuzz_support/mod.rs"]
mod fuzz_support;

use api::codec::{MAX_TXN_DEPTH, REQUEST_THREAD_STACK_BYTES};
use api::etcdserverpb as pb;
use api::{v3electionpb, v3lockpb};
use base64::Engine;
use prost::Name;
use prost_reflect::{DescriptorPool, Kind, MessageDescriptor};
use serde_json::{Map, Value};
use tonic::Status;

use super::reflect::FromJson;
use super::stream::JsonValues;
use super::{json, request_value, ROUTES};
use fuzz_support::{bounded, mutate, on_stack, some_bytes, Fuzz, Meter};

#[global_allocator]
static METER: Meter = Meter;

/// A route: its path, its request message's full name, its decoding.
struct RouteRequest {
    path: &'static str,
    message: fn() -> String,
    decode: fn(&Value) -> Result<(), Status>,
}

fn decode<T: FromJson>(value: &Value) -> Result<(), Status> {
    T::from_json(value).map(|_| ())
}

macro_rules! routes {
    ($(($path:literal, $type:ty)),* $(,)?) => {
        &[$(RouteRequest {
            path: $path,
            message: <$type>::full_name,
            decode: decode::<$type>,
        }),*]
    };
}

/// The request message of every route of [`ROUTES`] (a test holds the two
/// lists to each other) and of the two bidirectional streams.
const REQUESTS: &[RouteRequest] = routes![
    ("kv/range", pb::RangeRequest),
    ("kv/put", pb::PutRequest),
    ("kv/deleterange", pb::DeleteRangeRequest),
    ("kv/txn", pb::TxnRequest),
    ("kv/compaction", pb::CompactionRequest),
    ("maintenance/alarm", pb::AlarmRequest),
    ("maintenance/status", pb::StatusRequest),
    ("maintenance/defragment", pb::DefragmentRequest),
    ("maintenance/hash", pb::HashRequest),
    ("maintenance/snapshot", pb::SnapshotRequest),
    ("maintenance/transfer-leadership", pb::MoveLeaderRequest),
    ("maintenance/downgrade", pb::DowngradeRequest),
    ("cluster/member/add", pb::MemberAddRequest),
    ("cluster/member/remove", pb::MemberRemoveRequest),
    ("cluster/member/update", pb::MemberUpdateRequest),
    ("cluster/member/list", pb::MemberListRequest),
    ("cluster/member/promote", pb::MemberPromoteRequest),
    ("lease/grant", pb::LeaseGrantRequest),
    ("lease/revoke", pb::LeaseRevokeRequest),
    ("kv/lease/revoke", pb::LeaseRevokeRequest),
    ("lease/timetolive", pb::LeaseTimeToLiveRequest),
    ("kv/lease/timetolive", pb::LeaseTimeToLiveRequest),
    ("lease/leases", pb::LeaseLeasesRequest),
    ("kv/lease/leases", pb::LeaseLeasesRequest),
    ("election/campaign", v3electionpb::CampaignRequest),
    ("election/proclaim", v3electionpb::ProclaimRequest),
    ("election/leader", v3electionpb::LeaderRequest),
    ("election/observe", v3electionpb::LeaderRequest),
    ("election/resign", v3electionpb::ResignRequest),
    ("lock/lock", v3lockpb::LockRequest),
    ("lock/unlock", v3lockpb::UnlockRequest),
    ("auth/enable", pb::AuthEnableRequest),
    ("auth/disable", pb::AuthDisableRequest),
    ("auth/status", pb::AuthStatusRequest),
    ("auth/authenticate", pb::AuthenticateRequest),
    ("auth/user/add", pb::AuthUserAddRequest),
    ("auth/user/get", pb::AuthUserGetRequest),
    ("auth/user/list", pb::AuthUserListRequest),
    ("auth/user/delete", pb::AuthUserDeleteRequest),
    ("auth/user/changepw", pb::AuthUserChangePasswordRequest),
    ("auth/user/grant", pb::AuthUserGrantRoleRequest),
    ("auth/user/revoke", pb::AuthUserRevokeRoleRequest),
    ("auth/role/add", pb::AuthRoleAddRequest),
    ("auth/role/get", pb::AuthRoleGetRequest),
    ("auth/role/list", pb::AuthRoleListRequest),
    ("auth/role/delete", pb::AuthRoleDeleteRequest),
    ("auth/role/grant", pb::AuthRoleGrantPermissionRequest),
    ("auth/role/revoke", pb::AuthRoleRevokePermissionRequest),
    ("watch", pb::WatchRequest),
    ("lease/keepalive", pb::LeaseKeepAliveRequest),
];

#[test]
fn every_route_has_its_request_here() {
    let mut ours: Vec<&str> = REQUESTS.iter().map(|r| r.path).collect();
    let mut theirs: Vec<&str> = ROUTES.iter().map(|(path, _)| *path).collect();
    theirs.extend(["watch", "lease/keepalive"]);
    ours.sort_unstable();
    theirs.sort_unstable();
    assert_eq!(ours, theirs);
}

fn pool() -> DescriptorPool {
    DescriptorPool::decode(api::FILE_DESCRIPTOR_SET).expect("descriptors")
}

// ---- JSON of (nearly) the right shape ----

/// A JSON value of any kind, mostly small.
fn any_value(rng: &mut fastrand::Rng) -> Value {
    match rng.u8(..8) {
        0 => Value::Null,
        1 => Value::Bool(rng.bool()),
        2 => Value::from(rng.i64(..)),
        3 => Value::from(rng.f64() * 1e20 - 5e19),
        4 => Value::from(random_text(rng)),
        5 => Value::Array(vec![Value::from(1), Value::Null]),
        6 => Value::Object(Map::new()),
        _ => Value::from(u64::MAX),
    }
}

fn random_text(rng: &mut fastrand::Rng) -> String {
    (0..rng.usize(0..12))
        .map(|_| match rng.u8(..6) {
            0 => rng.char(..),
            1 => '"',
            2 => '\\',
            _ => rng.alphanumeric(),
        })
        .collect()
}

/// An integer as jsonpb takes one (a number or a string) or does not.
fn integer(rng: &mut fastrand::Rng, low: i128, high: i128) -> Value {
    let n: i128 = match rng.u8(..6) {
        0 => low,
        1 => high,
        2 => low - 1,
        3 => high + 1,
        _ => rng.i64(-5..100).into(),
    };
    match rng.u8(..5) {
        0 => Value::from(n.to_string()),
        1 => Value::from(n as f64 + if rng.bool() { 0.5 } else { 0.0 }),
        2 if n >= 0 => Value::from(n as u64),
        _ => match i64::try_from(n) {
            Ok(n) => Value::from(n),
            Err(_) => Value::from(n.to_string()),
        },
    }
}

fn field_value(rng: &mut fastrand::Rng, kind: &Kind, depth: usize) -> Value {
    if rng.u8(..12) == 0 {
        return any_value(rng);
    }
    match kind {
        Kind::Int64 | Kind::Sint64 | Kind::Sfixed64 => {
            integer(rng, i64::MIN.into(), i64::MAX.into())
        }
        Kind::Uint64 | Kind::Fixed64 => integer(rng, 0, u64::MAX.into()),
        Kind::Int32 | Kind::Sint32 | Kind::Sfixed32 => {
            integer(rng, i32::MIN.into(), i32::MAX.into())
        }
        Kind::Uint32 | Kind::Fixed32 => integer(rng, 0, u32::MAX.into()),
        Kind::Bool => Value::Bool(rng.bool()),
        Kind::String => Value::from(random_text(rng)),
        Kind::Bytes => {
            let bytes = some_bytes(rng, 0..24);
            Value::from(match rng.u8(..6) {
                0 => base64::engine::general_purpose::URL_SAFE.encode(&bytes),
                1 => random_text(rng),
                _ => base64::engine::general_purpose::STANDARD.encode(&bytes),
            })
        }
        Kind::Enum(e) => match rng.u8(..4) {
            0 => Value::from(rng.i64(-2..8)),
            1 => Value::from("BOGUS"),
            _ => {
                let names: Vec<String> = e.values().map(|v| v.name().to_string()).collect();
                Value::from(names[rng.usize(..names.len())].clone())
            }
        },
        Kind::Message(m) if depth > 0 => random_json(rng, m, depth - 1),
        Kind::Message(_) => Value::Object(Map::new()),
        Kind::Double | Kind::Float => Value::from(rng.f64()),
    }
}

/// A request of message `desc` as a client might send it, wrong at times.
fn random_json(rng: &mut fastrand::Rng, desc: &MessageDescriptor, depth: usize) -> Value {
    if rng.u8(..30) == 0 {
        return any_value(rng);
    }
    let mut map = Map::new();
    for field in desc.fields() {
        if rng.u8(..3) == 0 {
            continue;
        }
        let name = if rng.bool() {
            field.name()
        } else {
            field.json_name()
        };
        let value = if field.is_list() && rng.u8(..10) != 0 {
            Value::Array(
                (0..rng.usize(0..4))
                    .map(|_| field_value(rng, &field.kind(), depth))
                    .collect(),
            )
        } else {
            field_value(rng, &field.kind(), depth)
        };
        map.insert(name.to_string(), value);
    }
    if rng.u8(..8) == 0 {
        map.insert(random_text(rng), any_value(rng));
    }
    Value::Object(map)
}

/// A body for `route`: its JSON text, damaged at times, or noise.
fn body(rng: &mut fastrand::Rng, pool: &DescriptorPool, route: &RouteRequest) -> Vec<u8> {
    let desc = pool
        .get_message_by_name(&(route.message)())
        .expect("a descriptor for every request");
    let depth = rng.usize(0..5);
    let mut text = serde_json::to_vec(&random_json(rng, &desc, depth)).expect("JSON");
    match rng.u8(..8) {
        0 => mutate(rng, &mut text),
        1 => text = some_bytes(rng, 0..32),
        2 => text.extend_from_slice(b" {\"trailing\": true} garbage"),
        _ => {}
    }
    text
}

/// What decoding holds per byte of body: serde's values, the descriptor
/// walk's dynamic message, its encoding and the decoded request, each a
/// few times the JSON they came from (an empty object, `{}`, is a whole
/// message). Measured worst: ~145 (a txn of 20,000 empty ops).
const BYTES_PER_BODY_BYTE: usize = 256;
const SLACK_BYTES: usize = 256 * 1024;

#[test]
fn json_bodies_of_every_route_decode_or_are_refused() {
    let fuzz = Fuzz::new("gateway-bodies", 10000);
    let mut rng = fuzz.rng();
    let pool = pool();
    let accepted = on_stack(REQUEST_THREAD_STACK_BYTES, move || {
        let mut accepted = 0;
        for _ in fuzz.iterations() {
            let route = &REQUESTS[rng.usize(..REQUESTS.len())];
            let bytes = body(&mut rng, &pool, route);
            let decoded = bounded(
                route.path,
                bytes.len(),
                BYTES_PER_BODY_BYTE,
                SLACK_BYTES,
                || request_value(&bytes).and_then(|value| (route.decode)(&value)),
            );
            accepted += usize::from(decoded.is_ok());
        }
        accepted
    });
    assert!(accepted > 0);
}

#[test]
fn stream_bodies_split_anywhere_read_as_when_whole() {
    let fuzz = Fuzz::new("gateway-streams", 3000);
    let mut rng = fuzz.rng();
    let pool = pool();
    let streams = [&REQUESTS[REQUESTS.len() - 2], &REQUESTS[REQUESTS.len() - 1]];
    for _ in fuzz.iterations() {
        let route = streams[rng.usize(..2)];
        let mut stream = Vec::new();
        for _ in 0..rng.usize(0..5) {
            stream.extend(body(&mut rng, &pool, route));
            stream.extend_from_slice([&b""[..], b" ", b"\n"][rng.usize(..3)]);
        }
        // whole, then in random chunks: the same values, the same end
        let read = |chunks: &[&[u8]]| {
            let mut values = JsonValues::new();
            let mut all = Vec::new();
            for chunk in chunks {
                all.extend(values.push(chunk));
            }
            values.finish();
            let parsed = all.len();
            let requests: Vec<Result<(), Status>> = match route.path {
                "watch" => values
                    .decode::<pb::WatchRequest>(all, usize::MAX)
                    .into_iter()
                    .map(|r| r.map(|_| ()))
                    .collect(),
                _ => values
                    .decode::<pb::LeaseKeepAliveRequest>(all, usize::MAX)
                    .into_iter()
                    .map(|r| r.map(|_| ()))
                    .collect(),
            };
            // Which requests decode, and whether an error ends them, do not
            // depend on the cuts. The error's words may: a number cut by a
            // chunk parses as two (both end the stream: a request is an
            // object), and where serde's stream splitter and Go's decoder
            // disagree (a number followed by garbage: Go decodes the number,
            // serde says "trailing characters"), so may the words.
            let _ = parsed;
            let outcome: Vec<bool> = requests.iter().map(Result::is_ok).collect();
            outcome
        };
        let whole = read(&[&stream]);
        let mut chunks = Vec::new();
        let mut rest = &stream[..];
        while !rest.is_empty() {
            let (chunk, tail) = rest.split_at(rng.usize(1..=rest.len().min(40)));
            chunks.push(chunk);
            rest = tail;
        }
        assert_eq!(
            read(&chunks),
            whole,
            "{:?}",
            String::from_utf8_lossy(&stream)
        );
    }
}

// ---- deep ----

/// A txn `levels` deep in JSON: `{"success":[{"request_txn":{...}}]}`.
fn txn_json(levels: usize) -> String {
    let mut text = "{\"success\":[{\"request_txn\":".repeat(levels - 1);
    text.push_str("{\"success\":[{\"request_put\":{\"key\":\"aw==\"}}]}");
    text.push_str(&"}]}".repeat(levels - 1));
    text
}

fn too_many_ops(result: Result<(), Status>) {
    let status = result.expect_err("refused");
    assert_eq!(status.code(), tonic::Code::InvalidArgument);
    assert_eq!(status.message(), api::rpctypes::TOO_MANY_OPS.message);
}

#[test]
fn a_txn_nested_100k_deep_is_refused_before_it_is_parsed() {
    let text = txn_json(100_000);
    let (result, peak) = fuzz_support::peak_bytes(|| request_value(text.as_bytes()).map(|_| ()));
    too_many_ops(result);
    assert!(peak < 4096, "{peak} bytes allocated refusing it");
    let arrays = "[".repeat(100_000);
    too_many_ops(request_value(arrays.as_bytes()).map(|_| ()));
    // a stream's requests are parsed with serde's own depth limit
    let mut values = JsonValues::new();
    assert!(values.push(arrays.as_bytes()).is_empty());
    values.finish();
    let refused = values.decode::<pb::WatchRequest>(Vec::new(), usize::MAX);
    assert!(matches!(refused.as_slice(), [Err(_)]), "{refused:?}");
}

#[test]
fn json_as_deep_as_the_gateway_takes_is_decoded_on_a_request_thread() {
    on_stack(REQUEST_THREAD_STACK_BYTES, || {
        let deepest = txn_json(MAX_TXN_DEPTH);
        let value = request_value(deepest.as_bytes()).expect("parses");
        assert!(decode::<pb::TxnRequest>(&value).is_ok());
        drop(value);
        let deeper = txn_json(MAX_TXN_DEPTH + 1);
        let value = request_value(deeper.as_bytes()).expect("parses");
        too_many_ops(decode::<pb::TxnRequest>(&value));
        // as deep as the depth check lets through, in a field that is not
        // a txn: parsed, refused by the mapping, no overflow
        let depth = json::MAX_DEPTH - 1;
        let deep = format!("{{\"key\":{}{}}}", "[".repeat(depth), "]".repeat(depth));
        let value = request_value(deep.as_bytes()).expect("parses");
        assert!(decode::<pb::RangeRequest>(&value).is_err());
        let deep = format!(
            "{{\"compare\":{}1{}}}",
            "[{\"k\":".repeat(depth / 2),
            "}]".repeat(depth / 2)
        );
        let value = request_value(deep.as_bytes()).expect("parses");
        let _ = decode::<pb::TxnRequest>(&value);
    });
}

#[test]
fn a_syntax_error_after_stream_requests_is_worded_as_go_words_it_however_it_arrives() {
    // Found by `stream_bodies_split_anywhere_read_as_when_whole`: the
    // error's position was looked up from the failed value's start while
    // serde counts from the buffer's, so the same body got serde's
    // "expected value at line 1 column N", N depending on how the body
    // was cut into chunks, instead of Go's words.
    let body = b"{\"ID\":1} {\"ID\":2} garbage";
    for split in 1..body.len() {
        let mut values = JsonValues::new();
        let mut parsed = values.push(&body[..split]);
        parsed.extend(values.push(&body[split..]));
        values.finish();
        let requests = values.decode::<pb::LeaseKeepAliveRequest>(parsed, usize::MAX);
        assert_eq!(requests.len(), 3, "split at {split}");
        assert_eq!(
            requests[2].as_ref().expect_err("garbage").message(),
            "invalid character 'g' looking for beginning of value",
            "split at {split}"
        );
    }
}

#[test]
fn a_non_ascii_byte_is_named_as_go_names_it_however_the_stream_is_cut() {
    // Found by `stream_bodies_split_anywhere_read_as_when_whole`: the
    // offending character was decoded from the bytes at hand, so a
    // multi-byte one cut by a chunk was named '\u{fffd}', whole '\u{7b7}';
    // Go names the byte ("invalid character 'Þ'", U+00DE for 0xDE).
    let body = "{\"ID\":1} \u{7b7}x".as_bytes();
    let expected = "invalid character 'Þ' looking for beginning of value";
    for split in 1..body.len() {
        let mut values = JsonValues::new();
        let mut parsed = values.push(&body[..split]);
        parsed.extend(values.push(&body[split..]));
        values.finish();
        let requests = values.decode::<pb::LeaseKeepAliveRequest>(parsed, usize::MAX);
        let error = requests.last().expect("two").as_ref().expect_err("refused");
        assert_eq!(error.message(), expected, "split at {split}");
    }
    let status = request_value("\u{7b7}".as_bytes()).expect_err("refused");
    assert_eq!(status.message(), expected);
}
