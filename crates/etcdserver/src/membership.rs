//! The cluster's members as this member knows them (etcd's RaftCluster).
//! Their records and IDs: `schema::members`.

use std::collections::BTreeMap;

use parking_lot::RwLock;
pub(crate) use schema::members::Member;

/// The cluster's members as this member knows them: bootstrapped from
/// `--initial-cluster`, kept in the backend's members table, and updated
/// by the attributes each member publishes through raft when it starts.
pub struct ClusterMembers {
    members: RwLock<BTreeMap<u64, Member>>,
}

impl ClusterMembers {
    pub fn new(members: Vec<Member>) -> ClusterMembers {
        ClusterMembers {
            members: RwLock::new(members.into_iter().map(|m| (m.id, m)).collect()),
        }
    }

    /// Replaces the whole list (a snapshot installed from the leader). An
    /// empty list leaves the current one: a snapshot always has members.
    pub(crate) fn replace(&self, members: Vec<Member>) {
        if !members.is_empty() {
            *self.members.write() = members.into_iter().map(|m| (m.id, m)).collect();
        }
    }

    /// Every member, ordered by ID (as etcd lists them).
    pub fn list(&self) -> Vec<Member> {
        self.members.read().values().cloned().collect()
    }

    pub fn get(&self, id: u64) -> Option<Member> {
        self.members.read().get(&id).cloned()
    }

    /// Applies a published name and client URLs; returns the updated
    /// member, or None for a member this cluster does not have.
    pub(crate) fn set_attributes(
        &self,
        id: u64,
        name: &str,
        client_urls: &[String],
    ) -> Option<Member> {
        let mut members = self.members.write();
        let m = members.get_mut(&id)?;
        m.name = name.to_string();
        m.client_urls = client_urls.to_vec();
        Some(m.clone())
    }
}
