//! Linearizability checking (issue 20's first layer): the Wing–Gong–Lowe
//! search as porcupine implements it, over a [`Model`], and a key-value
//! model with etcd's revisions, checked key by key plus one pass over the
//! revisions across keys.
//!
//! # The search
//!
//! Every operation is a call event and a return event on one time line
//! (a call before a return at the same instant). The search walks the
//! events: at a call it tries to linearize that operation now (the model
//! accepts its input and output in the current state), removes it and
//! starts over; at a return whose operation is not linearized yet it
//! backtracks. A cache of (linearized set, state) prunes what was tried.
//! An operation whose outcome is unknown (a timeout: it may or may not
//! have taken effect) returns at infinity and may be linearized with any
//! output or left out: the search succeeds once every known operation is
//! linearized.
//!
//! # The key-value model
//!
//! etcd gives every write a revision and every response the revision it
//! saw, so the check can be split by key without losing what links keys:
//! - per key, the state is (value, mod revision, highest header revision
//!   of the reads linearized so far). A write at revision R is legal iff R
//!   is above both (the key's writes apply in revision order, and a read
//!   that saw the store at H ≥ R would have seen it); a read is legal iff
//!   it returns the state's value and mod revision and its header revision
//!   is at least that mod revision;
//! - across keys, [`revisions_follow_real_time`]: an operation that
//!   returned before another was called has a revision no higher than the
//!   later one's (lower, when the later one writes).

use std::collections::{BTreeMap, HashSet};
use std::hash::Hash;

/// One operation of a history. `ret` None: its outcome is unknown.
#[derive(Clone, Debug)]
pub struct Op<I, O> {
    pub call: u64,
    pub ret: Option<u64>,
    pub input: I,
    /// None exactly when `ret` is None.
    pub output: Option<O>,
}

/// A sequential specification.
pub trait Model {
    type State: Clone + Eq + Hash;
    type Input;
    type Output;
    fn init(&self) -> Self::State;
    /// The state after `input` answered with `output` (None: any output,
    /// for an operation whose outcome is unknown), or None if the model
    /// cannot produce that answer in `state`.
    fn step(
        &self,
        state: &Self::State,
        input: &Self::Input,
        output: Option<&Self::Output>,
    ) -> Option<Self::State>;
}

/// Why a history is not linearizable: the longest prefix of operations
/// the search could linearize (indices into the history, in order), and
/// the operations that were pending where it got stuck.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Violation {
    pub linearized: Vec<usize>,
    pub pending: Vec<usize>,
}

#[derive(Clone, Copy)]
struct Event {
    op: usize,
    is_call: bool,
    prev: usize,
    next: usize,
}

const NIL: usize = usize::MAX;

/// Checks `history` against `model` (see the module doc).
pub fn check<M: Model>(model: &M, history: &[Op<M::Input, M::Output>]) -> Result<(), Violation> {
    let n = history.len();
    // events sorted by time, a call before a return at the same time
    let mut order: Vec<(u64, bool, usize)> = Vec::with_capacity(2 * n);
    for (i, op) in history.iter().enumerate() {
        order.push((op.call, false, i));
        order.push((op.ret.unwrap_or(u64::MAX), true, i));
    }
    order.sort();
    // events[0] is the head sentinel
    let mut events = vec![Event {
        op: NIL,
        is_call: false,
        prev: NIL,
        next: NIL,
    }];
    let mut call_of = vec![0; n];
    let mut ret_of = vec![0; n];
    for (k, &(_, is_return, op)) in order.iter().enumerate() {
        let at = k + 1;
        events.push(Event {
            op,
            is_call: !is_return,
            prev: at - 1,
            next: NIL,
        });
        events[at - 1].next = at;
        if is_return {
            ret_of[op] = at;
        } else {
            call_of[op] = at;
        }
    }
    let lift = |events: &mut Vec<Event>, at: usize| {
        let (p, x) = (events[at].prev, events[at].next);
        events[p].next = x;
        if x != NIL {
            events[x].prev = p;
        }
    };
    let unlift = |events: &mut Vec<Event>, at: usize| {
        let (p, x) = (events[at].prev, events[at].next);
        events[p].next = at;
        if x != NIL {
            events[x].prev = at;
        }
    };

    let mut state = model.init();
    let mut linearized = vec![0u64; n.div_ceil(64)];
    let mut cache: HashSet<(Vec<u64>, M::State)> = HashSet::new();
    let mut stack: Vec<(usize, M::State)> = Vec::new();
    let mut best: Vec<usize> = Vec::new();
    let mut entry = events[0].next;
    loop {
        if entry == NIL {
            return Ok(());
        }
        let e = events[entry];
        if e.is_call {
            let op = &history[e.op];
            if let Some(next) = model.step(&state, &op.input, op.output.as_ref()) {
                let mut set = linearized.clone();
                set[e.op / 64] |= 1 << (e.op % 64);
                if cache.insert((set.clone(), next.clone())) {
                    stack.push((entry, std::mem::replace(&mut state, next)));
                    linearized = set;
                    lift(&mut events, entry);
                    lift(&mut events, ret_of[e.op]);
                    if stack.len() > best.len() {
                        best = stack.iter().map(|(at, _)| events[*at].op).collect();
                    }
                    entry = events[0].next;
                    continue;
                }
            }
            entry = e.next;
        } else {
            if history[e.op].ret.is_none() {
                // only unknown operations are left: they may never have
                // taken effect
                return Ok(());
            }
            let Some((at, previous)) = stack.pop() else {
                let mut pending = Vec::new();
                let mut x = events[0].next;
                while x != NIL {
                    if events[x].is_call {
                        pending.push(events[x].op);
                    }
                    x = events[x].next;
                }
                // from the deepest point the search reached
                pending.retain(|op| !best.contains(op));
                return Err(Violation {
                    linearized: best,
                    pending,
                });
            };
            let op = events[at].op;
            state = previous;
            linearized[op / 64] &= !(1 << (op % 64));
            unlift(&mut events, ret_of[op]);
            unlift(&mut events, call_of[op]);
            entry = events[at].next;
        }
    }
}

/// An operation on one key.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum KvInput {
    Put(String),
    Delete,
    Get,
    /// A transaction on this key: if `cond` holds, `then`, else `otherwise`.
    Txn {
        cond: Cond,
        then: Box<KvInput>,
        otherwise: Box<KvInput>,
    },
    /// An empty transaction branch.
    Nothing,
}

/// A transaction's comparison of the key (equality, as the traffic sends):
/// etcd compares a missing key's mod revision and version as 0 and its
/// value as never equal.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Cond {
    ModRevision(i64),
    Version(i64),
    Value(String),
}

impl KvInput {
    /// The value this operation writes if it takes effect with
    /// `succeeded` (for a transaction, the branch taken).
    fn written_value(&self) -> Option<(&str, bool)> {
        match self {
            KvInput::Put(v) => Some((v, true)),
            KvInput::Txn {
                then, otherwise, ..
            } => match (then.as_ref(), otherwise.as_ref()) {
                (KvInput::Put(v), _) => Some((v, true)),
                (_, KvInput::Put(v)) => Some((v, false)),
                _ => None,
            },
            _ => None,
        }
    }
}

/// Its answer: for a write, the revision it made (None: a delete that
/// found nothing, which makes no revision); for a read, the value and mod
/// revision it saw (None: no key) and the header revision.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum KvOutput {
    Written(Option<i64>),
    Read {
        found: Option<(String, i64)>,
        header: i64,
    },
    /// A transaction: the branch taken, the header revision and the
    /// branch's own answer (`Written(None)` for an empty branch).
    Txn {
        succeeded: bool,
        header: i64,
        result: Box<KvOutput>,
    },
}

/// One key's state: (value and mod revision, the highest header revision
/// of the reads linearized so far, the key's last write revision).
#[derive(Clone, Debug, PartialEq, Eq, Hash, Default)]
pub struct KeyState {
    pub current: Option<(String, i64)>,
    pub read_up_to: i64,
    pub written_at: i64,
    /// The key's version (puts since it was created), 0 when absent.
    pub version: i64,
}

impl KeyState {
    fn holds(&self, cond: &Cond) -> bool {
        match cond {
            Cond::ModRevision(rev) => self.current.as_ref().map_or(0, |c| c.1) == *rev,
            Cond::Version(version) => self.version == *version,
            Cond::Value(value) => self.current.as_ref().is_some_and(|c| c.0 == *value),
        }
    }
}

/// The key-value model of one key (see the module doc).
pub struct KeyModel;

impl Model for KeyModel {
    type State = KeyState;
    type Input = KvInput;
    type Output = KvOutput;

    fn init(&self) -> KeyState {
        KeyState::default()
    }

    fn step(&self, s: &KeyState, input: &KvInput, output: Option<&KvOutput>) -> Option<KeyState> {
        let legal_write = |rev: i64| rev > s.written_at && rev > s.read_up_to;
        match (input, output) {
            (KvInput::Get, None) => Some(s.clone()),
            (KvInput::Get, Some(KvOutput::Read { found, header })) => {
                let seen_at = s.current.as_ref().map_or(s.written_at, |c| c.1);
                (*found == s.current && *header >= seen_at).then(|| KeyState {
                    read_up_to: s.read_up_to.max(*header),
                    ..s.clone()
                })
            }
            (KvInput::Put(value), Some(KvOutput::Written(Some(rev)))) => {
                legal_write(*rev).then(|| KeyState {
                    current: Some((value.clone(), *rev)),
                    read_up_to: s.read_up_to,
                    written_at: *rev,
                    version: s.version + 1,
                })
            }
            // an unknown put: its revision is unknown too; later reads
            // name it (their mod revision)
            (KvInput::Put(value), None) => Some(KeyState {
                current: Some((value.clone(), i64::MIN)),
                version: s.version + 1,
                ..s.clone()
            }),
            (KvInput::Delete, Some(KvOutput::Written(None))) => {
                s.current.is_none().then(|| s.clone())
            }
            (KvInput::Delete, Some(KvOutput::Written(Some(rev)))) => {
                (s.current.is_some() && legal_write(*rev)).then_some(KeyState {
                    current: None,
                    read_up_to: s.read_up_to,
                    written_at: *rev,
                    version: 0,
                })
            }
            (KvInput::Delete, None) => Some(KeyState {
                current: None,
                version: 0,
                ..s.clone()
            }),
            (KvInput::Nothing, _) => Some(s.clone()),
            (
                KvInput::Txn {
                    cond,
                    then,
                    otherwise,
                },
                output,
            ) => {
                let holds = s.holds(cond);
                let branch = if holds { then } else { otherwise };
                match output {
                    None => self.step(s, branch, None),
                    Some(KvOutput::Txn {
                        succeeded,
                        header,
                        result,
                    }) => {
                        // a transaction that wrote made revision `header`;
                        // one that did not saw the store at `header`
                        let seen_at = s.current.as_ref().map_or(s.written_at, |c| c.1);
                        let header_ok = match result.as_ref() {
                            KvOutput::Written(Some(rev)) => rev == header,
                            _ => *header >= seen_at,
                        };
                        if *succeeded != holds || !header_ok {
                            return None;
                        }
                        let mut next = self.step(s, branch, Some(result))?;
                        if !matches!(result.as_ref(), KvOutput::Written(Some(_))) {
                            next.read_up_to = next.read_up_to.max(*header);
                        }
                        Some(next)
                    }
                    Some(_) => None,
                }
            }
            _ => None,
        }
    }
}

/// A key-value history: (key, operation).
pub type KvHistory = Vec<(String, Op<KvInput, KvOutput>)>;

/// Linearizability of a key-value history, key by key, plus the revisions
/// across keys; the violation names the key.
pub fn check_kv(history: &KvHistory) -> Result<(), (String, Violation)> {
    let mut by_key: BTreeMap<&str, Vec<Op<KvInput, KvOutput>>> = BTreeMap::new();
    for (key, op) in history {
        by_key.entry(key).or_default().push(op.clone());
    }
    for (key, ops) in by_key {
        check(&KeyModel, &resolve_unknown_revisions(ops)).map_err(|v| (key.to_string(), v))?;
    }
    Ok(())
}

/// An unknown put that a read saw gets the revision the read names (the
/// model cannot know it otherwise): each read's mod revision that no known
/// write made is given to the unknown put of that value.
fn resolve_unknown_revisions(mut ops: Vec<Op<KvInput, KvOutput>>) -> Vec<Op<KvInput, KvOutput>> {
    let known: HashSet<i64> = ops
        .iter()
        .filter_map(|op| op.output.as_ref().and_then(revision_of))
        .filter(|(_, write)| *write)
        .map(|(rev, _)| rev)
        .collect();
    let seen: Vec<(String, i64)> = ops
        .iter()
        .filter_map(|op| match &op.output {
            Some(KvOutput::Read {
                found: Some((v, rev)),
                ..
            }) if !known.contains(rev) => Some((v.clone(), *rev)),
            _ => None,
        })
        .collect();
    for (value, rev) in seen {
        if let Some(op) = ops
            .iter_mut()
            .find(|op| op.output.is_none() && op.input.written_value().map(|w| w.0) == Some(&value))
        {
            // it happened: it returned at infinity with that revision
            let written = KvOutput::Written(Some(rev));
            op.output = Some(match op.input.written_value() {
                Some((_, succeeded)) if matches!(op.input, KvInput::Txn { .. }) => KvOutput::Txn {
                    succeeded,
                    header: rev,
                    result: Box::new(written),
                },
                _ => written,
            });
        }
    }
    ops
}

/// The revision an answer carries: a write's, or a read's header.
fn revision_of(output: &KvOutput) -> Option<(i64, bool)> {
    match output {
        KvOutput::Written(Some(rev)) => Some((*rev, true)),
        KvOutput::Written(None) => None,
        KvOutput::Read { header, .. } => Some((*header, false)),
        KvOutput::Txn { header, result, .. } => Some((
            *header,
            matches!(result.as_ref(), KvOutput::Written(Some(_))),
        )),
    }
}

/// Across keys: an operation that returned before another was called has
/// a revision no higher than the later one's, and lower when the later one
/// is a write. Returns the first offending pair (earlier, later).
pub fn revisions_follow_real_time(history: &KvHistory) -> Result<(), (usize, usize)> {
    let mut done: Vec<(u64, i64, usize)> = history
        .iter()
        .enumerate()
        .filter_map(|(i, (_, op))| {
            let (rev, _) = revision_of(op.output.as_ref()?)?;
            Some((op.ret?, rev, i))
        })
        .collect();
    done.sort();
    let mut calls: Vec<(u64, usize)> = history
        .iter()
        .enumerate()
        .map(|(i, (_, op))| (op.call, i))
        .collect();
    calls.sort();
    // the highest revision among operations returned so far
    let (mut max_rev, mut max_op, mut k) = (i64::MIN, usize::MAX, 0);
    for (call, i) in calls {
        while k < done.len() && done[k].0 < call {
            if done[k].1 > max_rev {
                (max_rev, max_op) = (done[k].1, done[k].2);
            }
            k += 1;
        }
        let Some((rev, write)) = history[i].1.output.as_ref().and_then(revision_of) else {
            continue;
        };
        if rev < max_rev || (write && rev == max_rev) {
            return Err((max_op, i));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn put(
        key: &str,
        value: &str,
        call: u64,
        ret: u64,
        rev: i64,
    ) -> (String, Op<KvInput, KvOutput>) {
        (
            key.into(),
            Op {
                call,
                ret: Some(ret),
                input: KvInput::Put(value.into()),
                output: Some(KvOutput::Written(Some(rev))),
            },
        )
    }

    fn lost_put(key: &str, value: &str, call: u64) -> (String, Op<KvInput, KvOutput>) {
        (
            key.into(),
            Op {
                call,
                ret: None,
                input: KvInput::Put(value.into()),
                output: None,
            },
        )
    }

    fn get(
        key: &str,
        found: Option<(&str, i64)>,
        header: i64,
        call: u64,
        ret: u64,
    ) -> (String, Op<KvInput, KvOutput>) {
        (
            key.into(),
            Op {
                call,
                ret: Some(ret),
                input: KvInput::Get,
                output: Some(KvOutput::Read {
                    found: found.map(|(v, r)| (v.to_string(), r)),
                    header,
                }),
            },
        )
    }

    fn delete(key: &str, call: u64, ret: u64, rev: Option<i64>) -> (String, Op<KvInput, KvOutput>) {
        (
            key.into(),
            Op {
                call,
                ret: Some(ret),
                input: KvInput::Delete,
                output: Some(KvOutput::Written(rev)),
            },
        )
    }

    fn ok(h: &KvHistory) -> bool {
        check_kv(h).is_ok() && revisions_follow_real_time(h).is_ok()
    }

    #[test]
    fn a_sequential_history_is_linearizable() {
        let h = vec![
            put("a", "1", 0, 1, 2),
            get("a", Some(("1", 2)), 2, 2, 3),
            put("b", "1", 4, 5, 3),
            delete("a", 6, 7, Some(4)),
            get("a", None, 4, 8, 9),
            delete("a", 10, 11, None),
            get("b", Some(("1", 3)), 4, 12, 13),
        ];
        assert!(ok(&h));
    }

    #[test]
    fn a_read_concurrent_with_a_write_may_see_either() {
        for seen in [None, Some(("1", 2))] {
            let h = vec![
                put("a", "1", 0, 10, 2),
                get("a", seen, if seen.is_some() { 2 } else { 1 }, 1, 9),
            ];
            assert!(ok(&h), "{seen:?}");
        }
    }

    #[test]
    fn a_stale_read_is_found() {
        // the put returned before the read was called; the read misses it
        let h = vec![
            put("a", "1", 0, 1, 2),
            put("a", "2", 2, 3, 3),
            get("a", Some(("1", 2)), 2, 4, 5),
        ];
        let (key, v) = check_kv(&h).unwrap_err();
        assert_eq!(key, "a");
        assert_eq!(v.pending, [2]);
        // and the header revision went backwards in real time
        assert_eq!(revisions_follow_real_time(&h), Err((1, 2)));
    }

    #[test]
    fn a_lost_write_is_found() {
        // acknowledged at revision 2, then a read at revision 3 without it
        let h = vec![put("a", "1", 0, 1, 2), get("a", None, 3, 2, 3)];
        assert!(check_kv(&h).is_err());
    }

    #[test]
    fn a_read_claiming_a_newer_write_than_its_header_is_found() {
        let h = vec![put("a", "1", 0, 1, 5), get("a", Some(("1", 5)), 4, 0, 2)];
        assert!(check_kv(&h).is_err());
    }

    #[test]
    fn writes_out_of_revision_order_are_found_across_keys() {
        // b's put was called after a's returned, yet got a lower revision
        let h = vec![put("a", "1", 0, 1, 5), put("b", "1", 2, 3, 4)];
        assert!(check_kv(&h).is_ok(), "each key alone is fine");
        assert_eq!(revisions_follow_real_time(&h), Err((0, 1)));
    }

    #[test]
    fn an_unknown_write_may_or_may_not_have_happened() {
        let seen = vec![lost_put("a", "1", 0), get("a", Some(("1", 7)), 7, 5, 6)];
        assert!(ok(&seen));
        let unseen = vec![lost_put("a", "1", 0), get("a", None, 7, 5, 6)];
        assert!(ok(&unseen));
        // but not a value nobody wrote
        let invented = vec![lost_put("a", "1", 0), get("a", Some(("2", 7)), 7, 5, 6)];
        assert!(check_kv(&invented).is_err());
    }

    #[test]
    fn a_read_cannot_see_a_write_called_after_it_returned() {
        let h = vec![get("a", Some(("1", 2)), 2, 0, 1), put("a", "1", 2, 3, 2)];
        assert!(check_kv(&h).is_err());
    }

    /// Histories of a real (sequential) store, with every operation's
    /// interval stretched around the instant it took effect, and some
    /// outcomes lost: always linearizable. LIN_SEED / LIN_RUNS run it
    /// elsewhere or longer.
    #[test]
    fn histories_of_a_correct_store_always_pass() {
        let mut rng = fastrand::Rng::with_seed(
            std::env::var("LIN_SEED")
                .ok()
                .and_then(|s| s.parse().ok())
                .unwrap_or(7),
        );
        for _ in 0..std::env::var("LIN_RUNS")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(300)
        {
            let mut store: BTreeMap<String, (String, i64)> = BTreeMap::new();
            let mut revision = 1;
            let mut h: KvHistory = Vec::new();
            for step in 0..rng.usize(1..40) {
                let at = 10 * step as u64 + 5;
                let (call, ret) = (at - rng.u64(0..30).min(at), at + rng.u64(0..30));
                let key = format!("k{}", rng.u8(0..3));
                let (input, output) = match rng.u8(0..3) {
                    0 => {
                        revision += 1;
                        let value = format!("v{step}");
                        store.insert(key.clone(), (value.clone(), revision));
                        (KvInput::Put(value), KvOutput::Written(Some(revision)))
                    }
                    1 => {
                        let rev = store.remove(&key).map(|_| {
                            revision += 1;
                            revision
                        });
                        (KvInput::Delete, KvOutput::Written(rev))
                    }
                    _ => (
                        KvInput::Get,
                        KvOutput::Read {
                            found: store.get(&key).cloned(),
                            header: revision,
                        },
                    ),
                };
                let lost = rng.u8(0..10) == 0 && input != KvInput::Get;
                h.push((
                    key,
                    Op {
                        call,
                        ret: (!lost).then_some(ret),
                        input,
                        output: (!lost).then_some(output),
                    },
                ));
            }
            assert!(check_kv(&h).is_ok(), "{h:#?}");
            assert!(revisions_follow_real_time(&h).is_ok(), "{h:#?}");
        }
    }
}
