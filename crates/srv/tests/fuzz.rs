//! Fuzzing what this crate reads from the network (DNS messages, as the
//! resolver takes a response and the test zone a query) and from the
//! system's files (resolv.conf, hosts): decoded or refused, never a panic,
//! never an allocation sized by a count or length read.
//!
//! `FUZZ_SEED` / `FUZZ_RUNS` replay or lengthen a run:
//! `FUZZ_RUNS=200000 cargo test -p srv --test fuzz`.

#[path = "../../api/tests/fuzz_support/mod.rs"]
mod fuzz_support;

use std::net::{Ipv4Addr, Ipv6Addr};

use fuzz_support::{bounded, mutate, some_bytes, Fuzz, Meter};
use srv::wire::{self, Header, Message, Question, RData, Record, SrvData};

#[global_allocator]
static METER: Meter = Meter;

/// A decoded record per 11 input bytes, its name (a 2-byte pointer can
/// stand for 255 bytes, each non-ASCII byte printed as 3), Vec growth.
const BYTES_PER_INPUT_BYTE: usize = 256;
const SLACK_BYTES: usize = 16 * 1024;

fn name(rng: &mut fastrand::Rng) -> String {
    let labels = [
        "_etcd-server",
        "_etcd-server-ssl",
        "_tcp",
        "example",
        "com",
        "m1",
        "a",
        "x-y",
    ];
    let mut name: String = (0..rng.usize(0..5))
        .map(|_| format!("{}.", labels[rng.usize(..labels.len())]))
        .collect();
    if name.is_empty() {
        name.push('.');
    }
    name
}

fn record(rng: &mut fastrand::Rng) -> Record {
    let (rtype, data) = match rng.u8(..5) {
        0 => (wire::TYPE_A, RData::A(Ipv4Addr::from(rng.u32(..)))),
        1 => (wire::TYPE_AAAA, RData::Aaaa(Ipv6Addr::from(rng.u128(..)))),
        2 => (
            wire::TYPE_SRV,
            RData::Srv(SrvData {
                priority: rng.u16(..),
                weight: rng.u16(..),
                port: rng.u16(..),
                target: name(rng),
            }),
        ),
        3 => (wire::TYPE_CNAME, RData::Cname(name(rng))),
        _ => (wire::TYPE_OPT, RData::Other(some_bytes(rng, 0..8))),
    };
    Record {
        name: name(rng),
        rtype,
        class: rng.u16(..),
        ttl: rng.u32(..),
        data,
    }
}

fn message(rng: &mut fastrand::Rng) -> Message {
    let mut records = |n| {
        (0..rng.usize(0..n))
            .map(|_| record(rng))
            .collect::<Vec<_>>()
    };
    let (answers, authorities, additionals) = (records(6), records(2), records(3));
    Message {
        header: Header {
            id: rng.u16(..),
            response: rng.bool(),
            opcode: rng.u8(..16),
            authoritative: rng.bool(),
            truncated: rng.bool(),
            recursion_desired: rng.bool(),
            recursion_available: rng.bool(),
            rcode: rng.u16(..16),
        },
        questions: (0..rng.usize(0..3))
            .map(|_| Question {
                name: name(rng),
                qtype: [wire::TYPE_SRV, wire::TYPE_A, wire::TYPE_AAAA][rng.usize(..3)],
                class: wire::CLASS_INET,
            })
            .collect(),
        answers,
        authorities,
        additionals,
    }
}

/// A response whose names point back at the question, as servers write
/// them (the encoder writes no pointers).
fn compressed(rng: &mut fastrand::Rng) -> Vec<u8> {
    let mut bytes = vec![0, 1, 0x85, 0x80, 0, 1, 0, 2, 0, 0, 0, 0];
    wire::put_name(&mut bytes, "_etcd-server._tcp.example.com.").expect("a name");
    bytes.extend_from_slice(&[0, 33, 0, 1]);
    for _ in 0..2 {
        bytes.extend_from_slice(&[0xc0, 12, 0, 33, 0, 1, 0, 0, 0, 60, 0, 10]);
        bytes.extend_from_slice(&rng.u16(..).to_be_bytes());
        bytes.extend_from_slice(&[0, 0, 0x09, 0x4c, 2, b'm', b'1', 0xc0, 12 + 14]);
    }
    bytes
}

#[test]
fn dns_messages_of_any_bytes_decode_or_are_refused() {
    let fuzz = Fuzz::new("srv-messages", 20000);
    let mut rng = fuzz.rng();
    let zone = srv::zone::Zone::new()
        .with_srv(
            "_etcd-server._tcp.example.com",
            0,
            0,
            2380,
            "m1.example.com",
        )
        .with_a("m1.example.com", Ipv4Addr::LOCALHOST);
    for _ in fuzz.iterations() {
        let mut bytes = match rng.u8(..4) {
            0 => some_bytes(&mut rng, 0..64),
            1 => compressed(&mut rng),
            _ => match message(&mut rng).encode() {
                Ok(bytes) => bytes,
                Err(_) => continue,
            },
        };
        if rng.u8(..4) != 0 {
            mutate(&mut rng, &mut bytes);
        }
        let within = |what, f: &dyn Fn() -> bool| {
            bounded(what, bytes.len(), BYTES_PER_INPUT_BYTE, SLACK_BYTES, f)
        };
        within("parse", &|| wire::parse(&bytes).is_ok());
        within("zone answer", &|| zone.answer(&bytes, 512).is_some());
        let decoded = bounded(
            "decode",
            bytes.len(),
            BYTES_PER_INPUT_BYTE,
            SLACK_BYTES,
            || Message::decode(&bytes),
        );
        if let Ok(message) = decoded {
            // what decodes and encodes again reads back the same
            if let Ok(again) = message.encode() {
                assert_eq!(Message::decode(&again), Ok(message));
            }
        }
    }
}

#[test]
fn resolv_conf_and_hosts_of_any_text_are_read() {
    let fuzz = Fuzz::new("srv-files", 5000);
    let mut rng = fuzz.rng();
    let words = [
        "nameserver",
        "search",
        "domain",
        "options",
        "ndots:",
        "timeout:99999999999999999999",
        "attempts:-3",
        "rotate",
        "10.0.0.1",
        "::1",
        "fe80::1%eth0",
        "#",
        ";",
        "\n",
        " ",
        "\t",
        "localhost",
        "a.example",
        "ndots:7",
    ];
    for _ in fuzz.iterations() {
        let text: String = (0..rng.usize(0..40))
            .map(|_| match rng.u8(..8) {
                0 => rng.char(..).to_string(),
                _ => words[rng.usize(..words.len())].to_string(),
            })
            .collect();
        let conf = srv::ResolvConf::parse(&text, "host.example");
        assert!(!conf.servers.is_empty() && conf.servers.len() <= 3);
        assert!(conf.attempts >= 1 && conf.ndots <= 15);
        for name in ["a", "a.b.c", "x.", &text] {
            for fqdn in conf.name_list(name) {
                assert!(fqdn.ends_with('.') && fqdn.len() <= 254, "{fqdn:?}");
            }
        }
        let hosts = srv::resolver::Hosts::parse(&text);
        let _ = hosts.lookup("localhost");
        let _ = srv::is_domain_name(&text);
    }
}
