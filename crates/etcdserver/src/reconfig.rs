//! Membership changes (etcd's AddMember, RemoveMember, UpdateMember and
//! PromoteMember): judged by the leader, carried out as raft conf changes.
//!
//! etcd checks a change twice: on the receiving member before proposing
//! (strict reconfig checks, a learner's readiness) and again at apply
//! (ValidateConfigurationChange), where a refused change becomes a no-op
//! for raft. Here the raft thread applies a conf change to raft before the
//! apply side sees it, so every check is made before proposing, by the
//! leader, one change at a time ([`EtcdServer::reconfig`] held from the
//! check until the change is applied) and on a member list that has caught
//! up with everything committed (a ReadIndex round first): what a change
//! is judged on is what it applies on. A member that does not lead
//! forwards the change to the leader (etcd forwards promotions so).
//! Raft itself accepts one pending change at a time, and a new leader none
//! until it has applied its predecessor's.

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use api::etcdserverpb::{
    Member as PbMember, MemberAddRequest, MemberAddResponse, MemberPromoteRequest,
    MemberPromoteResponse, MemberRemoveRequest, MemberRemoveResponse, MemberUpdateRequest,
    MemberUpdateResponse,
};
use api::oxcdpeerpb::membership_peer_client::MembershipPeerClient;
use api::rpctypes::{self, EtcdError};
use raft::eraftpb::{ConfChange, ConfChangeType};

use crate::errors;
use crate::membership::Member;
use crate::EtcdServer;

/// A voter counts as connected for the strict reconfig check once its
/// link has been up this long (etcd's HealthInterval).
pub const HEALTH_INTERVAL: Duration = Duration::from_secs(5);
/// A learner is promoted only once its log holds this share of the
/// leader's (etcd's readyPercent).
pub const READY_PERCENT: f64 = 0.9;
/// What a member that does not lead answers a forwarded change.
const NOT_LEADER: &str = "not leader";
/// How long a change waits for a leader before trying again.
const ROUTE_RETRY: Duration = Duration::from_millis(100);

/// A member as the Cluster API lists it.
pub fn to_pb(m: &Member) -> PbMember {
    PbMember {
        id: m.id,
        name: m.name.clone(),
        peer_ur_ls: m.peer_urls.clone(),
        client_ur_ls: m.client_urls.clone(),
        is_learner: m.is_learner,
    }
}

fn to_pb_all(members: &[Member]) -> Vec<PbMember> {
    members.iter().map(to_pb).collect()
}

/// A change as the leader carries it out.
enum Change {
    Add(Member),
    Remove(u64),
    Update { id: u64, peer_urls: Vec<String> },
    Promote(u64),
}

impl EtcdServer {
    /// Whether this member is a learner (it does not vote, and serves only
    /// what etcd's learners serve).
    pub fn is_learner(&self) -> bool {
        self.members
            .get(self.member.id)
            .is_some_and(|m| m.is_learner)
    }

    /// The peer transport, for membership changes to follow.
    pub fn set_transport(&self, transport: std::sync::Arc<consensus::transport::PeerTransport>) {
        let _ = self.transport.set(transport);
    }

    pub async fn member_add(&self, req: MemberAddRequest) -> Result<MemberAddResponse, EtcdError> {
        // etcd checks the URLs, and the strict reconfig rules, where the
        // request arrives (with or without a leader)
        schema::members::parse_peer_urls(&req.peer_ur_ls)
            .map_err(|_| rpctypes::MEMBER_BAD_U_R_LS)?;
        if self.cfg.strict_reconfig_check {
            self.may_add_member(req.is_learner)?;
        }
        self.route(
            req,
            |r| self.member_add_as_leader(r),
            |mut c, r| async move { c.add(r).await },
        )
        .await
    }

    pub async fn member_remove(
        &self,
        req: MemberRemoveRequest,
    ) -> Result<MemberRemoveResponse, EtcdError> {
        if self.cfg.strict_reconfig_check {
            self.may_remove_member(req.id)?;
        }
        self.route(
            req,
            |r| self.member_remove_as_leader(r),
            |mut c, r| async move { c.remove(r).await },
        )
        .await
    }

    pub async fn member_update(
        &self,
        req: MemberUpdateRequest,
    ) -> Result<MemberUpdateResponse, EtcdError> {
        self.route(
            req,
            |r| self.member_update_as_leader(r),
            |mut c, r| async move { c.update(r).await },
        )
        .await
    }

    pub async fn member_promote(
        &self,
        req: MemberPromoteRequest,
    ) -> Result<MemberPromoteResponse, EtcdError> {
        self.route(
            req,
            |r| self.member_promote_as_leader(r),
            |mut c, r| async move { c.promote(r).await },
        )
        .await
    }

    /// Carries a change out here when this member leads, else sends it to
    /// the leader over the peer port; retries while there is no leader or
    /// leadership moves, until the request timeout. The response carries
    /// this member's header (etcd's cluster server: no revision).
    async fn route<Req, Resp, L, LFut, R, RFut>(
        &self,
        req: Req,
        local: L,
        remote: R,
    ) -> Result<Resp, EtcdError>
    where
        Resp: crate::auth::requests::HasHeader,
        Req: Clone,
        L: Fn(Req) -> LFut,
        LFut: std::future::Future<Output = Result<Resp, EtcdError>>,
        R: Fn(MembershipPeerClient<tonic::transport::Channel>, Req) -> RFut,
        RFut: std::future::Future<Output = Result<tonic::Response<Resp>, tonic::Status>>,
    {
        let mut resp = self.route_once(req, local, remote).await?;
        *resp.header_mut() = Some(self.header(0));
        Ok(resp)
    }

    async fn route_once<Req, Resp, L, LFut, R, RFut>(
        &self,
        req: Req,
        local: L,
        remote: R,
    ) -> Result<Resp, EtcdError>
    where
        Req: Clone,
        L: Fn(Req) -> LFut,
        LFut: std::future::Future<Output = Result<Resp, EtcdError>>,
        R: Fn(MembershipPeerClient<tonic::transport::Channel>, Req) -> RFut,
        RFut: std::future::Future<Output = Result<tonic::Response<Resp>, tonic::Status>>,
    {
        let deadline = tokio::time::Instant::now() + self.cfg.request_timeout();
        loop {
            let status = self.raft.status();
            if status.is_leader {
                match tokio::time::timeout_at(deadline, local(req.clone())).await {
                    Ok(Err(e)) if e == rpctypes::NOT_LEADER => {}
                    Ok(result) => return result,
                    Err(_) => return Err(rpctypes::TIMEOUT),
                }
            } else if let Some(channel) = (status.leader != 0)
                .then(|| self.peer_channels.channel(&self.members, status.leader))
                .flatten()
            {
                let client = MembershipPeerClient::new(channel);
                match tokio::time::timeout_at(deadline, remote(client, req.clone())).await {
                    Ok(Ok(resp)) => return Ok(resp.into_inner()),
                    Ok(Err(status)) if status.message() != NOT_LEADER && !is_transport(&status) => {
                        return Err(etcd_error_of(&status))
                    }
                    Ok(Err(_)) => {}
                    Err(_) => return Err(rpctypes::TIMEOUT),
                }
            }
            if tokio::time::Instant::now() + ROUTE_RETRY >= deadline {
                return Err(rpctypes::TIMEOUT);
            }
            tokio::time::sleep(ROUTE_RETRY).await;
        }
    }

    pub async fn member_add_as_leader(
        &self,
        req: MemberAddRequest,
    ) -> Result<MemberAddResponse, EtcdError> {
        let peer_urls = schema::members::parse_peer_urls(&req.peer_ur_ls)
            .map_err(|_| rpctypes::MEMBER_BAD_U_R_LS)?;
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs() as i64);
        let member = Member {
            id: schema::members::added_member_id(&peer_urls, now),
            name: String::new(),
            peer_urls,
            client_urls: Vec::new(),
            is_learner: req.is_learner,
        };
        let members = self.change(Change::Add(member.clone())).await?;
        Ok(MemberAddResponse {
            header: None,
            member: Some(PbMember {
                id: member.id,
                peer_ur_ls: member.peer_urls,
                is_learner: member.is_learner,
                ..Default::default()
            }),
            members: to_pb_all(&members),
        })
    }

    pub async fn member_remove_as_leader(
        &self,
        req: MemberRemoveRequest,
    ) -> Result<MemberRemoveResponse, EtcdError> {
        let members = self.change(Change::Remove(req.id)).await?;
        Ok(MemberRemoveResponse {
            header: None,
            members: to_pb_all(&members),
        })
    }

    pub async fn member_update_as_leader(
        &self,
        req: MemberUpdateRequest,
    ) -> Result<MemberUpdateResponse, EtcdError> {
        let members = self
            .change(Change::Update {
                id: req.id,
                peer_urls: req.peer_ur_ls,
            })
            .await?;
        Ok(MemberUpdateResponse {
            header: None,
            members: to_pb_all(&members),
        })
    }

    pub async fn member_promote_as_leader(
        &self,
        req: MemberPromoteRequest,
    ) -> Result<MemberPromoteResponse, EtcdError> {
        let result = self.change(Change::Promote(req.id)).await;
        match &result {
            Ok(_) => self.metrics.learner_promote_successes.inc(),
            Err(e) => self
                .metrics
                .learner_promote_failures
                .with_label_values(&[e.message])
                .inc(),
        }
        Ok(MemberPromoteResponse {
            header: None,
            members: to_pb_all(&result?),
        })
    }

    /// Judges a change and carries it out; the members once it applied.
    async fn change(&self, change: Change) -> Result<Vec<Member>, EtcdError> {
        let _one_at_a_time = self.reconfig.lock().await;
        if !self.raft.status().is_leader {
            return Err(rpctypes::NOT_LEADER);
        }
        // Judge on everything committed so far.
        self.linearizable_read_notify().await?;
        let cc = match change {
            Change::Add(member) => {
                self.validate_add(&member)?;
                conf_change(
                    if member.is_learner {
                        ConfChangeType::AddLearnerNode
                    } else {
                        ConfChangeType::AddNode
                    },
                    &member,
                )
            }
            Change::Remove(id) => {
                let member = self.existing(id)?;
                if id == self.member.id && self.hand_over_leadership().await {
                    // the new leader removes this member (route() sends
                    // the change there)
                    return Err(rpctypes::NOT_LEADER);
                }
                let mut cc = conf_change(ConfChangeType::RemoveNode, &member);
                cc.context = Vec::new().into();
                cc
            }
            Change::Update { id, peer_urls } => {
                let mut member = self.existing(id)?;
                let peer_urls = schema::members::parse_peer_urls(&peer_urls)
                    .map_err(|_| rpctypes::MEMBER_BAD_U_R_LS)?;
                let taken = self
                    .members
                    .list()
                    .into_iter()
                    .filter(|m| m.id != id)
                    .any(|m| m.peer_urls.iter().any(|u| peer_urls.contains(u)));
                if taken {
                    return Err(rpctypes::PEER_U_R_L_EXIST);
                }
                member.peer_urls = peer_urls;
                // re-adding a member in its own role changes nothing for
                // raft; the list takes the new URLs
                conf_change(
                    if member.is_learner {
                        ConfChangeType::AddLearnerNode
                    } else {
                        ConfChangeType::AddNode
                    },
                    &member,
                )
            }
            Change::Promote(id) => {
                self.learner_ready(id).await?;
                if self.cfg.strict_reconfig_check && !self.ready_to_promote() {
                    return Err(rpctypes::MEMBER_NOT_ENOUGH_STARTED);
                }
                let mut member = self.existing(id)?;
                if !member.is_learner {
                    return Err(rpctypes::MEMBER_NOT_LEARNER);
                }
                member.is_learner = false;
                conf_change(ConfChangeType::AddNode, &member)
            }
        };
        self.configure(cc).await
    }

    /// Before the leader removes itself, it hands leadership to the voter
    /// whose log is furthest along, so that writes pause for a transfer
    /// rather than an election timeout (etcd 3.5 removes its leader as is:
    /// it stops and the others elect one after an election timeout). True
    /// once another member leads; false (the leader removes itself, as
    /// etcd does) when no voter is there to take over in time.
    async fn hand_over_leadership(&self) -> bool {
        let Ok(Some(progress)) = self.raft.progress().await else {
            return false;
        };
        let Some(target) = progress
            .iter()
            .filter(|p| p.id != self.member.id && !p.is_learner && p.recent_active)
            .max_by_key(|p| p.matched)
            .map(|p| p.id)
        else {
            return false;
        };
        tracing::info!("local-member-id" = %format!("{:x}", self.member.id),
            "transferee" = %format!("{target:x}"),
            "transferring leadership before removing the local member");
        if self.raft.transfer_leader(target).await.is_err() {
            return false;
        }
        let deadline = tokio::time::Instant::now() + self.cfg.election_timeout * 2;
        while tokio::time::Instant::now() < deadline {
            let status = self.raft.status();
            if !status.is_leader && status.leader != 0 {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        false
    }

    /// A member of the cluster (a removed or unknown ID is "member not
    /// found", as etcd maps ErrIDRemoved and ErrIDNotFound).
    fn existing(&self, id: u64) -> Result<Member, EtcdError> {
        if self.members.is_removed(id) {
            return Err(rpctypes::MEMBER_NOT_FOUND);
        }
        self.members.get(id).ok_or(rpctypes::MEMBER_NOT_FOUND)
    }

    /// etcd's ValidateConfigurationChange for an added member.
    fn validate_add(&self, member: &Member) -> Result<(), EtcdError> {
        if self.members.is_removed(member.id) {
            return Err(rpctypes::MEMBER_NOT_FOUND);
        }
        let members = self.members.list();
        if members.iter().any(|m| m.id == member.id) {
            return Err(rpctypes::MEMBER_EXIST);
        }
        let taken = members
            .iter()
            .any(|m| m.peer_urls.iter().any(|u| member.peer_urls.contains(u)));
        if taken {
            return Err(rpctypes::PEER_U_R_L_EXIST);
        }
        if member.is_learner && members.iter().filter(|m| m.is_learner).count() >= MAX_LEARNERS {
            return Err(rpctypes::TOO_MANY_LEARNERS);
        }
        Ok(())
    }

    /// etcd's mayAddMember (strict reconfig check), on the member the
    /// request reached.
    fn may_add_member(&self, is_learner: bool) -> Result<(), EtcdError> {
        if !is_learner && !self.ready_to_add_voter() {
            tracing::warn!("local-member-id" = %format!("{:x}", self.member.id),
                "rejecting member add request; not enough healthy members");
            return Err(rpctypes::MEMBER_NOT_ENOUGH_STARTED);
        }
        let voters = self.members.voters();
        if self.connected_since(&voters) != voters.len() {
            tracing::warn!("local-member-id" = %format!("{:x}", self.member.id),
                "rejecting member add request; local member has not been connected to all peers, reconfigure breaks active quorum");
            return Err(rpctypes::UNHEALTHY);
        }
        Ok(())
    }

    /// etcd's mayRemoveMember (strict reconfig check).
    fn may_remove_member(&self, id: u64) -> Result<(), EtcdError> {
        if self.members.get(id).is_some_and(|m| m.is_learner) {
            return Ok(()); // a learner is not part of any quorum
        }
        if !self.ready_to_remove_voter(id) {
            tracing::warn!("local-member-id" = %format!("{:x}", self.member.id),
                "requested-member-remove-id" = %format!("{id:x}"),
                "rejecting member remove request; not enough healthy members");
            return Err(rpctypes::MEMBER_NOT_ENOUGH_STARTED);
        }
        // a member that is down is no part of the active quorum
        if id != self.member.id && self.active_since(id).is_none() {
            return Ok(());
        }
        let voters = self.members.voters();
        let active = self.connected_since(&voters);
        if active.saturating_sub(1) < 1 + (voters.len().saturating_sub(1)) / 2 {
            tracing::warn!("local-member-id" = %format!("{:x}", self.member.id),
                "requested-member-remove" = %format!("{id:x}"),
                "rejecting member remove request; local member has not been connected to all peers, reconfigure breaks active quorum");
            return Err(rpctypes::UNHEALTHY);
        }
        Ok(())
    }

    fn active_since(&self, id: u64) -> Option<Instant> {
        self.transport.get().and_then(|t| t.active_since(id))
    }

    /// How many of `voters` (this member always) this member has been
    /// connected to for the last [`HEALTH_INTERVAL`].
    fn connected_since(&self, voters: &[u64]) -> usize {
        let since = Instant::now().checked_sub(HEALTH_INTERVAL);
        voters
            .iter()
            .filter(|id| {
                **id == self.member.id
                    || matches!((self.active_since(**id), since), (Some(t), Some(s)) if t < s)
            })
            .count()
    }

    /// Started voters (those that published a name), with `extra` more
    /// voters counted and `skip` left out.
    fn started_voters(&self, skip: Option<u64>) -> (usize, usize) {
        let voters: Vec<Member> = self
            .members
            .list()
            .into_iter()
            .filter(|m| !m.is_learner && Some(m.id) != skip)
            .collect();
        let started = voters.iter().filter(|m| !m.name.is_empty()).count();
        (voters.len(), started)
    }

    /// etcd's IsReadyToAddVotingMember.
    fn ready_to_add_voter(&self) -> bool {
        let (voters, started) = self.started_voters(None);
        let members = voters + 1;
        // a 1-member cluster may always add one (restoring a cluster)
        if started == 1 && members == 2 {
            return true;
        }
        started > members / 2
    }

    /// etcd's IsReadyToRemoveVotingMember.
    fn ready_to_remove_voter(&self, id: u64) -> bool {
        let (members, started) = self.started_voters(Some(id));
        started > members / 2
    }

    /// etcd's IsReadyToPromoteMember: the learner counts as started.
    fn ready_to_promote(&self) -> bool {
        let (voters, started) = self.started_voters(None);
        let (members, started) = (voters + 1, started + 1);
        started > members / 2
    }

    /// etcd's isLearnerReady: the leader's view of the learner's log holds
    /// [`READY_PERCENT`] of its own. A member the leader does not track is
    /// not judged here (the change's own checks refuse it).
    async fn learner_ready(&self, id: u64) -> Result<(), EtcdError> {
        let progress = self
            .raft
            .progress()
            .await
            .map_err(|e| errors::from_consensus(&e))?
            .ok_or(rpctypes::NOT_LEADER)?;
        let matched = |member: u64| progress.iter().find(|p| p.id == member).map(|p| p.matched);
        if let Some(learner) = matched(id) {
            let leader = matched(self.member.id).unwrap_or(0);
            if (learner as f64) < (leader as f64) * READY_PERCENT {
                return Err(rpctypes::LEARNER_NOT_READY);
            }
        }
        Ok(())
    }

    /// Proposes a conf change and waits until this member applied it.
    async fn configure(&self, mut cc: ConfChange) -> Result<Vec<Member>, EtcdError> {
        let id = self.request_ids.next();
        cc.id = id;
        let deadline = tokio::time::Instant::now() + self.cfg.request_timeout();
        let applied = self.conf_wait.register(id);
        let proposed = tokio::time::timeout_at(deadline, self.raft.propose_conf_change(cc)).await;
        let result = match proposed {
            Ok(Ok(())) => match tokio::time::timeout_at(deadline, applied).await {
                Ok(Ok(members)) => return Ok(members),
                Ok(Err(_)) => Err(rpctypes::STOPPED),
                Err(_) => Err(rpctypes::TIMEOUT),
            },
            Ok(Err(e)) => Err(errors::from_consensus(&e)),
            Err(_) => Err(rpctypes::TIMEOUT),
        };
        self.conf_wait.cancel(id);
        self.metrics.proposals_failed.inc();
        result
    }
}

/// etcd's maxLearners.
pub const MAX_LEARNERS: usize = 1;

/// A conf change carrying `member` (etcd carries the member in the
/// change's context, as JSON; ours is its members-table record).
fn conf_change(change_type: ConfChangeType, member: &Member) -> ConfChange {
    let mut cc = ConfChange::default();
    cc.set_change_type(change_type);
    cc.node_id = member.id;
    cc.context = schema::members::encode(member).into();
    cc
}

/// The call never reached a member that could answer it.
fn is_transport(status: &tonic::Status) -> bool {
    matches!(
        status.code(),
        tonic::Code::Unavailable | tonic::Code::Unknown
    ) && rpctypes::ALL.iter().all(|e| e.message != status.message())
}

/// The etcd error a forwarded change came back with.
fn etcd_error_of(status: &tonic::Status) -> EtcdError {
    rpctypes::ALL
        .iter()
        .copied()
        .find(|e| e.message == status.message())
        .unwrap_or(rpctypes::TIMEOUT)
}

/// The leader's end of forwarded membership changes and the membership a
/// joining member asks for, on the peer listener.
pub struct MembershipPeerService {
    server: std::sync::Arc<EtcdServer>,
}

impl MembershipPeerService {
    pub fn server(
        server: std::sync::Arc<EtcdServer>,
    ) -> api::oxcdpeerpb::membership_peer_server::MembershipPeerServer<MembershipPeerService> {
        api::oxcdpeerpb::membership_peer_server::MembershipPeerServer::new(MembershipPeerService {
            server,
        })
    }

    fn leading(&self) -> Result<(), tonic::Status> {
        if self.server.raft.status().is_leader {
            Ok(())
        } else {
            Err(tonic::Status::unavailable(NOT_LEADER))
        }
    }
}

fn answer<T>(result: Result<T, EtcdError>) -> Result<tonic::Response<T>, tonic::Status> {
    match result {
        Ok(resp) => Ok(tonic::Response::new(resp)),
        Err(e) if e == rpctypes::NOT_LEADER => Err(tonic::Status::unavailable(NOT_LEADER)),
        Err(e) => Err(e.status()),
    }
}

#[tonic::async_trait]
impl api::oxcdpeerpb::membership_peer_server::MembershipPeer for MembershipPeerService {
    async fn members(
        &self,
        _request: tonic::Request<api::oxcdpeerpb::MembersRequest>,
    ) -> Result<tonic::Response<api::oxcdpeerpb::MembersResponse>, tonic::Status> {
        let server = &self.server;
        Ok(tonic::Response::new(api::oxcdpeerpb::MembersResponse {
            cluster_id: server.cluster_id,
            members: to_pb_all(&server.members.list()),
            initial_voters: server.raft.initial_voters(),
            version: crate::ETCD_VERSION.to_string(),
        }))
    }

    async fn add(
        &self,
        request: tonic::Request<MemberAddRequest>,
    ) -> Result<tonic::Response<MemberAddResponse>, tonic::Status> {
        self.leading()?;
        answer(self.server.member_add_as_leader(request.into_inner()).await)
    }

    async fn remove(
        &self,
        request: tonic::Request<MemberRemoveRequest>,
    ) -> Result<tonic::Response<MemberRemoveResponse>, tonic::Status> {
        self.leading()?;
        answer(
            self.server
                .member_remove_as_leader(request.into_inner())
                .await,
        )
    }

    async fn update(
        &self,
        request: tonic::Request<MemberUpdateRequest>,
    ) -> Result<tonic::Response<MemberUpdateResponse>, tonic::Status> {
        self.leading()?;
        answer(
            self.server
                .member_update_as_leader(request.into_inner())
                .await,
        )
    }

    async fn promote(
        &self,
        request: tonic::Request<MemberPromoteRequest>,
    ) -> Result<tonic::Response<MemberPromoteResponse>, tonic::Status> {
        self.leading()?;
        answer(
            self.server
                .member_promote_as_leader(request.into_inner())
                .await,
        )
    }
}
