//! The checks of one run's history (see the robustness module doc):
//! linearizability of the key-value operations, reads at a revision
//! (serializable, pinned pages, counts) against the revision log, the six
//! watch guarantees, every acknowledged write in the log, leases, and the
//! members' convergence.
//!
//! The revision log is the history watcher's events (every key, from
//! revision 1). It is itself checked: every acknowledged write is in it at
//! its revision, no revision is missing or delivered twice, and the members'
//! final key spaces are its replay.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::fmt::Write as _;

use super::history::{
    txn_branch, Compare, Event, EventKind, History, Kv, OpResult, Operation, Request, Response,
    TxnOp, Watcher,
};
use crate::linearizability::{
    check_kv, revisions_follow_real_time, Cond, KvHistory, KvInput, KvOutput, Op,
};

/// What the checks found and how much they covered.
#[derive(Debug, Default)]
pub struct Report {
    pub violations: Vec<String>,
    /// Things that limit a check without being violations (a log with a
    /// gap, a watcher that did not catch up).
    pub warnings: Vec<String>,
    pub operations: usize,
    pub unknown: usize,
    pub linearizability_ops: usize,
    pub reads_checked_against_log: usize,
    pub watch_events: usize,
}

/// Every event of the run by revision, replayable key by key.
pub struct RevisionLog {
    pub by_revision: BTreeMap<i64, Vec<Event>>,
    /// Each key's changes in revision order: (revision, the kv after it,
    /// None after a delete).
    pub by_key: HashMap<String, Vec<(i64, Option<Kv>)>>,
    /// The log has every event from revision 2 through this one.
    pub complete_through: i64,
}

impl RevisionLog {
    /// The key's kv at `revision` (None: absent).
    pub fn value_at(&self, key: &str, revision: i64) -> Option<&Kv> {
        let changes = self.by_key.get(key)?;
        let at = changes.partition_point(|(rev, _)| *rev <= revision);
        changes[..at].last().and_then(|(_, kv)| kv.as_ref())
    }

    /// The kvs in [key, end) at `revision` (end empty: the key alone),
    /// in key order.
    pub fn range_at(&self, key: &str, end: &str, revision: i64) -> Vec<Kv> {
        let mut keys: Vec<&String> = self
            .by_key
            .keys()
            .filter(|k| in_range(k, key, end))
            .collect();
        keys.sort();
        keys.into_iter()
            .filter_map(|k| self.value_at(k, revision).cloned())
            .collect()
    }

    fn covers(&self, revision: i64) -> bool {
        revision <= self.complete_through
    }
}

fn in_range(k: &str, key: &str, end: &str) -> bool {
    if end.is_empty() {
        return k == key;
    }
    k >= key && (end == "\0" || k < end)
}

/// Builds the revision log from the history watcher, reporting what is
/// wrong with the log itself.
pub fn revision_log(log: &Watcher, report: &mut Report) -> RevisionLog {
    let mut by_revision: BTreeMap<i64, Vec<Event>> = BTreeMap::new();
    let mut seen: HashSet<(i64, String)> = HashSet::new();
    let mut gap_at: Option<i64> = None;
    let mut covered = 1i64;
    for stream in &log.streams {
        if stream.start_revision > covered + 1 && gap_at.is_none() {
            gap_at = Some(covered + 1);
        }
        for response in &stream.responses {
            if response.canceled && response.compact_revision > 0 && gap_at.is_none() {
                gap_at = Some(covered + 1);
                report.warnings.push(format!(
                    "the history watcher lost revisions {}..{} to compaction: checks against the log stop at {covered}",
                    covered + 1,
                    response.compact_revision
                ));
            }
            for event in &response.events {
                let rev = event.kv.mod_revision;
                if !seen.insert((rev, event.kv.key.clone())) {
                    report.violations.push(format!(
                        "watch (history watcher): event for {:?} at revision {rev} delivered twice",
                        event.kv.key
                    ));
                    continue;
                }
                by_revision.entry(rev).or_default().push(event.clone());
                covered = covered.max(rev);
            }
            if response.is_progress() {
                covered = covered.max(response.revision);
            }
        }
    }
    let mut complete_through = gap_at.map_or(covered, |g| g - 1);
    // every revision is one write transaction with at least one event
    for rev in 2..=complete_through {
        if !by_revision.contains_key(&rev) {
            report.violations.push(format!(
                "revision {rev} has no event in the history watcher's stream (a gap in a watch, or a revision without a change)"
            ));
            complete_through = rev - 1;
            break;
        }
    }
    let mut by_key: HashMap<String, Vec<(i64, Option<Kv>)>> = HashMap::new();
    for (rev, events) in &by_revision {
        for e in events {
            let after = match e.kind {
                EventKind::Put => Some(e.kv.clone()),
                EventKind::Delete => None,
            };
            by_key
                .entry(e.kv.key.clone())
                .or_default()
                .push((*rev, after));
        }
    }
    RevisionLog {
        by_revision,
        by_key,
        complete_through,
    }
}

/// Runs every check.
pub fn check(history: &History) -> Report {
    let mut report = Report {
        operations: history.operations.len(),
        unknown: history
            .operations
            .iter()
            .filter(|o| o.ret.is_none())
            .count(),
        ..Report::default()
    };
    let log = revision_log(&history.log, &mut report);
    acknowledged_writes_in_log(history, &log, &mut report);
    reads_against_log(history, &log, &mut report);
    linearizability(history, &log, &mut report);
    for watcher in &history.watchers {
        watch_guarantees(watcher, &log, &mut report);
    }
    leases(history, &log, &mut report);
    convergence(history, &log, &mut report);
    for fault in &history.faults {
        if let Some((_, why)) = fault.detail.split_once(super::faults::DID_NOT_COME_BACK) {
            report.violations.push(format!(
                "m{} did not come back after {}: its log ends\n{why}",
                fault.member + 1,
                fault.kind
            ));
        }
    }
    report
}

fn describe(op: &Operation) -> String {
    let ret = op
        .ret
        .map_or("?".to_string(), |r| format!("{:.3}", r as f64 / 1e9));
    let outcome = match (&op.response, &op.error) {
        (Some(r), _) => format!("{r:?}"),
        (None, Some(e)) if op.ret.is_some() => format!("refused: {e}"),
        (None, Some(e)) => format!("unknown: {e}"),
        (None, None) => "unknown".into(),
    };
    format!(
        "[{:.3}s..{ret}s] client {} → m{}: {:?} ⇒ {outcome}",
        op.call as f64 / 1e9,
        op.client,
        op.member + 1,
        op.request
    )
}

/// The revision an acknowledged write made, with the events it must have
/// left in the log: (key, kind, value).
/// An event a write must have left: key, kind, value.
type ExpectedEvent = (String, EventKind, String);

fn expected_events(op: &Operation) -> Option<(i64, Vec<ExpectedEvent>)> {
    let response = op.response.as_ref()?;
    match (&op.request, response) {
        (Request::Put { key, value, .. }, Response::Put { revision }) => Some((
            *revision,
            vec![(key.clone(), EventKind::Put, value.clone())],
        )),
        (Request::Delete { key }, Response::Delete { revision, deleted }) if *deleted > 0 => {
            Some((
                *revision,
                vec![(key.clone(), EventKind::Delete, String::new())],
            ))
        }
        (Request::Txn { .. }, _) => {
            let (revision, branch) = txn_branch(&op.request, response)?;
            let mut events = Vec::new();
            for (op, result) in branch {
                match (op, result) {
                    (TxnOp::Put { key, value, .. }, _) => {
                        events.push((key.clone(), EventKind::Put, value.clone()))
                    }
                    (TxnOp::Delete { key }, OpResult::Delete { deleted }) if *deleted > 0 => {
                        events.push((key.clone(), EventKind::Delete, String::new()))
                    }
                    _ => {}
                }
            }
            (!events.is_empty()).then_some((revision, events))
        }
        _ => None,
    }
}

fn acknowledged_writes_in_log(history: &History, log: &RevisionLog, report: &mut Report) {
    for op in &history.operations {
        let Some((revision, events)) = expected_events(op) else {
            continue;
        };
        if !log.covers(revision) {
            if revision > log.complete_through
                && log
                    .by_revision
                    .keys()
                    .next_back()
                    .is_none_or(|last| *last < revision)
            {
                report.violations.push(format!(
                    "acknowledged write missing: revision {revision} is past the end of the log ({})\n  {}",
                    log.complete_through,
                    describe(op)
                ));
            }
            continue;
        }
        let at = log.by_revision.get(&revision).map_or(&[][..], |v| v);
        for (key, kind, value) in events {
            let found = at.iter().any(|e| {
                e.kv.key == key
                    && e.kind == kind
                    && (kind == EventKind::Delete || e.kv.value == value)
            });
            if !found {
                report.violations.push(format!(
                    "acknowledged write missing: no {kind:?} of {key:?} at revision {revision} in the log (it has {:?})\n  {}",
                    at.iter().map(|e| (&e.kv.key, e.kind, &e.kv.value)).collect::<Vec<_>>(),
                    describe(op)
                ));
            }
        }
    }
}

/// Every read answer against the log's state at the revision it was served
/// at: serializable reads (some prefix of the history), pages pinned to a
/// revision, counts, and the gets inside transactions.
fn reads_against_log(history: &History, log: &RevisionLog, report: &mut Report) {
    for op in &history.operations {
        let Some(response) = &op.response else {
            continue;
        };
        match (&op.request, response) {
            (
                Request::Range {
                    key,
                    end,
                    revision,
                    limit,
                    count_only,
                    ..
                },
                Response::Range {
                    revision: header,
                    kvs,
                    count,
                    more,
                },
            ) => {
                let at = if *revision > 0 { *revision } else { *header };
                if !log.covers(at) {
                    continue;
                }
                report.reads_checked_against_log += 1;
                let expected = log.range_at(key, end, at);
                let shown = if *limit > 0 {
                    &expected[..expected.len().min(*limit as usize)]
                } else {
                    &expected[..]
                };
                let count_ok = *count == expected.len() as i64;
                let kvs_ok = *count_only || kvs.as_slice() == shown;
                let more_ok = *count_only || *more == (shown.len() < expected.len());
                if !(count_ok && kvs_ok && more_ok) {
                    report.violations.push(format!(
                        "read at revision {at} does not match the history up to it: expected count {} and {:?}\n  {}",
                        expected.len(),
                        shown.iter().map(|kv| (&kv.key, &kv.value, kv.mod_revision)).collect::<Vec<_>>(),
                        describe(op)
                    ));
                }
            }
            (Request::Txn { .. }, _) => {
                let Some((revision, branch)) = txn_branch(&op.request, response) else {
                    continue;
                };
                let revision = &revision;
                for (txn_op, result) in branch {
                    if let (TxnOp::Get { key }, OpResult::Get { kvs }) = (txn_op, result) {
                        if !log.covers(*revision) {
                            continue;
                        }
                        report.reads_checked_against_log += 1;
                        let expected: Vec<Kv> =
                            log.value_at(key, *revision).cloned().into_iter().collect();
                        if *kvs != expected {
                            report.violations.push(format!(
                                "transaction read at revision {revision} does not match the history: expected {expected:?}\n  {}",
                                describe(op)
                            ));
                        }
                    }
                }
            }
            _ => {}
        }
    }
}

fn txn_input(op: Option<&TxnOp>) -> KvInput {
    match op {
        Some(TxnOp::Put { value, .. }) => KvInput::Put(value.clone()),
        Some(TxnOp::Delete { .. }) => KvInput::Delete,
        Some(TxnOp::Get { .. }) => KvInput::Get,
        None => KvInput::Nothing,
    }
}

fn txn_output(op: Option<&TxnOp>, result: Option<&OpResult>, header: i64) -> KvOutput {
    match (op, result) {
        (Some(TxnOp::Put { .. }), _) => KvOutput::Written(Some(header)),
        (Some(TxnOp::Delete { .. }), Some(OpResult::Delete { deleted })) => {
            KvOutput::Written((*deleted > 0).then_some(header))
        }
        (Some(TxnOp::Get { .. }), Some(OpResult::Get { kvs })) => KvOutput::Read {
            found: kvs.first().map(|kv| (kv.value.clone(), kv.mod_revision)),
            header,
        },
        _ => KvOutput::Written(None),
    }
}

/// The revision at which the log shows `key` = `value` written, if any.
fn logged_put(log: &RevisionLog, key: &str, value: &str) -> Option<i64> {
    log.by_key.get(key)?.iter().find_map(|(rev, kv)| {
        kv.as_ref()
            .is_some_and(|kv| kv.value == value)
            .then_some(*rev)
    })
}

/// The key-value history the linearizability check takes (see the
/// linearizability module): single-key operations, ranges split into one
/// read per key they cover, unknown writes resolved from the log when it
/// shows them, and deletes by lease expiry added as operations that may
/// have happened at any time.
pub fn kv_history(history: &History, log: &RevisionLog) -> KvHistory {
    let mut universe: BTreeSet<String> = log.by_key.keys().cloned().collect();
    let mut leased: HashSet<String> = HashSet::new();
    for op in &history.operations {
        match &op.request {
            Request::Put { key, lease, .. } => {
                universe.insert(key.clone());
                if *lease != 0 {
                    leased.insert(key.clone());
                }
            }
            Request::Delete { key } => {
                universe.insert(key.clone());
            }
            Request::Txn {
                compare,
                then,
                otherwise,
            } => {
                universe.insert(compare.key().to_string());
                for t in then.iter().chain(otherwise) {
                    if let TxnOp::Put { key, lease, .. } = t {
                        if *lease != 0 {
                            leased.insert(key.clone());
                        }
                    }
                }
            }
            _ => {}
        }
    }
    // the log has every revision any answer named: a write it lacks never
    // happened
    let log_is_whole = log.complete_through >= last_revision(history);
    let mut out: KvHistory = Vec::new();
    let mut write_revisions: HashSet<i64> = HashSet::new();
    // revisions a client's put, delete or transaction made: a revoke whose
    // header names one of them made no revision of its own
    let client_revisions: HashSet<i64> = history
        .operations
        .iter()
        .filter_map(expected_events)
        .map(|(rev, _)| rev)
        .collect();
    for op in &history.operations {
        let refused = op.response.is_none() && op.ret.is_some();
        if refused {
            continue;
        }
        let response = op.response.as_ref();
        let mut push = |key: &str, input: KvInput, output: Option<KvOutput>, known: bool| {
            out.push((
                key.to_string(),
                Op {
                    call: op.call,
                    ret: if known { op.ret } else { None },
                    input,
                    output,
                },
            ));
        };
        match (&op.request, response) {
            (Request::Put { key, value, .. }, Some(Response::Put { revision })) => {
                write_revisions.insert(*revision);
                push(
                    key,
                    KvInput::Put(value.clone()),
                    Some(KvOutput::Written(Some(*revision))),
                    true,
                );
            }
            (Request::Put { key, value, .. }, None) => match logged_put(log, key, value) {
                Some(rev) => push(
                    key,
                    KvInput::Put(value.clone()),
                    Some(KvOutput::Written(Some(rev))),
                    false,
                ),
                // the whole log says it never happened
                None if log_is_whole => {}
                None => push(key, KvInput::Put(value.clone()), None, false),
            },
            (Request::Delete { key }, Some(Response::Delete { revision, deleted })) => {
                if *deleted > 0 {
                    write_revisions.insert(*revision);
                }
                push(
                    key,
                    KvInput::Delete,
                    Some(KvOutput::Written((*deleted > 0).then_some(*revision))),
                    true,
                );
            }
            (Request::Delete { key }, None) => push(key, KvInput::Delete, None, false),
            (
                Request::Range {
                    key,
                    end,
                    revision: 0,
                    limit,
                    serializable: false,
                    count_only: false,
                },
                Some(Response::Range {
                    revision: header,
                    kvs,
                    more,
                    ..
                }),
            ) => {
                // with a limit, only the keys up to the last one returned
                // are known to be absent when not returned
                let last = if *limit > 0 && *more {
                    kvs.last().map(|kv| kv.key.clone())
                } else {
                    None
                };
                for k in universe.iter().filter(|k| in_range(k, key, end)) {
                    if last.as_ref().is_some_and(|l| k > l) {
                        break;
                    }
                    let found = kvs
                        .iter()
                        .find(|kv| &kv.key == k)
                        .map(|kv| (kv.value.clone(), kv.mod_revision));
                    push(
                        k,
                        KvInput::Get,
                        Some(KvOutput::Read {
                            found,
                            header: *header,
                        }),
                        true,
                    );
                }
            }
            (
                Request::Txn {
                    compare,
                    then,
                    otherwise,
                },
                response,
            ) => {
                let key = compare.key();
                let single = then.iter().chain(otherwise).all(|t| t.key() == key)
                    && then.len() <= 1
                    && otherwise.len() <= 1;
                if !single {
                    continue;
                }
                let cond = match compare {
                    Compare::ModRevision(_, r) => Cond::ModRevision(*r),
                    Compare::Version(_, v) => Cond::Version(*v),
                    Compare::Value(_, v) => Cond::Value(v.clone()),
                };
                let input = KvInput::Txn {
                    cond,
                    then: Box::new(txn_input(then.first())),
                    otherwise: Box::new(txn_input(otherwise.first())),
                };
                match response {
                    Some(Response::Txn {
                        revision,
                        succeeded,
                        results,
                    }) => {
                        let branch = if *succeeded { then } else { otherwise };
                        let result = txn_output(branch.first(), results.first(), *revision);
                        if matches!(result, KvOutput::Written(Some(_))) {
                            write_revisions.insert(*revision);
                        }
                        push(
                            key,
                            input,
                            Some(KvOutput::Txn {
                                succeeded: *succeeded,
                                header: *revision,
                                result: Box::new(result),
                            }),
                            true,
                        );
                    }
                    _ => {
                        // an unknown transaction whose put the log shows
                        let put = then
                            .first()
                            .map(|t| (t, true))
                            .into_iter()
                            .chain(otherwise.first().map(|t| (t, false)))
                            .find_map(|(t, succeeded)| match t {
                                TxnOp::Put { key, value, .. } => {
                                    logged_put(log, key, value).map(|rev| (rev, succeeded))
                                }
                                _ => None,
                            });
                        let output = put.map(|(rev, succeeded)| KvOutput::Txn {
                            succeeded,
                            header: rev,
                            result: Box::new(KvOutput::Written(Some(rev))),
                        });
                        push(key, input, output, false);
                    }
                }
            }
            (Request::LeaseRevoke { id }, Some(Response::LeaseRevoke { revision })) => {
                // the keys the revoke deleted, at its revision (a revoke
                // of a lease without keys makes no revision: its header
                // names someone else's)
                if client_revisions.contains(revision) {
                    continue;
                }
                for key in revoke_deletes(log, *id, *revision) {
                    write_revisions.insert(*revision);
                    push(
                        &key,
                        KvInput::Delete,
                        Some(KvOutput::Written(Some(*revision))),
                        true,
                    );
                }
            }
            _ => {}
        }
    }
    // deletes no client operation accounts for: leases that expired (or
    // an unknown revoke), for keys that were put on a lease
    for (rev, events) in &log.by_revision {
        if write_revisions.contains(rev) {
            continue;
        }
        for e in events
            .iter()
            .filter(|e| e.kind == EventKind::Delete && leased.contains(&e.kv.key))
        {
            out.push((
                e.kv.key.clone(),
                Op {
                    call: 0,
                    ret: None,
                    input: KvInput::Delete,
                    output: Some(KvOutput::Written(Some(*rev))),
                },
            ));
        }
    }
    out
}

/// The keys deleted at `revision` that were on lease `id` just before:
/// what a revoke of `id` answered with that revision deleted.
fn revoke_deletes(log: &RevisionLog, id: i64, revision: i64) -> Vec<String> {
    log.by_revision
        .get(&revision)
        .map_or_else(Vec::new, |events| {
            events
                .iter()
                .filter(|e| {
                    e.kind == EventKind::Delete
                        && log
                            .value_at(&e.kv.key, revision - 1)
                            .is_some_and(|kv| kv.lease == id)
                })
                .map(|e| e.kv.key.clone())
                .collect()
        })
}

/// The highest revision any answer carried.
fn last_revision(history: &History) -> i64 {
    history
        .operations
        .iter()
        .filter_map(|o| o.response.as_ref()?.revision())
        .chain(history.members_at_end.iter().map(|m| m.revision))
        .max()
        .unwrap_or(0)
}

fn linearizability(history: &History, log: &RevisionLog, report: &mut Report) {
    let kv = kv_history(history, log);
    report.linearizability_ops = kv.len();
    if let Err((key, violation)) = check_kv(&kv) {
        let ops: Vec<&Op<KvInput, KvOutput>> = kv
            .iter()
            .filter(|(k, _)| *k == key)
            .map(|(_, o)| o)
            .collect();
        let mut text = format!(
            "not linearizable: key {key:?}: {} operations could be ordered, then none of these:\n",
            violation.linearized.len()
        );
        let tail = violation.linearized.len().saturating_sub(5);
        let _ = writeln!(text, "  the last ones ordered:");
        for i in &violation.linearized[tail..] {
            let _ = writeln!(text, "    {}", show(ops[*i]));
        }
        let _ = writeln!(text, "  pending:");
        for i in violation.pending.iter().take(10) {
            let _ = writeln!(text, "    {}", show(ops[*i]));
        }
        report.violations.push(text);
    }
    if let Err((earlier, later)) = revisions_follow_real_time(&kv) {
        report.violations.push(format!(
            "revisions go back in real time: {:?} returned before {:?} was called, with a higher revision\n    {}\n    {}",
            kv[earlier].0,
            kv[later].0,
            show(&kv[earlier].1),
            show(&kv[later].1)
        ));
    }
}

fn show(op: &Op<KvInput, KvOutput>) -> String {
    let ret = op
        .ret
        .map_or("?".to_string(), |r| format!("{:.3}", r as f64 / 1e9));
    format!(
        "[{:.3}s..{ret}s] {:?} ⇒ {:?}",
        op.call as f64 / 1e9,
        op.input,
        op.output
    )
}

/// The six watch guarantees for one watcher, against the log.
pub fn watch_guarantees(watcher: &Watcher, log: &RevisionLog, report: &mut Report) {
    let name = format!(
        "watch {:?}..{:?} (client {})",
        watcher.key, watcher.end, watcher.client
    );
    let in_watch = |key: &str| in_range(key, &watcher.key, &watcher.end);
    let mut delivered: HashSet<(i64, String)> = HashSet::new();
    let mut last_event = 0i64;
    for (s, stream) in watcher.streams.iter().enumerate() {
        let mut stream_last = 0i64;
        let mut bookmark = 0i64;
        let mut covered = stream.start_revision - 1;
        let mut got: BTreeMap<i64, Vec<&Event>> = BTreeMap::new();
        for response in &stream.responses {
            let mut revisions_here: BTreeSet<i64> = BTreeSet::new();
            for event in &response.events {
                report.watch_events += 1;
                let rev = event.kv.mod_revision;
                // ordered
                if rev < stream_last || rev < stream.start_revision {
                    report.violations.push(format!(
                        "{name}: not ordered: revision {rev} after {stream_last} on stream {s} (start {})",
                        stream.start_revision
                    ));
                }
                // bookmarkable
                if rev <= bookmark {
                    report.violations.push(format!(
                        "{name}: progress notification at {bookmark} was ahead of an event at revision {rev} (stream {s})"
                    ));
                }
                // unique (resumable: no event again after a reconnect)
                if !delivered.insert((rev, event.kv.key.clone())) {
                    report.violations.push(format!(
                        "{name}: duplicate event: {:?} at revision {rev} (stream {s})",
                        event.kv.key
                    ));
                }
                if !in_watch(&event.kv.key) {
                    report.violations.push(format!(
                        "{name}: event for {:?} outside the watched range",
                        event.kv.key
                    ));
                }
                stream_last = stream_last.max(rev);
                last_event = last_event.max(rev);
                covered = covered.max(rev);
                revisions_here.insert(rev);
                got.entry(rev).or_default().push(event);
                // the event itself and its prev_kv against the log
                if log.covers(rev) {
                    let logged = log
                        .by_revision
                        .get(&rev)
                        .and_then(|es| es.iter().find(|e| e.kv.key == event.kv.key));
                    let same = logged.is_some_and(|l| {
                        l.kind == event.kind
                            && (event.kind == EventKind::Delete || l.kv == event.kv)
                    });
                    if !same {
                        report.violations.push(format!(
                            "{name}: event {:?} {:?} at {rev} is not what happened at that revision ({logged:?})",
                            event.kind, event.kv
                        ));
                    }
                    if watcher.prev_kv && log.covers(rev - 1) {
                        let expected = log.value_at(&event.kv.key, rev - 1);
                        if event.prev_kv.as_ref() != expected {
                            report.violations.push(format!(
                                "{name}: prev_kv of {:?} at {rev} is {:?}, the key was {expected:?}",
                                event.kv.key, event.prev_kv
                            ));
                        }
                    }
                }
            }
            // atomic: a revision's events all in this one response
            for rev in revisions_here {
                if !log.covers(rev) {
                    continue;
                }
                let want = log
                    .by_revision
                    .get(&rev)
                    .map_or(0, |es| es.iter().filter(|e| in_watch(&e.kv.key)).count());
                let have = response
                    .events
                    .iter()
                    .filter(|e| e.kv.mod_revision == rev)
                    .count();
                if have != want {
                    report.violations.push(format!(
                        "{name}: not atomic: revision {rev} has {want} events in range, one response carried {have}"
                    ));
                }
            }
            if response.is_progress() {
                bookmark = bookmark.max(response.revision);
                covered = covered.max(response.revision);
            }
        }
        // reliable: from the stream's start through what it covered, every
        // event in range, none missing
        let upto = covered
            .min(log.complete_through)
            .max(stream.start_revision - 1);
        for (rev, events) in log.by_revision.range(stream.start_revision..upto + 1) {
            for e in events.iter().filter(|e| in_watch(&e.kv.key)) {
                let has = got
                    .get(rev)
                    .is_some_and(|g| g.iter().any(|x| x.kv.key == e.kv.key));
                if !has {
                    report.violations.push(format!(
                        "{name}: gap: the event of {:?} at revision {rev} was not delivered on stream {s} (from {}, covered through {covered})",
                        e.kv.key, stream.start_revision
                    ));
                }
            }
        }
        // resumable: the next stream starts right after what this one had
        if let Some(next) = watcher.streams.get(s + 1) {
            let compacted = stream.responses.iter().any(|r| r.compact_revision > 0);
            if !compacted && next.start_revision > covered + 1 {
                report.violations.push(format!(
                    "{name}: resumed at {} after covering only through {covered}",
                    next.start_revision
                ));
            }
        }
    }
    let _ = last_event;
}

/// A revoked lease takes its keys with it at the revoke's revision, and no
/// put on it succeeds after the revoke returned.
fn leases(history: &History, log: &RevisionLog, report: &mut Report) {
    let mut revoked: HashMap<i64, (u64, i64)> = HashMap::new();
    for op in &history.operations {
        if let (Request::LeaseRevoke { id }, Some(Response::LeaseRevoke { revision }), Some(ret)) =
            (&op.request, &op.response, op.ret)
        {
            revoked.insert(*id, (ret, *revision));
            if log.covers(*revision) {
                // no key is left on it once the revoke answered
                let left: Vec<&Kv> = log
                    .by_key
                    .keys()
                    .filter_map(|k| log.value_at(k, *revision))
                    .filter(|kv| kv.lease == *id)
                    .collect();
                if !left.is_empty() {
                    report.violations.push(format!(
                        "lease {id:x} revoked at revision {revision}, yet {:?} still on it\n  {}",
                        left.iter().map(|kv| &kv.key).collect::<Vec<_>>(),
                        describe(op)
                    ));
                }
            }
        }
    }
    for op in &history.operations {
        let lease = match &op.request {
            Request::Put { lease, .. } => *lease,
            _ => 0,
        };
        if let (Some((revoked_at, _)), Some(_)) = (revoked.get(&lease), &op.response) {
            if op.call > *revoked_at {
                report.violations.push(format!(
                    "a put on lease {lease:x} succeeded after the lease was revoked\n  {}",
                    describe(op)
                ));
            }
        }
    }
}

/// All members at the same revision with the same key space and HashKV,
/// and that key space is the log's replay.
fn convergence(history: &History, log: &RevisionLog, report: &mut Report) {
    let Some(first) = history.members_at_end.first() else {
        report
            .violations
            .push("no member answered at the end of the run".into());
        return;
    };
    if history.members_at_end.len() < history.members as usize {
        report.violations.push(format!(
            "only {} of {} members answered at the end",
            history.members_at_end.len(),
            history.members
        ));
    }
    for m in &history.members_at_end {
        if m.revision != first.revision || m.hash != first.hash || m.kvs != first.kvs {
            report.violations.push(format!(
                "members diverged: m{} at revision {} hash {:#x} with {} keys, m{} at revision {} hash {:#x} with {} keys",
                first.member + 1,
                first.revision,
                first.hash,
                first.kvs.len(),
                m.member + 1,
                m.revision,
                m.hash,
                m.kvs.len()
            ));
        }
    }
    if log.covers(first.revision) {
        let replay = log.range_at("", "\0", first.revision);
        if replay != first.kvs {
            report.violations.push(format!(
                "the final key space ({} keys) is not the replay of the history ({} keys)",
                first.kvs.len(),
                replay.len()
            ));
        }
    }
}

#[cfg(test)]
mod tests {
    //! The checker finds what it must: each test breaks one guarantee in an
    //! otherwise correct history and requires the matching violation; the
    //! correct history itself passes.

    use super::*;
    use crate::robustness::history::{MemberState, WatchResponse, WatchStream};

    fn kv(key: &str, value: &str, create: i64, modified: i64, version: i64) -> Kv {
        Kv {
            key: key.into(),
            value: value.into(),
            create_revision: create,
            mod_revision: modified,
            version,
            lease: 0,
        }
    }

    fn put_event(kv: Kv, prev: Option<Kv>) -> Event {
        Event {
            kind: EventKind::Put,
            kv,
            prev_kv: prev,
        }
    }

    fn op(call: u64, ret: Option<u64>, request: Request, response: Option<Response>) -> Operation {
        Operation {
            client: 0,
            member: 0,
            call,
            ret,
            request,
            response,
            error: None,
        }
    }

    fn put(key: &str, value: &str) -> Request {
        Request::Put {
            key: key.into(),
            value: value.into(),
            lease: 0,
        }
    }

    fn get(key: &str, serializable: bool) -> Request {
        Request::Range {
            key: key.into(),
            end: String::new(),
            revision: 0,
            limit: 0,
            serializable,
            count_only: false,
        }
    }

    fn read(revision: i64, kvs: Vec<Kv>) -> Response {
        Response::Range {
            revision,
            count: kvs.len() as i64,
            kvs,
            more: false,
        }
    }

    fn response(time: u64, revision: i64, events: Vec<Event>) -> WatchResponse {
        WatchResponse {
            time,
            revision,
            events,
            created: false,
            canceled: false,
            compact_revision: 0,
            cancel_reason: String::new(),
        }
    }

    fn watcher(key: &str, end: &str, responses: Vec<WatchResponse>) -> Watcher {
        Watcher {
            client: 9,
            key: key.into(),
            end: end.into(),
            prev_kv: true,
            progress_notify: true,
            streams: vec![WatchStream {
                member: 0,
                start_revision: 1,
                opened: 0,
                responses,
                broken: None,
            }],
        }
    }

    /// a = 1 at revision 2, a = 2 at revision 3, b = 1 at revision 4; a
    /// linearizable read of a, a serializable one of b, a CAS on a's mod
    /// revision; a watch on "a" and one on everything; three members that
    /// agree.
    fn correct() -> History {
        let a1 = kv("a", "1", 2, 2, 1);
        let a2 = kv("a", "2", 2, 3, 2);
        let b1 = kv("b", "1", 4, 4, 1);
        let log_events = vec![
            response(10, 2, vec![put_event(a1.clone(), None)]),
            response(20, 3, vec![put_event(a2.clone(), Some(a1.clone()))]),
            response(30, 4, vec![put_event(b1.clone(), None)]),
        ];
        let mut log = watcher("", "\0", log_events.clone());
        log.prev_kv = false;
        for r in &mut log.streams[0].responses {
            for e in &mut r.events {
                e.prev_kv = None;
            }
        }
        let final_kvs = vec![a2.clone(), b1.clone()];
        History {
            seed: 1,
            traffic: "kv".into(),
            members: 3,
            faults: Vec::new(),
            operations: vec![
                op(
                    0,
                    Some(10),
                    put("a", "1"),
                    Some(Response::Put { revision: 2 }),
                ),
                op(
                    11,
                    Some(20),
                    put("a", "2"),
                    Some(Response::Put { revision: 3 }),
                ),
                op(
                    21,
                    Some(25),
                    get("a", false),
                    Some(read(3, vec![a2.clone()])),
                ),
                op(
                    26,
                    Some(30),
                    Request::Txn {
                        compare: Compare::ModRevision("b".into(), 0),
                        then: vec![TxnOp::Put {
                            key: "b".into(),
                            value: "1".into(),
                            lease: 0,
                        }],
                        otherwise: vec![TxnOp::Get { key: "b".into() }],
                    },
                    Some(Response::Txn {
                        revision: 4,
                        succeeded: true,
                        results: vec![OpResult::Put],
                    }),
                ),
                op(31, Some(32), get("b", true), Some(read(3, vec![]))),
                op(
                    33,
                    Some(34),
                    get("b", true),
                    Some(read(4, vec![b1.clone()])),
                ),
            ],
            watchers: vec![
                watcher("a", "", log_events[..2].to_vec()),
                watcher("", "\0", log_events.clone()),
            ],
            log,
            members_at_end: (0..3)
                .map(|m| MemberState {
                    member: m,
                    revision: 4,
                    compact_revision: 0,
                    hash: 7,
                    kvs: final_kvs.clone(),
                })
                .collect(),
            broken_server: false,
        }
    }

    fn violations(history: &History) -> Vec<String> {
        check(history).violations
    }

    fn assert_found(history: &History, needle: &str) {
        let found = violations(history);
        assert!(
            found.iter().any(|v| v.contains(needle)),
            "expected a violation containing {needle:?}, got {found:#?}"
        );
    }

    #[test]
    fn a_correct_history_passes() {
        assert_eq!(violations(&correct()), Vec::<String>::new());
    }

    #[test]
    fn a_stale_linearizable_read_is_not_linearizable() {
        let mut h = correct();
        // the read after a = 2 returned sees a = 1
        h.operations[2].response = Some(read(2, vec![kv("a", "1", 2, 2, 1)]));
        assert_found(&h, "not linearizable");
    }

    #[test]
    fn a_lost_acknowledged_write_is_found() {
        let mut h = correct();
        // a put acknowledged at revision 5 that nothing has
        h.operations.push(op(
            40,
            Some(41),
            put("c", "1"),
            Some(Response::Put { revision: 5 }),
        ));
        assert_found(&h, "acknowledged write missing");
    }

    #[test]
    fn two_compare_and_swaps_on_one_revision_both_succeeding_are_not_linearizable() {
        let mut h = correct();
        // a second create of b that also claims to have succeeded
        let mut second = h.operations[3].clone();
        second.call = 35;
        second.ret = Some(36);
        second.request = Request::Txn {
            compare: Compare::ModRevision("b".into(), 0),
            then: vec![TxnOp::Put {
                key: "b".into(),
                value: "x".into(),
                lease: 0,
            }],
            otherwise: vec![TxnOp::Get { key: "b".into() }],
        };
        second.response = Some(Response::Txn {
            revision: 5,
            succeeded: true,
            results: vec![OpResult::Put],
        });
        h.operations.push(second);
        assert_found(&h, "not linearizable");
    }

    #[test]
    fn a_serializable_read_that_matches_no_revision_is_found() {
        let mut h = correct();
        // b seen at revision 3, before it existed
        h.operations[4].response = Some(read(3, vec![kv("b", "1", 4, 4, 1)]));
        assert_found(&h, "does not match the history");
    }

    #[test]
    fn a_duplicate_watch_event_is_found() {
        let mut h = correct();
        let again = h.watchers[0].streams[0].responses[1].clone();
        h.watchers[0].streams[0].responses.push(again);
        assert_found(&h, "duplicate event");
    }

    #[test]
    fn a_gap_in_a_watch_is_found() {
        let mut h = correct();
        // the watch on everything skips revision 3
        h.watchers[1].streams[0].responses.remove(1);
        assert_found(&h, "gap");
    }

    #[test]
    fn events_out_of_order_are_found() {
        let mut h = correct();
        h.watchers[1].streams[0].responses.swap(0, 2);
        assert_found(&h, "not ordered");
    }

    #[test]
    fn a_revision_split_across_responses_is_not_atomic() {
        let mut h = correct();
        // revision 4 writes b and c; the watch delivers them apart
        let c1 = kv("c", "1", 4, 4, 1);
        h.log.streams[0].responses[2]
            .events
            .push(put_event(c1.clone(), None));
        for m in &mut h.members_at_end {
            m.kvs.push(c1.clone());
        }
        let responses = &mut h.watchers[1].streams[0].responses;
        responses.push(response(31, 4, vec![put_event(c1, None)]));
        assert_found(&h, "not atomic");
    }

    #[test]
    fn a_progress_notification_ahead_of_an_event_is_found() {
        let mut h = correct();
        // progress at 4 before the event of revision 4
        let responses = &mut h.watchers[1].streams[0].responses;
        responses.insert(2, response(25, 4, vec![]));
        assert_found(&h, "progress notification at 4 was ahead");
    }

    #[test]
    fn a_wrong_prev_kv_is_found() {
        let mut h = correct();
        h.watchers[0].streams[0].responses[1].events[0].prev_kv = None;
        assert_found(&h, "prev_kv");
    }

    #[test]
    fn a_resume_that_skips_revisions_is_found() {
        let mut h = correct();
        // the watch on everything reconnects at 4 having had only 2
        let w = &mut h.watchers[1];
        let mut second = w.streams[0].clone();
        w.streams[0].responses.truncate(1);
        second.start_revision = 4;
        second.responses = vec![second.responses[2].clone()];
        w.streams.push(second);
        assert_found(&h, "resumed at 4");
    }

    #[test]
    fn members_that_diverged_are_found() {
        let mut h = correct();
        h.members_at_end[2].hash = 8;
        assert_found(&h, "members diverged");
    }

    #[test]
    fn a_history_watcher_that_misses_a_revision_is_found() {
        let mut h = correct();
        h.log.streams[0].responses.remove(1);
        assert_found(&h, "revision 3 has no event");
    }

    #[test]
    fn a_revoke_after_its_key_was_deleted_made_no_revision() {
        let mut h = correct();
        // l on lease 5 at revision 5, deleted by a client at 6; the revoke
        // that follows finds nothing and answers with header 6
        let mut l = kv("l", "1", 5, 5, 1);
        l.lease = 5;
        let delete = Event {
            kind: EventKind::Delete,
            kv: kv("l", "", 0, 6, 0),
            prev_kv: None,
        };
        h.operations.push(op(
            40,
            Some(41),
            Request::Put {
                key: "l".into(),
                value: "1".into(),
                lease: 5,
            },
            Some(Response::Put { revision: 5 }),
        ));
        h.operations.push(op(
            42,
            Some(43),
            Request::Delete { key: "l".into() },
            Some(Response::Delete {
                revision: 6,
                deleted: 1,
            }),
        ));
        h.operations.push(op(
            44,
            Some(45),
            Request::LeaseRevoke { id: 5 },
            Some(Response::LeaseRevoke { revision: 6 }),
        ));
        let events = [
            response(41, 5, vec![put_event(l.clone(), None)]),
            response(43, 6, vec![delete]),
        ];
        h.log.streams[0].responses.extend(events.iter().cloned());
        h.watchers[1].streams[0]
            .responses
            .extend(events.iter().cloned());
        for m in &mut h.members_at_end {
            m.revision = 6;
        }
        // the watch on everything has prev_kv: give it the truth
        let w = &mut h.watchers[1].streams[0].responses;
        let n = w.len();
        w[n - 1].events[0].prev_kv = Some(l);
        assert_eq!(violations(&h), Vec::<String>::new());
    }

    #[test]
    fn an_unknown_write_may_have_happened_or_not() {
        let mut h = correct();
        // a put that timed out and that nothing shows: fine
        h.operations.push(op(40, None, put("z", "9"), None));
        // a put that timed out but happened (the log and a read show it)
        let z = kv("y", "8", 5, 5, 1);
        h.operations.push(op(41, None, put("y", "8"), None));
        h.operations.push(op(
            50,
            Some(51),
            get("y", false),
            Some(read(5, vec![z.clone()])),
        ));
        h.log.streams[0]
            .responses
            .push(response(45, 5, vec![put_event(z.clone(), None)]));
        for m in &mut h.members_at_end {
            m.revision = 5;
            m.kvs.push(z.clone());
            m.kvs.sort_by(|a, b| a.key.cmp(&b.key));
        }
        h.watchers[1].streams[0]
            .responses
            .push(response(45, 5, vec![put_event(z, None)]));
        assert_eq!(violations(&h), Vec::<String>::new());
    }
}
