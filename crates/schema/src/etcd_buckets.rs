//! etcd 3.5's backend buckets (server/mvcc/buckets): their names, and the
//! records oxcd writes into them when it hands out a backend in etcd's
//! format (the Snapshot RPC), or reads from them (restoring an etcd
//! snapshot). The values are etcd's byte for byte:
//!
//! | bucket | key | value |
//! |---|---|---|
//! | `alarm` | a marshalled `AlarmMember` | empty |
//! | `auth` | `authEnabled`, `authRevision` | 1 byte 0/1; u64 big endian |
//! | `authRoles`, `authUsers` | the name | `authpb.Role`, `authpb.User` |
//! | `cluster` | `clusterVersion` | `3.5.0` |
//! | `key` | revision key (17 bytes, `t` added for a tombstone) | `mvccpb.KeyValue` |
//! | `lease` | the ID, u64 big endian | `leasepb.Lease` |
//! | `members` | the ID in hex | the member as JSON (membership.Member) |
//! | `members_removed` | the ID in hex | `removed` |
//! | `meta` | `consistent_index`, `term` (u64 big endian), `confState` (JSON), `finishedCompactRev`, `scheduledCompactRev` (revision keys) | |

use crate::members::Member;

/// The ten buckets of an etcd 3.5 backend, in bbolt's (byte) order.
pub const BUCKETS: [&str; 10] = [
    ALARM,
    AUTH,
    AUTH_ROLES,
    AUTH_USERS,
    CLUSTER,
    KEY,
    LEASE,
    MEMBERS,
    MEMBERS_REMOVED,
    META,
];

pub const ALARM: &str = "alarm";
pub const AUTH: &str = "auth";
pub const AUTH_ROLES: &str = "authRoles";
pub const AUTH_USERS: &str = "authUsers";
pub const CLUSTER: &str = "cluster";
pub const KEY: &str = "key";
pub const LEASE: &str = "lease";
pub const MEMBERS: &str = "members";
pub const MEMBERS_REMOVED: &str = "members_removed";
pub const META: &str = "meta";

/// `auth` bucket keys.
pub const AUTH_ENABLED: &[u8] = b"authEnabled";
pub const AUTH_REVISION: &[u8] = b"authRevision";
/// `cluster` bucket key, and the cluster version a 3.5 member records.
pub const CLUSTER_VERSION: &[u8] = b"clusterVersion";
pub const CLUSTER_VERSION_VALUE: &[u8] = b"3.5.0";
/// `meta` bucket keys.
pub const CONSISTENT_INDEX: &[u8] = b"consistent_index";
pub const TERM: &[u8] = b"term";
pub const CONF_STATE: &[u8] = b"confState";
pub const FINISHED_COMPACT_REV: &[u8] = b"finishedCompactRev";
pub const SCHEDULED_COMPACT_REV: &[u8] = b"scheduledCompactRev";

/// A member's key in `members` and `members_removed`: its ID in lowercase
/// hex, unpadded (types.ID.String()).
pub fn member_key(id: u64) -> Vec<u8> {
    format!("{id:x}").into_bytes()
}

/// A member as etcd's `members` bucket holds it: Go's json.Marshal of
/// membership.Member (`id` as a number; `isLearner`, `name` and
/// `clientURLs` omitted when empty).
pub fn member_json(m: &Member) -> Vec<u8> {
    let mut out = format!("{{\"id\":{},\"peerURLs\":", m.id);
    push_string_list(&mut out, &m.peer_urls);
    if m.is_learner {
        out.push_str(",\"isLearner\":true");
    }
    if !m.name.is_empty() {
        out.push_str(",\"name\":");
        push_go_string(&mut out, &m.name);
    }
    if !m.client_urls.is_empty() {
        out.push_str(",\"clientURLs\":");
        push_string_list(&mut out, &m.client_urls);
    }
    out.push('}');
    out.into_bytes()
}

/// raftpb.ConfState as etcd's `meta/confState` holds it (Go's JSON of the
/// gogo struct: empty lists omitted, `auto_leave` always there).
pub fn conf_state_json(voters: &[u64], learners: &[u64]) -> Vec<u8> {
    let list = |ids: &[u64]| {
        ids.iter()
            .map(|id| id.to_string())
            .collect::<Vec<_>>()
            .join(",")
    };
    let mut out = String::from("{");
    if !voters.is_empty() {
        out.push_str(&format!("\"voters\":[{}],", list(voters)));
    }
    if !learners.is_empty() {
        out.push_str(&format!("\"learners\":[{}],", list(learners)));
    }
    out.push_str("\"auto_leave\":false}");
    out.into_bytes()
}

/// etcd's revision key of a main revision (sub 0): what `meta` holds for
/// the compaction revisions.
pub fn revision_key(main: i64) -> Vec<u8> {
    let mut key = Vec::with_capacity(17);
    key.extend_from_slice(&main.to_be_bytes());
    key.push(b'_');
    key.extend_from_slice(&0i64.to_be_bytes());
    key
}

fn push_string_list(out: &mut String, items: &[String]) {
    out.push('[');
    for (i, item) in items.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        push_go_string(out, item);
    }
    out.push(']');
}

/// A JSON string as Go's encoding/json writes it (HTML characters and the
/// JavaScript line separators escaped).
fn push_go_string(out: &mut String, s: &str) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '<' | '>' | '&' | '\u{2028}' | '\u{2029}' => {
                out.push_str(&format!("\\u{:04x}", c as u32))
            }
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_in_bbolts_byte_order() {
        let mut sorted = BUCKETS;
        sorted.sort_unstable();
        assert_eq!(sorted, BUCKETS);
    }

    #[test]
    fn a_member_is_etcds_json() {
        // etcd 3.5.16's members bucket for a default single member
        let m = Member {
            id: 0x8e9e05c52164694d,
            name: "default".into(),
            peer_urls: vec!["http://localhost:2380".into()],
            client_urls: vec!["http://localhost:2379".into()],
            is_learner: false,
        };
        assert_eq!(
            String::from_utf8(member_json(&m)).unwrap(),
            r#"{"id":10276657743932975437,"peerURLs":["http://localhost:2380"],"name":"default","clientURLs":["http://localhost:2379"]}"#
        );
        assert_eq!(member_key(m.id), b"8e9e05c52164694d");
        let unstarted = Member {
            name: String::new(),
            client_urls: vec![],
            is_learner: true,
            ..m
        };
        assert_eq!(
            String::from_utf8(member_json(&unstarted)).unwrap(),
            r#"{"id":10276657743932975437,"peerURLs":["http://localhost:2380"],"isLearner":true}"#
        );
    }

    #[test]
    fn conf_state_and_revision_keys_are_etcds() {
        assert_eq!(
            conf_state_json(&[10276657743932975437], &[]),
            br#"{"voters":[10276657743932975437],"auto_leave":false}"#
        );
        assert_eq!(revision_key(5), b"\0\0\0\0\0\0\0\x05_\0\0\0\0\0\0\0\0");
    }
}
