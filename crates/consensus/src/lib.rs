//! # consensus: the raft layer of oxcd
//!
//! This crate owns a member's raft state: the raft-rs [`raft::RawNode`], the
//! write-ahead log ([`wal`]), the raft snapshot files ([`snap`]) and the loop
//! that drives them. It hands committed entries, in index order, to the apply
//! side and never looks inside them: payloads are opaque bytes (it must never
//! depend on `mvcc` or `api`).
//!
//! ## The loop (one dedicated thread, [`start`])
//!
//! The `RawNode` and everything a turn of the loop touches sit behind one
//! lock; the raft thread takes it for each of its turns. Everything else
//! reaches the loop through a bounded channel ([`RaftHandle`]) plus a
//! wake-up, or through two atomics plus a wake-up (applied index, snapshot
//! requests). Each turn:
//!
//! 1. (the raft thread) waits for a wake-up or the next tick (every
//!    heartbeat interval);
//! 2. drains everything queued (at most [`INPUT_QUEUE_CAPACITY`]), so N
//!    concurrent proposals share one Ready and one fdatasync (group commit);
//! 3. handles each Ready: sends leader messages, persists snapshot, entries
//!    and hard state to the WAL with ONE fdatasync, sends follower messages,
//!    answers ReadIndex waiters, advances, and hands committed entries to the
//!    apply side through a bounded tokio channel;
//! 4. publishes a [`RaftStatus`] that [`RaftHandle::status`] reads without a
//!    round trip.
//!
//! ## Client turns
//!
//! While the member leads alone (one voter, no learners), a proposal made
//! on a thread that allows it ([`allow_client_turns`]: the member's
//! `grpc-client-N` threads) wakes nobody: that thread takes the lock and
//! turns the loop itself once the tasks already queued on it have run, so
//! a lone client's write crosses no thread (see `turns`). A thread that
//! finds the lock held wakes the raft thread instead. Ticks, peer
//! messages, snapshot files and stopping stay the raft thread's.
//!
//! Conf-change entries are applied to the `RawNode` by the turn that hands
//! them out (the apply side still receives them, to update its
//! member list).
//!
//! The loop is a driver (`node`: the thread, its runtime, the WAL, the
//! `.snap` files, the transport, the hand-off to apply) around a core with
//! no I/O (`node::core`: the RawNode, read rounds, conf-state history,
//! snapshot policy; input and the clock in, Ready effects out), which its
//! unit tests drive without disk or threads. The WAL's file operations go
//! through [`wal::FileOps`], which tests replace to fail or tear a call.
//!
//! ## Inline apply
//!
//! Handing a batch to the apply thread costs a thread wake-up, which on an
//! idle machine (a lone client) is a good part of a write's latency. When
//! no batch is queued or being applied, the turn (the raft thread's or a
//! client thread's) offers the batch to
//! an [`InlineApply`] hook ([`RaftHandle::set_inline_apply`]) first, which
//! may apply it on the spot (it refuses when the apply side is busy or the
//! batch is large); under load the channel and the apply thread take over,
//! so applying still overlaps the next fdatasync. Order is kept: the hook
//! is only offered a batch while [`RaftHandle::batch_applied`] has
//! acknowledged every queued one.
//!
//! ## Invariants
//!
//! - An entry reaches the apply side only after the WAL record holding it is
//!   fdatasync'ed (raft-rs releases committed entries only once persisted).
//! - Committed entries leave in strictly increasing index order, each once per
//!   process lifetime; after a restart everything above the caller's
//!   `applied` index is handed out again (apply must be idempotent by index).
//! - WAL segments are released only up to an index passed to
//!   [`RaftHandle::snapshot`], which the caller promises a DURABLE backend
//!   commit covers. Release follows the snapshot file and the WAL snapshot
//!   marker being synced. Break this and a kill -9 loses acknowledged writes.
//! - Snapshot counting is the caller's: the apply side knows when a durable
//!   commit happened, so it decides when to call `snapshot` (etcd:
//!   every `--snapshot-count` applied entries).
//!
//! ## On disk (`<member_dir>`)
//!
//! `wal/%016x-%016x.wal` (see [`wal`] for the record layout; with etcd's
//! `--wal-dir` the segments are in that directory instead,
//! [`RaftConfig::wal_dir`]) and `snap/%016x-%016x.snap` (see [`snap`]).
//! `snap/db` belongs to the backend.

mod fatal;
pub mod fileutil;
#[cfg(test)]
mod fuzz_tests;
mod import;
pub mod logger;
mod node;
pub mod observer;
pub mod snap;
pub mod transport;
mod turns;
pub mod wal;

// Failpoint sites (`crate::fail_point!`) are compiled in only with the
// `failpoints` feature (test builds); without it they expand to nothing.
#[cfg(feature = "failpoints")]
pub(crate) use failpoint::fail_point;
#[cfg(not(feature = "failpoints"))]
macro_rules! fail_point {
    ($($site:tt)*) => {};
}
#[cfg(not(feature = "failpoints"))]
pub(crate) use fail_point;

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use raft::eraftpb;
use tokio::sync::{mpsc, oneshot, Notify};

pub use fatal::Fatal;
pub use import::import_log;
pub use observer::{Observer, RaftObserver};
pub use raft;
pub use snap::SnapError;
pub use turns::allow_client_turns;
pub use wal::WalError;

/// Proposals, read requests and peer messages queued to the raft thread.
/// Bounded for backpressure; one drain's worth forms one Ready (group
/// commit), so it is also the largest group commit.
pub const INPUT_QUEUE_CAPACITY: usize = 4096;

/// Committed batches queued for the apply side. When apply falls this far
/// behind the raft thread blocks (as etcd's unbuffered applyc does).
pub const COMMITTED_QUEUE_CAPACITY: usize = 1024;

/// Entries kept in memory below a snapshot so slow followers can catch up
/// from the log rather than a snapshot (etcd's SnapshotCatchUpEntries).
pub const SNAPSHOT_CATCH_UP_ENTRIES: u64 = 5000;

/// raft-rs message size cap (etcd's maxSizePerMsg).
pub const MAX_SIZE_PER_MSG: u64 = 1024 * 1024;

/// raft-rs inflight append window (etcd's maxInflightMsgs).
pub const MAX_INFLIGHT_MSGS: usize = 512;

/// The raft thread's stack: inline apply runs the apply side's code on it,
/// which recurses once per level of a nested txn (the server's request
/// threads get the same for the same reason). Only pages used are mapped.
pub const RAFT_THREAD_STACK_BYTES: usize = 16 << 20;

#[derive(Clone, Debug)]
pub struct RaftConfig {
    /// This member's raft id.
    pub id: u64,
    /// `<data-dir>/member`; `snap/` is created under it.
    pub member_dir: PathBuf,
    /// Where the WAL segments live: `<member_dir>/wal`, or etcd's
    /// `--wal-dir`.
    pub wal_dir: PathBuf,
    /// Voters of the bootstrap configuration; used only when the WAL is new.
    pub voters: Vec<u64>,
    pub heartbeat: Duration,
    pub election_timeout: Duration,
    /// Applied index durable in the backend (its consistent index).
    pub applied: u64,
    /// Recorded in a new WAL's metadata.
    pub cluster_id: u64,
    /// etcd's `--force-new-cluster`: on a member with a WAL, drop the log
    /// entries past the commit index and commit the removal of every other
    /// member, so that this one alone is the cluster (its data kept).
    /// Repeated at every start while set, as etcd does.
    pub force_new_cluster: bool,
}

/// Tunables a member does not change; tests shrink them.
#[derive(Clone, Debug, Default)]
pub struct StartOptions {
    pub wal: wal::WalOptions,
    /// Entries kept in memory below a snapshot for slow followers (etcd's
    /// --experimental-snapshot-catchup-entries); 0 means the default,
    /// [`SNAPSHOT_CATCH_UP_ENTRIES`]. A follower further behind gets the
    /// backend as a snapshot.
    pub snapshot_catch_up_entries: u64,
    /// etcd's `--pre-vote=false`: candidates campaign at once, without
    /// first asking whether they could win (PreVote is on by default).
    pub disable_pre_vote: bool,
    /// etcd's `--max-snapshots`: `.snap` files kept (0: all); None: 5,
    /// etcd's default.
    pub max_snapshots: Option<usize>,
    /// Told how long each WAL fdatasync took (the server's
    /// etcd_disk_wal_fsync_duration_seconds); this crate knows no metrics.
    pub wal_sync_observer: Option<wal::SyncObserver>,
    /// Told of WAL writes, `.snap` saves and late heartbeats (the server's
    /// etcd_disk_wal_write_*, etcd_snap_* and heartbeat failure metrics).
    pub observer: Option<Observer>,
}

/// Committed entries (normal and conf change, including raft's empty entries
/// at each new term), in index order.
#[derive(Clone, Debug)]
pub struct CommittedBatch {
    /// A snapshot received from the leader, to install before `entries`:
    /// its metadata is durable in the WAL and snap dir; its `data` names the
    /// backend file the transport received for it.
    pub snapshot: Option<eraftpb::Snapshot>,
    pub entries: Vec<eraftpb::Entry>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RaftStatus {
    pub id: u64,
    pub leader: u64,
    pub term: u64,
    pub commit_index: u64,
    pub applied_index: u64,
    pub is_leader: bool,
    pub leader_changes: u64,
    /// Some(commit index) when this member leads a configuration in which
    /// it is the only voter and has committed an entry of its term: raft
    /// answers a ReadIndex at once then (a quorum of one), so
    /// [`RaftHandle::read_index`] takes it from here without a round trip
    /// to the raft thread. Any write acknowledged before a read began is at
    /// or below the commit index published by then (it is published before
    /// the apply side can apply up to it).
    pub local_read_index: Option<u64>,
    /// Whom this member voted for in `term` (0: nobody).
    pub vote: u64,
    /// raft's role, as etcd's raft prints it: "StateFollower",
    /// "StateCandidate", "StateLeader" or "StatePreCandidate".
    pub raft_state: &'static str,
    /// The member leadership is being transferred to (0: none).
    pub lead_transferee: u64,
}

/// Delivers raft messages to peers. Must not block: queue and return.
pub trait Transport: Send + Sync {
    fn send(&self, msgs: Vec<eraftpb::Message>);

    /// Called once on the raft thread when it starts, with the handle of
    /// the runtime it drives whenever it waits: peer I/O spawned there runs
    /// on the raft thread itself, so a message from a peer reaches raft
    /// without a thread wake-up. Whatever `send` queued is flushed there
    /// before the raft thread blocks on a disk write (see `Node`).
    fn start(&self, _io: &tokio::runtime::Handle) {}
}

/// The transport of a single-member cluster: there is nobody to talk to.
pub struct NoopTransport;

impl Transport for NoopTransport {
    fn send(&self, _msgs: Vec<eraftpb::Message>) {}
}

#[derive(Debug, thiserror::Error)]
pub enum ConsensusError {
    #[error("etcdserver: no leader")]
    NoLeader,
    #[error("raft proposal dropped")]
    ProposalDropped,
    #[error("etcdserver: server stopped")]
    Stopped,
    #[error("etcdserver: request timed out")]
    Timeout,
    /// A ReadIndex round was in flight when the leader changed.
    #[error("etcdserver: leader changed")]
    LeaderChanged,
    #[error(transparent)]
    Wal(#[from] WalError),
    #[error(transparent)]
    Snap(#[from] SnapError),
    #[error("corrupt raft state: {0}")]
    Corrupt(String),
    #[error("io: {0}")]
    Io(#[from] std::io::Error),
    #[error("raft: {0}")]
    Raft(#[from] raft::Error),
    #[error("invalid raft config: {0}")]
    Config(String),
}

pub(crate) enum Input {
    Propose {
        data: Vec<u8>,
        reply: ProposeReply,
    },
    ProposeConfChange {
        change: eraftpb::ConfChange,
        reply: oneshot::Sender<Result<(), ConsensusError>>,
    },
    /// The leader's view of its followers' logs (None on a follower).
    Progress {
        reply: oneshot::Sender<Option<Vec<PeerProgress>>>,
    },
    ReadIndex {
        reply: oneshot::Sender<Result<u64, ConsensusError>>,
    },
    Step(eraftpb::Message),
    ReportSnapshot {
        to: u64,
        finished: bool,
    },
    /// Hands leadership to another voter (raft's MsgTransferLeader).
    TransferLeader(u64),
    /// Ticks raft this many times at once (etcd's advanceTicks).
    AdvanceTicks(usize),
}

/// How the raft thread answers a proposal.
pub(crate) enum ProposeReply {
    /// Accepted or refused, the caller is told.
    Always(oneshot::Sender<Result<(), ConsensusError>>),
    /// Only a refusal is told: accepting wakes nobody.
    OnRefusal(Arc<RefusalSlot>),
}

impl ProposeReply {
    pub(crate) fn send(self, result: Result<(), ConsensusError>) {
        match self {
            ProposeReply::Always(tx) => {
                let _ = tx.send(result);
            }
            ProposeReply::OnRefusal(slot) => {
                if let Err(e) = result {
                    *slot.error.lock() = Some(e);
                    slot.notify.notify_one();
                }
            }
        }
    }
}

#[derive(Default)]
pub(crate) struct RefusalSlot {
    error: parking_lot::Mutex<Option<ConsensusError>>,
    notify: Notify,
}

/// The refusal of a proposal queued with [`RaftHandle::propose_detached`],
/// if raft refuses it. Raft accepting it (the usual case) sends nothing, so
/// [`ProposalRefusal::refused`] then never resolves: wait for the entry's
/// apply alongside it.
pub struct ProposalRefusal {
    slot: Arc<RefusalSlot>,
}

impl ProposalRefusal {
    /// Resolves with raft's refusal: no leader, proposal dropped, or
    /// `Stopped` for a proposal still queued when the raft thread stopped.
    /// Never resolves for an accepted proposal.
    pub async fn refused(&self) -> ConsensusError {
        loop {
            // notify_one keeps a permit when nobody waits yet
            self.slot.notify.notified().await;
            if let Some(e) = self.slot.error.lock().take() {
                return e;
            }
        }
    }
}

/// State shared between handles and the raft thread without a channel.
pub(crate) struct Shared {
    /// Highest applied index reported by the apply side.
    pub applied: AtomicU64,
    /// Highest index the apply side asked to snapshot at (durable in backend).
    pub snapshot_request: AtomicU64,
    pub stopping: AtomicBool,
    /// Wakes the raft thread for the atomics above.
    pub wake: Notify,
    /// Wakes a raft thread blocked handing entries to a full apply queue.
    pub stop_wake: Notify,
    pub status: parking_lot::Mutex<RaftStatus>,
    pub wal_syncs: AtomicU64,
    /// (is leader, term), sent when either changes.
    pub role: tokio::sync::watch::Sender<Role>,
    /// Batches sent to the apply channel and not yet acknowledged by
    /// [`RaftHandle::batch_applied`].
    pub queued_batches: AtomicU64,
    pub inline_apply: std::sync::OnceLock<InlineApply>,
    /// The raft thread's runtime (see [`Transport::start`]).
    pub io: std::sync::OnceLock<tokio::runtime::Handle>,
    /// Raised when the raft loop stops on an error (a WAL or snapshot write
    /// failed): the member cannot go on.
    pub fatal: Arc<Fatal>,
    /// The voters of the cluster's first configuration, from the WAL's
    /// metadata (see [`RaftHandle::initial_voters`]).
    pub initial_voters: std::sync::OnceLock<Vec<u64>>,
    /// The member leads a configuration of itself alone (published with
    /// the status): a client thread may turn the loop for its proposals.
    pub leads_alone: AtomicBool,
}

/// Applies a committed batch on the raft thread, or hands it back (the apply
/// side is busy, or the batch is one to apply off the raft thread). It must
/// not block on the raft thread (no proposals, no waiting on raft).
pub type InlineApply = Box<dyn Fn(CommittedBatch) -> Result<(), CommittedBatch> + Send + Sync>;

/// How far a member's log matches the leader's, as the leader tracks it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PeerProgress {
    pub id: u64,
    /// The highest index known to be in that member's log.
    pub matched: u64,
    pub is_learner: bool,
    /// Heard from within the last election timeout (raft's recent_active).
    pub recent_active: bool,
    /// The next index the leader sends it.
    pub next: u64,
    /// raft's replication state, as etcd's raft names it: "StateProbe",
    /// "StateReplicate" or "StateSnapshot".
    pub state: &'static str,
}

/// Whether this member leads, and in which term.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Role {
    pub is_leader: bool,
    pub term: u64,
}

struct HandleInner {
    input: mpsc::Sender<Input>,
    shared: Arc<Shared>,
    /// The raft loop's state, for turns on client threads (`turns`); gone
    /// once the raft thread has stopped.
    engine: std::sync::Weak<parking_lot::Mutex<node::Engine>>,
    thread: parking_lot::Mutex<Option<JoinHandle<()>>>,
}

impl HandleInner {
    /// A turn for the proposals this thread queued: here, when the loop is
    /// free and the member leads alone; else the raft thread's.
    fn client_turn(&self) {
        if let Some(engine) = self.engine.upgrade() {
            if let Some(mut engine) = engine.try_lock() {
                if engine.client_turn() {
                    return;
                }
            }
        }
        self.shared.wake.notify_one();
    }
}

impl Drop for HandleInner {
    /// Every handle is gone: the raft thread stops (it would otherwise
    /// wait for input nobody can send).
    fn drop(&mut self) {
        self.shared.stopping.store(true, Ordering::Release);
        self.shared.wake.notify_one();
        self.shared.stop_wake.notify_one();
    }
}

/// The raft loop's lock, held by [`RaftHandle::hold_loop_for_test`].
#[doc(hidden)]
pub struct LoopHold {
    _guard: parking_lot::ArcMutexGuard<parking_lot::RawMutex, node::Engine>,
}

/// The way into the raft thread. Cheap to clone; all clones drive one node.
#[derive(Clone)]
pub struct RaftHandle {
    inner: Arc<HandleInner>,
}

/// Starts the raft thread for the member in `cfg.member_dir`: loads the
/// newest snapshot and the WAL after it (creating both for a new member),
/// and returns the handle and the committed-entries receiver.
pub fn start(
    cfg: RaftConfig,
    transport: Arc<dyn Transport>,
) -> Result<(RaftHandle, mpsc::Receiver<CommittedBatch>), ConsensusError> {
    start_with_options(cfg, transport, StartOptions::default())
}

/// [`start`] with non-default tunables.
pub fn start_with_options(
    cfg: RaftConfig,
    transport: Arc<dyn Transport>,
    options: StartOptions,
) -> Result<(RaftHandle, mpsc::Receiver<CommittedBatch>), ConsensusError> {
    let (input_tx, input_rx) = mpsc::channel(INPUT_QUEUE_CAPACITY);
    let (committed_tx, committed_rx) = mpsc::channel(COMMITTED_QUEUE_CAPACITY);
    let shared = Arc::new(Shared {
        applied: AtomicU64::new(cfg.applied),
        snapshot_request: AtomicU64::new(0),
        stopping: AtomicBool::new(false),
        wake: Notify::new(),
        stop_wake: Notify::new(),
        status: parking_lot::Mutex::new(RaftStatus {
            id: cfg.id,
            applied_index: cfg.applied,
            ..Default::default()
        }),
        wal_syncs: AtomicU64::new(0),
        role: tokio::sync::watch::channel(Role::default()).0,
        queued_batches: AtomicU64::new(0),
        inline_apply: std::sync::OnceLock::new(),
        io: std::sync::OnceLock::new(),
        fatal: Arc::new(Fatal::default()),
        initial_voters: std::sync::OnceLock::new(),
        leads_alone: AtomicBool::new(false),
    });
    let node = node::Node::load(
        &cfg,
        &options,
        transport,
        input_rx,
        committed_tx,
        shared.clone(),
    )?;
    let fatal = shared.fatal.clone();
    let engine = node.engine();
    let thread = std::thread::Builder::new()
        .name(format!("raft-{:x}", cfg.id))
        .stack_size(RAFT_THREAD_STACK_BYTES)
        .spawn(move || fatal.run_thread("raft", move || node.run()))?;
    let handle = RaftHandle {
        inner: Arc::new(HandleInner {
            input: input_tx,
            shared,
            engine,
            thread: parking_lot::Mutex::new(Some(thread)),
        }),
    };
    Ok((handle, committed_rx))
}

impl RaftHandle {
    /// Queues `data` as a raft proposal. Resolves once raft accepted it (not
    /// once committed: wait on the apply side for that). Waits while the
    /// input queue is full.
    pub async fn propose(&self, data: Vec<u8>) -> Result<(), ConsensusError> {
        let (reply, rx) = oneshot::channel();
        self.send(Input::Propose {
            data,
            reply: ProposeReply::Always(reply),
        })
        .await?;
        rx.await.map_err(|_| ConsensusError::Stopped)?
    }

    /// Queues `data` as a raft proposal without a reply when raft accepts
    /// it: [`RaftHandle::propose`] costs the caller a wake-up (the raft
    /// thread answering "accepted") that on an idle machine is a good part
    /// of a lone client's write latency. Resolves once queued; the returned
    /// [`ProposalRefusal`] resolves only if raft refuses it.
    ///
    /// On a thread that allows it ([`allow_client_turns`]), while the
    /// member leads alone, the proposal does not wake the raft thread: the
    /// thread turns the loop itself once the tasks already queued on it
    /// have run (their proposals share the turn and its fdatasync).
    pub async fn propose_detached(&self, data: Vec<u8>) -> Result<ProposalRefusal, ConsensusError> {
        let slot = Arc::new(RefusalSlot::default());
        let input = Input::Propose {
            data,
            reply: ProposeReply::OnRefusal(slot.clone()),
        };
        if turns::allowed() && self.inner.shared.leads_alone.load(Ordering::Acquire) {
            self.queue(input).await?;
            turns::schedule(&self.inner);
        } else {
            self.send(input).await?;
        }
        Ok(ProposalRefusal { slot })
    }

    /// Queues a membership change (its `context` and `id` travel with
    /// it). It reaches the apply side as an `EntryConfChange` entry; the
    /// raft thread has applied it to raft by then, and hands out a change
    /// raft refused as an empty normal entry instead, so that the apply
    /// side follows raft's configuration exactly. While another change is
    /// pending, raft turns the proposal into an empty entry (it never
    /// applies: the proposer's wait times out, as in etcd).
    pub async fn propose_conf_change(
        &self,
        change: eraftpb::ConfChange,
    ) -> Result<(), ConsensusError> {
        let (reply, rx) = oneshot::channel();
        self.send(Input::ProposeConfChange { change, reply })
            .await?;
        rx.await.map_err(|_| ConsensusError::Stopped)?
    }

    /// The leader's view of every member's log (None when this member
    /// does not lead): what etcd judges a learner's promotion by.
    pub async fn progress(&self) -> Result<Option<Vec<PeerProgress>>, ConsensusError> {
        let (reply, rx) = oneshot::channel();
        self.send(Input::Progress { reply }).await?;
        rx.await.map_err(|_| ConsensusError::Stopped)
    }

    /// The voters of the cluster's first configuration (the WAL metadata's,
    /// which a member joining a running cluster copies from it): the
    /// configuration in force before the log's first entry.
    pub fn initial_voters(&self) -> Vec<u64> {
        self.inner
            .shared
            .initial_voters
            .get()
            .cloned()
            .unwrap_or_default()
    }

    /// A linearizable read index (ReadOnlySafe): the commit index confirmed
    /// by a quorum heartbeat round after this call. Concurrent callers share
    /// one round. Wait for applied ≥ the result before reading locally.
    pub async fn read_index(&self) -> Result<u64, ConsensusError> {
        let shared = &self.inner.shared;
        if !shared.stopping.load(Ordering::Acquire) {
            if let Some(index) = shared.status.lock().local_read_index {
                return Ok(index);
            }
        }
        let (reply, rx) = oneshot::channel();
        self.send(Input::ReadIndex { reply }).await?;
        rx.await.map_err(|_| ConsensusError::Stopped)?
    }

    /// Asks the leader to hand leadership to `transferee` (it catches the
    /// transferee's log up, then tells it to campaign at once). Watch
    /// `status().leader` for the outcome.
    pub async fn transfer_leader(&self, transferee: u64) -> Result<(), ConsensusError> {
        self.send(Input::TransferLeader(transferee)).await
    }

    /// Ticks raft `ticks` times at once (etcd's advanceTicks): only the
    /// election timer moves on, so that a fresh member campaigns sooner.
    pub async fn advance_ticks(&self, ticks: usize) -> Result<(), ConsensusError> {
        self.send(Input::AdvanceTicks(ticks)).await
    }

    /// The runtime the raft thread drives while it waits, once started:
    /// peer links spawned there deliver messages without a thread hop.
    pub fn io_runtime(&self) -> Option<tokio::runtime::Handle> {
        self.inner.shared.io.get().cloned()
    }

    /// Hands a raft message from a peer to the raft thread.
    pub async fn step(&self, msg: eraftpb::Message) -> Result<(), ConsensusError> {
        self.send(Input::Step(msg)).await
    }

    /// Queues `input` and wakes the raft thread for it.
    async fn send(&self, input: Input) -> Result<(), ConsensusError> {
        self.queue(input).await?;
        self.inner.shared.wake.notify_one();
        Ok(())
    }

    /// Queues `input` without waking anyone: the caller turns the loop.
    async fn queue(&self, input: Input) -> Result<(), ConsensusError> {
        if self.inner.shared.stopping.load(Ordering::Acquire) {
            return Err(ConsensusError::Stopped);
        }
        self.inner
            .input
            .send(input)
            .await
            .map_err(|_| ConsensusError::Stopped)
    }

    /// The transport finished (or failed) sending a snapshot to `to`: the
    /// leader resumes replicating to it (or retries the snapshot).
    pub fn report_snapshot(&self, to: u64, finished: bool) {
        if self
            .inner
            .input
            .try_send(Input::ReportSnapshot { to, finished })
            .is_err()
        {
            tracing::warn!(to = %format!("{to:x}"), "raft: snapshot report dropped (input queue full)");
        } else {
            self.inner.shared.wake.notify_one();
        }
    }

    /// The apply side has applied everything up to `index`. The raft thread
    /// picks it up at its next turn (a proposal, a message or the next tick):
    /// waking it for this alone would cost a context switch per write while
    /// the proposer is waiting for its response.
    pub fn report_applied(&self, index: u64) {
        self.inner.shared.applied.fetch_max(index, Ordering::AcqRel);
    }

    /// The apply side finished a batch it received through the channel.
    pub fn batch_applied(&self) {
        self.inner
            .shared
            .queued_batches
            .fetch_sub(1, Ordering::AcqRel);
    }

    /// Installs the inline apply hook (once; later calls are ignored).
    pub fn set_inline_apply(&self, apply: InlineApply) {
        let _ = self.inner.shared.inline_apply.set(apply);
    }

    /// A durable backend commit covers `index`: write a snapshot file at it,
    /// compact the in-memory log and release WAL segments below it. Never
    /// call this with an index that is applied but not yet durable.
    pub fn snapshot(&self, index: u64) {
        self.inner
            .shared
            .snapshot_request
            .fetch_max(index, Ordering::AcqRel);
        self.inner.shared.wake.notify_one();
    }

    /// The member's fatal-error signal: the raft loop raises it when it
    /// stops on an error; the apply side shares it.
    pub fn fatal(&self) -> Arc<Fatal> {
        self.inner.shared.fatal.clone()
    }

    /// Holds the raft loop's lock until the returned hold is dropped, as a
    /// turn in progress would (for tests of who turns the loop).
    #[doc(hidden)]
    pub fn hold_loop_for_test(&self) -> LoopHold {
        let engine = self.inner.engine.upgrade().expect("the raft thread runs");
        LoopHold {
            _guard: engine.lock_arc(),
        }
    }

    /// The status published after the last Ready; no round trip.
    pub fn status(&self) -> RaftStatus {
        self.inner.shared.status.lock().clone()
    }

    /// Follows leadership: changes when this member becomes or stops being
    /// leader, or the term moves.
    pub fn subscribe_role(&self) -> tokio::sync::watch::Receiver<Role> {
        self.inner.shared.role.subscribe()
    }

    /// fdatasync calls the WAL has made since start (for metrics and tests).
    pub fn wal_sync_count(&self) -> u64 {
        self.inner.shared.wal_syncs.load(Ordering::Acquire)
    }

    /// Stops the raft thread: it finishes the Ready in hand, syncs the WAL,
    /// fails queued requests with `Stopped` and closes the committed channel.
    /// Blocks until the thread has exited; idempotent.
    pub fn stop(&self) {
        self.inner.shared.stopping.store(true, Ordering::Release);
        self.inner.shared.wake.notify_one();
        self.inner.shared.stop_wake.notify_one();
        let thread = self.inner.thread.lock().take();
        if let Some(thread) = thread {
            if thread.join().is_err() {
                tracing::error!("raft thread panicked");
            }
        }
    }
}
