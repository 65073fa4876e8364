//! The core without disk, threads or network: input in, effects out.

use super::*;
use crate::ProposeReply;
use tokio::sync::oneshot;

fn config(id: u64) -> Config {
    Config {
        id,
        election_tick: 10,
        heartbeat_tick: 1,
        pre_vote: true,
        check_quorum: true,
        ..Default::default()
    }
}

fn restore(voters: &[u64]) -> Restore {
    Restore {
        snapshot: None,
        initial_voters: voters.to_vec(),
        hard_state: HardState::default(),
        entries: Vec::new(),
        applied: 0,
        catch_up_entries: 2,
        read_timeout: Duration::from_secs(5),
    }
}

/// Carries out every Ready as the driver would, with a perfect disk;
/// returns the committed entries and the messages sent.
fn drive(core: &mut Core) -> (Vec<Entry>, Vec<Message>) {
    let (mut committed, mut sent) = (Vec::new(), Vec::new());
    while let Some(mut persist) = core.ready() {
        sent.append(&mut persist.messages);
        assert!(persist.snapshot.is_none());
        let advanced = core.advance(persist).unwrap();
        sent.extend(advanced.persisted_messages);
        sent.extend(advanced.messages);
        committed.extend(advanced.committed);
    }
    (committed, sent)
}

fn propose(core: &mut Core, data: &[u8]) -> oneshot::Receiver<Result<(), ConsensusError>> {
    let (reply, answer) = oneshot::channel();
    core.input(Input::Propose {
        data: data.to_vec(),
        reply: ProposeReply::Always(reply),
    });
    answer
}

#[test]
fn a_single_voter_leads_at_once_and_commits_what_it_persists() {
    let mut core = Core::restore(&config(1), restore(&[1])).unwrap();
    drive(&mut core);
    let status = core.status();
    assert!(status.is_leader, "a lone voter campaigns when restored");
    assert_eq!(status.leader_changes, 1);

    let mut answer = propose(&mut core, b"put");
    assert!(answer.try_recv().unwrap().is_ok());
    let persist = core.ready().expect("the proposal is a Ready");
    assert_eq!(persist.entries().last().unwrap().data, b"put".to_vec());
    assert!(persist.must_sync(), "new entries are synced");
    let advanced = core.advance(persist).unwrap();
    let (mut committed, _) = drive(&mut core);
    committed.splice(0..0, advanced.committed);
    assert_eq!(committed.last().unwrap().data, b"put".to_vec());
    let index = committed.last().unwrap().index;
    assert!(core.status().commit_index >= index);
    assert!(committed.windows(2).all(|w| w[1].index == w[0].index + 1));

    core.applied_to(index);
    assert_eq!(core.status().applied_index, index);
    core.applied_to(index + 100);
    assert_eq!(
        core.status().applied_index,
        index,
        "applied never passes what raft committed"
    );
}

#[test]
fn a_follower_without_a_leader_refuses_proposals() {
    let mut core = Core::restore(&config(1), restore(&[1, 2, 3])).unwrap();
    drive(&mut core);
    assert!(!core.status().is_leader);
    let mut answer = propose(&mut core, b"put");
    assert!(matches!(
        answer.try_recv().unwrap(),
        Err(ConsensusError::NoLeader)
    ));
}

#[test]
fn ticks_past_the_election_timeout_start_a_pre_vote() {
    let mut core = Core::restore(&config(1), restore(&[1, 2, 3])).unwrap();
    drive(&mut core);
    let mut sent = Vec::new();
    for _ in 0..40 {
        core.tick();
        sent.extend(drive(&mut core).1);
    }
    let pre_votes: Vec<u64> = sent
        .iter()
        .filter(|m| m.get_msg_type() == raft::eraftpb::MessageType::MsgRequestPreVote)
        .map(|m| m.to)
        .collect();
    assert!(
        pre_votes.contains(&2) && pre_votes.contains(&3),
        "{pre_votes:?}"
    );
    assert_eq!(core.status().term, 0, "a pre-vote does not raise the term");
}

#[test]
fn snapshots_follow_the_apply_sides_request_and_keep_catch_up_entries() {
    let mut core = Core::restore(&config(1), restore(&[1])).unwrap();
    drive(&mut core);
    for i in 0..10 {
        drop(propose(&mut core, format!("put {i}").as_bytes()));
    }
    let (committed, _) = drive(&mut core);
    let last = committed.last().unwrap().index;
    core.applied_to(last);
    assert!(core.snapshot_due(0).is_none(), "nothing requested");
    assert!(
        core.snapshot_due(last + 5).unwrap().get_metadata().index == last,
        "never past what raft committed"
    );
    let snapshot = core.snapshot_due(last - 1).unwrap();
    let meta = snapshot.get_metadata();
    assert_eq!(meta.index, last - 1);
    assert_eq!(meta.get_conf_state().voters, vec![1]);
    let index = meta.index;
    core.snapshot_saved(index).unwrap();
    assert!(core.snapshot_due(last - 1).is_none(), "taken once");
    assert_eq!(
        core.raw.store().first_index().unwrap(),
        index - 2,
        "the two catch-up entries below the snapshot stay in memory"
    );
}

#[test]
fn a_wal_and_backend_that_disagree_are_refused() {
    let entry = |index, term| Entry {
        index,
        term,
        ..Default::default()
    };
    let gap = Restore {
        snapshot: None,
        entries: vec![entry(2, 1), entry(3, 1)],
        ..restore(&[1])
    };
    let error = Core::restore(&config(1), gap).err().unwrap().to_string();
    assert!(error.contains("resume at index 2"), "{error}");
    let ahead = Restore {
        entries: vec![entry(1, 1)],
        applied: 5,
        ..restore(&[1])
    };
    let error = Core::restore(&config(1), ahead).err().unwrap().to_string();
    assert!(error.contains("beyond the WAL's last index 1"), "{error}");
}

/// Found by the robustness harness (kubernetes seed 1031, a crash at
/// raftBeforeApplySnap): the leader's backend covered index 1022, the raft
/// snapshot it came with 1019, the WAL ended at 1019 when the member
/// crashed; the restart refused. raft starts from the WAL's end and the
/// entries up to the backend's index come again.
#[test]
fn a_leaders_backend_ahead_of_the_wal_after_its_snapshot_starts_from_the_wal() {
    let snapshot = |data: &str| {
        let mut s = raft::eraftpb::Snapshot::default();
        s.mut_metadata().index = 10;
        s.mut_metadata().term = 1;
        s.mut_metadata().mut_conf_state().voters = vec![1];
        s.data = data.as_bytes().to_vec().into();
        s
    };
    let received = Restore {
        snapshot: Some(snapshot("/data/member/snap/000000000000000a.snap.db")),
        applied: 13,
        hard_state: HardState {
            term: 1,
            commit: 10,
            ..Default::default()
        },
        ..restore(&[1])
    };
    let core = Core::restore(&config(1), received).expect("starts");
    assert_eq!(core.raw.raft.raft_log.applied, 10);
    // the member's own snapshot carries nothing: the WAL lost entries
    let own = Restore {
        snapshot: Some(snapshot("")),
        applied: 13,
        hard_state: HardState {
            term: 1,
            commit: 10,
            ..Default::default()
        },
        ..restore(&[1])
    };
    let error = Core::restore(&config(1), own).err().unwrap().to_string();
    assert!(error.contains("beyond the WAL's last index 10"), "{error}");
}

#[test]
fn an_undecodable_committed_conf_change_stops_the_member() {
    let entries = vec![Entry {
        index: 1,
        term: 1,
        entry_type: EntryType::EntryConfChangeV2,
        data: vec![0xff, 0xff, 0xff].into(),
        ..Default::default()
    }];
    let damaged = Restore {
        entries,
        hard_state: HardState {
            term: 1,
            commit: 1,
            ..Default::default()
        },
        applied: 1,
        ..restore(&[1])
    };
    let error = Core::restore(&config(1), damaged)
        .err()
        .unwrap()
        .to_string();
    assert!(
        error.contains("cannot decode the committed conf change at index 1"),
        "{error}"
    );
}
