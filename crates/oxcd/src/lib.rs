//! oxcd's command line, as a library so that tests read it through the
//! code `main` uses: etcd's flags and `ETCD_*` variables ([`flags`]),
//! etcd's YAML config file ([`config_file`], read by `main`) and the
//! member's configuration they make ([`config`]), and `--discovery-srv`'s
//! initial cluster from DNS SRV records ([`discovery_srv`], asked through
//! the resolver `main` passes in). The binary (`main.rs`) adds logging,
//! signals and exit codes.
//!
//! Never: start anything, or read the process's arguments and environment
//! itself (they are passed in).

pub mod config;
pub mod config_file;
pub mod discovery_srv;
pub mod flags;

pub use config::{config_from, Config};
