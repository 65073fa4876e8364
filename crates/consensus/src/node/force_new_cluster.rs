//! etcd's `--force-new-cluster` (etcdserver/raft.go
//! restartAsStandaloneNode): the member keeps its committed log, drops
//! what was not committed, and commits the removal of every other member
//! (and its own addition if it was not a voter), so that it alone is the
//! cluster when raft starts. The removed members' IDs reach the apply side
//! like any removal: they can never rejoin.

use protobuf::Message as _;
use raft::eraftpb::{
    ConfChange, ConfChangeType, ConfChangeV2, ConfState, Entry, EntryType, HardState, Snapshot,
};

use crate::{ConsensusError, RaftConfig};

/// Rewrites the log read from the WAL: `entries` are cut at the commit
/// index and `hard_state` commits the returned entries, which the caller
/// appends to the WAL (and to `entries`).
pub(super) fn rewrite(
    cfg: &RaftConfig,
    snapshot: Option<&Snapshot>,
    initial_voters: &[u64],
    hard_state: &mut HardState,
    entries: &mut Vec<Entry>,
) -> Result<Vec<Entry>, ConsensusError> {
    let snap_index = snapshot.map_or(0, |s| s.get_metadata().index);
    let commit = hard_state.commit.max(snap_index).max(cfg.applied);
    let dropped = entries.iter().filter(|e| e.index > commit).count();
    entries.retain(|e| e.index <= commit);
    let mut conf = match snapshot {
        Some(s) => s.get_metadata().get_conf_state().clone(),
        None => ConfState {
            voters: initial_voters.to_vec(),
            ..Default::default()
        },
    };
    for e in entries.iter().filter(|e| e.index > snap_index) {
        follow(&mut conf, e)?;
    }
    let mut changes = Vec::new();
    if !conf.voters.contains(&cfg.id) {
        changes.push((ConfChangeType::AddNode, cfg.id));
    }
    let mut others: Vec<u64> = conf
        .voters
        .iter()
        .chain(&conf.learners)
        .copied()
        .filter(|id| *id != cfg.id)
        .collect();
    others.sort_unstable();
    others.dedup();
    changes.extend(others.iter().map(|id| (ConfChangeType::RemoveNode, *id)));
    // What was applied or committed must be in the log, or the forced
    // entries would follow a gap (raft's log would not hold together).
    let last = entries
        .last()
        .map_or(snap_index, |e| e.index)
        .max(snap_index);
    if commit > last {
        return Err(ConsensusError::Corrupt(format!(
            "cannot force a new cluster: commit index {commit} is beyond the log's last index {last}"
        )));
    }
    if last.checked_add(changes.len() as u64).is_none() {
        return Err(ConsensusError::Corrupt(format!(
            "cannot force a new cluster: no index after the log's last index {last}"
        )));
    }
    let term = hard_state.term;
    let mut forced = Vec::with_capacity(changes.len());
    for (i, (change_type, node_id)) in changes.into_iter().enumerate() {
        let mut cc = ConfChange::default();
        cc.set_change_type(change_type);
        cc.node_id = node_id;
        let data = cc
            .write_to_bytes()
            .map_err(|e| ConsensusError::Corrupt(format!("cannot encode a conf change: {e}")))?;
        let mut entry = Entry::default();
        entry.set_entry_type(EntryType::EntryConfChange);
        entry.index = last + 1 + i as u64;
        entry.term = term;
        entry.data = data.into();
        forced.push(entry);
    }
    hard_state.commit = forced.last().map_or(commit, |e| e.index);
    tracing::warn!(
        "local-member-id" = %format!("{:x}", cfg.id),
        "commit-index" = commit,
        "discarded-uncommitted-entries" = dropped,
        "removed-members" = %others.iter().map(|id| format!("{id:x}")).collect::<Vec<_>>().join(","),
        "forcing restart member"
    );
    Ok(forced)
}

/// Follows one committed entry's conf change on `conf`.
fn follow(conf: &mut ConfState, entry: &Entry) -> Result<(), ConsensusError> {
    let undecodable = |e: protobuf::ProtobufError| {
        ConsensusError::Corrupt(format!(
            "cannot decode the committed conf change at index {}: {e}",
            entry.index
        ))
    };
    let changes: Vec<(ConfChangeType, u64)> = match entry.get_entry_type() {
        EntryType::EntryNormal => return Ok(()),
        EntryType::EntryConfChange => {
            let cc = ConfChange::parse_from_bytes(&entry.data).map_err(undecodable)?;
            vec![(cc.get_change_type(), cc.node_id)]
        }
        EntryType::EntryConfChangeV2 => {
            let cc = ConfChangeV2::parse_from_bytes(&entry.data).map_err(undecodable)?;
            cc.get_changes()
                .iter()
                .map(|c| (c.get_change_type(), c.node_id))
                .collect()
        }
    };
    for (change_type, id) in changes {
        conf.voters.retain(|v| *v != id);
        conf.learners.retain(|v| *v != id);
        match change_type {
            ConfChangeType::AddNode => conf.voters.push(id),
            ConfChangeType::AddLearnerNode => conf.learners.push(id),
            ConfChangeType::RemoveNode => {}
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cc_entry(index: u64, change_type: ConfChangeType, node_id: u64) -> Entry {
        let mut cc = ConfChange::default();
        cc.set_change_type(change_type);
        cc.node_id = node_id;
        let mut e = Entry::default();
        e.set_entry_type(EntryType::EntryConfChange);
        e.index = index;
        e.term = 2;
        e.data = cc.write_to_bytes().unwrap().into();
        e
    }

    fn normal(index: u64) -> Entry {
        Entry {
            index,
            term: 2,
            ..Default::default()
        }
    }

    #[test]
    fn keeps_the_committed_log_and_commits_the_removal_of_every_other_member() {
        let cfg = RaftConfig {
            id: 1,
            member_dir: Default::default(),
            wal_dir: Default::default(),
            voters: vec![],
            heartbeat: Default::default(),
            election_timeout: Default::default(),
            applied: 2,
            cluster_id: 9,
            force_new_cluster: true,
        };
        let mut hs = HardState {
            term: 3,
            commit: 3,
            vote: 2,
            ..Default::default()
        };
        // 4 joined as a learner at 2; 5 was proposed but never committed
        let mut entries = vec![
            normal(1),
            cc_entry(2, ConfChangeType::AddLearnerNode, 4),
            normal(3),
            cc_entry(4, ConfChangeType::AddNode, 5),
        ];
        let forced = rewrite(&cfg, None, &[1, 2, 3], &mut hs, &mut entries).unwrap();
        assert_eq!(entries.len(), 3, "the uncommitted entry is dropped");
        let removed: Vec<(u64, u64)> = forced
            .iter()
            .map(|e| {
                let cc = ConfChange::parse_from_bytes(&e.data).unwrap();
                assert_eq!(cc.get_change_type(), ConfChangeType::RemoveNode);
                (e.index, cc.node_id)
            })
            .collect();
        assert_eq!(removed, [(4, 2), (5, 3), (6, 4)]);
        assert_eq!(hs.commit, 6);
        assert!(forced.iter().all(|e| e.term == 3));
    }
}
