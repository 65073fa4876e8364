//! Alarms (etcd's etcdserver/api/v3alarm) and the space quota
//! (etcdserver/quota.go): which members raised NOSPACE or CORRUPT, kept in
//! the backend's `alarm` table and changed only by applied raft entries;
//! and what the apply loop refuses while one is raised.
//!
//! * NOSPACE: writes that grow the database (puts, txns with a put, lease
//!   grants) fail with "etcdserver: mvcc: database space exceeded"; reads,
//!   deletes, compaction and lease revocation still work, so the documented
//!   recovery (compact, defrag, disarm) can run.
//! * CORRUPT: every write fails with "etcdserver: corrupt cluster".

use std::collections::BTreeSet;

use api::etcdserverpb::{request_op, AlarmMember, AlarmType, PutRequest, TxnRequest};
use parking_lot::Mutex;
use prost::Message;

/// etcd's estimate of a lease's storage cost (quota.go leaseOverhead).
const LEASE_OVERHEAD: i64 = 64;
/// etcd's estimate of a key's metadata cost (quota.go kvOverhead).
const KV_OVERHEAD: i64 = 256;
/// etcd's suggested maximum quota (MaxQuotaBytes: 8 GiB): above it etcd
/// only warns, and keeps the quota asked for.
pub const MAX_QUOTA_BYTES: i64 = 8 * 1024 * 1024 * 1024;
/// etcd's DefaultQuotaBytes, the quota of a flag of 0.
pub const DEFAULT_QUOTA_BYTES: i64 = 2 * 1024 * 1024 * 1024;
/// The name etcd's first quota logs under (its applier's, created first).
const QUOTA_NAME: &str = "v3-applier";

/// etcd's NewBackendQuota on --quota-backend-bytes: 0 is the default
/// (2 GiB), negative disables the quota (0 here), anything else is kept,
/// with a warning above [`MAX_QUOTA_BYTES`]; logged with etcd's lines.
pub fn backend_quota(flag: i64) -> i64 {
    let humanize = |bytes: i64| mvcc::snapshot_file::humanize_bytes(bytes.unsigned_abs());
    if flag < 0 {
        tracing::info!(
            "quota-name" = QUOTA_NAME,
            "quota-size-bytes" = flag,
            "disabled backend quota"
        );
        return 0;
    }
    if flag == 0 {
        tracing::info!(
            "quota-name" = QUOTA_NAME,
            "quota-size-bytes" = DEFAULT_QUOTA_BYTES,
            "quota-size" = %humanize(DEFAULT_QUOTA_BYTES),
            "enabled backend quota with default value"
        );
        return DEFAULT_QUOTA_BYTES;
    }
    if flag > MAX_QUOTA_BYTES {
        tracing::warn!(
            "quota-name" = QUOTA_NAME,
            "quota-size-bytes" = flag,
            "quota-size" = %humanize(flag),
            "quota-maximum-size-bytes" = MAX_QUOTA_BYTES,
            "quota-maximum-size" = %humanize(MAX_QUOTA_BYTES),
            "quota exceeds the maximum value"
        );
    }
    tracing::info!(
        "quota-name" = QUOTA_NAME,
        "quota-size-bytes" = flag,
        "quota-size" = %humanize(flag),
        "enabled backend quota"
    );
    flag
}

/// The apply-side restriction the raised alarms impose.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Restriction {
    None,
    /// NOSPACE: no write that grows the database.
    Capped,
    /// CORRUPT: no write at all.
    Corrupt,
}

#[derive(Default)]
pub struct Alarms {
    /// (member ID, alarm type).
    raised: Mutex<BTreeSet<(u64, i32)>>,
}

impl Alarms {
    /// Replaces every alarm with the backend's records.
    pub(crate) fn recover(&self, records: impl IntoIterator<Item = Vec<u8>>) {
        let mut raised = self.raised.lock();
        raised.clear();
        for record in records {
            match schema::alarms::decode(&record) {
                Ok(m) => {
                    raised.insert((m.member_id, m.alarm));
                }
                Err(e) => tracing::error!(error = %e, "cannot decode an alarm record; skipping it"),
            }
        }
    }

    /// Raises an alarm; Some(the alarm) if it was not raised yet.
    pub(crate) fn activate(&self, member: u64, alarm: i32) -> Option<AlarmMember> {
        if alarm == AlarmType::None as i32 {
            return None;
        }
        self.raised
            .lock()
            .insert((member, alarm))
            .then_some(AlarmMember {
                member_id: member,
                alarm,
            })
    }

    /// Clears an alarm; Some(the alarm) if it was raised.
    pub(crate) fn deactivate(&self, member: u64, alarm: i32) -> Option<AlarmMember> {
        self.raised
            .lock()
            .remove(&(member, alarm))
            .then_some(AlarmMember {
                member_id: member,
                alarm,
            })
    }

    /// The raised alarms of a type (NONE: all), by member.
    pub fn get(&self, alarm: i32) -> Vec<AlarmMember> {
        self.raised
            .lock()
            .iter()
            .filter(|(_, a)| alarm == AlarmType::None as i32 || *a == alarm)
            .map(|(member, a)| AlarmMember {
                member_id: *member,
                alarm: *a,
            })
            .collect()
    }

    pub(crate) fn restriction(&self) -> Restriction {
        let raised = self.raised.lock();
        if raised.iter().any(|(_, a)| *a == AlarmType::Corrupt as i32) {
            Restriction::Corrupt
        } else if raised.iter().any(|(_, a)| *a == AlarmType::Nospace as i32) {
            Restriction::Capped
        } else {
            Restriction::None
        }
    }
}

/// etcd's AlarmMember String(): `memberID:N alarm:NAME ` (as in Status errors).
pub(crate) fn describe(m: &AlarmMember) -> String {
    let name = AlarmType::try_from(m.alarm)
        .map(|a| a.as_str_name().to_string())
        .unwrap_or_else(|_| m.alarm.to_string());
    format!("memberID:{} alarm:{} ", m.member_id, name)
}

/// The bytes a put may add to the database (etcd's costPut).
pub fn cost_put(req: &PutRequest) -> i64 {
    let kv = api::mvccpb::KeyValue {
        key: req.key.clone(),
        value: req.value.clone(),
        lease: req.lease,
        ..Default::default()
    };
    let mut cost = kv.encoded_len() as i64 + KV_OVERHEAD;
    if req.lease != 0 {
        // The lease's key set grows too.
        cost += LEASE_OVERHEAD;
    }
    cost
}

/// The larger of a txn's branches' put costs (etcd's costTxn; nested txns
/// cost nothing there either).
pub fn cost_txn(req: &TxnRequest) -> i64 {
    let branch = |ops: &[api::etcdserverpb::RequestOp]| -> i64 {
        ops.iter()
            .map(|op| match &op.request {
                Some(request_op::Request::RequestPut(put)) => cost_put(put),
                _ => 0,
            })
            .sum()
    };
    branch(&req.success).max(branch(&req.failure))
}

pub(crate) fn cost_lease_grant() -> i64 {
    LEASE_OVERHEAD
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nospace_caps_and_corrupt_wins() {
        let alarms = Alarms::default();
        assert_eq!(alarms.restriction(), Restriction::None);
        assert!(alarms.activate(1, AlarmType::Nospace as i32).is_some());
        assert!(alarms.activate(1, AlarmType::Nospace as i32).is_none());
        assert!(alarms.activate(1, AlarmType::None as i32).is_none());
        assert_eq!(alarms.restriction(), Restriction::Capped);
        alarms.activate(2, AlarmType::Corrupt as i32);
        assert_eq!(alarms.restriction(), Restriction::Corrupt);
        assert_eq!(alarms.get(AlarmType::None as i32).len(), 2);
        assert_eq!(alarms.get(AlarmType::Nospace as i32).len(), 1);
        alarms.deactivate(2, AlarmType::Corrupt as i32);
        alarms.deactivate(1, AlarmType::Nospace as i32);
        assert_eq!(alarms.restriction(), Restriction::None);
    }

    #[test]
    fn recovered_alarms_match_their_records() {
        let alarms = Alarms::default();
        alarms.recover(vec![schema::alarms::encode(
            u64::MAX,
            AlarmType::Nospace as i32,
        )]);
        assert_eq!(
            alarms.get(AlarmType::None as i32),
            vec![AlarmMember {
                member_id: u64::MAX,
                alarm: AlarmType::Nospace as i32
            }]
        );
        assert_ne!(
            schema::alarms::record_key(7, AlarmType::Nospace as i32),
            schema::alarms::record_key(7, AlarmType::Corrupt as i32)
        );
    }

    #[test]
    fn a_quota_above_etcds_suggested_maximum_is_kept_as_etcd_keeps_it() {
        let sixteen_gib = 16 * 1024 * 1024 * 1024;
        assert_eq!(backend_quota(sixteen_gib), sixteen_gib);
        assert_eq!(backend_quota(MAX_QUOTA_BYTES + 1), MAX_QUOTA_BYTES + 1);
        assert_eq!(backend_quota(MAX_QUOTA_BYTES), MAX_QUOTA_BYTES);
        assert_eq!(backend_quota(0), DEFAULT_QUOTA_BYTES);
        assert_eq!(backend_quota(-1), 0, "negative disables the quota");
        assert_eq!(
            mvcc::snapshot_file::humanize_bytes(sixteen_gib as u64),
            "17 GB"
        );
        assert_eq!(
            mvcc::snapshot_file::humanize_bytes(MAX_QUOTA_BYTES as u64),
            "8.6 GB"
        );
    }

    #[test]
    fn only_puts_cost_space() {
        let put = PutRequest {
            key: "k".into(),
            value: vec![0; 100].into(),
            ..Default::default()
        };
        assert!(cost_put(&put) > 100);
        let txn = TxnRequest {
            success: vec![api::etcdserverpb::RequestOp {
                request: Some(request_op::Request::RequestDeleteRange(Default::default())),
            }],
            ..Default::default()
        };
        assert_eq!(cost_txn(&txn), 0);
    }
}
