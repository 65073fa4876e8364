//! Fuzzing the records this crate decodes from a backend (leases, alarms,
//! the auth store, members) and the text it parses from the network and
//! the command line (MemberAdd's peer URLs, `--initial-cluster`), and the
//! first bytes it tells backend files apart by: decoded or refused, never
//! a panic, never an allocation sized by a length read.
//!
//! `FUZZ_SEED` / `FUZZ_RUNS` replay or lengthen a run:
//! `FUZZ_RUNS=200000 cargo test -p schema --test fuzz`.

#[path = "../../api/tests/fuzz_support/mod.rs"]
mod fuzz_support;

use fuzz_support::{bounded, mutate, protobuf_fields, some_bytes, Fuzz, Meter};
use schema::members::{self, Member};

#[global_allocator]
static METER: Meter = Meter;

/// A decoded record's structs per byte of record (an empty repeated
/// element is two bytes and a whole `User` or `Role`).
const BYTES_PER_INPUT_BYTE: usize = 256;
const SLACK_BYTES: usize = 16 * 1024;

fn text(rng: &mut fastrand::Rng) -> String {
    (0..rng.usize(0..10))
        .map(|_| match rng.u8(..4) {
            0 => rng.char(..),
            _ => rng.alphanumeric(),
        })
        .collect()
}

fn random_member(rng: &mut fastrand::Rng) -> Member {
    Member {
        id: rng.u64(..),
        name: text(rng),
        peer_urls: (0..rng.usize(0..3)).map(|_| url(rng)).collect(),
        client_urls: (0..rng.usize(0..3)).map(|_| url(rng)).collect(),
        is_learner: rng.bool(),
    }
}

/// A URL as a client might send one in MemberAdd: sound, or not quite.
fn url(rng: &mut fastrand::Rng) -> String {
    let scheme = ["http", "https", "unix", "unixs", "ftp", "", "HTTP"][rng.usize(..7)];
    let host = [
        "10.0.0.1",
        "[::1]",
        "::1",
        "host",
        "",
        "[",
        "é.example",
        "a@b",
    ][rng.usize(..8)];
    let port = [":2380", ":", "", ":]", ":65536", ":x"][rng.usize(..6)];
    let tail = ["", "/", "/path", "?q", "#f", "/\u{1F600}"][rng.usize(..6)];
    let separator = ["://", ":/", "", ":///"][rng.usize(..4)];
    let mut url = format!("{scheme}{separator}{host}{port}{tail}");
    if rng.u8(..4) == 0 {
        url = format!(" {url}\t");
    }
    if rng.u8(..4) == 0 {
        let mut bytes = url.into_bytes();
        mutate(rng, &mut bytes);
        url = String::from_utf8_lossy(&bytes).into_owned();
    }
    url
}

#[test]
fn records_of_any_bytes_decode_or_are_refused() {
    let fuzz = Fuzz::new("schema-records", 20000);
    let mut rng = fuzz.rng();
    for _ in fuzz.iterations() {
        let mut bytes = match rng.u8(..6) {
            0 => schema::leases::encode(rng.i64(..), rng.i64(..), rng.i64(..)),
            1 => schema::alarms::encode(rng.u64(..), rng.i32(..)),
            2 => members::encode(&random_member(&mut rng)),
            3 => some_bytes(&mut rng, 0..40),
            _ => {
                let mut bytes = Vec::new();
                let depth = rng.usize(0..4);
                protobuf_fields(&mut rng, depth, &mut bytes);
                bytes
            }
        };
        if rng.bool() {
            mutate(&mut rng, &mut bytes);
        }
        let within = |what, f: &dyn Fn() -> bool| {
            bounded(what, bytes.len(), BYTES_PER_INPUT_BYTE, SLACK_BYTES, f)
        };
        within("lease", &|| schema::leases::decode(&bytes).is_ok());
        within("alarm", &|| schema::alarms::decode(&bytes).is_ok());
        within("auth store", &|| schema::auth::decode(&bytes).is_ok());
        let member = bounded(
            "member",
            bytes.len(),
            BYTES_PER_INPUT_BYTE,
            SLACK_BYTES,
            || members::decode(&bytes),
        );
        if let Some(member) = member {
            assert_eq!(
                members::decode(&members::encode(&member)),
                Some(member.clone())
            );
            // etcd's own JSON of it, as an etcd backend's `members` holds it
            let json = schema::etcd_buckets::member_json(&member);
            let parsed: serde_json::Value =
                serde_json::from_slice(&json).expect("member_json writes JSON");
            assert_eq!(parsed["id"].as_u64(), Some(member.id));
        }
    }
}

#[test]
fn peer_urls_of_any_text_are_taken_or_refused_as_etcds() {
    let fuzz = Fuzz::new("schema-peer-urls", 20000);
    let mut rng = fuzz.rng();
    for _ in fuzz.iterations() {
        let urls: Vec<String> = (0..rng.usize(0..4))
            .map(|_| {
                if rng.u8(..5) == 0 {
                    text(&mut rng)
                } else {
                    url(&mut rng)
                }
            })
            .collect();
        if let Ok(parsed) = members::parse_peer_urls(&urls) {
            assert_eq!(parsed.len(), urls.len());
            assert!(parsed.windows(2).all(|w| w[0] <= w[1]), "sorted");
            for url in &parsed {
                assert!(
                    ["http://", "https://", "unix://", "unixs://"]
                        .iter()
                        .any(|scheme| url.starts_with(scheme)),
                    "{url}"
                );
            }
            let id = members::added_member_id(&parsed, rng.i64(..));
            let _ = members::cluster_id(&[id, rng.u64(..)]);
        }
        let spec: String = urls
            .iter()
            .map(|url| format!("{}={url}", text(&mut rng)))
            .collect::<Vec<_>>()
            .join([",", ", ", ",,", "="][rng.usize(..4)]);
        if let Ok(cluster) = members::parse_initial_cluster(&spec) {
            assert!(!cluster.is_empty());
        }
    }
}

#[test]
fn a_files_first_bytes_tell_what_it_is_whatever_they_are() {
    let fuzz = Fuzz::new("schema-backend-files", 300);
    let mut rng = fuzz.rng();
    let dir = std::env::temp_dir().join(format!("schema-fuzz-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let path = dir.join("db");
    for _ in fuzz.iterations() {
        let mut head = match rng.u8(..3) {
            0 => schema::backend_file::REDB_MAGIC.to_vec(),
            1 => {
                let mut page = vec![0u8; 16];
                page.extend_from_slice(&schema::backend_file::BBOLT_MAGIC.to_le_bytes());
                page
            }
            _ => Vec::new(),
        };
        head.extend(some_bytes(&mut rng, 0..24));
        mutate(&mut rng, &mut head);
        std::fs::write(&path, &head).expect("write");
        let _ = schema::backend_file::inspect(&path);
    }
    std::fs::remove_dir_all(&dir).expect("clean up");
}
