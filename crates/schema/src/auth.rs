//! Auth: the `auth` table's one record (key [`RECORD_KEY`]): the enabled
//! flag, the auth revision, and every user and role as etcd's own
//! `authpb.User` and `authpb.Role` messages (what etcd keeps in its `auth`,
//! `authUsers` and `authRoles` buckets).

use api::oxcdauthpb::AuthStore;
use prost::Message;

/// The key of the auth store's record in the `auth` side table.
pub const RECORD_KEY: u64 = 0;

pub fn encode(store: &AuthStore) -> Vec<u8> {
    store.encode_to_vec()
}

pub fn decode(record: &[u8]) -> Result<AuthStore, prost::DecodeError> {
    AuthStore::decode(record)
}
