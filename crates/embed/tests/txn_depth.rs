//! Nested txns as etcd bounds them (checked against etcd 3.5.16: the same
//! answers at 50, 52, 128 and 129 levels, with and without a put inside): by a cumulative operation budget
//! (`--max-txn-ops`), not by a decoder depth limit. A txn raft commits is
//! always one apply can decode: before, 51 levels passed the gRPC decoder,
//! were committed, and were then skipped by every member's apply.

mod common;
use common::{endpoint, member};

use api::etcdserverpb::{request_op, PutRequest, RequestOp, TxnRequest};
use prost::Message;
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic::codegen::http::uri::PathAndQuery;
use tonic::{Code, Status};

/// `levels` txns, each the only op of the one above; the innermost holds a
/// put of `key` (or nothing).
fn chain(levels: usize, key: Option<&str>) -> TxnRequest {
    let mut txn = TxnRequest::default();
    if let Some(key) = key {
        txn.success.push(RequestOp {
            request: Some(request_op::Request::RequestPut(PutRequest {
                key: key.as_bytes().to_vec().into(),
                value: levels.to_string().into_bytes().into(),
                ..Default::default()
            })),
        });
    }
    for _ in 1..levels {
        txn = TxnRequest {
            success: vec![RequestOp {
                request: Some(request_op::Request::RequestTxn(txn)),
            }],
            ..Default::default()
        };
    }
    txn
}

/// Sends a TxnRequest and keeps the response's bytes: a response nested
/// as deep as its request is past prost's own decoder limit (and so past
/// the etcd-client crate's), which is not the server's concern.
#[derive(Default)]
struct RawTxn;

impl Codec for RawTxn {
    type Encode = TxnRequest;
    type Decode = Vec<u8>;
    type Encoder = RawTxn;
    type Decoder = RawTxn;
    fn encoder(&mut self) -> RawTxn {
        RawTxn
    }
    fn decoder(&mut self) -> RawTxn {
        RawTxn
    }
}

impl Encoder for RawTxn {
    type Item = TxnRequest;
    type Error = Status;
    fn encode(&mut self, item: TxnRequest, buf: &mut EncodeBuf<'_>) -> Result<(), Status> {
        item.encode(buf)
            .map_err(|e| Status::internal(e.to_string()))
    }
}

impl Decoder for RawTxn {
    type Item = Vec<u8>;
    type Error = Status;
    fn decode(&mut self, buf: &mut DecodeBuf<'_>) -> Result<Option<Vec<u8>>, Status> {
        use prost::bytes::Buf;
        Ok(Some(buf.copy_to_bytes(buf.remaining()).to_vec()))
    }
}

async fn send(endpoint: &str, txn: TxnRequest) -> Result<(), (Code, String)> {
    let channel = tonic::transport::Endpoint::from_shared(endpoint.to_string())
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut grpc = tonic::client::Grpc::new(channel);
    grpc.ready().await.unwrap();
    let path = PathAndQuery::from_static("/etcdserverpb.KV/Txn");
    grpc.unary(tonic::Request::new(txn), path, RawTxn)
        .await
        .map(|_| ())
        .map_err(|s| (s.code(), s.message().to_string()))
}

fn too_many_ops() -> Result<(), (Code, String)> {
    Err((
        Code::InvalidArgument,
        "etcdserver: too many operations in txn request".into(),
    ))
}

#[tokio::test]
async fn txn_nesting_is_bounded_by_etcds_op_budget_and_every_accepted_txn_applies() {
    let dir = tempfile::tempdir().unwrap();
    let (m, mut c) = member(dir.path(), |_| {}).await;
    let ep = endpoint(&m);
    // Budget 128: each level spends one op, the put at the bottom one more.
    assert_eq!(send(&ep, chain(50, Some("k50"))).await, Ok(()));
    assert_eq!(send(&ep, chain(52, Some("k52"))).await, Ok(()));
    assert_eq!(send(&ep, chain(128, Some("k128"))).await, Ok(()));
    assert_eq!(send(&ep, chain(129, Some("k129"))).await, too_many_ops());
    // An empty txn at a budget of 0 passes.
    assert_eq!(send(&ep, chain(129, None)).await, Ok(()));
    assert_eq!(send(&ep, chain(130, None)).await, too_many_ops());
    for (key, want) in [
        ("k50", Some("50")),
        ("k52", Some("52")),
        ("k128", Some("128")),
        ("k129", None),
    ] {
        let got = c.get(key, None).await.unwrap();
        assert_eq!(
            got.kvs()
                .first()
                .map(|kv| kv.value_str().unwrap().to_string()),
            want.map(String::from),
            "{key}"
        );
    }
    // The member is healthy afterwards: nothing was skipped or stuck.
    c.put("after", "x", None).await.unwrap();
    m.stop().await;
}

#[tokio::test]
async fn a_larger_max_txn_ops_reaches_the_decoders_depth_bound() {
    use api::codec::MAX_TXN_DEPTH;
    let dir = tempfile::tempdir().unwrap();
    let (m, mut c) = member(dir.path(), |cfg| cfg.max_txn_ops = 10_000).await;
    let ep = endpoint(&m);
    assert_eq!(
        send(&ep, chain(MAX_TXN_DEPTH, Some("deepest"))).await,
        Ok(())
    );
    let got = c.get("deepest", None).await.unwrap();
    assert_eq!(got.kvs()[0].value_str().unwrap(), MAX_TXN_DEPTH.to_string());
    // Past the bound the decoder refuses it as etcd's budget would.
    assert_eq!(
        send(&ep, chain(MAX_TXN_DEPTH + 1, Some("x"))).await,
        too_many_ops()
    );
    // Across a restart the WAL replays the deep entry without trouble.
    let rev = c
        .put("after", "x", None)
        .await
        .unwrap()
        .header()
        .unwrap()
        .revision();
    m.stop().await;
    let (m, mut c) = member(dir.path(), |cfg| cfg.max_txn_ops = 10_000).await;
    let got = c.get("deepest", None).await.unwrap();
    assert_eq!(got.header().unwrap().revision(), rev);
    m.stop().await;
}
