//! The etcd v3 wire API: generated message types and gRPC services, plus the
//! etcd error codes and messages every client-visible failure must carry.
//!
//! Owns: the protobuf types (package names, message names and field numbers
//! are facts of etcd's wire format) and `rpctypes`. Never: business logic.

#![allow(clippy::all)]

pub mod mvccpb {
    tonic::include_proto!("mvccpb");
}
pub mod authpb {
    tonic::include_proto!("authpb");
}
pub mod etcdserverpb {
    tonic::include_proto!("etcdserverpb");
}
pub mod v3electionpb {
    tonic::include_proto!("v3electionpb");
}
pub mod v3lockpb {
    tonic::include_proto!("v3lockpb");
}
pub mod leasepb {
    tonic::include_proto!("leasepb");
}
pub mod codec;
pub mod rpctypes;

/// The encoded `FileDescriptorSet` of every message above (with their
/// dependencies): the map by which a message can be walked field by field
/// without code of its own (the JSON gateway).
pub const FILE_DESCRIPTOR_SET: &[u8] =
    include_bytes!(concat!(env!("OUT_DIR"), "/file_descriptor_set.bin"));
pub mod oxcdauthpb {
    tonic::include_proto!("oxcdauthpb");
}
pub mod oxcdpeerpb {
    tonic::include_proto!("oxcdpeerpb");
}
