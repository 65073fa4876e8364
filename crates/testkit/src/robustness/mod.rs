//! The robustness harness (issue 20): real clusters under faults, with
//! traffic shaped like what etcd's users send, every operation recorded and
//! the history checked for etcd's guarantees afterwards.
//!
//! A run ([`run::run`]) starts a 3-member cluster in network namespaces
//! (root needed), runs one kind of traffic ([`traffic`]) from several
//! clients spread over the members plus watchers, injects the seed's faults
//! one after another ([`faults`]), stops the traffic, heals the cluster,
//! reads every member's final state and lets every watcher catch up to it.
//! The [`history`] is then checked ([`check`]):
//! - linearizability of the key-value operations (the Wing–Gong–Lowe search
//!   of [`crate::linearizability`], key by key, with revisions), and
//!   revisions that follow real time across keys;
//! - every read served at a revision — serializable reads, pages pinned to
//!   a revision, counts, the gets inside transactions — equal to the
//!   history replayed up to that revision;
//! - the six watch guarantees: ordered, unique, reliable (no gap from a
//!   stream's start to what it covered), atomic (a revision's events in one
//!   response), resumable (a reconnect starts right after what was had),
//!   bookmarkable (a progress notification never ahead of an event);
//!   prev_kv checked too;
//! - every acknowledged write in the revision log at its revision; a
//!   revoked lease's keys deleted with it, no put on it afterwards;
//! - all members converged: same revision, HashKV and key space, which is
//!   the replay of the log.
//!
//! The binary `robustness` drives runs by seed, prints a summary, and saves
//! the history of a run that failed a check (or of every run, on request)
//! as JSON that `robustness --check FILE` checks again offline.

pub mod check;
pub mod client;
pub mod faults;
pub mod history;
pub mod run;
pub mod traffic;
pub mod watcher;
