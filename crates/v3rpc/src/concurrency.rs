//! The member's own client and etcd's clientv3/concurrency recipes on it,
//! for the Election and Lock services.
//!
//! etcd serves v3election and v3lock by running clientv3's concurrency
//! recipes (Session, Election, Mutex) against an in-process client of the
//! member itself. We do the same without a loopback connection: writes and
//! reads go through [`KvService`] (so requests get etcd's checks, headers
//! and linearizable reads), leases through [`EtcdServer::lease_grant`], and
//! waits for deletes through an mvcc watch stream of our own.
//!
//! Errors: clientv3 turns every etcd error it receives into an `EtcdError`
//! value, which grpc-go cannot map back to a status, so a service built on
//! it answers `Unknown` with etcd's message (e.g. "etcdserver: requested
//! lease not found"). [`client_error`] does the same.

use std::sync::Arc;

use crate::auth::Credentials;
use api::etcdserverpb::compare::{CompareResult, CompareTarget, TargetUnion};
use api::etcdserverpb::kv_server::Kv;
use api::etcdserverpb::range_request::{SortOrder, SortTarget};
use api::etcdserverpb::request_op::Request as Op;
use api::etcdserverpb::{
    Compare, DeleteRangeRequest, DeleteRangeResponse, LeaseGrantRequest, PutRequest, RangeRequest,
    RangeResponse, RequestOp, ResponseHeader, TxnRequest, TxnResponse,
};
use api::mvccpb::{event::EventType, Event, KeyValue};
use api::rpctypes;
use mvcc::{WatchOptions, WatchStream};
use tokio::sync::{watch, Notify};
use tonic::{Request, Status};

use crate::kv::KvService;
use etcdserver::EtcdServer;

/// concurrency's defaultSessionTTL: a session without a lease grants one of
/// this many seconds (and, orphaned at once, never keeps it alive).
pub(crate) const SESSION_TTL_SECONDS: i64 = 60;

/// An error as clientv3 hands it to the recipes' caller: etcd's message with
/// gRPC code Unknown (see the module doc).
pub(crate) fn client_error(status: Status) -> Status {
    Status::unknown(status.message())
}

/// A plain Go error returned by a gRPC handler (grpc-go: code Unknown).
pub(crate) fn go_error(message: &str) -> Status {
    Status::unknown(message)
}

/// Go's `fmt.Sprintf("%x", leaseID)`: a negative ID keeps its sign.
pub(crate) fn go_hex(value: i64) -> String {
    if value < 0 {
        format!("-{:x}", value.unsigned_abs())
    } else {
        format!("{value:x}")
    }
}

/// clientv3.GetPrefixRangeEnd: the first key after every key with `prefix`.
pub(crate) fn prefix_range_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    // Every byte was 0xff: the range runs to the end of the keyspace.
    vec![0]
}

/// clientv3.WithFirstCreate / WithLastCreate: the oldest (or newest) key
/// under `prefix`.
pub(crate) fn first_created(prefix: &[u8], order: SortOrder) -> RangeRequest {
    RangeRequest {
        key: prefix.to_vec().into(),
        range_end: prefix_range_end(prefix).into(),
        sort_order: order as i32,
        sort_target: SortTarget::Create as i32,
        limit: 1,
        ..Default::default()
    }
}

/// `CreateRevision(key) == revision`.
pub(crate) fn create_revision_is(key: &[u8], revision: i64) -> Compare {
    Compare {
        result: CompareResult::Equal as i32,
        target: CompareTarget::Create as i32,
        key: key.to_vec().into(),
        target_union: Some(TargetUnion::CreateRevision(revision)),
        ..Default::default()
    }
}

pub(crate) fn put_op(key: &[u8], value: &[u8], lease: i64) -> RequestOp {
    RequestOp {
        request: Some(Op::RequestPut(PutRequest {
            key: key.to_vec().into(),
            value: value.to_vec().into(),
            lease,
            ..Default::default()
        })),
    }
}

pub(crate) fn range_op(range: RangeRequest) -> RequestOp {
    RequestOp {
        request: Some(Op::RequestRange(range)),
    }
}

pub(crate) fn get_key(key: &[u8]) -> RangeRequest {
    RangeRequest {
        key: key.to_vec().into(),
        ..Default::default()
    }
}

pub(crate) fn delete_op(key: &[u8]) -> RequestOp {
    RequestOp {
        request: Some(Op::RequestDeleteRange(DeleteRangeRequest {
            key: key.to_vec().into(),
            ..Default::default()
        })),
    }
}

/// The kvs of a txn's `index`-th response, if it was a range.
pub(crate) fn txn_range_kvs(resp: &TxnResponse, index: usize) -> &[KeyValue] {
    use api::etcdserverpb::response_op::Response as OpResponse;
    match resp.responses.get(index).and_then(|r| r.response.as_ref()) {
        Some(OpResponse::ResponseRange(range)) => &range.kvs,
        _ => &[],
    }
}

/// The member seen as a clientv3 client of itself.
#[derive(Clone)]
pub struct LocalClient {
    server: Arc<EtcdServer>,
    /// Becomes true when the member stops: waits end instead of holding the
    /// client listener open.
    shutdown: watch::Receiver<bool>,
    /// Whose requests these are: the KV calls a recipe makes run with its
    /// caller's credentials, so they pass the caller's permission checks
    /// (etcd's v3election/v3lock call clientv3 with the caller's context).
    credentials: Credentials,
}

impl LocalClient {
    pub fn new(server: Arc<EtcdServer>, shutdown: watch::Receiver<bool>) -> Self {
        LocalClient {
            server,
            shutdown,
            credentials: Credentials::default(),
        }
    }

    /// This client acting for the caller of `request`.
    pub fn as_caller<T>(&self, request: &Request<T>) -> LocalClient {
        LocalClient {
            credentials: Credentials::of(request),
            ..self.clone()
        }
    }

    /// A KV request carrying the caller's credentials.
    fn request<T>(&self, message: T) -> Request<T> {
        let mut request = Request::new(message);
        if let Some(token) = &self.credentials.token {
            if let Ok(value) = token.parse() {
                request.metadata_mut().insert(crate::auth::TOKEN_KEY, value);
            }
        }
        if let Some(common_name) = &self.credentials.common_name {
            request.extensions_mut().insert(crate::TlsConnectInfo {
                remote_addr: None,
                common_name: Some(common_name.clone()),
            });
        }
        request
    }

    pub(crate) fn server(&self) -> &Arc<EtcdServer> {
        &self.server
    }

    fn kv(&self) -> KvService {
        KvService::new(self.server.clone())
    }

    pub(crate) async fn txn(&self, request: TxnRequest) -> Result<TxnResponse, Status> {
        self.kv()
            .txn(self.request(request))
            .await
            .map(|r| r.into_inner())
            .map_err(client_error)
    }

    /// A linearizable Get.
    pub(crate) async fn range(&self, request: RangeRequest) -> Result<RangeResponse, Status> {
        self.kv()
            .range(self.request(request))
            .await
            .map(|r| r.into_inner())
            .map_err(client_error)
    }

    pub(crate) async fn delete(&self, key: &[u8]) -> Result<DeleteRangeResponse, Status> {
        let request = DeleteRangeRequest {
            key: key.to_vec().into(),
            ..Default::default()
        };
        self.kv()
            .delete_range(self.request(request))
            .await
            .map(|r| r.into_inner())
            .map_err(client_error)
    }

    /// concurrency.NewSession(WithLease(lease)) then Orphan(): the lease to
    /// use, granted here (60 s, never kept alive) when `lease` is 0.
    pub(crate) async fn session(&self, lease: i64) -> Result<i64, Status> {
        if lease != 0 {
            return Ok(lease);
        }
        let granted = self
            .server
            .lease_grant(LeaseGrantRequest {
                id: 0,
                ttl: SESSION_TTL_SECONDS,
            })
            .await
            .map_err(|e| client_error(e.status()))?;
        Ok(granted.id)
    }

    /// Watches `key` (to `range_end`) from `start_revision`.
    pub(crate) fn watch(
        &self,
        key: &[u8],
        range_end: &[u8],
        start_revision: i64,
    ) -> Result<KeyWatch, Status> {
        let ready = Arc::new(Notify::new());
        let wake = ready.clone();
        let stream = self
            .server
            .store
            .watch_stream(Box::new(move || wake.notify_one()));
        stream
            .watch(WatchOptions {
                key: key.to_vec().into(),
                range_end: range_end.to_vec().into(),
                start_revision,
                ..Default::default()
            })
            .map_err(|e| go_error(&e.to_string()))?;
        Ok(KeyWatch {
            server: self.server.clone(),
            stream,
            ready,
            shutdown: self.shutdown.clone(),
        })
    }

    /// concurrency's waitDeletes: waits until no key under `prefix` with a
    /// create revision ≤ `max_create_revision` is left, newest first, and
    /// returns the header of the last Get (which found none).
    pub(crate) async fn wait_deletes(
        &self,
        prefix: &[u8],
        max_create_revision: i64,
    ) -> Result<ResponseHeader, Status> {
        loop {
            let mut range = first_created(prefix, SortOrder::Descend);
            range.max_create_revision = max_create_revision;
            let resp = self.range(range).await?;
            let header = resp.header.unwrap_or_default();
            let Some(last) = resp.kvs.first() else {
                return Ok(header);
            };
            self.wait_delete(&last.key, header.revision).await?;
        }
    }

    /// concurrency's waitDelete: the first DELETE of `key` at or after
    /// `revision`.
    async fn wait_delete(&self, key: &[u8], revision: i64) -> Result<(), Status> {
        let mut watch = self.watch(key, &[], revision)?;
        loop {
            let (_, events) = watch.next().await?;
            if events.iter().any(|e| e.r#type == EventType::Delete as i32) {
                return Ok(());
            }
        }
    }
}

/// One watcher on a watch stream of its own (clientv3's Watch channel).
pub(crate) struct KeyWatch {
    server: Arc<EtcdServer>,
    stream: WatchStream,
    ready: Arc<Notify>,
    shutdown: watch::Receiver<bool>,
}

impl KeyWatch {
    /// The next response with events: its header and events. A compacted
    /// start revision ends the watch with etcd's error, as clientv3's
    /// `WatchResponse.Err()` reports it.
    pub(crate) async fn next(&mut self) -> Result<(ResponseHeader, Vec<Event>), Status> {
        loop {
            while let Some(response) = self.stream.pop() {
                if response.compact_revision != 0 {
                    return Err(client_error(rpctypes::COMPACTED.status()));
                }
                if response.canceled {
                    return Err(client_error(rpctypes::WATCH_CANCELED.status()));
                }
                if !response.events.is_empty() {
                    return Ok((self.server.header(response.revision), response.events));
                }
            }
            tokio::select! {
                _ = self.ready.notified() => {}
                _ = self.shutdown.wait_for(|stop| *stop) => {
                    return Err(rpctypes::STOPPED.status());
                }
            }
        }
    }
}

/// What a recipe undoes when its caller goes away mid-wait (etcd runs it
/// with the client's own context once the request's context is done).
pub(crate) enum Cleanup {
    /// Mutex.Unlock: delete the waiter's key.
    Delete(Vec<u8>),
    /// Election.Resign: delete the candidate's key if it is still ours.
    Resign { key: Vec<u8>, revision: i64 },
}

impl Cleanup {
    pub(crate) async fn run(self, client: &LocalClient) -> Result<(), Status> {
        match self {
            Cleanup::Delete(key) => client.delete(&key).await.map(drop),
            Cleanup::Resign { key, revision } => client
                .txn(TxnRequest {
                    compare: vec![create_revision_is(&key, revision)],
                    success: vec![delete_op(&key)],
                    failure: Vec::new(),
                })
                .await
                .map(drop),
        }
    }
}

/// Runs its cleanup in the background if dropped while armed: tonic drops a
/// handler's future when the client cancels the call.
pub(crate) struct CleanupOnDrop {
    client: LocalClient,
    cleanup: Option<Cleanup>,
}

impl CleanupOnDrop {
    pub fn new(client: &LocalClient, cleanup: Cleanup) -> Self {
        CleanupOnDrop {
            client: client.clone(),
            cleanup: Some(cleanup),
        }
    }

    /// The wait ended normally: nothing to undo on drop. Returns the cleanup
    /// for the caller to run itself if it needs to.
    pub(crate) fn disarm(mut self) -> Option<Cleanup> {
        self.cleanup.take()
    }
}

impl Drop for CleanupOnDrop {
    fn drop(&mut self) {
        let Some(cleanup) = self.cleanup.take() else {
            return;
        };
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let client = self.client.clone();
        runtime.spawn(async move {
            if let Err(e) = cleanup.run(&client).await {
                tracing::warn!(error = %e, "failed to clean up after a canceled election or lock request");
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefix_range_end_matches_clientv3() {
        assert_eq!(prefix_range_end(b"a/"), b"a0".to_vec());
        assert_eq!(prefix_range_end(b"a\xff"), b"b".to_vec());
        assert_eq!(prefix_range_end(b"\xff\xff"), vec![0]);
        assert_eq!(prefix_range_end(b""), vec![0]);
    }

    #[test]
    fn go_hex_keeps_the_sign() {
        assert_eq!(go_hex(0x694d7a2b1c3d4e5f), "694d7a2b1c3d4e5f");
        assert_eq!(go_hex(-26), "-1a");
        assert_eq!(go_hex(i64::MIN), "-8000000000000000");
    }
}
