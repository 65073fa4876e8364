//! `oxctl migrate --data-dir DIR`: a stopped etcd 3.4 or 3.5 member's data
//! dir becomes an oxcd data dir for the same member, in place, with
//! etcd's files kept beside it for the way back.
//!
//! # What it reads
//!
//! * `member/snap/db`, etcd's bbolt backend: every bucket, as a snapshot
//!   restore reads it, plus `meta/consistent_index` (the last raft entry
//!   the backend holds) and the membership (`members`, `members_removed`;
//!   when those are empty, the v2 store of the newest raft snapshot, as
//!   etcd 3.5's start reads it).
//! * `member/wal` (or etcd's `--wal-dir`) and `member/snap/*.snap`
//!   ([`crate::etcd_dir`]): the
//!   member and cluster IDs, the hard state, and the entries above the
//!   snapshot.
//!
//! # What it writes
//!
//! A new `member/` holding an oxcd backend (the keys with their history,
//! compaction marks, leases, auth, alarms, the membership, the same
//! consistent index), a raft snapshot at the consistent index whose
//! configuration is the membership's voters and learners, and a WAL with
//! the same member and cluster IDs, the hard state, and etcd's entries
//! above the consistent index: oxcd's start applies them as etcd's would
//! have. An entry is carried over as it is, except what oxcd's apply does
//! not know:
//! - a v2 `PUT /0/members/<id>/attributes` (how etcd 3.4 publishes a
//!   member's name and client URLs) becomes the v3 request etcd 3.5 uses
//!   for it (`ClusterMemberAttrSet`);
//! - other v2 requests (the v2 store: `--enable-v2` keys, the cluster
//!   version) and the cluster version and downgrade requests of 3.5 become
//!   empty entries at the same index and term: they touch nothing oxcd
//!   keeps;
//! - conf changes get oxcd's context (the member as a protobuf `Member`
//!   instead of etcd's JSON), and etcd's `ConfChangeUpdateNode` becomes an
//!   add in the member's own role (oxcd's update).
//!
//! # In place, and the way back
//!
//! The new `member/` is built as `member.oxcd-migrating/` beside etcd's,
//! synced, then etcd's `member/` is renamed `member.etcd/` (its files are
//! never written) and the new one renamed `member/`. A member with a
//! dedicated `--wal-dir W` gets oxcd's WAL in W (built as
//! `W.oxcd-migrating` beside it, swapped in after `member/`, etcd's kept
//! as `W.etcd`), so that oxcd starts with etcd's flags. A crash between
//! the renames is finished by running migrate again (with the same
//! `--wal-dir`). Rolling back: stop oxcd, `rm -r DIR/member && mv
//! DIR/member.etcd DIR/member` (and `rm -r W && mv W.etcd W`), start etcd.
//! etcd must be stopped: migrate refuses while a process holds etcd's lock
//! on the backend file.

use std::fs;
use std::path::{Path, PathBuf};

use consensus::raft::eraftpb::{
    ConfChange, ConfChangeType, ConfState, Entry, EntryType, HardState, Snapshot,
};
use prost::Message;
use protobuf::Message as _;
use schema::etcd_buckets as eb;
use schema::members::{self as membership, Member};

use crate::etcd_dir::{self, EtcdLog};
use crate::CliError;

/// Where etcd's `member/` goes once the oxcd one is in place.
pub const ETCD_KEPT: &str = "member.etcd";
const STAGING: &str = "member.oxcd-migrating";
const STAGING_SUFFIX: &str = ".oxcd-migrating";

fn failed(msg: impl Into<String>) -> CliError {
    CliError::Failed(msg.into())
}

/// What etcd's backend holds beside the keys.
#[derive(Debug, Default)]
struct BackendMeta {
    consistent_index: u64,
    term: u64,
    members: Vec<Member>,
    removed: Vec<u64>,
}

fn read_backend_meta(db: &Path) -> Result<BackendMeta, CliError> {
    let bad = |e: bbolt::ReadError| failed(format!("{}: {e}", db.display()));
    let mut reader = bbolt::Reader::open(db).map_err(bad)?;
    reader.check().map_err(bad)?;
    let mut meta = BackendMeta::default();
    if let Some(mut cursor) = reader.bucket(eb::META.as_bytes()).map_err(bad)? {
        while let Some(item) = cursor.next(&mut reader).map_err(bad)? {
            let u64_of = |v: &[u8]| v.try_into().map(u64::from_be_bytes).ok();
            if item.key == eb::CONSISTENT_INDEX {
                meta.consistent_index = u64_of(item.value)
                    .ok_or_else(|| failed("meta/consistent_index is not 8 bytes"))?;
            } else if item.key == eb::TERM {
                meta.term = u64_of(item.value).ok_or_else(|| failed("meta/term is not 8 bytes"))?;
            }
        }
    }
    if let Some(mut cursor) = reader.bucket(eb::MEMBERS.as_bytes()).map_err(bad)? {
        while let Some(item) = cursor.next(&mut reader).map_err(bad)? {
            let member = parse_member_json(item.value).ok_or_else(|| {
                failed(format!(
                    "members/{}: not a member record: {}",
                    String::from_utf8_lossy(item.key),
                    String::from_utf8_lossy(item.value)
                ))
            })?;
            meta.members.push(member.0);
        }
    }
    if let Some(mut cursor) = reader.bucket(eb::MEMBERS_REMOVED.as_bytes()).map_err(bad)? {
        while let Some(item) = cursor.next(&mut reader).map_err(bad)? {
            let id = std::str::from_utf8(item.key)
                .ok()
                .and_then(|k| u64::from_str_radix(k, 16).ok())
                .ok_or_else(|| {
                    failed(format!(
                        "members_removed: {:?} is not a member ID",
                        String::from_utf8_lossy(item.key)
                    ))
                })?;
            meta.removed.push(id);
        }
    }
    Ok(meta)
}

/// etcd's JSON of a member (membership.Member, or the ConfigChangeContext
/// that embeds it): the member, and whether it is a promotion.
fn parse_member_json(bytes: &[u8]) -> Option<(Member, bool)> {
    let v: serde_json::Value = serde_json::from_slice(bytes).ok()?;
    let strings = |field: &str| string_list(&v, field);
    let member = Member {
        id: v.get("id")?.as_u64()?,
        name: v
            .get("name")
            .and_then(|n| n.as_str())
            .unwrap_or_default()
            .to_string(),
        peer_urls: strings("peerURLs")?,
        client_urls: strings("clientURLs")?,
        is_learner: v
            .get("isLearner")
            .and_then(|l| l.as_bool())
            .unwrap_or(false),
    };
    let promote = v.get("isPromote").and_then(|p| p.as_bool()) == Some(true);
    Some((member, promote))
}

/// A JSON list of strings in `field` of `v` (Go's nil slice: missing or
/// null, an empty list); None when it is something else.
fn string_list(v: &serde_json::Value, field: &str) -> Option<Vec<String>> {
    match v.get(field) {
        None | Some(serde_json::Value::Null) => Some(Vec::new()),
        Some(serde_json::Value::Array(items)) => items
            .iter()
            .map(|i| i.as_str().map(str::to_string))
            .collect(),
        Some(_) => None,
    }
}

/// The members of etcd's v2 store (`/0/members/<id>/raftAttributes` and
/// `attributes`, `/0/removed_members/<id>`), from a raft snapshot's data.
fn members_from_v2_store(json: &[u8]) -> Result<(Vec<Member>, Vec<u64>), CliError> {
    let v: serde_json::Value = serde_json::from_slice(json)
        .map_err(|e| failed(format!("the v2 store of the raft snapshot: {e}")))?;
    let child = |node: &serde_json::Value, name: &str| -> Option<serde_json::Value> {
        node.get("Children")?.get(name).cloned()
    };
    let Some(zero) = v.get("Root").and_then(|root| child(root, "0")) else {
        return Ok((Vec::new(), Vec::new()));
    };
    let mut members = Vec::new();
    if let Some(serde_json::Value::Object(nodes)) = child(&zero, "members")
        .as_ref()
        .and_then(|m| m.get("Children"))
    {
        for (hex, node) in nodes {
            let Ok(id) = u64::from_str_radix(hex, 16) else {
                continue;
            };
            let value = |name: &str| -> Option<serde_json::Value> {
                let text = child(node, name)?.get("Value")?.as_str()?.to_string();
                serde_json::from_str(&text).ok()
            };
            let raft = value("raftAttributes").unwrap_or_default();
            let attrs = value("attributes").unwrap_or_default();
            let list = |v: &serde_json::Value, field: &str| -> Vec<String> {
                string_list(v, field).unwrap_or_default()
            };
            members.push(Member {
                id,
                name: attrs
                    .get("name")
                    .and_then(|n| n.as_str())
                    .unwrap_or_default()
                    .to_string(),
                peer_urls: list(&raft, "peerURLs"),
                client_urls: list(&attrs, "clientURLs"),
                is_learner: raft.get("isLearner").and_then(|l| l.as_bool()) == Some(true),
            });
        }
    }
    let mut removed = Vec::new();
    if let Some(serde_json::Value::Object(nodes)) = child(&zero, "removed_members")
        .as_ref()
        .and_then(|m| m.get("Children"))
    {
        removed.extend(nodes.keys().filter_map(|h| u64::from_str_radix(h, 16).ok()));
    }
    Ok((members, removed))
}

/// etcd's v2 `etcdserverpb.Request` (the fields migrate reads).
#[derive(Clone, PartialEq, prost::Message)]
struct V2Request {
    #[prost(uint64, tag = "1")]
    id: u64,
    #[prost(string, tag = "2")]
    method: String,
    #[prost(string, tag = "3")]
    path: String,
    #[prost(string, tag = "4")]
    val: String,
}

/// etcd's `raftpb.ConfChange` with its own type numbers (raft-rs numbers
/// the learner add differently and has no update).
#[derive(Clone, PartialEq, prost::Message)]
struct EtcdConfChange {
    #[prost(uint64, tag = "1")]
    id: u64,
    #[prost(int32, tag = "2")]
    kind: i32,
    #[prost(uint64, tag = "3")]
    node_id: u64,
    #[prost(bytes = "vec", tag = "4")]
    context: Vec<u8>,
}

const ETCD_ADD_NODE: i32 = 0;
const ETCD_REMOVE_NODE: i32 = 1;
const ETCD_UPDATE_NODE: i32 = 2;
const ETCD_ADD_LEARNER_NODE: i32 = 3;

/// InternalRaftRequest fields oxcd applies (api's raft_internal.proto).
fn known_field(tag: u32) -> bool {
    matches!(tag, 1 | 3..=11 | 100 | 1000 | 1011..=1013 | 1100..=1107 | 1200..=1204 | 1301)
}
/// etcd's v2 request field.
const V2_FIELD: u32 = 2;
/// etcd 3.5's cluster version and downgrade requests: nothing oxcd keeps.
fn etcd_only_field(tag: u32) -> bool {
    matches!(tag, 1300 | 1302)
}

/// How the entries were carried over.
#[derive(Debug, Default, PartialEq, Eq)]
struct Converted {
    kept: u64,
    attributes: u64,
    emptied: u64,
    conf_changes: u64,
}

/// The top-level field numbers of a protobuf message.
fn field_tags(mut buf: &[u8]) -> Result<Vec<u32>, prost::DecodeError> {
    use prost::encoding::{decode_key, skip_field, DecodeContext};
    let mut tags = Vec::new();
    while !buf.is_empty() {
        let (tag, wire_type) = decode_key(&mut buf)?;
        skip_field(wire_type, tag, &mut buf, DecodeContext::default())?;
        tags.push(tag);
    }
    Ok(tags)
}

fn member_attributes_id(path: &str) -> Option<u64> {
    let rest = path.strip_prefix("/0/members/")?;
    let hex = rest.strip_suffix("/attributes")?;
    u64::from_str_radix(hex, 16).ok()
}

/// One normal entry's data as oxcd applies it (None: an empty entry).
fn convert_normal(
    index: u64,
    data: &[u8],
    stats: &mut Converted,
) -> Result<Option<Vec<u8>>, CliError> {
    let tags = field_tags(data).map_err(|e| {
        failed(format!(
            "the entry at index {index} is not an etcd request: {e}"
        ))
    })?;
    if let Some(unknown) = tags
        .iter()
        .find(|t| !known_field(**t) && **t != V2_FIELD && !etcd_only_field(**t))
    {
        return Err(failed(format!(
            "the entry at index {index} carries a request oxcd does not know (InternalRaftRequest field {unknown})"
        )));
    }
    if tags.iter().all(|t| matches!(*t, 1 | 100)) && !tags.is_empty() {
        // only an ID: nothing to apply
        stats.emptied += 1;
        return Ok(None);
    }
    if !tags.contains(&V2_FIELD) && !tags.iter().any(|t| etcd_only_field(*t)) {
        stats.kept += 1;
        return Ok(Some(data.to_vec()));
    }
    if tags.contains(&V2_FIELD) {
        #[derive(Clone, PartialEq, prost::Message)]
        struct Wrapper {
            #[prost(message, optional, tag = "2")]
            v2: Option<V2Request>,
        }
        let v2 = Wrapper::decode(data)
            .map_err(|e| failed(format!("the v2 request at index {index}: {e}")))?
            .v2
            .unwrap_or_default();
        if v2.method == "PUT" {
            if let Some(id) = member_attributes_id(&v2.path) {
                let attrs: serde_json::Value = serde_json::from_str(&v2.val)
                    .map_err(|e| failed(format!("the member attributes at index {index}: {e}")))?;
                let request = api::etcdserverpb::InternalRaftRequest {
                    header: Some(api::etcdserverpb::RequestHeader {
                        id: v2.id,
                        ..Default::default()
                    }),
                    cluster_member_attr_set: Some(api::etcdserverpb::ClusterMemberAttrSetRequest {
                        member_id: id,
                        member_attributes: Some(api::etcdserverpb::Attributes {
                            name: attrs
                                .get("name")
                                .and_then(|n| n.as_str())
                                .unwrap_or_default()
                                .to_string(),
                            client_urls: string_list(&attrs, "clientURLs").unwrap_or_default(),
                        }),
                    }),
                    ..Default::default()
                };
                stats.attributes += 1;
                return Ok(Some(request.encode_to_vec()));
            }
        }
    }
    stats.emptied += 1;
    Ok(None)
}

/// One conf change as oxcd's apply takes it; `members` follows the
/// changes to know a member's role.
fn convert_conf_change(
    index: u64,
    data: &[u8],
    members: &mut std::collections::BTreeMap<u64, Member>,
) -> Result<Vec<u8>, CliError> {
    let cc = EtcdConfChange::decode(data)
        .map_err(|e| failed(format!("the conf change at index {index}: {e}")))?;
    let proposed = if cc.context.is_empty() {
        None
    } else {
        Some(parse_member_json(&cc.context).ok_or_else(|| {
            failed(format!(
                "the conf change at index {index} carries no member: {}",
                String::from_utf8_lossy(&cc.context)
            ))
        })?)
    };
    let mut ours = ConfChange {
        id: cc.id,
        node_id: cc.node_id,
        ..Default::default()
    };
    let kind = match cc.kind {
        ETCD_ADD_NODE => ConfChangeType::AddNode,
        ETCD_ADD_LEARNER_NODE => ConfChangeType::AddLearnerNode,
        ETCD_REMOVE_NODE => ConfChangeType::RemoveNode,
        ETCD_UPDATE_NODE => {
            let learner = members.get(&cc.node_id).is_some_and(|m| m.is_learner);
            if learner {
                ConfChangeType::AddLearnerNode
            } else {
                ConfChangeType::AddNode
            }
        }
        other => {
            return Err(failed(format!(
                "the conf change at index {index} has type {other}, unknown to etcd 3.5"
            )))
        }
    };
    ours.set_change_type(kind);
    match kind {
        ConfChangeType::RemoveNode => {
            members.remove(&cc.node_id);
        }
        _ => {
            let entry = members.entry(cc.node_id).or_insert_with(|| Member {
                id: cc.node_id,
                name: String::new(),
                peer_urls: Vec::new(),
                client_urls: Vec::new(),
                is_learner: kind == ConfChangeType::AddLearnerNode,
            });
            if kind == ConfChangeType::AddNode {
                entry.is_learner = false;
            }
            if let Some((m, _)) = &proposed {
                if !m.peer_urls.is_empty() {
                    entry.peer_urls = m.peer_urls.clone();
                }
            }
        }
    }
    if let Some((mut m, _)) = proposed {
        m.id = cc.node_id;
        ours.context = membership::encode(&m).into();
    }
    ours.write_to_bytes()
        .map_err(|e| failed(format!("the conf change at index {index}: {e}")))
}

/// What migrate did, for its report.
#[derive(Debug)]
pub struct Migrated {
    /// etcd's dedicated WAL dir, now oxcd's (etcd's kept beside it).
    pub wal_dir: Option<PathBuf>,
    pub member_id: u64,
    pub cluster_id: u64,
    pub consistent_index: u64,
    pub last_index: u64,
    pub revision: i64,
    pub members: usize,
    pub replayed: u64,
}

fn sync_dir(dir: &Path) -> Result<(), CliError> {
    fs::File::open(dir)?.sync_all()?;
    Ok(())
}

/// `dir`'s sibling named `<name><suffix>`.
fn beside(dir: &Path, suffix: &str) -> PathBuf {
    let name = dir
        .file_name()
        .map_or_else(|| "wal".into(), |n| n.to_string_lossy().into_owned());
    dir.with_file_name(format!("{name}{suffix}"))
}

/// Where etcd's dedicated WAL dir goes once oxcd's is in its place.
pub fn kept_wal_dir(wal_dir: &Path) -> PathBuf {
    beside(wal_dir, ".etcd")
}

/// Where oxcd's WAL for a dedicated WAL dir is built: beside it, on its
/// file system (a rename does not cross file systems).
fn staged_wal_dir(wal_dir: &Path) -> PathBuf {
    beside(wal_dir, STAGING_SUFFIX)
}

/// Puts oxcd's staged WAL in place of etcd's dedicated one, keeping
/// etcd's as [`kept_wal_dir`]; resumes a swap a crash cut short.
fn swap_wal_dirs(wal_dir: &Path) -> Result<(), CliError> {
    let kept = kept_wal_dir(wal_dir);
    if wal_dir.exists() && !kept.exists() {
        fs::rename(wal_dir, &kept)?;
    }
    fs::rename(staged_wal_dir(wal_dir), wal_dir)?;
    let parent = wal_dir
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    sync_dir(parent)
}

/// Holds etcd's lock on its backend file for as long as it lives, so that
/// etcd cannot start on the dir while migrate reads it; refuses when etcd
/// (or anything) holds it.
struct BackendLock(#[allow(dead_code)] fs::File);

fn lock_backend(db: &Path) -> Result<BackendLock, CliError> {
    use std::os::unix::io::AsRawFd;
    let file = fs::File::open(db).map_err(|e| failed(format!("open {}: {e}", db.display())))?;
    // SAFETY: flock on a descriptor this function owns.
    let rc = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
    if rc != 0 {
        return Err(failed(format!(
            "{} is locked: etcd is still running on this data dir; stop it first",
            db.display()
        )));
    }
    Ok(BackendLock(file))
}

/// Converts the etcd member in `data_dir` (see the module doc).
/// `etcd_wal_dir`: etcd's `--wal-dir` when it had one (None:
/// `member/wal`); oxcd's WAL then takes its place, so that oxcd starts
/// with the same `--wal-dir`, and etcd's is kept as `<wal-dir>.etcd`.
pub fn migrate(data_dir: &Path, etcd_wal_dir: Option<&Path>) -> Result<Migrated, CliError> {
    let member = data_dir.join("member");
    let kept = data_dir.join(ETCD_KEPT);
    let staging = data_dir.join(STAGING);
    let dedicated = etcd_wal_dir.filter(|w| *w != member.join("wal"));
    // a crash between the renames: the staged dirs are complete
    let mut finished = false;
    if !member.exists() && kept.exists() && staging.exists() {
        fs::rename(&staging, &member)?;
        sync_dir(data_dir)?;
        finished = true;
    }
    if let Some(wal_dir) = dedicated.filter(|w| kept.exists() && staged_wal_dir(w).exists()) {
        swap_wal_dirs(wal_dir)?;
        finished = true;
    }
    if finished {
        return Err(failed(format!(
            "{} was migrated already (an interrupted run, finished now); etcd's files are in {}",
            data_dir.display(),
            kept.display()
        )));
    }
    let db = member.join("snap").join("db");
    let wal_dir = etcd_wal_dir.map_or_else(|| member.join("wal"), Path::to_path_buf);
    if !db.exists() {
        return Err(failed(format!(
            "{} holds no etcd member (no member/snap/db)",
            data_dir.display()
        )));
    }
    if !mvcc::etcd_backend::is_bbolt(&db) {
        return Err(failed(if kept.exists() {
            format!(
                "{} is an oxcd data dir already (migrated; etcd's files are in {})",
                data_dir.display(),
                kept.display()
            )
        } else {
            format!("{} is not an etcd (bbolt) backend", db.display())
        }));
    }
    for kept in std::iter::once(kept.clone()).chain(dedicated.map(kept_wal_dir)) {
        if kept.exists() {
            return Err(failed(format!(
                "{} exists: remove it (an earlier migration's etcd files) before migrating again",
                kept.display()
            )));
        }
    }
    if !etcd_dir::is_etcd_wal(&wal_dir) {
        return Err(failed(format!(
            "{} holds no etcd WAL (an etcd member with a separate --wal-dir: give it with --wal-dir)",
            wal_dir.display()
        )));
    }
    let _lock = lock_backend(&db)?;
    let backend = read_backend_meta(&db)?;
    let log =
        etcd_dir::read_log(&wal_dir, &member.join("snap")).map_err(|e| failed(e.to_string()))?;
    if log.torn_bytes > 0 {
        eprintln!(
            "{{\"level\":\"warn\",\"msg\":\"the WAL ends with a torn record, cut as etcd's start cuts it\",\"bytes\":{}}}",
            log.torn_bytes
        );
    }
    let (base_members, removed) = base_membership(&backend, &log)?;
    let plan = plan(&backend, &log, base_members, removed)?;

    let staged_wal = dedicated.map_or_else(|| staging.join("wal"), staged_wal_dir);
    let _ = fs::remove_dir_all(&staging);
    if dedicated.is_some() {
        let _ = fs::remove_dir_all(&staged_wal);
    }
    let result = write_member(&db, &log, &plan, &staging, &staged_wal).and_then(|revision| {
        sync_dir(data_dir)?;
        fs::rename(&member, &kept)?;
        fs::rename(&staging, &member)?;
        sync_dir(data_dir)?;
        if let Some(wal_dir) = dedicated {
            swap_wal_dirs(wal_dir)?;
        }
        Ok(revision)
    });
    let revision = match result {
        Ok(r) => r,
        Err(e) => {
            // before etcd's member was set aside, nothing is kept; after,
            // the staged dirs finish the run when migrate runs again
            if !kept.exists() {
                let _ = fs::remove_dir_all(&staging);
                if dedicated.is_some() {
                    let _ = fs::remove_dir_all(&staged_wal);
                }
            }
            return Err(e);
        }
    };
    Ok(Migrated {
        wal_dir: dedicated.map(Path::to_path_buf),
        member_id: log.node_id,
        cluster_id: log.cluster_id,
        consistent_index: plan.consistent_index,
        last_index: log.last_index(),
        revision,
        members: plan.members.len(),
        replayed: plan
            .entries
            .iter()
            .filter(|e| e.index <= log.hard_state.commit)
            .count() as u64,
    })
}

/// The membership at the backend's consistent index: its buckets, or the
/// v2 store of the raft snapshot when they are empty (etcd 3.5 reads the
/// v2 store).
fn base_membership(
    backend: &BackendMeta,
    log: &EtcdLog,
) -> Result<(Vec<Member>, Vec<u64>), CliError> {
    if !backend.members.is_empty() {
        return Ok((backend.members.clone(), backend.removed.clone()));
    }
    if let Some(snapshot) = &log.snapshot {
        let (members, removed) = members_from_v2_store(&snapshot.v2_store)?;
        if !members.is_empty() {
            return Ok((members, removed));
        }
    }
    // a member whose backend never saw its bootstrap conf changes: they
    // are in the log, applied on start
    Ok((Vec::new(), backend.removed.clone()))
}

struct Plan {
    consistent_index: u64,
    base: Snapshot,
    members: Vec<Member>,
    removed: Vec<u64>,
    entries: Vec<Entry>,
    hard_state: HardState,
    voters: Vec<u64>,
}

fn plan(
    backend: &BackendMeta,
    log: &EtcdLog,
    members: Vec<Member>,
    removed: Vec<u64>,
) -> Result<Plan, CliError> {
    let ci = backend.consistent_index;
    let snap_index = log.snapshot_index();
    let last = log.last_index();
    if ci < snap_index {
        return Err(failed(format!(
            "the backend's consistent index {ci} is below the raft snapshot at {snap_index}: \
             etcd has not installed a snapshot it received; start etcd once, stop it, then migrate"
        )));
    }
    if ci > last {
        return Err(failed(format!(
            "the backend's consistent index {ci} is beyond the WAL's last entry {last}: the WAL is missing entries"
        )));
    }
    let term = match log.term_at(ci) {
        Some(t) => t,
        None if ci == 0 => 0,
        None if backend.term > 0 => backend.term,
        None => {
            return Err(failed(format!(
                "the term of the consistent index {ci} is in neither the WAL nor the backend"
            )))
        }
    };
    let mut by_id: std::collections::BTreeMap<u64, Member> =
        members.into_iter().map(|m| (m.id, m)).collect();
    let conf = ConfState {
        voters: by_id
            .values()
            .filter(|m| !m.is_learner)
            .map(|m| m.id)
            .collect(),
        learners: by_id
            .values()
            .filter(|m| m.is_learner)
            .map(|m| m.id)
            .collect(),
        ..Default::default()
    };
    if ci > 0 && conf.voters.is_empty() {
        return Err(failed(
            "the backend names no voting member at its consistent index".to_string(),
        ));
    }
    let mut base = Snapshot::default();
    base.mut_metadata().index = ci;
    base.mut_metadata().term = term;
    base.mut_metadata().set_conf_state(conf.clone());
    let final_members: Vec<Member> = by_id.values().cloned().collect();
    let mut stats = Converted::default();
    let mut entries = Vec::new();
    for e in log.entries.iter().filter(|e| e.index > ci) {
        let mut out = e.clone();
        match e.get_entry_type() {
            EntryType::EntryNormal if e.data.is_empty() => {}
            EntryType::EntryNormal => match convert_normal(e.index, &e.data, &mut stats)? {
                Some(data) => out.data = data.into(),
                None => out.data = Vec::new().into(),
            },
            EntryType::EntryConfChange => {
                out.data = convert_conf_change(e.index, &e.data, &mut by_id)?.into();
                stats.conf_changes += 1;
            }
            EntryType::EntryConfChangeV2 => {
                return Err(failed(format!(
                    "the entry at index {} is a ConfChangeV2, which etcd 3.5 never proposes",
                    e.index
                )))
            }
        }
        out.context = Vec::new().into();
        entries.push(out);
    }
    eprintln!(
        "{{\"level\":\"info\",\"msg\":\"converted the WAL's entries above the consistent index\",\"consistent-index\":{ci},\"last-index\":{last},\"kept\":{},\"v2-member-attributes\":{},\"emptied\":{},\"conf-changes\":{}}}",
        stats.kept, stats.attributes, stats.emptied, stats.conf_changes
    );
    let mut hard_state = log.hard_state.clone();
    hard_state.commit = hard_state.commit.max(ci).min(last);
    Ok(Plan {
        consistent_index: ci,
        base,
        voters: conf.voters,
        members: final_members,
        removed,
        entries,
        hard_state,
    })
}

/// Writes the oxcd member dir at `staging` and its WAL at `staged_wal`;
/// the revision it holds.
fn write_member(
    db: &Path,
    log: &EtcdLog,
    plan: &Plan,
    staging: &Path,
    staged_wal: &Path,
) -> Result<i64, CliError> {
    let snap_dir = staging.join("snap");
    consensus::fileutil::create_private_dir_all(&snap_dir)?;
    let records: Vec<(u64, Vec<u8>)> = plan
        .members
        .iter()
        .map(|m| (m.id, membership::encode(m)))
        .collect();
    let summary = mvcc::etcd_backend::import_bbolt(
        db,
        &snap_dir.join("db"),
        &mvcc::etcd_backend::BboltImport {
            members: &records,
            removed: &plan.removed,
            consistent_index: plan.consistent_index,
        },
    )
    .map_err(|e| failed(format!("cannot import {}: {e}", db.display())))?;
    consensus::import_log(
        staging,
        staged_wal,
        consensus::wal::Metadata {
            node_id: log.node_id,
            cluster_id: log.cluster_id,
            initial_voters: plan.voters.clone(),
        },
        &plan.base,
        &plan.entries,
        &plan.hard_state,
    )
    .map_err(|e| failed(format!("cannot write the raft log: {e}")))?;
    sync_dir(&snap_dir)?;
    sync_dir(staged_wal)?;
    sync_dir(staging)?;
    Ok(summary.revision)
}

/// migrate's report: what it did and how to go back.
pub fn report(data_dir: &Path, m: &Migrated) -> String {
    let kept: PathBuf = data_dir.join(ETCD_KEPT);
    let mut out = format!(
        "migrated etcd member {:x} of cluster {:x} ({} members) to oxcd in {}\n\
         backend: revision {}, consistent index {}; the WAL's last entry {}: a start applies {} committed entries\n",
        m.member_id,
        m.cluster_id,
        m.members,
        data_dir.display(),
        m.revision,
        m.consistent_index,
        m.last_index,
        m.replayed,
    );
    match &m.wal_dir {
        None => out.push_str(&format!(
            "etcd's files are kept in {}; to go back: rm -r {}/member && mv {} {}/member\n",
            kept.display(),
            data_dir.display(),
            kept.display(),
            data_dir.display(),
        )),
        Some(wal_dir) => {
            let kept_wal = kept_wal_dir(wal_dir);
            out.push_str(&format!(
                "oxcd's WAL is in {} (start oxcd with the same --wal-dir)\n\
                 etcd's files are kept in {} and {}; to go back: rm -r {}/member && mv {} {}/member \
                 && rm -r {} && mv {} {}\n",
                wal_dir.display(),
                kept.display(),
                kept_wal.display(),
                data_dir.display(),
                kept.display(),
                data_dir.display(),
                wal_dir.display(),
                kept_wal.display(),
                wal_dir.display(),
            ));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn member_json_as_etcd_writes_it() {
        let (m, promote) = parse_member_json(
            br#"{"id":12297534891839296811,"peerURLs":["http://127.0.0.1:2380"],"name":"a","clientURLs":["http://127.0.0.1:2379"]}"#,
        )
        .unwrap();
        assert_eq!(m.id, 12297534891839296811);
        assert_eq!(m.name, "a");
        assert_eq!(m.client_urls, ["http://127.0.0.1:2379"]);
        assert!(!m.is_learner && !promote);
        let (m, promote) =
            parse_member_json(br#"{"id":5,"peerURLs":null,"isLearner":false,"isPromote":true}"#)
                .unwrap();
        assert!(m.peer_urls.is_empty() && promote);
        assert!(parse_member_json(b"{\"peerURLs\":[]}").is_none());
        assert!(parse_member_json(b"not json").is_none());
    }

    #[test]
    fn v2_store_members() {
        let json = br#"{"Root":{"Path":"/","Children":{"0":{"Path":"/0","Children":{
            "members":{"Path":"/0/members","Children":{"8e9e05c52164694d":{"Children":{
                "attributes":{"Value":"{\"name\":\"default\",\"clientURLs\":[\"http://localhost:2379\"]}"},
                "raftAttributes":{"Value":"{\"peerURLs\":[\"http://localhost:2380\"]}"}}}}},
            "removed_members":{"Children":{"abc":{"Value":""}}}}}}}}"#;
        let (members, removed) = members_from_v2_store(json).unwrap();
        assert_eq!(members.len(), 1);
        assert_eq!(members[0].id, 0x8e9e05c52164694d);
        assert_eq!(members[0].name, "default");
        assert_eq!(members[0].peer_urls, ["http://localhost:2380"]);
        assert_eq!(removed, [0xabc]);
    }

    #[test]
    fn entries_are_carried_over_as_oxcd_applies_them() {
        let mut stats = Converted::default();
        // a v3 put: as it is
        let put = api::etcdserverpb::InternalRaftRequest {
            header: Some(api::etcdserverpb::RequestHeader {
                id: 9,
                ..Default::default()
            }),
            put: Some(api::etcdserverpb::PutRequest {
                key: b"k".to_vec().into(),
                value: b"v".to_vec().into(),
                ..Default::default()
            }),
            ..Default::default()
        }
        .encode_to_vec();
        assert_eq!(
            convert_normal(1, &put, &mut stats).unwrap(),
            Some(put.clone())
        );
        // etcd 3.4's publish: a v2 PUT of the member's attributes
        #[derive(Clone, PartialEq, prost::Message)]
        struct Wrapper {
            #[prost(uint64, tag = "1")]
            id: u64,
            #[prost(message, optional, tag = "2")]
            v2: Option<V2Request>,
        }
        let publish = Wrapper {
            id: 0,
            v2: Some(V2Request {
                id: 77,
                method: "PUT".into(),
                path: "/0/members/8e9e05c52164694d/attributes".into(),
                val: r#"{"name":"default","clientURLs":["http://localhost:2379"]}"#.into(),
            }),
        }
        .encode_to_vec();
        let got = convert_normal(2, &publish, &mut stats).unwrap().unwrap();
        let got = api::etcdserverpb::InternalRaftRequest::decode(&got[..]).unwrap();
        let set = got.cluster_member_attr_set.unwrap();
        assert_eq!(set.member_id, 0x8e9e05c52164694d);
        assert_eq!(set.member_attributes.unwrap().name, "default");
        // the cluster version in the v2 store: nothing to keep
        let version = Wrapper {
            id: 0,
            v2: Some(V2Request {
                id: 78,
                method: "PUT".into(),
                path: "/0/version".into(),
                val: "3.4.0".into(),
            }),
        }
        .encode_to_vec();
        assert_eq!(convert_normal(3, &version, &mut stats).unwrap(), None);
        // etcd 3.5's ClusterVersionSet (field 1300)
        let mut cvs = Vec::new();
        prost::encoding::bytes::encode(1300, &b"\x0a\x053.5.0".to_vec(), &mut cvs);
        assert_eq!(convert_normal(4, &cvs, &mut stats).unwrap(), None);
        // a field oxcd does not know: refused, never skipped
        let mut unknown = Vec::new();
        prost::encoding::bytes::encode(1400, &b"x".to_vec(), &mut unknown);
        let e = convert_normal(5, &unknown, &mut stats).unwrap_err();
        assert!(e.to_string().contains("field 1400"), "{e}");
        assert!(convert_normal(6, b"\xff\xff\xff", &mut stats).is_err());
        assert_eq!(
            stats,
            Converted {
                kept: 1,
                attributes: 1,
                emptied: 2,
                conf_changes: 0
            }
        );
    }

    #[test]
    fn conf_changes_get_oxcd_types_and_context() {
        let mut members = std::collections::BTreeMap::new();
        let add = EtcdConfChange {
            id: 1,
            kind: ETCD_ADD_LEARNER_NODE,
            node_id: 5,
            context: br#"{"id":5,"peerURLs":["http://b:2380"],"isLearner":true}"#.to_vec(),
        }
        .encode_to_vec();
        let cc = ConfChange::parse_from_bytes(&convert_conf_change(1, &add, &mut members).unwrap())
            .unwrap();
        assert_eq!(cc.get_change_type(), ConfChangeType::AddLearnerNode);
        let m = membership::decode(&cc.context).unwrap();
        assert_eq!((m.id, m.is_learner), (5, true));
        // an update of a learner stays a learner's add
        let update = EtcdConfChange {
            id: 2,
            kind: ETCD_UPDATE_NODE,
            node_id: 5,
            context: br#"{"id":5,"peerURLs":["http://c:2380"],"isLearner":true}"#.to_vec(),
        }
        .encode_to_vec();
        let cc =
            ConfChange::parse_from_bytes(&convert_conf_change(2, &update, &mut members).unwrap())
                .unwrap();
        assert_eq!(cc.get_change_type(), ConfChangeType::AddLearnerNode);
        assert_eq!(members[&5].peer_urls, ["http://c:2380"]);
        let remove = EtcdConfChange {
            id: 3,
            kind: ETCD_REMOVE_NODE,
            node_id: 5,
            context: Vec::new(),
        }
        .encode_to_vec();
        let cc =
            ConfChange::parse_from_bytes(&convert_conf_change(3, &remove, &mut members).unwrap())
                .unwrap();
        assert_eq!(cc.get_change_type(), ConfChangeType::RemoveNode);
        assert!(cc.context.is_empty() && members.is_empty());
        let bad = EtcdConfChange {
            id: 4,
            kind: 9,
            node_id: 5,
            context: Vec::new(),
        }
        .encode_to_vec();
        assert!(convert_conf_change(4, &bad, &mut members).is_err());
    }

    /// An etcd 3.5 member's data dir, made by hand: the backend has applied
    /// entries 1 (the bootstrap conf change) and 2 (put a), the WAL holds
    /// 3 (put b) and 4 (etcd 3.4's v2 publish) above it. The WAL goes to
    /// `wal_dir` (None: member/wal).
    fn etcd_member(dir: &Path, wal_dir: Option<&Path>) -> PathBuf {
        use crate::etcd_dir::testwal;
        const ID: u64 = 0x10;
        let snap = dir.join("member").join("snap");
        fs::create_dir_all(&snap).unwrap();
        let kv = |key: &str, value: &str, rev: i64| {
            api::mvccpb::KeyValue {
                key: key.as_bytes().to_vec().into(),
                value: value.as_bytes().to_vec().into(),
                create_revision: rev,
                mod_revision: rev,
                version: 1,
                lease: 0,
            }
            .encode_to_vec()
        };
        let mut w =
            bbolt::Writer::create(snap.join("db"), bbolt::WriterOptions::default()).unwrap();
        for bucket in eb::BUCKETS {
            w.begin_bucket(bucket.as_bytes()).unwrap();
            match bucket {
                eb::KEY => w.put(&eb::revision_key(2), &kv("a", "1", 2)).unwrap(),
                eb::MEMBERS => w
                    .put(
                        &eb::member_key(ID),
                        br#"{"id":16,"peerURLs":["http://127.0.0.1:2380"],"name":"e"}"#,
                    )
                    .unwrap(),
                eb::META => {
                    w.put(eb::CONSISTENT_INDEX, &2u64.to_be_bytes()).unwrap();
                    w.put(eb::TERM, &1u64.to_be_bytes()).unwrap();
                }
                _ => {}
            }
        }
        w.finish().unwrap();
        let entry = |index: u64, kind: EntryType, data: Vec<u8>| {
            let mut e = Entry {
                index,
                term: 1,
                data: data.into(),
                ..Default::default()
            };
            e.set_entry_type(kind);
            e
        };
        let put = |key: &str| {
            api::etcdserverpb::InternalRaftRequest {
                header: Some(api::etcdserverpb::RequestHeader {
                    id: 100,
                    ..Default::default()
                }),
                put: Some(api::etcdserverpb::PutRequest {
                    key: key.as_bytes().to_vec().into(),
                    value: b"2".to_vec().into(),
                    ..Default::default()
                }),
                ..Default::default()
            }
            .encode_to_vec()
        };
        #[derive(Clone, PartialEq, prost::Message)]
        struct Wrapper {
            #[prost(message, optional, tag = "2")]
            v2: Option<V2Request>,
        }
        let publish = Wrapper {
            v2: Some(V2Request {
                id: 7,
                method: "PUT".into(),
                path: "/0/members/10/attributes".into(),
                val: r#"{"name":"e","clientURLs":["http://127.0.0.1:2379"]}"#.into(),
            }),
        }
        .encode_to_vec();
        let add = EtcdConfChange {
            id: 1,
            kind: ETCD_ADD_NODE,
            node_id: ID,
            context: br#"{"id":16,"peerURLs":["http://127.0.0.1:2380"]}"#.to_vec(),
        }
        .encode_to_vec();
        let (segment, _) = testwal::segment(
            &[
                testwal::metadata(ID, 0x20),
                testwal::snapshot_record(0, 0),
                testwal::entry(&entry(1, EntryType::EntryConfChange, add)),
                testwal::entry(&entry(2, EntryType::EntryNormal, put("a"))),
                testwal::entry(&entry(3, EntryType::EntryNormal, put("b"))),
                testwal::entry(&entry(4, EntryType::EntryNormal, publish)),
                testwal::state(&HardState {
                    term: 1,
                    vote: ID,
                    commit: 4,
                    ..Default::default()
                }),
            ],
            0,
        );
        let wal = wal_dir.map_or_else(|| dir.join("member").join("wal"), Path::to_path_buf);
        fs::create_dir_all(&wal).unwrap();
        let path = wal.join("0000000000000000-0000000000000000.wal");
        fs::write(&path, segment).unwrap();
        path
    }

    #[test]
    fn a_hand_made_etcd_member_is_migrated_with_its_unapplied_entries() {
        for separate_wal in [false, true] {
            let dir = tempfile::tempdir().unwrap();
            let data = dir.path().join("data");
            let etcd_wal = dir.path().join("etcd-wal");
            let wal_dir = separate_wal.then_some(etcd_wal.as_path());
            let segment = etcd_member(&data, wal_dir);
            let m = migrate(&data, wal_dir).unwrap();
            assert_eq!((m.member_id, m.cluster_id), (0x10, 0x20));
            assert_eq!((m.consistent_index, m.last_index, m.replayed), (2, 4, 2));
            // etcd's files are kept as they were
            assert!(data.join("member.etcd/snap/db").exists());
            let kept_segment = match wal_dir {
                // etcd's dedicated WAL dir is set aside for oxcd's
                Some(w) => kept_wal_dir(w).join(segment.file_name().unwrap()),
                None => data
                    .join("member.etcd/wal")
                    .join(segment.file_name().unwrap()),
            };
            assert!(kept_segment.exists());
            let report = report(&data, &m);
            if let Some(w) = wal_dir {
                assert!(report.contains(&format!(
                    "&& rm -r {} && mv {} {}",
                    w.display(),
                    kept_wal_dir(w).display(),
                    w.display()
                )));
            }
            // the backend: applied up to 2, the member from its bucket
            let store = mvcc::Store::open(&data.join("member/snap/db")).unwrap();
            assert_eq!((store.current_revision(), store.consistent_index()), (2, 2));
            let members = store.members().unwrap();
            assert_eq!(membership::decode(&members[&0x10]).unwrap().name, "e");
            drop(store);
            // the log: the same identity, 3 as it was, 4 as oxcd's publish
            // oxcd's WAL: where etcd's was, for a start with etcd's flags
            let oxcd_wal = wal_dir.map_or_else(|| data.join("member/wal"), Path::to_path_buf);
            assert_eq!(data.join("member/wal").exists(), !separate_wal);
            let wal = consensus::wal::Wal::read(&oxcd_wal).unwrap();
            assert_eq!(
                (wal.metadata.node_id, wal.metadata.cluster_id),
                (0x10, 0x20)
            );
            let tail: Vec<&Entry> = wal.entries.iter().filter(|e| e.index > 2).collect();
            assert_eq!(tail.len(), 2);
            let publish = api::etcdserverpb::InternalRaftRequest::decode(tail[1].data.as_ref())
                .unwrap()
                .cluster_member_attr_set
                .unwrap();
            assert_eq!(publish.member_id, 0x10);
            assert_eq!(wal.hard_state.commit, 4);
            let base = consensus::snap::load_newest(&data.join("member/snap"))
                .unwrap()
                .unwrap();
            assert_eq!(base.get_metadata().index, 2);
            assert_eq!(base.get_metadata().get_conf_state().voters, [0x10]);
        }
    }

    #[test]
    fn an_interrupted_migration_with_a_wal_dir_is_finished_by_running_it_again() {
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path().join("data");
        let wal = dir.path().join("wal");
        let segment = etcd_member(&data, Some(&wal));
        let name = segment.file_name().unwrap().to_owned();
        migrate(&data, Some(&wal)).unwrap();
        let oxcd_segment = fs::read(wal.join(&name)).unwrap();
        let etcd_segment = fs::read(kept_wal_dir(&wal).join(&name)).unwrap();
        assert_ne!(oxcd_segment, etcd_segment);
        let staged = staged_wal_dir(&wal);
        // a crash before the WAL dirs were swapped, then one between the
        // two renames of the swap
        for etcd_set_aside in [false, true] {
            fs::rename(&wal, &staged).unwrap();
            if !etcd_set_aside {
                fs::rename(kept_wal_dir(&wal), &wal).unwrap();
            }
            let e = migrate(&data, Some(&wal)).unwrap_err().to_string();
            assert!(e.contains("an interrupted run, finished now"), "{e}");
            assert_eq!(fs::read(wal.join(&name)).unwrap(), oxcd_segment);
            assert_eq!(
                fs::read(kept_wal_dir(&wal).join(&name)).unwrap(),
                etcd_segment
            );
            assert!(!staged.exists());
        }
        // a finished one is not migrated again
        let e = migrate(&data, Some(&wal)).unwrap_err().to_string();
        assert!(e.contains("is an oxcd data dir already"), "{e}");
    }

    #[test]
    fn a_damaged_etcd_wal_is_refused_and_nothing_is_written() {
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path().join("data");
        let segment = etcd_member(&data, None);
        let mut bytes = fs::read(&segment).unwrap();
        // a bit flipped in the value of entry 3 ("b" -> "c")
        let at = bytes
            .windows(3)
            .position(|w| w == b"\x0a\x01b")
            .expect("entry 3's key");
        bytes[at + 2] ^= 0x01;
        fs::write(&segment, &bytes).unwrap();
        let before: Vec<_> = fs::read_dir(&data)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        let e = migrate(&data, None).unwrap_err().to_string();
        assert!(
            e.contains("damaged at offset") && e.contains("CRC mismatch"),
            "{e}"
        );
        let after: Vec<_> = fs::read_dir(&data)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(before, after, "nothing written beside etcd's member dir");
        assert!(mvcc::etcd_backend::is_bbolt(&data.join("member/snap/db")));
    }

    #[test]
    fn random_entry_bytes_never_panic() {
        let mut rng = fastrand::Rng::with_seed(0x5eed);
        let mut stats = Converted::default();
        let mut members = std::collections::BTreeMap::new();
        for _ in 0..5000 {
            let data: Vec<u8> = (0..rng.usize(0..64)).map(|_| rng.u8(..)).collect();
            let _ = convert_normal(1, &data, &mut stats);
            let _ = convert_conf_change(1, &data, &mut members);
            let _ = parse_member_json(&data);
            let _ = members_from_v2_store(&data);
        }
    }
}
