//! The v3election service (etcd's server/etcdserver/api/v3election): leader
//! election as clientv3/concurrency's Election recipe runs it on the member.
//!
//! An election `name` is the key prefix `name/`; each candidate holds the
//! key `name/<lease in hex>` under its lease, and the candidate whose key
//! was created first leads. Campaign returns once every older candidate's
//! key is gone. Nothing here keeps a lease alive: a candidate's lease is the
//! client's to keep (etcd orphans the session at once).

use std::pin::Pin;

use api::etcdserverpb::range_request::SortOrder;
use api::etcdserverpb::{ResponseHeader, TxnRequest};
use api::mvccpb::{event::EventType, KeyValue};
use api::v3electionpb::election_server::Election;
use api::v3electionpb::{
    CampaignRequest, CampaignResponse, LeaderKey, LeaderRequest, LeaderResponse, ProclaimRequest,
    ProclaimResponse, ResignRequest, ResignResponse,
};
use futures::{Stream, StreamExt};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status};

use crate::check_require_leader;
use crate::concurrency::{
    create_revision_is, delete_op, first_created, get_key, go_error, go_hex, prefix_range_end,
    put_op, range_op, txn_range_kvs, Cleanup, CleanupOnDrop, LocalClient,
};

/// v3election's ErrMissingLeaderKey.
pub(crate) const MISSING_LEADER_KEY: &str = "\"leader\" field must be provided";
/// concurrency.ErrElectionNotLeader.
pub(crate) const NOT_LEADER: &str = "election: not leader";
/// concurrency.ErrElectionNoLeader.
pub(crate) const NO_LEADER: &str = "election: no leader";

/// Leader responses handed to gRPC ahead of the observer's reads (etcd's
/// observe channel is unbuffered; a few let the watch keep draining).
const OBSERVE_BUFFER: usize = 4;

pub struct ElectionService {
    client: LocalClient,
}

impl ElectionService {
    pub fn new(client: LocalClient) -> Self {
        ElectionService { client }
    }

    /// Election.Proclaim on a resumed election: rewrite the leader key's
    /// value if the key is still the one created at `leader.rev`.
    async fn proclaim_as(
        client: &LocalClient,
        leader: &LeaderKey,
        lease: i64,
        value: &[u8],
    ) -> Result<ResponseHeader, Status> {
        let resp = client
            .txn(TxnRequest {
                compare: vec![create_revision_is(&leader.key, leader.rev)],
                success: vec![put_op(&leader.key, value, lease)],
                failure: Vec::new(),
            })
            .await?;
        if !resp.succeeded {
            return Err(go_error(NOT_LEADER));
        }
        Ok(resp.header.unwrap_or_default())
    }
}

fn leader_prefix(name: &[u8]) -> Vec<u8> {
    let mut prefix = name.to_vec();
    prefix.push(b'/');
    prefix
}

#[tonic::async_trait]
impl Election for ElectionService {
    async fn campaign(
        &self,
        request: Request<CampaignRequest>,
    ) -> Result<Response<CampaignResponse>, Status> {
        check_require_leader(self.client.server(), &request)?;
        let client = self.client.as_caller(&request);
        let req = request.into_inner();
        let lease = client.session(req.lease).await?;
        let prefix = leader_prefix(&req.name);
        let mut key = prefix.clone();
        key.extend_from_slice(go_hex(lease).as_bytes());

        let resp = client
            .txn(TxnRequest {
                compare: vec![create_revision_is(&key, 0)],
                success: vec![put_op(&key, &req.value, lease)],
                failure: vec![range_op(get_key(&key))],
            })
            .await?;
        let header = resp.header.unwrap_or_default();
        let mut leader_rev = header.revision;
        if !resp.succeeded {
            // This lease already campaigns: resume with its key, and make
            // its value the one asked for.
            let Some(existing) = txn_range_kvs(&resp, 0).first() else {
                return Err(go_error(NOT_LEADER));
            };
            leader_rev = existing.create_revision;
            if existing.value != req.value {
                let leader = LeaderKey {
                    name: req.name.clone(),
                    key: key.clone().into(),
                    rev: leader_rev,
                    lease,
                };
                if let Err(e) = Self::proclaim_as(&client, &leader, lease, &req.value).await {
                    // A failed proclaim leaves etcd's election without a key
                    // when it lost the leadership; only another failure resigns.
                    if e.message() != NOT_LEADER {
                        let _ = Cleanup::Resign {
                            key: key.clone(),
                            revision: leader_rev,
                        }
                        .run(&client)
                        .await;
                    }
                    return Err(e);
                }
            }
        }

        // If the caller goes away while waiting, etcd resigns for it.
        let resign = CleanupOnDrop::new(
            &client,
            Cleanup::Resign {
                key: key.clone(),
                revision: leader_rev,
            },
        );
        let waited = client.wait_deletes(&prefix, leader_rev - 1).await;
        resign.disarm();
        waited?;

        Ok(Response::new(CampaignResponse {
            header: Some(header),
            leader: Some(LeaderKey {
                name: req.name,
                key: key.into(),
                rev: leader_rev,
                lease,
            }),
        }))
    }

    async fn proclaim(
        &self,
        request: Request<ProclaimRequest>,
    ) -> Result<Response<ProclaimResponse>, Status> {
        check_require_leader(self.client.server(), &request)?;
        let client = self.client.as_caller(&request);
        let req = request.into_inner();
        let Some(leader) = req.leader else {
            return Err(go_error(MISSING_LEADER_KEY));
        };
        // As etcd: a leader key without a lease gets a fresh session lease,
        // and the proclaimed value is put under it.
        let lease = client.session(leader.lease).await?;
        let header = Self::proclaim_as(&client, &leader, lease, &req.value).await?;
        Ok(Response::new(ProclaimResponse {
            header: Some(header),
        }))
    }

    async fn leader(
        &self,
        request: Request<LeaderRequest>,
    ) -> Result<Response<LeaderResponse>, Status> {
        check_require_leader(self.client.server(), &request)?;
        let client = self.client.as_caller(&request);
        let req = request.into_inner();
        let prefix = leader_prefix(&req.name);
        let mut resp = client
            .range(first_created(&prefix, SortOrder::Ascend))
            .await?;
        if resp.kvs.is_empty() {
            return Err(go_error(NO_LEADER));
        }
        Ok(Response::new(LeaderResponse {
            header: resp.header,
            kv: Some(resp.kvs.swap_remove(0)),
        }))
    }

    type ObserveStream = Pin<Box<dyn Stream<Item = Result<LeaderResponse, Status>> + Send>>;

    async fn observe(
        &self,
        request: Request<LeaderRequest>,
    ) -> Result<Response<Self::ObserveStream>, Status> {
        check_require_leader(self.client.server(), &request)?;
        let client = self.client.as_caller(&request);
        let req = request.into_inner();
        let (outbound, mut rx) = mpsc::channel(OBSERVE_BUFFER);
        let client = client.clone();
        let prefix = leader_prefix(&req.name);
        tokio::spawn(async move {
            tokio::select! {
                _ = observe(&client, &prefix, &outbound) => {}
                _ = outbound.closed() => {}
            }
        });
        // grpc-go sends a stream's headers with its first message, so etcd's
        // Observe answers the call only once there is a leader to report.
        let first = rx.recv().await;
        let responses = futures::stream::iter(first).chain(ReceiverStream::new(rx));
        Ok(Response::new(Box::pin(responses)))
    }

    async fn resign(
        &self,
        request: Request<ResignRequest>,
    ) -> Result<Response<ResignResponse>, Status> {
        check_require_leader(self.client.server(), &request)?;
        let client = self.client.as_caller(&request);
        let req = request.into_inner();
        let Some(leader) = req.leader else {
            return Err(go_error(MISSING_LEADER_KEY));
        };
        // etcd opens a session here too (granting a lease when none is
        // given) although resigning does not use it.
        client.session(leader.lease).await?;
        let resp = client
            .txn(TxnRequest {
                compare: vec![create_revision_is(&leader.key, leader.rev)],
                success: vec![delete_op(&leader.key)],
                failure: Vec::new(),
            })
            .await?;
        Ok(Response::new(ResignResponse {
            header: resp.header,
        }))
    }
}

type Outbound = mpsc::Sender<Result<LeaderResponse, Status>>;

/// concurrency's Election.observe: the current leader, then every value it
/// proclaims, then the next leader once its key is deleted. Any failure
/// ends the stream without an error, as etcd's Observe does when the
/// recipe closes its channel.
async fn observe(client: &LocalClient, prefix: &[u8], outbound: &Outbound) {
    let _ = observe_leaders(client, prefix, outbound).await;
}

async fn observe_leaders(
    client: &LocalClient,
    prefix: &[u8],
    outbound: &Outbound,
) -> Result<(), Status> {
    loop {
        let resp = client
            .range(first_created(prefix, SortOrder::Ascend))
            .await?;
        let header = resp.header.unwrap_or_default();
        let (header, kv) = match resp.kvs.into_iter().next() {
            Some(kv) => (header, kv),
            None => first_put(client, prefix, header.revision).await?,
        };
        let revision = header.revision;
        send(outbound, header, kv.clone()).await?;

        let mut watch = client.watch(&kv.key, &[], revision + 1)?;
        'leader: loop {
            let (header, events) = watch.next().await?;
            for event in events {
                if event.r#type == EventType::Delete as i32 {
                    break 'leader;
                }
                send(outbound, header, event.kv.unwrap_or_default()).await?;
            }
        }
    }
}

/// No leader yet: the first key put under the prefix from `revision` on,
/// with the header's revision set to that put's (etcd: "may have multiple
/// revs; hdr.rev = the last rev").
async fn first_put(
    client: &LocalClient,
    prefix: &[u8],
    revision: i64,
) -> Result<(ResponseHeader, KeyValue), Status> {
    let mut watch = client.watch(prefix, &prefix_range_end(prefix), revision)?;
    loop {
        let (mut header, events) = watch.next().await?;
        let put = events
            .into_iter()
            .find(|e| e.r#type == EventType::Put as i32)
            .and_then(|e| e.kv);
        if let Some(kv) = put {
            header.revision = kv.mod_revision;
            return Ok((header, kv));
        }
    }
}

async fn send(outbound: &Outbound, header: ResponseHeader, kv: KeyValue) -> Result<(), Status> {
    outbound
        .send(Ok(LeaderResponse {
            header: Some(header),
            kv: Some(kv),
        }))
        .await
        .map_err(|_| Status::cancelled("observer went away"))
}
