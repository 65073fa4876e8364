//! The member: proposes writes through raft and waits for their apply,
//! serves reads (linearizable through ReadIndex, or serializable), and
//! answers status. The gRPC services are thin layers over this.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::{SystemTime, UNIX_EPOCH};

use api::etcdserverpb::ResponseHeader;

use crate::apply::{Proposal, Request};
use api::rpctypes::{self, EtcdError};
use consensus::RaftHandle;
use mvcc::Store;
use prost::Message;
use tokio::sync::watch;

use crate::alarms::{self, Alarms};
use crate::apply::{ApplyOutcome, ApplyResponse};
use crate::auth::{AuthInfo, AuthStore};
use crate::config::ServerConfig;
use crate::errors;
use crate::membership::{ClusterMembers, Member};
use crate::metrics::Metrics;
use crate::peers::PeerChannels;
use crate::wait::Wait;
use lease::Lessor;

/// etcd refuses new proposals once apply lags commit by this many entries
/// (maxGapBetweenApplyAndCommitIndex): the backlog is bounded.
pub(crate) const MAX_GAP_BETWEEN_APPLY_AND_COMMIT: u64 = 5000;

/// How often a request waiting for a leader looks again (a tenth of etcd's
/// default heartbeat would be too busy; elections take ≥ one election timeout).
const LEADER_POLL_INTERVAL: std::time::Duration = std::time::Duration::from_millis(20);

/// The etcd API version this member implements and reports: that of etcd
/// 3.5.16, the reference it is checked against. kube-apiserver enables
/// features (watch progress, consistent list from cache) only for 3.5.13 and
/// later.
pub const ETCD_VERSION: &str = "3.5.16";
/// The cluster version, as etcd reports it (major.minor).
pub const CLUSTER_VERSION: &str = "3.5";

pub struct EtcdServer {
    pub cfg: ServerConfig,
    pub store: Arc<Store>,
    pub raft: RaftHandle,
    pub member: Member,
    /// Every member of the cluster, this one included.
    pub members: Arc<ClusterMembers>,
    pub cluster_id: u64,
    pub(crate) wait: Arc<Wait<ApplyOutcome>>,
    pub(crate) conf_wait: Arc<Wait<crate::apply::ConfChangeOutcome>>,
    pub(crate) applied: watch::Receiver<u64>,
    pub(crate) request_ids: RequestIdGenerator,
    pub metrics: Arc<Metrics>,
    pub lessor: Arc<Lessor>,
    pub alarms: Arc<Alarms>,
    pub auth: Arc<AuthStore>,
    pub(crate) peer_channels: PeerChannels,
    /// The peer transport (raft links), once started: membership changes
    /// follow it, and its link ages tell whether the cluster is healthy.
    pub(crate) transport: std::sync::OnceLock<Arc<consensus::transport::PeerTransport>>,
    /// Held by the leader while it judges and carries out a membership
    /// change: one at a time, each judged on the list the last one left.
    pub(crate) reconfig: tokio::sync::Mutex<()>,
    /// This server's own Arc, for background work it starts.
    pub(crate) me: Weak<EtcdServer>,
}

impl EtcdServer {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        members: Arc<ClusterMembers>,
        cfg: ServerConfig,
        store: Arc<Store>,
        raft: RaftHandle,
        member: Member,
        cluster_id: u64,
        waits: (
            Arc<Wait<ApplyOutcome>>,
            Arc<Wait<crate::apply::ConfChangeOutcome>>,
        ),
        applied: watch::Receiver<u64>,
        metrics: Arc<Metrics>,
        lessor: Arc<Lessor>,
        alarms: Arc<Alarms>,
        auth: Arc<AuthStore>,
        me: Weak<EtcdServer>,
    ) -> EtcdServer {
        let request_ids = RequestIdGenerator::new(member.id);
        EtcdServer {
            cfg,
            store,
            raft,
            member,
            members,
            cluster_id,
            wait: waits.0,
            conf_wait: waits.1,
            applied,
            request_ids,
            metrics,
            lessor,
            alarms,
            auth,
            peer_channels: PeerChannels::default(),
            transport: std::sync::OnceLock::new(),
            reconfig: tokio::sync::Mutex::new(()),
            me,
        }
    }

    /// Backend snapshots of this member for followers too far behind (the
    /// transport's snapshot source); `snap_dir` holds them while they are
    /// sent.
    pub fn snapshot_source(
        &self,
        snap_dir: std::path::PathBuf,
    ) -> crate::snapshot::BackendSnapshots {
        crate::snapshot::BackendSnapshots {
            store: self.store.clone(),
            applied: self.applied.clone(),
            snap_dir,
        }
    }

    /// Nothing more will be applied (the member stops on a fatal error):
    /// requests waiting for their entry answer "server stopped" now rather
    /// than at their timeout.
    pub fn abandon_waiting_proposals(&self) {
        self.wait.close();
        self.conf_wait.close();
    }

    /// A response header for this member at the store's current revision.
    /// TLS for this member's own gRPC calls to `https://` peer URLs (lease
    /// forwarding, hashes); set once at start.
    pub fn set_peer_client_tls(&self, config: std::sync::Arc<rustls::ClientConfig>) {
        let _ = self.peer_channels.tls.set(config);
    }

    pub fn header(&self, revision: i64) -> ResponseHeader {
        ResponseHeader {
            cluster_id: self.cluster_id,
            member_id: self.member.id,
            revision,
            raft_term: self.raft.status().term,
        }
    }

    /// Completes a header that mvcc filled with its revision.
    pub fn fill_header(&self, header: &mut Option<ResponseHeader>) {
        let revision = match header {
            Some(h) => h.revision,
            None => self.store.current_revision(),
        };
        *header = Some(self.header(revision));
    }

    pub fn has_leader(&self) -> bool {
        self.raft.status().leader != 0
    }

    /// Proposes one request through raft and waits until this member has
    /// applied it (etcd's processInternalRaftRequestOnce); the response is
    /// of the request's own kind.
    pub async fn propose<P: Proposal>(&self, request: P) -> Result<P::Response, EtcdError> {
        self.propose_as(None, request).await
    }

    /// Proposes a request on behalf of `user` (apply checks its
    /// permissions as of the entry; None: no credentials, or auth off).
    pub async fn propose_as<P: Proposal>(
        &self,
        user: Option<&AuthInfo>,
        request: P,
    ) -> Result<P::Response, EtcdError> {
        let response = self.propose_request(request.into(), user).await?;
        // Apply answers every request with a response of its own kind.
        P::response(response).ok_or(rpctypes::NOT_CAPABLE)
    }

    async fn propose_request(
        &self,
        request: Request,
        user: Option<&AuthInfo>,
    ) -> Result<ApplyResponse, EtcdError> {
        // A guard: a caller that goes away mid-proposal drops this future.
        struct Pending<'a>(&'a prometheus::IntGauge);
        impl Drop for Pending<'_> {
            fn drop(&mut self) {
                self.0.dec();
            }
        }
        self.metrics.proposals_pending.inc();
        let _pending = Pending(&self.metrics.proposals_pending);
        self.propose_once(request, user).await
    }

    async fn propose_once(
        &self,
        request: Request,
        user: Option<&AuthInfo>,
    ) -> Result<ApplyResponse, EtcdError> {
        let status = self.raft.status();
        if status.commit_index > *self.applied.borrow() + MAX_GAP_BETWEEN_APPLY_AND_COMMIT {
            return Err(rpctypes::REQUEST_TOO_MANY_REQUESTS);
        }
        let id = self.request_ids.next();
        let data = request.into_entry(id, user).encode_to_vec();
        if data.len() > self.cfg.max_request_bytes {
            return Err(rpctypes::REQUEST_TOO_LARGE);
        }

        let deadline = tokio::time::Instant::now() + self.cfg.request_timeout();
        let mut applied = self.wait.register(id);
        let result = loop {
            // Raft answers only a refusal: accepting costs no wake-up here.
            let refusal =
                match tokio::time::timeout_at(deadline, self.raft.propose_detached(data.clone()))
                    .await
                {
                    Ok(Ok(refusal)) => refusal,
                    Ok(Err(e)) => break Err(errors::from_consensus(&e)),
                    Err(_) => break Err(rpctypes::TIMEOUT),
                };
            tokio::select! {
                outcome = tokio::time::timeout_at(deadline, &mut applied) => match outcome {
                    Ok(Ok(outcome)) => return outcome,
                    // The apply side dropped the waiter: the member is stopping.
                    Ok(Err(_)) => break Err(rpctypes::STOPPED),
                    Err(_) => break Err(rpctypes::TIMEOUT),
                },
                refused = refusal.refused() => match refused {
                    // An election is under way, or leadership is moving
                    // (raft drops proposals while it transfers): the entry
                    // is not in the log, so retry until the deadline, as
                    // with_leader does.
                    consensus::ConsensusError::NoLeader
                    | consensus::ConsensusError::ProposalDropped => {
                        if let Err(e) = leader_poll(deadline).await {
                            break Err(e);
                        }
                    }
                    e => break Err(errors::from_consensus(&e)),
                },
            }
        };
        self.wait.cancel(id);
        self.metrics.proposals_failed.inc();
        result
    }

    /// A physical Compact's wait (etcd's `<-physc` and ForceCommit): until
    /// the compaction at `revision` has deleted its records from the file
    /// (its batches run on the store's compactor), and then a durable
    /// commit, so that a crash does not resume it.
    pub async fn wait_compaction_physical(&self, revision: i64) -> Result<(), EtcdError> {
        while self.store.finished_compact_revision() < revision {
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        let store = self.store.clone();
        match tokio::task::spawn_blocking(move || store.commit(true)).await {
            // a defragmentation defers it: the commit after the swap
            // carries it to the new file
            Ok(Ok(())) | Ok(Err(mvcc::MvccError::Deferred)) => Ok(()),
            Ok(Err(e)) => Err(errors::from_mvcc(&e)),
            Err(_) => Err(rpctypes::STOPPED),
        }
    }

    /// Waits until this member has applied everything committed when the
    /// read began, as confirmed by a quorum (ReadIndex, ReadOnlySafe).
    pub async fn linearizable_read_notify(&self) -> Result<(), EtcdError> {
        // A deliberately broken member for checking the linearizability
        // checker: armed with `return`, a "linearizable" read is served from
        // the local store at once, as a serializable one (a partitioned
        // follower then answers stale values).
        crate::fail_point!("brokenLinearizableRead", |_| Ok(()));
        let deadline = tokio::time::Instant::now() + self.cfg.request_timeout();
        let read_index = self
            .with_leader(deadline, || self.raft.read_index())
            .await
            .inspect_err(|e| match *e {
                // etcd: a read index that timed out is a slow one
                rpctypes::TIMEOUT => self.metrics.ops.slow_read_indexes.inc(),
                _ => self.metrics.ops.read_indexes_failed.inc(),
            })?;
        self.wait_applied(read_index, deadline).await
    }

    /// Runs a raft operation, retrying while the member has no leader (an
    /// election is under way) until `deadline`, as etcd lets such requests
    /// wait: without a leader they end in "request timed out". Nothing is
    /// handed to raft while there is no leader, so a request that timed out
    /// here can never commit later.
    async fn with_leader<T, F, Fut>(
        &self,
        deadline: tokio::time::Instant,
        op: F,
    ) -> Result<T, EtcdError>
    where
        F: Fn() -> Fut,
        Fut: std::future::Future<Output = Result<T, consensus::ConsensusError>>,
    {
        loop {
            match tokio::time::timeout_at(deadline, op()).await {
                Ok(Ok(value)) => return Ok(value),
                Ok(Err(consensus::ConsensusError::NoLeader)) => leader_poll(deadline).await?,
                Ok(Err(consensus::ConsensusError::Timeout)) | Err(_) => {
                    return Err(rpctypes::TIMEOUT)
                }
                Ok(Err(e)) => return Err(errors::from_consensus(&e)),
            }
        }
    }

    pub(crate) async fn wait_applied(
        &self,
        index: u64,
        deadline: tokio::time::Instant,
    ) -> Result<(), EtcdError> {
        let mut applied = self.applied.clone();
        let reached = tokio::time::timeout_at(deadline, async {
            applied.wait_for(|a| *a >= index).await.is_ok()
        })
        .await;
        match reached {
            Ok(true) => Ok(()),
            Ok(false) => Err(rpctypes::STOPPED),
            Err(_) => Err(rpctypes::TIMEOUT_WAIT_APPLIED_INDEX),
        }
    }

    /// etcd's quota check before a write is proposed: past
    /// --quota-backend-bytes the member raises NOSPACE through raft and the
    /// write fails. A write that adds nothing (cost 0) always passes.
    pub async fn check_quota(&self, cost: i64) -> Result<(), EtcdError> {
        let quota = self.cfg.quota_backend_bytes;
        if cost == 0 || quota <= 0 || self.store.db_size() + cost < quota {
            return Ok(());
        }
        let raise = api::etcdserverpb::AlarmRequest {
            action: api::etcdserverpb::alarm_request::AlarmAction::Activate as i32,
            member_id: self.member.id,
            alarm: api::etcdserverpb::AlarmType::Nospace as i32,
        };
        if let Err(e) = self.alarm(raise).await {
            tracing::warn!(error = %e, "failed to raise the NOSPACE alarm");
        }
        Err(rpctypes::NO_SPACE)
    }

    /// Alarm requests, GET included, go through raft as in etcd.
    pub async fn alarm(
        &self,
        req: api::etcdserverpb::AlarmRequest,
    ) -> Result<api::etcdserverpb::AlarmResponse, EtcdError> {
        let mut resp = self.propose(req).await?;
        self.fill_header(&mut resp.header);
        Ok(resp)
    }

    /// The raised alarms as Status lists them.
    pub fn alarm_errors(&self) -> Vec<String> {
        self.alarms
            .get(api::etcdserverpb::AlarmType::None as i32)
            .iter()
            .map(alarms::describe)
            .collect()
    }

    /// Grants a lease through raft (etcd's EtcdServer.LeaseGrant): an ID of
    /// 0 asks the member to choose a positive one.
    pub async fn lease_grant(
        &self,
        mut req: api::etcdserverpb::LeaseGrantRequest,
    ) -> Result<api::etcdserverpb::LeaseGrantResponse, EtcdError> {
        self.check_quota(alarms::cost_lease_grant()).await?;
        while req.id == 0 {
            req.id = (self.request_ids.next() & ((1 << 63) - 1)) as i64;
        }
        let mut resp = self.propose(req).await?;
        self.fill_header(&mut resp.header);
        Ok(resp)
    }

    pub fn applied_index(&self) -> u64 {
        *self.applied.borrow()
    }
}

/// Unique request IDs, as etcd's idutil.Generator: the member's low 16 bits,
/// then 40 bits of the start time in ms, then an 8-bit counter that carries
/// into the time bits. IDs from different members and restarts never collide.
pub(crate) struct RequestIdGenerator {
    prefix: u64,
    suffix: AtomicU64,
}

const SUFFIX_BITS: u32 = 48;
const COUNT_BITS: u32 = 8;

impl RequestIdGenerator {
    fn new(member_id: u64) -> Self {
        let millis = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_millis() as u64)
            .unwrap_or(0);
        let prefix = (member_id & 0xffff) << SUFFIX_BITS;
        let suffix = (millis & ((1 << 40) - 1)) << COUNT_BITS;
        RequestIdGenerator {
            prefix,
            suffix: AtomicU64::new(suffix),
        }
    }

    pub(crate) fn next(&self) -> u64 {
        let suffix = self.suffix.fetch_add(1, Ordering::Relaxed) + 1;
        self.prefix | (suffix & ((1 << SUFFIX_BITS) - 1))
    }
}

/// Waits one leader poll interval before a retry; "request timed out" if
/// that would pass `deadline`.
async fn leader_poll(deadline: tokio::time::Instant) -> Result<(), EtcdError> {
    if tokio::time::Instant::now() + LEADER_POLL_INTERVAL >= deadline {
        return Err(rpctypes::TIMEOUT);
    }
    tokio::time::sleep(LEADER_POLL_INTERVAL).await;
    Ok(())
}
