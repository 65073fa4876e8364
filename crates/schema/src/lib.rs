//! The backend's records beside the key history, as etcd's
//! server/storage/schema and membership packages define them: how mvcc's
//! side tables (`members`, `alarm`, `lease`, `auth`) encode their records, how
//! member and cluster IDs are derived, and how a backend file is told from
//! others. Shared by the member and by the offline tools (oxctl), which must
//! not link the server.
//!
//! Never: I/O beyond reading a file's first bytes, state, networking.
//! mvcc stores these records as opaque bytes; only this crate knows them.

pub mod alarms;
pub mod auth;
pub mod backend_file;
pub mod etcd_buckets;
pub mod leases;
pub mod members;
