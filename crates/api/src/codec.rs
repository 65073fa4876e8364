//! Decoding the one recursive request of the API, `TxnRequest` (a
//! `RequestOp` may hold a whole nested txn), without prost's recursion
//! limit getting in the way of etcd's rule.
//!
//! prost refuses a message nested more than 100 levels deep, and a txn
//! level is two message levels (TxnRequest → RequestOp → TxnRequest), one
//! more inside a raft entry (InternalRaftRequest). etcd has no decoder
//! depth limit: it refuses a txn by its cumulative operation budget
//! (`--max-txn-ops`, 128 by default, so a chain of one-op levels is
//! accepted to 128 levels). So the txn levels are walked here, by hand, and
//! every other field is handed to prost with a fresh context: prost's limit
//! still guards everything else (unknown groups included), and our own
//! walk stops at [`MAX_TXN_DEPTH`] levels, which bounds the stack of every
//! recursive step downstream (validation, apply, encoding, drop).
//!
//! The gRPC services generated in this crate use [`EtcdCodec`]: prost's
//! codec, except that a `TxnRequest` is decoded here.

use std::any::{Any, TypeId};
use std::marker::PhantomData;

use prost::bytes::{Buf, Bytes};
use prost::encoding::{decode_key, decode_varint, DecodeContext, WireType};
use prost::Message;
use tonic::codec::{Codec, DecodeBuf, Decoder};
use tonic::Status;
use tonic_prost::{ProstDecoder, ProstEncoder};

use crate::etcdserverpb::{request_op, InternalRaftRequest, RequestOp, TxnRequest};

/// The deepest txn nesting decoded (the top-level txn is level 1). etcd's
/// default budget accepts 129 levels (128 one-op levels around an empty
/// one); only a `--max-txn-ops` above 511 would let etcd accept deeper,
/// and no client nests that deep. Deeper requests are refused with etcd's
/// "too many operations" error before anything recursive touches them.
pub const MAX_TXN_DEPTH: usize = 512;

/// The stack of a thread that decodes, validates, applies, encodes or drops
/// requests: each of those steps recurses once per txn level, up to
/// [`MAX_TXN_DEPTH`] (measured at 1024 levels: decoding ~1 KiB a level in
/// release builds, ~4 KiB in debug builds; encoding and drop less). Only
/// the pages a deep txn touches are ever mapped.
pub const REQUEST_THREAD_STACK_BYTES: usize = 16 << 20;

/// Why a txn could not be decoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TxnDecodeError {
    /// Nested deeper than [`MAX_TXN_DEPTH`].
    #[error("txn nested deeper than {MAX_TXN_DEPTH} levels")]
    TooDeep,
    #[error("{0}")]
    Malformed(String),
}

impl From<prost::DecodeError> for TxnDecodeError {
    fn from(e: prost::DecodeError) -> Self {
        TxnDecodeError::Malformed(e.to_string())
    }
}

/// A buffer that splits off a sub-message's bytes as its own type, so the
/// recursion below instantiates one type, not a tower of `Take`s.
trait Input: Buf + Sized {
    fn split_off_front(&mut self, len: usize) -> Self;
}

impl Input for Bytes {
    fn split_off_front(&mut self, len: usize) -> Self {
        self.split_to(len)
    }
}

impl Input for &[u8] {
    fn split_off_front(&mut self, len: usize) -> Self {
        let (front, rest) = self.split_at(len);
        *self = rest;
        front
    }
}

/// The bytes of a length-delimited field.
fn sub_message<B: Input>(buf: &mut B) -> Result<B, TxnDecodeError> {
    let len = decode_varint(buf)?;
    if len > buf.remaining() as u64 {
        return Err(TxnDecodeError::Malformed("buffer underflow".into()));
    }
    Ok(buf.split_off_front(len as usize))
}

/// Any field but the txn levels, decoded by prost with its own limits. Out
/// of line: the recursive frames above stay small (~100 B a level).
#[inline(never)]
fn merge_other_field<M: Message, B: Input>(
    message: &mut M,
    tag: u32,
    wire_type: WireType,
    buf: &mut B,
) -> Result<(), TxnDecodeError> {
    message.merge_field(tag, wire_type, buf, DecodeContext::default())?;
    Ok(())
}

fn merge_txn<B: Input>(
    txn: &mut TxnRequest,
    buf: &mut B,
    depth: usize,
) -> Result<(), TxnDecodeError> {
    if depth > MAX_TXN_DEPTH {
        return Err(TxnDecodeError::TooDeep);
    }
    while buf.has_remaining() {
        let (tag, wire_type) = decode_key(buf)?;
        let ops = match (tag, wire_type) {
            (2, WireType::LengthDelimited) => &mut txn.success,
            (3, WireType::LengthDelimited) => &mut txn.failure,
            _ => {
                merge_other_field(txn, tag, wire_type, buf)?;
                continue;
            }
        };
        let mut op = RequestOp::default();
        merge_op(&mut op, &mut sub_message(buf)?, depth)?;
        ops.push(op);
    }
    Ok(())
}

fn merge_op<B: Input>(op: &mut RequestOp, buf: &mut B, depth: usize) -> Result<(), TxnDecodeError> {
    while buf.has_remaining() {
        let (tag, wire_type) = decode_key(buf)?;
        if (tag, wire_type) != (4, WireType::LengthDelimited) {
            merge_other_field(op, tag, wire_type, buf)?;
            continue;
        }
        // A repeated message field merges into the one before, as prost does.
        let mut nested = match op.request.take() {
            Some(request_op::Request::RequestTxn(txn)) => txn,
            _ => TxnRequest::default(),
        };
        merge_txn(&mut nested, &mut sub_message(buf)?, depth + 1)?;
        op.request = Some(request_op::Request::RequestTxn(nested));
    }
    Ok(())
}

/// A `TxnRequest` off the wire.
pub fn decode_txn_request(mut buf: Bytes) -> Result<TxnRequest, TxnDecodeError> {
    let mut txn = TxnRequest::default();
    merge_txn(&mut txn, &mut buf, 1)?;
    Ok(txn)
}

/// The field of `InternalRaftRequest` that holds a txn.
const INTERNAL_TXN_FIELD: u32 = 6;

/// A raft entry's payload.
pub fn decode_internal_raft_request(mut buf: &[u8]) -> Result<InternalRaftRequest, TxnDecodeError> {
    let mut request = InternalRaftRequest::default();
    while buf.has_remaining() {
        let (tag, wire_type) = decode_key(&mut buf)?;
        if (tag, wire_type) != (INTERNAL_TXN_FIELD, WireType::LengthDelimited) {
            request.merge_field(tag, wire_type, &mut buf, DecodeContext::default())?;
            continue;
        }
        let mut txn = request.txn.take().unwrap_or_default();
        merge_txn(&mut txn, &mut sub_message(&mut buf)?, 1)?;
        request.txn = Some(txn);
    }
    Ok(request)
}

/// The status a refused txn gets: etcd's ErrGRPCTooManyOps for one nested
/// too deep (etcd's budget refuses it too), prost's wording otherwise.
fn txn_status(e: TxnDecodeError) -> Status {
    match e {
        TxnDecodeError::TooDeep => Status::invalid_argument(crate::rpctypes::TOO_MANY_OPS.message),
        TxnDecodeError::Malformed(m) => {
            Status::internal(format!("failed to decode Protobuf message: {m}"))
        }
    }
}

/// prost's gRPC codec, with `TxnRequest` decoded by [`decode_txn_request`].
#[derive(Debug, Clone)]
pub struct EtcdCodec<T, U>(PhantomData<(T, U)>);

impl<T, U> Default for EtcdCodec<T, U> {
    fn default() -> Self {
        EtcdCodec(PhantomData)
    }
}

impl<T, U> Codec for EtcdCodec<T, U>
where
    T: Message + Send + 'static,
    U: Message + Default + Send + 'static,
{
    type Encode = T;
    type Decode = U;
    type Encoder = ProstEncoder<T>;
    type Decoder = EtcdDecoder<U>;

    fn encoder(&mut self) -> Self::Encoder {
        ProstEncoder::default()
    }

    fn decoder(&mut self) -> Self::Decoder {
        EtcdDecoder(ProstDecoder::default())
    }
}

/// Decodes one request as the gRPC services receive it: prost's decoder,
/// but a TxnRequest with [`decode_txn_request`] (its own depth limit, not
/// prost's 100 levels). For what hands requests to the services from
/// elsewhere (the JSON gateway).
pub fn decode_request<U: Message + Default + 'static>(bytes: Bytes) -> Result<U, Status> {
    if TypeId::of::<U>() != TypeId::of::<TxnRequest>() {
        return U::decode(bytes).map_err(|e| Status::internal(e.to_string()));
    }
    let txn: Box<dyn Any> = Box::new(decode_txn_request(bytes).map_err(txn_status)?);
    match txn.downcast::<U>() {
        Ok(item) => Ok(*item),
        Err(_) => unreachable!("U is TxnRequest: its TypeId matched"),
    }
}

/// See [`EtcdCodec`].
#[derive(Debug, Clone)]
pub struct EtcdDecoder<U>(ProstDecoder<U>);

impl<U: Message + Default + 'static> Decoder for EtcdDecoder<U> {
    type Item = U;
    type Error = Status;

    fn decode(&mut self, buf: &mut DecodeBuf<'_>) -> Result<Option<U>, Status> {
        if TypeId::of::<U>() != TypeId::of::<TxnRequest>() {
            return self.0.decode(buf);
        }
        decode_request(buf.copy_to_bytes(buf.remaining())).map(Some)
    }

    fn buffer_settings(&self) -> tonic::codec::BufferSettings {
        self.0.buffer_settings()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::etcdserverpb::{compare, Compare, PutRequest, RangeRequest};

    /// A txn `depth` levels deep, one op per level around an empty txn,
    /// with a compare, a put and a range at the top.
    pub(crate) fn chain(depth: usize) -> TxnRequest {
        let mut txn = TxnRequest::default();
        for _ in 1..depth {
            txn = TxnRequest {
                success: vec![RequestOp {
                    request: Some(request_op::Request::RequestTxn(txn)),
                }],
                ..Default::default()
            };
        }
        txn.compare.push(Compare {
            key: "k".into(),
            target_union: Some(compare::TargetUnion::Version(3)),
            ..Default::default()
        });
        txn.failure.push(RequestOp {
            request: Some(request_op::Request::RequestPut(PutRequest {
                key: "k".into(),
                value: "v".into(),
                ..Default::default()
            })),
        });
        txn.failure.push(RequestOp {
            request: Some(request_op::Request::RequestRange(RangeRequest {
                key: "a".into(),
                ..Default::default()
            })),
        });
        txn
    }

    fn depth(txn: &TxnRequest) -> usize {
        let mut depth = 1;
        let mut level = txn;
        while let Some(request_op::Request::RequestTxn(next)) =
            level.success.first().and_then(|op| op.request.as_ref())
        {
            depth += 1;
            level = next;
        }
        depth
    }

    /// Runs `f` on a thread with a request thread's stack.
    fn on_request_stack(f: impl FnOnce() + Send + 'static) {
        std::thread::Builder::new()
            .stack_size(REQUEST_THREAD_STACK_BYTES)
            .spawn(f)
            .unwrap()
            .join()
            .unwrap();
    }

    #[test]
    fn txn_chains_decode_far_past_prosts_recursion_limit() {
        on_request_stack(txn_chains_decode);
    }

    fn txn_chains_decode() {
        for levels in [1, 2, 51, 52, 129, 130, MAX_TXN_DEPTH] {
            let txn = chain(levels);
            let bytes = Bytes::from(txn.encode_to_vec());
            // prost alone: 100 nested messages below the top, two a level
            if levels <= 51 {
                assert_eq!(TxnRequest::decode(bytes.clone()).unwrap(), txn);
            } else {
                assert!(
                    TxnRequest::decode(bytes.clone()).is_err(),
                    "prost alone stops at 51 levels"
                );
            }
            let decoded = decode_txn_request(bytes).unwrap();
            assert_eq!(depth(&decoded), levels);
            assert_eq!(decoded, txn);
            let entry = InternalRaftRequest {
                id: 7,
                txn: Some(txn),
                ..Default::default()
            };
            assert_eq!(
                decode_internal_raft_request(&entry.encode_to_vec()).unwrap(),
                entry
            );
        }
    }

    #[test]
    fn txn_deeper_than_the_limit_is_refused_as_too_many_ops() {
        on_request_stack(|| {
            let bytes = Bytes::from(chain(MAX_TXN_DEPTH + 1).encode_to_vec());
            assert_eq!(decode_txn_request(bytes), Err(TxnDecodeError::TooDeep));
        });
        let status = txn_status(TxnDecodeError::TooDeep);
        assert_eq!(status.code(), tonic::Code::InvalidArgument);
        assert_eq!(
            status.message(),
            "etcdserver: too many operations in txn request"
        );
    }

    #[test]
    fn malformed_txn_bytes_are_an_error_not_a_panic() {
        let good = chain(3).encode_to_vec();
        for cut in 0..good.len() {
            let _ = decode_txn_request(Bytes::copy_from_slice(&good[..cut]));
            let _ = decode_internal_raft_request(&good[..cut]);
        }
        // A length past the end, a wrong wire type for success, and deeply
        // nested unknown groups (prost's limit still applies to those).
        assert!(decode_txn_request(Bytes::from_static(&[0x12, 0x05, 0x00])).is_err());
        assert!(decode_txn_request(Bytes::from_static(&[0x10, 0x01])).is_err());
        let mut groups = vec![0x3b_u8; 100_000]; // field 7, start group
        groups.extend(std::iter::repeat_n(0x3c_u8, 100_000));
        assert!(decode_txn_request(Bytes::from(groups.clone())).is_err());
        assert!(decode_internal_raft_request(&groups).is_err());
    }
}
