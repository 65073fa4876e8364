//! Leases: the `lease` table's records (etcd's leasepb.Lease message).

use api::leasepb::Lease;
use prost::Message;

/// A lease as the table stores it: its ID, TTL and the remaining TTL of its
/// last checkpoint (0: none).
pub fn encode(id: i64, ttl: i64, remaining_ttl: i64) -> Vec<u8> {
    Lease {
        id,
        ttl,
        remaining_ttl,
    }
    .encode_to_vec()
}

pub fn decode(record: &[u8]) -> Result<Lease, prost::DecodeError> {
    Lease::decode(record)
}
