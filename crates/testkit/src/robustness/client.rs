//! A client that records: each call goes to one member through
//! etcd-client, with a deadline, and lands in the shared [`Recorder`] with
//! its call and return times. An answer that never came is recorded as
//! unknown; an error that proves the request was refused before it could
//! take effect is recorded as a failure with a return time.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use etcd_client::{
    Compare as EtcdCompare, CompareOp, ConnectOptions, GetOptions, PutOptions, Txn,
    TxnOp as EtcdTxnOp, TxnOpResponse,
};

use super::history::{Compare, Kv, OpResult, Operation, Request, Response, TxnOp};

/// The run's clock and the operations recorded so far.
pub struct Recorder {
    start: Instant,
    operations: Mutex<Vec<Operation>>,
}

impl Recorder {
    pub fn new() -> Arc<Recorder> {
        Arc::new(Recorder {
            start: Instant::now(),
            operations: Mutex::new(Vec::new()),
        })
    }

    /// Nanoseconds since the run started.
    pub fn now(&self) -> u64 {
        self.start.elapsed().as_nanos() as u64
    }

    fn push(&self, op: Operation) {
        self.operations.lock().expect("recorder lock").push(op);
    }

    pub fn take(&self) -> Vec<Operation> {
        std::mem::take(&mut *self.operations.lock().expect("recorder lock"))
    }

    pub fn len(&self) -> usize {
        self.operations.lock().expect("recorder lock").len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Connects to one endpoint; etcd-client connects lazily, so this does not
/// wait for the member to be up.
pub async fn connect(endpoint: &str, timeout: Duration) -> Option<etcd_client::Client> {
    let options = ConnectOptions::new()
        .with_connect_timeout(Duration::from_millis(500))
        .with_timeout(timeout);
    match tokio::time::timeout(
        timeout,
        etcd_client::Client::connect([endpoint], Some(options)),
    )
    .await
    {
        Ok(Ok(client)) => Some(client),
        _ => None,
    }
}

/// Whether an error proves the request took no effect: the member refused
/// it while checking it, before proposing it. Everything else (timeouts,
/// unavailable members, broken connections, "no leader") is unknown.
fn refused(error: &etcd_client::Error) -> bool {
    use tonic::Code;
    match error {
        etcd_client::Error::GRpcStatus(status) => matches!(
            status.code(),
            Code::InvalidArgument
                | Code::FailedPrecondition
                | Code::NotFound
                | Code::OutOfRange
                | Code::PermissionDenied
                | Code::ResourceExhausted
                | Code::AlreadyExists
        ),
        _ => false,
    }
}

fn kv_of(kv: &etcd_client::KeyValue) -> Kv {
    Kv {
        key: String::from_utf8_lossy(kv.key()).into_owned(),
        value: String::from_utf8_lossy(kv.value()).into_owned(),
        create_revision: kv.create_revision(),
        mod_revision: kv.mod_revision(),
        version: kv.version(),
        lease: kv.lease(),
    }
}

pub fn kvs_of(kvs: &[etcd_client::KeyValue]) -> Vec<Kv> {
    kvs.iter().map(kv_of).collect()
}

fn header_revision(header: Option<&etcd_client::ResponseHeader>) -> i64 {
    header.map_or(0, |h| h.revision())
}

/// One client of the traffic: a member, a connection, the recorder.
pub struct RecordingClient {
    pub id: u32,
    pub member: u32,
    client: Option<etcd_client::Client>,
    endpoint: String,
    recorder: Arc<Recorder>,
    timeout: Duration,
}

impl RecordingClient {
    pub fn new(
        id: u32,
        member: u32,
        endpoint: String,
        recorder: Arc<Recorder>,
        timeout: Duration,
    ) -> RecordingClient {
        RecordingClient {
            id,
            member,
            client: None,
            endpoint,
            recorder,
            timeout,
        }
    }

    /// Moves to another member (after a failure, as a balancer would).
    pub fn switch_to(&mut self, member: u32, endpoint: String) {
        self.member = member;
        self.endpoint = endpoint;
        self.client = None;
    }

    /// Runs `request` and records it; returns the answer, None on failure.
    pub async fn run(&mut self, request: Request) -> Option<Response> {
        let call = self.recorder.now();
        let result = match self.client.clone() {
            Some(c) => Ok(c),
            None => connect(&self.endpoint, self.timeout)
                .await
                .ok_or_else(|| etcd_client::Error::EndpointError("cannot connect".into())),
        };
        let result = match result {
            Ok(client) => {
                self.client = Some(client.clone());
                match tokio::time::timeout(self.timeout, send(client, &request)).await {
                    Ok(r) => r,
                    Err(_) => Err(etcd_client::Error::EndpointError(
                        "deadline exceeded".into(),
                    )),
                }
            }
            Err(e) => Err(e),
        };
        let now = self.recorder.now();
        let (ret, response, error) = match result {
            Ok(response) => (Some(now), Some(response), None),
            Err(e) => {
                let known = refused(&e);
                if !known {
                    // a fresh connection next time: this one may be stuck
                    self.client = None;
                }
                (known.then_some(now), None, Some(e.to_string()))
            }
        };
        self.recorder.push(Operation {
            client: self.id,
            member: self.member,
            call,
            ret,
            request,
            response: response.clone(),
            error,
        });
        response
    }
}

fn compare_of(compare: &Compare) -> EtcdCompare {
    match compare {
        Compare::ModRevision(key, rev) => {
            EtcdCompare::mod_revision(key.as_str(), CompareOp::Equal, *rev)
        }
        Compare::Version(key, version) => {
            EtcdCompare::version(key.as_str(), CompareOp::Equal, *version)
        }
        Compare::Value(key, value) => {
            EtcdCompare::value(key.as_str(), CompareOp::Equal, value.as_str())
        }
    }
}

fn txn_op_of(op: &TxnOp) -> EtcdTxnOp {
    match op {
        TxnOp::Put { key, value, lease } => EtcdTxnOp::put(
            key.as_str(),
            value.as_str(),
            (*lease != 0).then(|| PutOptions::new().with_lease(*lease)),
        ),
        TxnOp::Delete { key } => EtcdTxnOp::delete(key.as_str(), None),
        TxnOp::Get { key } => EtcdTxnOp::get(key.as_str(), None),
    }
}

async fn send(
    mut client: etcd_client::Client,
    request: &Request,
) -> Result<Response, etcd_client::Error> {
    Ok(match request {
        Request::Put { key, value, lease } => {
            let options = (*lease != 0).then(|| PutOptions::new().with_lease(*lease));
            let r = client.put(key.as_str(), value.as_str(), options).await?;
            Response::Put {
                revision: header_revision(r.header()),
            }
        }
        Request::Delete { key } => {
            let r = client.delete(key.as_str(), None).await?;
            Response::Delete {
                revision: header_revision(r.header()),
                deleted: r.deleted(),
            }
        }
        Request::Range {
            key,
            end,
            revision,
            limit,
            serializable,
            count_only,
        } => {
            let mut options = GetOptions::new()
                .with_revision(*revision)
                .with_limit(*limit);
            if !end.is_empty() {
                options = options.with_range(end.as_str());
            }
            if *serializable {
                options = options.with_serializable();
            }
            if *count_only {
                options = options.with_count_only();
            }
            let r = client.get(key.as_str(), Some(options)).await?;
            Response::Range {
                revision: header_revision(r.header()),
                kvs: kvs_of(r.kvs()),
                count: r.count(),
                more: r.more(),
            }
        }
        Request::Txn {
            compare,
            then,
            otherwise,
        } => {
            let txn = Txn::new()
                .when([compare_of(compare)])
                .and_then(then.iter().map(txn_op_of).collect::<Vec<_>>())
                .or_else(otherwise.iter().map(txn_op_of).collect::<Vec<_>>());
            let r = client.txn(txn).await?;
            let results = r
                .op_responses()
                .into_iter()
                .map(|op| match op {
                    TxnOpResponse::Put(_) => OpResult::Put,
                    TxnOpResponse::Delete(d) => OpResult::Delete {
                        deleted: d.deleted(),
                    },
                    TxnOpResponse::Get(g) => OpResult::Get {
                        kvs: kvs_of(g.kvs()),
                    },
                    // the traffic never nests transactions
                    TxnOpResponse::Txn(_) => OpResult::Get { kvs: Vec::new() },
                })
                .collect();
            Response::Txn {
                revision: header_revision(r.header()),
                succeeded: r.succeeded(),
                results,
            }
        }
        Request::LeaseGrant { ttl } => {
            let r = client.lease_grant(*ttl, None).await?;
            Response::LeaseGrant {
                revision: header_revision(r.header()),
                id: r.id(),
                ttl: r.ttl(),
            }
        }
        Request::LeaseRevoke { id } => {
            let r = client.lease_revoke(*id).await?;
            Response::LeaseRevoke {
                revision: header_revision(r.header()),
            }
        }
        Request::LeaseKeepAlive { id } => {
            let (mut keeper, mut stream) = client.lease_keep_alive(*id).await?;
            keeper.keep_alive().await?;
            match stream.message().await? {
                Some(r) => Response::LeaseKeepAlive {
                    revision: header_revision(r.header()),
                    ttl: r.ttl(),
                },
                None => {
                    return Err(etcd_client::Error::LeaseKeepAliveError(
                        "keep-alive stream ended".into(),
                    ))
                }
            }
        }
        Request::Compact { revision } => {
            let r = client.compact(*revision, None).await?;
            Response::Compact {
                revision: header_revision(r.header()),
            }
        }
        Request::Defragment => {
            client.defragment().await?;
            Response::Defragment
        }
    })
}
