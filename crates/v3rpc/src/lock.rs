//! The v3lock service (etcd's server/etcdserver/api/v3lock): a distributed
//! mutex as clientv3/concurrency's Mutex recipe runs it on the member.
//!
//! A lock `name` is the key prefix `name/`; each waiter puts the key
//! `name/<lease in hex>` under its lease, and the waiter whose key was
//! created first holds the lock. Lock returns once every older waiter's key
//! is gone; Unlock deletes the key Lock returned. The lease is the client's
//! to keep alive: when it expires, its key goes and the next waiter gets in.

use api::etcdserverpb::range_request::SortOrder;
use api::etcdserverpb::TxnRequest;
use api::v3lockpb::lock_server::Lock;
use api::v3lockpb::{LockRequest, LockResponse, UnlockRequest, UnlockResponse};
use tonic::{Request, Response, Status};

use crate::check_require_leader;
use crate::concurrency::{
    create_revision_is, first_created, get_key, go_error, go_hex, put_op, range_op, txn_range_kvs,
    Cleanup, CleanupOnDrop, LocalClient,
};

/// concurrency.ErrSessionExpired (etcd 3.5's Mutex checks its key is still
/// there after waiting).
pub(crate) const SESSION_EXPIRED: &str = "mutex: session is expired";

pub struct LockService {
    client: LocalClient,
}

impl LockService {
    pub fn new(client: LocalClient) -> Self {
        LockService { client }
    }
}

#[tonic::async_trait]
impl Lock for LockService {
    async fn lock(&self, request: Request<LockRequest>) -> Result<Response<LockResponse>, Status> {
        check_require_leader(self.client.server(), &request)?;
        let client = self.client.as_caller(&request);
        let req = request.into_inner();
        let lease = client.session(req.lease).await?;
        let mut prefix = req.name.to_vec();
        prefix.push(b'/');
        let mut my_key = prefix.clone();
        my_key.extend_from_slice(go_hex(lease).as_bytes());

        // Put ourselves in the queue (or find our key from an earlier
        // Lock of this lease), and fetch the holder in the same round.
        let owner = range_op(first_created(&prefix, SortOrder::Ascend));
        let resp = client
            .txn(TxnRequest {
                compare: vec![create_revision_is(&my_key, 0)],
                success: vec![put_op(&my_key, b"", lease), owner.clone()],
                failure: vec![range_op(get_key(&my_key)), owner],
            })
            .await?;
        let mut my_rev = resp.header.as_ref().map_or(0, |h| h.revision);
        if !resp.succeeded {
            // The key can only vanish between the compare and this read if
            // a later revision deleted it; answer as the recipe would fail.
            let Some(mine) = txn_range_kvs(&resp, 0).first() else {
                return Err(go_error(SESSION_EXPIRED));
            };
            my_rev = mine.create_revision;
        }
        let holder = txn_range_kvs(&resp, 1).first();
        if holder.is_none_or(|kv| kv.create_revision == my_rev) {
            return Ok(Response::new(LockResponse {
                header: resp.header,
                key: my_key.into(),
            }));
        }

        // Wait for every older waiter; if the caller goes away meanwhile,
        // leave the queue (etcd: m.Unlock with the client's own context).
        let unlock = CleanupOnDrop::new(&client, Cleanup::Delete(my_key.clone()));
        if let Err(e) = client.wait_deletes(&prefix, my_rev - 1).await {
            leave_queue(&client, unlock).await;
            return Err(e);
        }
        // Our lease may have expired while we waited.
        let mine = match client.range(get_key(&my_key)).await {
            Ok(mine) => mine,
            Err(e) => {
                leave_queue(&client, unlock).await;
                return Err(e);
            }
        };
        unlock.disarm();
        if mine.kvs.is_empty() {
            return Err(go_error(SESSION_EXPIRED));
        }
        Ok(Response::new(LockResponse {
            header: mine.header,
            key: my_key.into(),
        }))
    }

    async fn unlock(
        &self,
        request: Request<UnlockRequest>,
    ) -> Result<Response<UnlockResponse>, Status> {
        check_require_leader(self.client.server(), &request)?;
        let client = self.client.as_caller(&request);
        let req = request.into_inner();
        let resp = client.delete(&req.key).await?;
        Ok(Response::new(UnlockResponse {
            header: resp.header,
        }))
    }
}

async fn leave_queue(client: &LocalClient, unlock: CleanupOnDrop) {
    if let Some(cleanup) = unlock.disarm() {
        if let Err(e) = cleanup.run(client).await {
            tracing::warn!(error = %e, "failed to delete a lock waiter's key");
        }
    }
}
