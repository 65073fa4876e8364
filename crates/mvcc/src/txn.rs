//! The write transaction: put, delete_range, range and txn at one revision,
//! as etcd's storeTxnWrite plus the applier logic of etcdserver/apply.go.

use api::etcdserverpb::compare::{CompareResult, CompareTarget, TargetUnion};
use api::etcdserverpb::{
    request_op, response_op, Compare, DeleteRangeRequest, DeleteRangeResponse, PutRequest,
    PutResponse, RangeRequest, RangeResponse, RequestOp, ResponseHeader, ResponseOp, TxnRequest,
    TxnResponse,
};
use api::mvccpb::{event::EventType, Event, KeyValue};
use bytes::Bytes;
use parking_lot::MutexGuard;
use prost::Message;

use crate::key_index::RangeEnd;
use crate::range::{self, header};
use crate::revision::Revision;
use crate::store::{Store, ValueReader};
use crate::MvccError;

/// What `TxnWrite::end` published.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct WriteResult {
    /// The store's current revision after the transaction.
    pub revision: i64,
    /// PUT/DELETE events in sub-revision order; `prev_kv` is the key's value
    /// before the transaction (when enabled on the store).
    pub events: Vec<Event>,
}

struct Change {
    key: Bytes,
    tombstone: bool,
    encoded: Bytes,
    event: Event,
}

/// The chosen branch of a txn and, for each nested txn in it, its own choice.
struct Branch {
    succeeded: bool,
    nested: Vec<Branch>,
}

/// The ops of the branch a txn takes.
fn branch_ops(req: &TxnRequest, succeeded: bool) -> &[RequestOp] {
    if succeeded {
        &req.success
    } else {
        &req.failure
    }
}

/// One write transaction. Every change gets main revision `begin + 1` and
/// increasing sub revisions. Changes are visible to other readers only after
/// `end`; dropping it without `end` undoes them.
pub struct TxnWrite<'s> {
    store: &'s Store,
    _writer: MutexGuard<'s, ()>,
    begin_revision: i64,
    consistent_index: u64,
    changes: Vec<Change>,
    /// Side-table records to write (Some) or remove (None) at `end`.
    side: Vec<(crate::SideTable, u64, Option<Vec<u8>>)>,
    reader: ValueReader<'s>,
    ended: bool,
    /// Range, put and delete ops run (counted when the transaction ends).
    ops: u32,
}

impl<'s> TxnWrite<'s> {
    pub(crate) fn new(
        store: &'s Store,
        writer: MutexGuard<'s, ()>,
        begin_revision: i64,
        consistent_index: u64,
    ) -> TxnWrite<'s> {
        TxnWrite {
            store,
            _writer: writer,
            begin_revision,
            consistent_index,
            changes: Vec::new(),
            side: Vec::new(),
            reader: ValueReader::new(store),
            ended: false,
            ops: 0,
        }
    }

    fn write_revision(&self) -> i64 {
        self.begin_revision + 1
    }

    /// The revision reads see: this transaction's once it changed something.
    fn view_revision(&self) -> i64 {
        if self.changes.is_empty() {
            self.begin_revision
        } else {
            self.write_revision()
        }
    }

    fn fetch(
        &mut self,
        revisions: &[Revision],
        read_revision: i64,
    ) -> Result<Vec<KeyValue>, MvccError> {
        let write_revision = self.write_revision();
        let changes = &self.changes;
        self.reader
            .get_many(revisions, read_revision, |revision: Revision| {
                (revision.main == write_revision)
                    .then(|| {
                        changes
                            .get(revision.sub as usize)
                            .map(|c| c.encoded.clone())
                    })
                    .flatten()
            })
    }

    fn get_kv(&mut self, key: &[u8], at_revision: i64) -> Result<Option<KeyValue>, MvccError> {
        let found = self.store.state.read().tree.get(key, at_revision);
        match found {
            Some(at) => Ok(self.fetch(&[at.modified], at_revision)?.pop()),
            None => Ok(None),
        }
    }

    fn range_kvs(&mut self, key: &[u8], range_end: &[u8]) -> Result<Vec<KeyValue>, MvccError> {
        let view = self.view_revision();
        let (revisions, _) = self.store.state.read().tree.revisions(
            key,
            RangeEnd::from_request(range_end),
            view,
            0,
            false,
        );
        self.fetch(&revisions, view)
    }

    pub fn range(&mut self, req: &RangeRequest) -> Result<RangeResponse, MvccError> {
        self.store.ops.range();
        self.ops += 1;
        let view = self.view_revision();
        let (revisions, count, read_revision) = {
            let state = self.store.state.read();
            let read_revision =
                range::resolve_revision(req.revision, view, state.compact_revision)?;
            let (revisions, count) = state.tree.revisions(
                &req.key,
                RangeEnd::from_request(&req.range_end),
                read_revision,
                range::fetch_limit(req),
                req.count_only,
            );
            (revisions, count, read_revision)
        };
        let kvs = self.fetch(&revisions, read_revision)?;
        Ok(range::finish(req, kvs, count, view))
    }

    pub fn put(&mut self, req: &PutRequest) -> Result<PutResponse, MvccError> {
        self.store.ops.put(req.key.len() + req.value.len());
        self.ops += 1;
        // etcd's applier checks the lease before anything else.
        if !self.store.lease_exists(req.lease) {
            return Err(MvccError::LeaseNotFound);
        }
        let needs_previous = req.ignore_value || req.ignore_lease || req.prev_kv;
        let previous = if needs_previous {
            self.get_kv(&req.key, self.view_revision())?
        } else {
            None
        };
        let (value, lease) = match (&previous, req.ignore_value || req.ignore_lease) {
            (None, true) => return Err(MvccError::KeyNotFound),
            (Some(prev), _) => (
                if req.ignore_value {
                    prev.value.clone()
                } else {
                    req.value.clone()
                },
                if req.ignore_lease {
                    prev.lease
                } else {
                    req.lease
                },
            ),
            (None, false) => (req.value.clone(), req.lease),
        };
        let revision = Revision::new(self.write_revision(), self.changes.len() as i64);
        let key = Bytes::copy_from_slice(&req.key);
        let kv = {
            let mut state = self.store.state.write();
            let (create_revision, version) = match state.tree.get(&key, revision.main) {
                Some(at) => (at.created, at.version + 1),
                None => (revision.main, 1),
            };
            state.tree.put(&key, revision);
            KeyValue {
                key: key.clone(),
                create_revision,
                mod_revision: revision.main,
                version,
                value,
                lease,
            }
        };
        let encoded = crate::backend::seal(kv.encode_to_vec());
        self.changes.push(Change {
            key,
            tombstone: false,
            encoded,
            event: Event {
                r#type: EventType::Put as i32,
                kv: Some(kv),
                prev_kv: None,
            },
        });
        Ok(PutResponse {
            header: Some(header(self.view_revision())),
            prev_kv: if req.prev_kv { previous } else { None },
        })
    }

    pub fn delete_range(
        &mut self,
        req: &DeleteRangeRequest,
    ) -> Result<DeleteRangeResponse, MvccError> {
        self.store.ops.delete();
        self.ops += 1;
        let prev_kvs = if req.prev_kv {
            self.range_kvs(&req.key, &req.range_end)?
        } else {
            Vec::new()
        };
        let keys = self.store.state.read().tree.live_keys(
            &req.key,
            RangeEnd::from_request(&req.range_end),
            self.view_revision(),
        );
        for key in &keys {
            let revision = Revision::new(self.write_revision(), self.changes.len() as i64);
            let tombstoned = self.store.state.write().tree.tombstone(key, revision);
            assert!(tombstoned, "a live key can be tombstoned");
            let record = KeyValue {
                key: key.clone(),
                ..Default::default()
            };
            self.changes.push(Change {
                key: key.clone(),
                tombstone: true,
                encoded: crate::backend::seal(record.encode_to_vec()),
                event: Event {
                    r#type: EventType::Delete as i32,
                    kv: Some(KeyValue {
                        key: key.clone(),
                        mod_revision: revision.main,
                        ..Default::default()
                    }),
                    prev_kv: None,
                },
            });
        }
        Ok(DeleteRangeResponse {
            header: Some(header(self.view_revision())),
            deleted: keys.len() as i64,
            prev_kvs,
        })
    }

    /// etcd's Txn: evaluate compares, validate the chosen branch against the
    /// state before the txn, then apply it. An error leaves no change behind.
    pub fn txn(&mut self, req: &TxnRequest) -> Result<TxnResponse, MvccError> {
        let branch = self.choose_branch(req)?;
        let view = self.view_revision();
        let compacted = self.store.state.read().compact_revision;
        self.check_puts(req, &branch, view)?;
        check_ranges(req, &branch, view, compacted)?;
        let savepoint = self.changes.len();
        match self.apply_txn(req, &branch) {
            Ok(mut resp) => {
                resp.header = Some(header(self.view_revision()));
                Ok(resp)
            }
            Err(err) => {
                self.rollback_to(savepoint);
                Err(err)
            }
        }
    }

    fn choose_branch(&mut self, req: &TxnRequest) -> Result<Branch, MvccError> {
        let mut succeeded = true;
        for compare in &req.compare {
            if !self.compare_holds(compare)? {
                succeeded = false;
                break;
            }
        }
        let ops = branch_ops(req, succeeded);
        let mut nested = Vec::new();
        for op in ops {
            if let Some(request_op::Request::RequestTxn(inner)) = &op.request {
                nested.push(self.choose_branch(inner)?);
            }
        }
        Ok(Branch { succeeded, nested })
    }

    /// etcd's applyCompare: every key in the range must pass; an empty range
    /// fails a VALUE compare and compares a zero KeyValue otherwise.
    fn compare_holds(&mut self, compare: &Compare) -> Result<bool, MvccError> {
        let needs_record = matches!(
            CompareTarget::try_from(compare.target),
            Ok(CompareTarget::Value | CompareTarget::Lease)
        );
        let kvs = if needs_record {
            self.range_kvs(&compare.key, &compare.range_end)?
        } else {
            // Versions and revisions are in the index: no value read.
            let view = self.view_revision();
            let state = self.store.state.read();
            let keys = state.tree.live_keys(
                &compare.key,
                RangeEnd::from_request(&compare.range_end),
                view,
            );
            keys.iter()
                .filter_map(|key| state.tree.get(key, view))
                .map(|at| KeyValue {
                    create_revision: at.created,
                    mod_revision: at.modified.main,
                    version: at.version,
                    ..Default::default()
                })
                .collect()
        };
        if kvs.is_empty() {
            if compare.target == CompareTarget::Value as i32 {
                return Ok(false);
            }
            return Ok(compare_kv(compare, &KeyValue::default()));
        }
        Ok(kvs.iter().all(|kv| compare_kv(compare, kv)))
    }

    fn check_puts(
        &mut self,
        req: &TxnRequest,
        branch: &Branch,
        view: i64,
    ) -> Result<(), MvccError> {
        let ops = branch_ops(req, branch.succeeded);
        let mut nested = branch.nested.iter();
        for op in ops {
            match &op.request {
                Some(request_op::Request::RequestTxn(inner)) => {
                    if let Some(inner_branch) = nested.next() {
                        self.check_puts(inner, inner_branch, view)?;
                    }
                }
                Some(request_op::Request::RequestPut(put)) => {
                    // etcd's checkRequestPut: the previous key first, then the lease.
                    if (put.ignore_value || put.ignore_lease)
                        && self.store.state.read().tree.get(&put.key, view).is_none()
                    {
                        return Err(MvccError::KeyNotFound);
                    }
                    if !self.store.lease_exists(put.lease) {
                        return Err(MvccError::LeaseNotFound);
                    }
                }
                _ => {}
            }
        }
        Ok(())
    }

    fn apply_txn(&mut self, req: &TxnRequest, branch: &Branch) -> Result<TxnResponse, MvccError> {
        let ops = branch_ops(req, branch.succeeded);
        let mut nested = branch.nested.iter();
        let mut responses = Vec::with_capacity(ops.len());
        for op in ops {
            let response = match &op.request {
                Some(request_op::Request::RequestRange(r)) => {
                    Some(response_op::Response::ResponseRange(self.range(r)?))
                }
                Some(request_op::Request::RequestPut(p)) => {
                    Some(response_op::Response::ResponsePut(self.put(p)?))
                }
                Some(request_op::Request::RequestDeleteRange(d)) => Some(
                    response_op::Response::ResponseDeleteRange(self.delete_range(d)?),
                ),
                Some(request_op::Request::RequestTxn(inner)) => {
                    let Some(inner_branch) = nested.next() else {
                        unreachable!("a branch was chosen for every nested txn");
                    };
                    Some(response_op::Response::ResponseTxn(
                        self.apply_txn(inner, inner_branch)?,
                    ))
                }
                None => None,
            };
            responses.push(ResponseOp { response });
        }
        Ok(TxnResponse {
            // Nested txns carry an empty header, as etcd's.
            header: Some(ResponseHeader::default()),
            succeeded: branch.succeeded,
            responses,
        })
    }

    fn rollback_to(&mut self, savepoint: usize) {
        if self.changes.len() <= savepoint {
            return;
        }
        let from = Revision::new(self.write_revision(), savepoint as i64);
        let mut state = self.store.state.write();
        state
            .tree
            .rollback(self.changes[savepoint..].iter().map(|c| &c.key[..]), from);
        drop(state);
        self.changes.truncate(savepoint);
    }

    /// The revision this transaction's changes take (its begin revision
    /// while it has changed nothing): what a response header reports.
    pub fn revision(&self) -> i64 {
        self.view_revision()
    }

    /// Writes (or with None removes) a record of a side table when the
    /// transaction ends, in the same batch as its consistent index; dropping
    /// the transaction drops it too.
    pub fn put_side(&mut self, side: crate::SideTable, id: u64, record: Option<Vec<u8>>) {
        self.side.push((side, id, record));
    }

    /// Compacts the history at `revision` (see [`Store::compact`]), as the
    /// whole of this transaction: it must have changed no key. Takes effect
    /// at once, also for readers (a compaction cannot be undone); the
    /// consistent index is recorded at `end`.
    pub fn compact(&mut self, revision: i64) -> Result<(), MvccError> {
        assert!(
            self.changes.is_empty(),
            "a compaction is a transaction of its own"
        );
        self.store.compact_locked(revision)
    }

    /// Ends a transaction that changed nothing without recording an index.
    pub(crate) fn discard(mut self) {
        debug_assert!(self.changes.is_empty(), "a read-only txn changed something");
        self.rollback_to(0);
        self.ended = true;
    }

    /// Publishes the changes: they join the pending batch, the current
    /// revision moves to this transaction's (if anything changed), and the
    /// consistent index is recorded.
    pub fn end(mut self) -> WriteResult {
        self.ended = true;
        let changes = std::mem::take(&mut self.changes);
        let store = self.store;
        let mut events = Vec::new();
        if !changes.is_empty() {
            let write_revision = self.write_revision();
            // Publishing the revision and notifying its watchers is one step
            // under the watch lock: a watcher created concurrently sees the
            // revision either before (and gets its events) or after it.
            let mut watchers = store.watch.lock();
            {
                let mut pending = store.pending.write();
                for (sub, change) in changes.iter().enumerate() {
                    pending.records.insert(
                        Revision::new(write_revision, sub as i64),
                        (change.tombstone, change.encoded.clone()),
                    );
                }
            }
            {
                let mut state = store.state.write();
                assert_eq!(
                    state.current_revision, self.begin_revision,
                    "revisions only grow, one write transaction at a time"
                );
                state.current_revision = write_revision;
            }
            events = changes.into_iter().map(|c| c.event).collect();
            let moved_aside = watchers.notify(write_revision, &events);
            drop(watchers);
            if moved_aside {
                store.watch.signal.wake();
            }
        }
        if !self.side.is_empty() {
            let mut pending = store.pending.write();
            for (side, id, record) in self.side.drain(..) {
                pending.side.insert((side, id), record);
            }
            pending.dirty = true;
        }
        store.record_consistent_index(self.consistent_index);
        WriteResult {
            revision: store.current_revision(),
            events,
        }
    }
}

impl Drop for TxnWrite<'_> {
    fn drop(&mut self) {
        self.store.ops.ended(self.ops);
        if !self.ended {
            self.rollback_to(0);
        }
    }
}

fn check_ranges(
    req: &TxnRequest,
    branch: &Branch,
    view: i64,
    compacted: i64,
) -> Result<(), MvccError> {
    let ops = branch_ops(req, branch.succeeded);
    let mut nested = branch.nested.iter();
    for op in ops {
        match &op.request {
            Some(request_op::Request::RequestTxn(inner)) => {
                if let Some(inner_branch) = nested.next() {
                    check_ranges(inner, inner_branch, view, compacted)?;
                }
            }
            Some(request_op::Request::RequestRange(r)) => {
                if r.revision != 0 && r.revision > view {
                    return Err(MvccError::FutureRev);
                }
                if r.revision != 0 && r.revision < compacted {
                    return Err(MvccError::Compacted);
                }
            }
            _ => {}
        }
    }
    Ok(())
}

fn compare_kv(compare: &Compare, kv: &KeyValue) -> bool {
    use std::cmp::Ordering;
    let target = CompareTarget::try_from(compare.target);
    let ordering = match target {
        Ok(CompareTarget::Value) => {
            let wanted: &[u8] = match &compare.target_union {
                Some(TargetUnion::Value(v)) => v,
                _ => &[],
            };
            kv.value[..].cmp(wanted)
        }
        Ok(CompareTarget::Create) => kv.create_revision.cmp(&match compare.target_union {
            Some(TargetUnion::CreateRevision(v)) => v,
            _ => 0,
        }),
        Ok(CompareTarget::Mod) => kv.mod_revision.cmp(&match compare.target_union {
            Some(TargetUnion::ModRevision(v)) => v,
            _ => 0,
        }),
        Ok(CompareTarget::Version) => kv.version.cmp(&match compare.target_union {
            Some(TargetUnion::Version(v)) => v,
            _ => 0,
        }),
        Ok(CompareTarget::Lease) => kv.lease.cmp(&match compare.target_union {
            Some(TargetUnion::Lease(v)) => v,
            _ => 0,
        }),
        Err(_) => Ordering::Equal,
    };
    match CompareResult::try_from(compare.result) {
        Ok(CompareResult::Equal) => ordering == Ordering::Equal,
        Ok(CompareResult::NotEqual) => ordering != Ordering::Equal,
        Ok(CompareResult::Greater) => ordering == Ordering::Greater,
        Ok(CompareResult::Less) => ordering == Ordering::Less,
        Err(_) => true,
    }
}

/// Whether a txn has no write in any branch, at any depth (etcd's
/// isTxnReadonly): such a txn never bumps the revision.
pub fn is_txn_read_only(req: &TxnRequest) -> bool {
    req.success
        .iter()
        .chain(&req.failure)
        .all(|op: &RequestOp| match &op.request {
            Some(request_op::Request::RequestRange(_)) | None => true,
            Some(request_op::Request::RequestTxn(inner)) => is_txn_read_only(inner),
            Some(_) => false,
        })
}
