//! Generates the etcd v3 API types and gRPC services from proto/ with protox,
//! so that a fresh machine needs no system protoc.
use std::path::PathBuf;

const PROTOS: &[&str] = &[
    "etcd/api/mvccpb/kv.proto",
    "etcd/api/authpb/auth.proto",
    "etcd/api/etcdserverpb/rpc.proto",
    "etcd/server/etcdserver/api/v3election/v3electionpb/v3election.proto",
    "etcd/server/etcdserver/api/v3lock/v3lockpb/v3lock.proto",
    "oxcd/raft_internal.proto",
    "oxcd/peer.proto",
    "oxcd/lease.proto",
    "oxcd/auth_store.proto",
];

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../proto");
    let files: Vec<PathBuf> = PROTOS.iter().map(|p| root.join(p)).collect();
    for f in &files {
        println!("cargo:rerun-if-changed={}", f.display());
    }
    let descriptors = protox::compile(&files, [&root])?;
    // The descriptors themselves, for what maps messages by them (the JSON
    // gateway): `api::FILE_DESCRIPTOR_SET`.
    let out = PathBuf::from(std::env::var("OUT_DIR")?);
    std::fs::write(
        out.join("file_descriptor_set.bin"),
        prost::Message::encode_to_vec(&descriptors),
    )?;
    let mut config = tonic_prost_build::Config::new();
    // `prost::Name` on every message: its full name finds its descriptor.
    config.enable_type_names();
    tonic_prost_build::configure()
        .bytes(".")
        // prost's codec, but a TxnRequest decoded without its depth limit (src/codec.rs)
        .codec_path("crate::codec::EtcdCodec")
        .compile_fds_with_config(descriptors, config)?;
    Ok(())
}
