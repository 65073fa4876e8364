use api::mvccpb::{event::EventType, Event, KeyValue};

use super::*;

fn lessor() -> Lessor {
    Lessor::new(2, None)
}

fn put(key: &str, lease: i64) -> Event {
    Event {
        r#type: EventType::Put as i32,
        kv: Some(KeyValue {
            key: Bytes::from(key.to_owned()),
            lease,
            ..Default::default()
        }),
        prev_kv: None,
    }
}

fn delete(key: &str) -> Event {
    Event {
        r#type: EventType::Delete as i32,
        kv: Some(KeyValue {
            key: Bytes::from(key.to_owned()),
            ..Default::default()
        }),
        prev_kv: None,
    }
}

const SECOND: Duration = Duration::from_secs(1);

#[test]
fn min_ttl_is_one_and_a_half_election_timeouts_rounded_up() {
    assert_eq!(
        min_lease_ttl(Duration::from_millis(100), Duration::from_millis(1000)),
        2
    );
    assert_eq!(
        min_lease_ttl(Duration::from_millis(100), Duration::from_millis(5000)),
        8
    );
}

#[test]
fn grant_clamps_ttl_and_refuses_duplicates_zero_and_too_large() {
    let l = lessor();
    let now = Instant::now();
    assert_eq!(l.grant(1, 1, now).unwrap().0, 2);
    assert_eq!(l.grant(2, 60, now).unwrap().0, 60);
    assert_eq!(l.grant(1, 10, now).unwrap_err(), rpctypes::LEASE_EXIST);
    assert_eq!(l.grant(0, 10, now).unwrap_err(), rpctypes::LEASE_NOT_FOUND);
    assert_eq!(
        l.grant(3, MAX_LEASE_TTL + 1, now).unwrap_err(),
        rpctypes::LEASE_T_T_L_TOO_LARGE
    );
    assert_eq!(l.leases().len(), 2);
}

#[test]
fn follower_leases_never_expire_leader_leases_do() {
    let l = lessor();
    let now = Instant::now();
    l.grant(7, 5, now).unwrap();
    assert!(l.expired(now + 100 * SECOND, 10).is_empty(), "not primary");
    l.promote(SECOND, now);
    assert!(
        l.expired(now + 5 * SECOND, 10).is_empty(),
        "extended by 1 s"
    );
    assert_eq!(l.expired(now + 6 * SECOND, 10), vec![7]);
    // Re-queued for a retry, not reported again at once.
    assert!(l.expired(now + 7 * SECOND, 10).is_empty());
    assert_eq!(l.expired(now + 9 * SECOND, 10), vec![7]);
    l.demote();
    assert!(l.expired(now + 100 * SECOND, 10).is_empty());
}

#[test]
fn renew_pushes_expiry_and_expired_lease_waits_for_revoke() {
    let l = lessor();
    let now = Instant::now();
    assert_eq!(l.renew(1, now), RenewOutcome::NotPrimary);
    l.promote(Duration::ZERO, now);
    assert_eq!(l.renew(1, now), RenewOutcome::NotFound);
    l.grant(1, 10, now).unwrap();
    assert_eq!(
        l.renew(1, now + 8 * SECOND),
        RenewOutcome::Renewed {
            ttl: 10,
            clear_checkpoint: false
        }
    );
    assert!(l.expired(now + 11 * SECOND, 10).is_empty(), "renewed");
    assert_eq!(
        l.time_to_live(1, false, now + 11 * SECOND)
            .unwrap()
            .remaining,
        7
    );
    assert_eq!(l.expired(now + 18 * SECOND, 10), vec![1]);
    assert_eq!(l.renew(1, now + 18 * SECOND), RenewOutcome::Expired);
    l.remove(1);
    assert_eq!(l.renew(1, now + 18 * SECOND), RenewOutcome::NotFound);
}

#[test]
fn keys_follow_puts_and_deletes() {
    let l = lessor();
    let now = Instant::now();
    l.grant(1, 10, now).unwrap();
    l.grant(2, 10, now).unwrap();
    l.on_events(&[put("b", 1), put("a", 1), put("c", 2)]);
    assert_eq!(l.keys_to_revoke(1).unwrap(), vec!["a", "b"]);
    // Moving a key to another lease, to none, or deleting it detaches it.
    l.on_events(&[put("a", 2), put("b", 0)]);
    assert!(l.keys_to_revoke(1).unwrap().is_empty());
    l.on_events(&[delete("c")]);
    assert_eq!(l.keys_to_revoke(2).unwrap(), vec!["a"]);
    let info = l.time_to_live(2, true, now).unwrap();
    assert_eq!(info.keys, vec![Bytes::from("a")]);
    l.remove(2);
    assert!(l.keys_to_revoke(2).is_none());
    // A later put of the key under a new lease starts clean.
    l.grant(3, 10, now).unwrap();
    l.on_events(&[put("a", 3)]);
    assert_eq!(l.keys_to_revoke(3).unwrap(), vec!["a"]);
}

#[test]
fn recover_rebuilds_leases_and_keys() {
    let l = lessor();
    let now = Instant::now();
    let (_, record) = l.grant(5, 30, now).unwrap();
    let other = lessor();
    other.recover(
        vec![record],
        vec![(Bytes::from("k"), 5), (Bytes::from("orphan"), 9)],
    );
    assert!(other.exists(5));
    assert!(!other.exists(9));
    assert_eq!(other.keys_to_revoke(5).unwrap(), vec!["k"]);
    assert_eq!(other.time_to_live(5, false, now).unwrap().granted_ttl, 30);
}

#[test]
fn checkpoint_sets_remaining_ttl_used_by_the_next_leader() {
    let interval = Duration::from_secs(5);
    let leader = Lessor::new(2, Some(interval));
    let follower = Lessor::new(2, Some(interval));
    let now = Instant::now();
    for l in [&leader, &follower] {
        l.grant(1, 100, now).unwrap();
    }
    leader.promote(Duration::ZERO, now);
    assert!(leader.due_checkpoints(now + 4 * SECOND, 10).is_empty());
    let due = leader.due_checkpoints(now + 30 * SECOND, 10);
    assert_eq!(due.len(), 1);
    assert_eq!(due[0].remaining_ttl, 70);
    let records = follower.checkpoint(&due, now + 30 * SECOND);
    assert_eq!(records.len(), 1);
    // The follower becomes leader: 70 s left plus the extension, not 100.
    follower.promote(SECOND, now + 30 * SECOND);
    let info = follower.time_to_live(1, false, now + 30 * SECOND).unwrap();
    assert_eq!(info.remaining, 71);
    // A renewal clears the checkpoint through raft.
    assert_eq!(
        follower.renew(1, now + 31 * SECOND),
        RenewOutcome::Renewed {
            ttl: 100,
            clear_checkpoint: true
        }
    );
}

#[test]
fn promote_spreads_many_leases_expiring_together() {
    let l = lessor();
    let now = Instant::now();
    let count = 3 * LEASE_REVOKE_RATE;
    for id in 1..=count as i64 {
        l.grant(id, 10, now).unwrap();
    }
    l.promote(Duration::ZERO, now);
    // Without spreading all 3,000 would expire at now + 10 s.
    let first_second = l.expired(now + 11 * SECOND, usize::MAX).len();
    assert!(
        first_second <= 3 * LEASE_REVOKE_RATE / 4 + 1,
        "{first_second} leases expire in the first second"
    );
    // Every lease still expires (retries of the first ones come back too).
    let later: HashSet<i64> = l
        .expired(now + 20 * SECOND, usize::MAX)
        .into_iter()
        .collect();
    assert_eq!(later.len(), count);
}
