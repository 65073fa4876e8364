//! The lessor: leases, their TTLs and the keys attached to them (etcd's
//! `server/lease` package).
//!
//! What every member keeps, changed only by the apply loop: the leases
//! (ID, granted TTL, remaining TTL of the last checkpoint) and, per lease,
//! the keys whose latest put names it. They persist in the backend's `lease`
//! table (as etcd's `leasepb.Lease`) and are rebuilt on start from that
//! table and the keys' own lease fields.
//!
//! What only the leader (the "primary") keeps: expiry times. A follower's
//! leases never expire; the leader finds expired ones and proposes their
//! revocation through raft, so every member deletes the same keys at the
//! same revision. On becoming leader every lease gets its remaining TTL (the
//! checkpointed one, else the full TTL) plus an election timeout, so no
//! lease expires because of the election; leases piled up at one instant
//! are spread so that at most 3/4 of the revoke rate expire per second.
//!
//! This crate does no I/O and reads no clock: callers pass `now`, so a
//! test drives time. The member's side (proposals, forwarding keep-alives
//! to the leader, the expiry loop) is etcdserver's (`etcdserver::lease_driver`).

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, HashSet};
use std::time::{Duration, Instant};

use api::etcdserverpb::LeaseCheckpoint;
use api::rpctypes::{self, EtcdError};
use bytes::Bytes;
use parking_lot::Mutex;

/// etcd's MaxLeaseTTL: a longer TTL is refused with "too large lease TTL".
pub const MAX_LEASE_TTL: i64 = 9_000_000_000;
/// Leases revoked per second at most (etcd's leaseRevokeRate): a mass
/// expiry becomes a steady trickle of revocations, not a stall of writes.
pub const LEASE_REVOKE_RATE: usize = 1000;
/// Checkpoints proposed per second at most (etcd's leaseCheckpointRate).
pub const LEASE_CHECKPOINT_RATE: usize = 1000;
/// Checkpoints in one proposal (etcd's maxLeaseCheckpointBatchSize).
pub const MAX_LEASE_CHECKPOINT_BATCH_SIZE: usize = 1000;
/// An expired lease whose revocation did not apply is retried after this
/// (etcd's expiredLeaseRetryInterval).
pub const EXPIRED_LEASE_RETRY_INTERVAL: Duration = Duration::from_secs(3);
/// etcd's default --experimental-lease-checkpoint-interval.
pub const DEFAULT_LEASE_CHECKPOINT_INTERVAL: Duration = Duration::from_secs(5 * 60);

/// The shortest TTL a lease gets (etcd's minLeaseTTL): one and a half
/// election timeouts in whole seconds, so a lease outlives an election.
pub fn min_lease_ttl(heartbeat: Duration, election_timeout: Duration) -> i64 {
    let heartbeat_ms = heartbeat.as_millis().max(1);
    let election_ticks = (election_timeout.as_millis() / heartbeat_ms).max(1);
    let min_ttl_ms = (3 * election_ticks / 2) * heartbeat_ms;
    (min_ttl_ms as i64 + 999) / 1000
}

#[derive(Debug)]
struct Lease {
    ttl: i64,
    /// From the last checkpoint; 0: none (the full TTL applies).
    remaining_ttl: i64,
    /// None: never expires (on a follower, or not promoted yet).
    expiry: Option<Instant>,
    /// The time of the expiry-queue entry that counts for this lease;
    /// other entries for it are stale.
    queued_at: Option<Instant>,
    keys: HashSet<Bytes>,
}

impl Lease {
    fn remaining_or_ttl(&self) -> i64 {
        if self.remaining_ttl > 0 {
            self.remaining_ttl
        } else {
            self.ttl
        }
    }

    fn record(&self, id: i64) -> Vec<u8> {
        schema::leases::encode(id, self.ttl, self.remaining_ttl)
    }
}

#[derive(Default)]
struct State {
    leases: HashMap<i64, Lease>,
    /// key → the lease its latest put names.
    key_leases: HashMap<Bytes, i64>,
    primary: bool,
    /// Bumped on every promote and demote: a renewal waiting on an expired
    /// lease gives up when leadership moves.
    term_of_primacy: u64,
    expiry_queue: BinaryHeap<Reverse<(Instant, i64)>>,
    checkpoint_queue: BinaryHeap<Reverse<(Instant, i64)>>,
}

/// What `renew` tells the caller.
#[derive(Debug, PartialEq, Eq)]
pub enum RenewOutcome {
    /// Renewed: the lease's TTL; `clear_checkpoint` asks the caller to
    /// propose a checkpoint of 0 (the lease had a checkpointed remaining TTL).
    Renewed {
        ttl: i64,
        clear_checkpoint: bool,
    },
    NotFound,
    /// This member is not the leader: the renewal goes to the leader.
    NotPrimary,
    /// Expired and waiting for its revocation: ask again after a change.
    Expired,
}

/// A lease as TimeToLive reports it.
#[derive(Debug, PartialEq, Eq)]
pub struct LeaseInfo {
    pub granted_ttl: i64,
    /// Seconds left, truncated toward zero (etcd's int64(Remaining().Seconds())).
    pub remaining: i64,
    pub keys: Vec<Bytes>,
}

pub struct Lessor {
    state: Mutex<State>,
    min_ttl: i64,
    /// None: checkpoints disabled (etcd's default).
    checkpoint_interval: Option<Duration>,
    /// Woken when a lease is revoked or primacy changes.
    pub changed: tokio::sync::Notify,
}

impl Lessor {
    pub fn new(min_ttl: i64, checkpoint_interval: Option<Duration>) -> Lessor {
        Lessor {
            state: Mutex::new(State::default()),
            min_ttl,
            checkpoint_interval,
            changed: tokio::sync::Notify::new(),
        }
    }

    pub fn min_ttl(&self) -> i64 {
        self.min_ttl
    }

    pub fn checkpointing(&self) -> bool {
        self.checkpoint_interval.is_some()
    }

    /// Replaces every lease with the backend's records and attaches the
    /// given keys (on start and after a snapshot install). Leases never
    /// expire until the next promote.
    pub fn recover(&self, records: impl IntoIterator<Item = Vec<u8>>, keys: Vec<(Bytes, i64)>) {
        let mut state = self.state.lock();
        let primary = state.primary;
        *state = State {
            primary,
            term_of_primacy: state.term_of_primacy,
            ..State::default()
        };
        for record in records {
            let Ok(lease) = schema::leases::decode(&record) else {
                tracing::error!("cannot decode a lease record; skipping it");
                continue;
            };
            state.leases.insert(
                lease.id,
                Lease {
                    ttl: lease.ttl.max(self.min_ttl),
                    remaining_ttl: lease.remaining_ttl,
                    expiry: None,
                    queued_at: None,
                    keys: HashSet::new(),
                },
            );
        }
        for (key, id) in keys {
            if let Some(lease) = state.leases.get_mut(&id) {
                lease.keys.insert(key.clone());
                state.key_leases.insert(key, id);
            }
        }
        drop(state);
        self.changed.notify_waiters();
    }

    /// Every key attached to a lease, with its lease (what [`Lessor::recover`]
    /// takes back).
    pub fn leased_keys(&self) -> Vec<(Bytes, i64)> {
        let state = self.state.lock();
        state
            .key_leases
            .iter()
            .map(|(key, id)| (key.clone(), *id))
            .collect()
    }

    pub fn exists(&self, id: i64) -> bool {
        self.state.lock().leases.contains_key(&id)
    }

    pub fn len(&self) -> usize {
        self.state.lock().leases.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn is_primary(&self) -> bool {
        self.state.lock().primary
    }

    /// Applies a grant: returns the granted TTL and the record to persist.
    pub fn grant(&self, id: i64, ttl: i64, now: Instant) -> Result<(i64, Vec<u8>), EtcdError> {
        if id == 0 {
            return Err(rpctypes::LEASE_NOT_FOUND);
        }
        if ttl > MAX_LEASE_TTL {
            return Err(rpctypes::LEASE_T_T_L_TOO_LARGE);
        }
        let mut state = self.state.lock();
        if state.leases.contains_key(&id) {
            return Err(rpctypes::LEASE_EXIST);
        }
        let mut lease = Lease {
            ttl: ttl.max(self.min_ttl),
            remaining_ttl: 0,
            expiry: None,
            queued_at: None,
            keys: HashSet::new(),
        };
        let record = lease.record(id);
        let granted = lease.ttl;
        if state.primary {
            refresh(&mut state.expiry_queue, id, &mut lease, Duration::ZERO, now);
            self.schedule_checkpoint(&mut state.checkpoint_queue, id, &lease, now);
        }
        state.leases.insert(id, lease);
        Ok((granted, record))
    }

    /// The keys to delete for a revocation, sorted (etcd deletes them in
    /// key order in one transaction); None if the lease does not exist.
    pub fn keys_to_revoke(&self, id: i64) -> Option<Vec<Bytes>> {
        let state = self.state.lock();
        let lease = state.leases.get(&id)?;
        let mut keys: Vec<Bytes> = lease.keys.iter().cloned().collect();
        keys.sort();
        Some(keys)
    }

    /// Forgets a revoked lease (its keys were deleted by the caller).
    pub fn remove(&self, id: i64) {
        let mut state = self.state.lock();
        if let Some(lease) = state.leases.remove(&id) {
            for key in lease.keys {
                if state.key_leases.get(&key) == Some(&id) {
                    state.key_leases.remove(&key);
                }
            }
        }
        drop(state);
        self.changed.notify_waiters();
    }

    /// Attaches and detaches keys as a write's events say: a put attaches
    /// the key to the lease it names (and detaches it from its old one), a
    /// delete detaches it.
    pub fn on_events(&self, events: &[api::mvccpb::Event]) {
        use api::mvccpb::event::EventType;
        let mut state = self.state.lock();
        if state.leases.is_empty() && state.key_leases.is_empty() {
            return;
        }
        for event in events {
            let Some(kv) = &event.kv else { continue };
            let new_lease = if event.r#type == EventType::Put as i32 {
                kv.lease
            } else {
                0
            };
            let old_lease = state.key_leases.get(&kv.key).copied().unwrap_or(0);
            if old_lease == new_lease {
                continue;
            }
            if old_lease != 0 {
                if let Some(lease) = state.leases.get_mut(&old_lease) {
                    lease.keys.remove(&kv.key);
                }
                state.key_leases.remove(&kv.key);
            }
            if new_lease != 0 {
                if let Some(lease) = state.leases.get_mut(&new_lease) {
                    lease.keys.insert(kv.key.clone());
                    state.key_leases.insert(kv.key.clone(), new_lease);
                }
            }
        }
    }

    /// Applies checkpoints: the remaining TTLs to persist, as records.
    pub fn checkpoint(&self, checkpoints: &[LeaseCheckpoint], now: Instant) -> Vec<(i64, Vec<u8>)> {
        let mut state = self.state.lock();
        let mut records = Vec::new();
        let primary = state.primary;
        let State {
            leases,
            checkpoint_queue,
            ..
        } = &mut *state;
        for cp in checkpoints {
            if let Some(lease) = leases.get_mut(&cp.id) {
                lease.remaining_ttl = cp.remaining_ttl;
                records.push((cp.id, lease.record(cp.id)));
                if primary {
                    self.schedule_checkpoint(checkpoint_queue, cp.id, lease, now);
                }
            }
        }
        records
    }

    /// The leader renews a lease (a keep-alive).
    pub fn renew(&self, id: i64, now: Instant) -> RenewOutcome {
        let mut state = self.state.lock();
        if !state.primary {
            return RenewOutcome::NotPrimary;
        }
        let State {
            leases,
            expiry_queue,
            ..
        } = &mut *state;
        let Some(lease) = leases.get_mut(&id) else {
            return RenewOutcome::NotFound;
        };
        if lease.expiry.is_some_and(|expiry| expiry <= now) {
            // Being revoked: the answer is "not found" once that applies,
            // or a retry on another leader.
            return RenewOutcome::Expired;
        }
        let clear_checkpoint = self.checkpointing() && lease.remaining_ttl > 0;
        // The full TTL: the checkpoint being cleared no longer counts.
        lease.expiry = Some(now + Duration::from_secs(lease.ttl as u64));
        lease.queued_at = lease.expiry;
        if let Some(at) = lease.expiry {
            expiry_queue.push(Reverse((at, id)));
        }
        RenewOutcome::Renewed {
            ttl: lease.ttl,
            clear_checkpoint,
        }
    }

    /// A generation number that changes with every promote and demote.
    pub fn primacy_generation(&self) -> u64 {
        self.state.lock().term_of_primacy
    }

    /// TimeToLive as the leader answers it; None if the lease is unknown.
    pub fn time_to_live(&self, id: i64, with_keys: bool, now: Instant) -> Option<LeaseInfo> {
        let state = self.state.lock();
        let lease = state.leases.get(&id)?;
        let remaining = match lease.expiry {
            // etcd: time.Duration(math.MaxInt64).Seconds().
            None => i64::MAX / 1_000_000_000,
            Some(expiry) if expiry >= now => (expiry - now).as_secs() as i64,
            Some(expiry) => -((now - expiry).as_secs() as i64),
        };
        let keys = if with_keys {
            let mut keys: Vec<Bytes> = lease.keys.iter().cloned().collect();
            keys.sort();
            keys
        } else {
            Vec::new()
        };
        Some(LeaseInfo {
            granted_ttl: lease.ttl,
            remaining,
            keys,
        })
    }

    /// Every lease ID, soonest expiry first (etcd's Leases()).
    pub fn leases(&self) -> Vec<i64> {
        let state = self.state.lock();
        let mut leases: Vec<(Option<Instant>, i64)> = state
            .leases
            .iter()
            .map(|(id, lease)| (lease.expiry, *id))
            .collect();
        leases.sort_by(|a, b| match (a.0, b.0) {
            (Some(x), Some(y)) => x.cmp(&y).then(a.1.cmp(&b.1)),
            (Some(_), None) => std::cmp::Ordering::Less,
            (None, Some(_)) => std::cmp::Ordering::Greater,
            (None, None) => a.1.cmp(&b.1),
        });
        leases.into_iter().map(|(_, id)| id).collect()
    }

    /// This member became leader: every lease expires after its remaining
    /// TTL plus `extend` (etcd's Promote), spread when many would expire
    /// together.
    pub fn promote(&self, extend: Duration, now: Instant) {
        let mut state = self.state.lock();
        state.primary = true;
        state.term_of_primacy += 1;
        state.expiry_queue.clear();
        state.checkpoint_queue.clear();
        let State {
            leases,
            expiry_queue,
            checkpoint_queue,
            ..
        } = &mut *state;
        for (id, lease) in leases.iter_mut() {
            refresh(expiry_queue, *id, lease, extend, now);
            self.schedule_checkpoint(checkpoint_queue, *id, lease, now);
        }
        if leases.len() >= LEASE_REVOKE_RATE {
            spread_expiries(leases, expiry_queue, extend, now);
        }
        drop(state);
        self.changed.notify_waiters();
    }

    /// This member lost leadership: no lease expires here any more.
    pub fn demote(&self) {
        let mut state = self.state.lock();
        state.primary = false;
        state.term_of_primacy += 1;
        state.expiry_queue.clear();
        state.checkpoint_queue.clear();
        for lease in state.leases.values_mut() {
            lease.expiry = None;
            lease.queued_at = None;
        }
        drop(state);
        self.changed.notify_waiters();
    }

    /// Up to `limit` leases expired at `now` whose revocation the leader
    /// should propose. Each is re-queued to be retried after
    /// [`EXPIRED_LEASE_RETRY_INTERVAL`] in case the revocation is lost.
    pub fn expired(&self, now: Instant, limit: usize) -> Vec<i64> {
        let mut state = self.state.lock();
        if !state.primary {
            return Vec::new();
        }
        let State {
            leases,
            expiry_queue,
            ..
        } = &mut *state;
        let mut expired = Vec::new();
        while expired.len() < limit {
            let Some(Reverse((at, id))) = expiry_queue.peek().copied() else {
                break;
            };
            if at > now {
                break;
            }
            expiry_queue.pop();
            let Some(lease) = leases.get_mut(&id) else {
                continue;
            };
            if lease.queued_at != Some(at) {
                continue; // renewed since: a stale entry
            }
            let retry = now + EXPIRED_LEASE_RETRY_INTERVAL;
            lease.queued_at = Some(retry);
            expiry_queue.push(Reverse((retry, id)));
            expired.push(id);
        }
        expired
    }

    /// Checkpoints due at `now`, at most `limit` (etcd's
    /// findDueScheduledCheckpoints): leases whose remaining TTL is below
    /// their TTL get it recorded through raft.
    pub fn due_checkpoints(&self, now: Instant, limit: usize) -> Vec<LeaseCheckpoint> {
        let mut state = self.state.lock();
        if !state.primary || self.checkpoint_interval.is_none() {
            return Vec::new();
        }
        let State {
            leases,
            checkpoint_queue,
            ..
        } = &mut *state;
        let mut due = Vec::new();
        while due.len() < limit {
            let Some(Reverse((at, id))) = checkpoint_queue.peek().copied() else {
                break;
            };
            if at > now {
                break;
            }
            checkpoint_queue.pop();
            let Some(lease) = leases.get(&id) else {
                continue;
            };
            let Some(expiry) = lease.expiry else { continue };
            if expiry <= now {
                continue;
            }
            let remaining = (expiry - now).as_secs_f64().ceil() as i64;
            if remaining >= lease.ttl {
                continue;
            }
            due.push(LeaseCheckpoint {
                id,
                remaining_ttl: remaining,
            });
        }
        due
    }

    /// The soonest time the expiry loop has work (expiry or checkpoint).
    pub fn next_deadline(&self) -> Option<Instant> {
        let state = self.state.lock();
        let expiry = state.expiry_queue.peek().map(|Reverse((at, _))| *at);
        let checkpoint = state.checkpoint_queue.peek().map(|Reverse((at, _))| *at);
        match (expiry, checkpoint) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    fn schedule_checkpoint(
        &self,
        queue: &mut BinaryHeap<Reverse<(Instant, i64)>>,
        id: i64,
        lease: &Lease,
        now: Instant,
    ) {
        if let Some(interval) = self.checkpoint_interval {
            if lease.remaining_or_ttl() > interval.as_secs() as i64 {
                queue.push(Reverse((now + interval, id)));
            }
        }
    }
}

/// Sets a lease's expiry to its remaining TTL plus `extend` from `now`.
fn refresh(
    queue: &mut BinaryHeap<Reverse<(Instant, i64)>>,
    id: i64,
    lease: &mut Lease,
    extend: Duration,
    now: Instant,
) {
    let expiry = now + extend + Duration::from_secs(lease.remaining_or_ttl().max(0) as u64);
    lease.expiry = Some(expiry);
    lease.queued_at = Some(expiry);
    queue.push(Reverse((expiry, id)));
}

/// etcd's Promote overlap adjustment: walking leases by expiry, once more
/// than 3/4 of the revoke rate would expire within one second, the later
/// ones are pushed back so that expiries stay under that rate.
fn spread_expiries(
    leases: &mut HashMap<i64, Lease>,
    queue: &mut BinaryHeap<Reverse<(Instant, i64)>>,
    extend: Duration,
    now: Instant,
) {
    let mut by_expiry: Vec<(Instant, i64)> = leases
        .iter()
        .filter_map(|(id, l)| l.expiry.map(|e| (e, *id)))
        .collect();
    by_expiry.sort();
    let Some(&(first, _)) = by_expiry.first() else {
        return;
    };
    let target_per_second = (3 * LEASE_REVOKE_RATE / 4) as f64;
    let mut base_window = first.saturating_duration_since(now);
    let mut next_window = base_window + Duration::from_secs(1);
    let mut expires = 0usize;
    for (expiry, id) in by_expiry {
        let remaining = expiry.saturating_duration_since(now);
        if remaining > next_window {
            base_window = remaining;
            next_window = base_window + Duration::from_secs(1);
            expires = 1;
            continue;
        }
        expires += 1;
        if expires as f64 <= target_per_second {
            continue;
        }
        let rate_delay = 1e9 * (expires as f64 / target_per_second)
            - (remaining.as_nanos() as f64 - base_window.as_nanos() as f64);
        let delay = Duration::from_nanos(rate_delay.max(0.0) as u64);
        next_window = base_window + delay;
        if let Some(lease) = leases.get_mut(&id) {
            refresh(queue, id, lease, delay + extend, now);
        }
    }
}

#[cfg(test)]
mod tests;
