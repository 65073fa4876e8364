//! The cluster's members as this member knows them (etcd's RaftCluster).
//! Their records and IDs: `schema::members`.
//!
//! It changes only as committed entries say, in log order: the bootstrap
//! list, conf changes (add, remove, promote, peer URL update) and the
//! attributes a member publishes. The raft thread applies the same conf
//! changes to raft's configuration, and hands a change raft refused to
//! apply as an empty entry, so the two never disagree. Removed IDs are
//! kept forever: such a member never joins again.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::OnceLock;

use parking_lot::RwLock;
pub(crate) use schema::members::Member;

/// A change of the member list, for whoever follows it (the peer
/// transport, the member's own lifecycle).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MembershipChange {
    /// A member was added, or its peer URLs or role changed.
    Upserted(Member),
    Removed(u64),
    /// The whole list was replaced (a snapshot was installed).
    Replaced {
        members: Vec<Member>,
        removed: Vec<u64>,
    },
}

type Observer = Box<dyn Fn(&MembershipChange) + Send + Sync>;

#[derive(Default)]
struct State {
    members: BTreeMap<u64, Member>,
    removed: BTreeSet<u64>,
}

/// The cluster's members as this member knows them: bootstrapped from
/// `--initial-cluster` (or the running cluster when joining), kept in the
/// backend's members tables, and changed by committed entries.
pub struct ClusterMembers {
    state: RwLock<State>,
    observer: OnceLock<Observer>,
}

/// What applying a conf change did to the member list.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum ConfOutcome {
    Added(Member),
    Promoted(Member),
    Updated(Member),
    Removed(u64),
    /// The change names a member this list cannot take (an ID removed
    /// before): raft's configuration took it, the list keeps the ID out.
    Ignored,
}

impl ClusterMembers {
    pub fn new(members: Vec<Member>) -> ClusterMembers {
        ClusterMembers::with_removed(members, Vec::new())
    }

    pub fn with_removed(members: Vec<Member>, removed: Vec<u64>) -> ClusterMembers {
        ClusterMembers {
            state: RwLock::new(State {
                members: members.into_iter().map(|m| (m.id, m)).collect(),
                removed: removed.into_iter().collect(),
            }),
            observer: OnceLock::new(),
        }
    }

    /// Calls `observer` after every change (once set; later calls are
    /// ignored). It runs on the apply side: it must not block.
    pub fn observe(&self, observer: Observer) {
        let _ = self.observer.set(observer);
    }

    fn notify(&self, change: MembershipChange) {
        if let Some(observer) = self.observer.get() {
            observer(&change);
        }
    }

    /// Replaces the whole list (a snapshot installed from the leader). An
    /// empty list leaves the current one: a snapshot always has members.
    pub(crate) fn replace(&self, members: Vec<Member>, removed: Vec<u64>) {
        if members.is_empty() {
            return;
        }
        {
            let mut state = self.state.write();
            state.members = members.iter().cloned().map(|m| (m.id, m)).collect();
            state.removed = removed.iter().copied().collect();
        }
        self.notify(MembershipChange::Replaced { members, removed });
    }

    /// Every member, ordered by ID (as etcd lists them).
    pub fn list(&self) -> Vec<Member> {
        self.state.read().members.values().cloned().collect()
    }

    pub fn get(&self, id: u64) -> Option<Member> {
        self.state.read().members.get(&id).cloned()
    }

    /// Whether `id` was removed from the cluster (it never comes back).
    pub fn is_removed(&self, id: u64) -> bool {
        self.state.read().removed.contains(&id)
    }

    pub fn removed(&self) -> Vec<u64> {
        self.state.read().removed.iter().copied().collect()
    }

    /// The voting members' IDs.
    pub fn voters(&self) -> Vec<u64> {
        let state = self.state.read();
        state
            .members
            .values()
            .filter(|m| !m.is_learner)
            .map(|m| m.id)
            .collect()
    }

    /// Applies a published name and client URLs; returns the updated
    /// member, or None for a member this cluster does not have.
    pub(crate) fn set_attributes(
        &self,
        id: u64,
        name: &str,
        client_urls: &[String],
    ) -> Option<Member> {
        let mut state = self.state.write();
        let m = state.members.get_mut(&id)?;
        m.name = name.to_string();
        m.client_urls = client_urls.to_vec();
        Some(m.clone())
    }

    /// Adds a member, or for a member already there: promotes a learner
    /// the change makes a voter, else takes the change's peer URLs (a
    /// MemberUpdate). `proposed` is the member the change carries (None:
    /// a change with no context, as `--force-new-cluster` writes).
    pub(crate) fn apply_add(
        &self,
        id: u64,
        as_learner: bool,
        proposed: Option<Member>,
    ) -> ConfOutcome {
        let outcome = {
            let mut state = self.state.write();
            if state.removed.contains(&id) {
                return ConfOutcome::Ignored;
            }
            match state.members.get_mut(&id) {
                Some(existing) if existing.is_learner && !as_learner => {
                    existing.is_learner = false;
                    ConfOutcome::Promoted(existing.clone())
                }
                Some(existing) => {
                    if let Some(p) = proposed.filter(|p| !p.peer_urls.is_empty()) {
                        existing.peer_urls = p.peer_urls;
                    }
                    ConfOutcome::Updated(existing.clone())
                }
                None => {
                    let mut member = proposed.unwrap_or(Member {
                        id,
                        name: String::new(),
                        peer_urls: Vec::new(),
                        client_urls: Vec::new(),
                        is_learner: as_learner,
                    });
                    member.id = id;
                    member.is_learner = as_learner;
                    state.members.insert(id, member.clone());
                    ConfOutcome::Added(member)
                }
            }
        };
        match &outcome {
            ConfOutcome::Added(m) | ConfOutcome::Promoted(m) | ConfOutcome::Updated(m) => {
                self.notify(MembershipChange::Upserted(m.clone()))
            }
            ConfOutcome::Removed(_) | ConfOutcome::Ignored => {}
        }
        outcome
    }

    /// Removes a member for good.
    pub(crate) fn apply_remove(&self, id: u64) -> ConfOutcome {
        {
            let mut state = self.state.write();
            state.members.remove(&id);
            state.removed.insert(id);
        }
        self.notify(MembershipChange::Removed(id));
        ConfOutcome::Removed(id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn member(id: u64, url: &str, is_learner: bool) -> Member {
        Member {
            id,
            name: String::new(),
            peer_urls: vec![url.to_string()],
            client_urls: Vec::new(),
            is_learner,
        }
    }

    #[test]
    fn conf_changes_add_promote_update_and_remove_for_good() {
        let members = ClusterMembers::new(vec![member(1, "http://a:1", false)]);
        let seen = std::sync::Arc::new(parking_lot::Mutex::new(Vec::new()));
        let log = seen.clone();
        members.observe(Box::new(move |c| log.lock().push(c.clone())));

        let added = members.apply_add(2, true, Some(member(2, "http://b:1", true)));
        assert_eq!(added, ConfOutcome::Added(member(2, "http://b:1", true)));
        // the same change again (a learner re-added with new URLs): an update
        let updated = members.apply_add(2, true, Some(member(2, "http://c:1", true)));
        assert_eq!(updated, ConfOutcome::Updated(member(2, "http://c:1", true)));
        let promoted = members.apply_add(2, false, None);
        assert_eq!(
            promoted,
            ConfOutcome::Promoted(member(2, "http://c:1", false))
        );
        assert_eq!(members.voters(), [1, 2]);

        assert_eq!(members.apply_remove(2), ConfOutcome::Removed(2));
        assert!(members.is_removed(2) && members.get(2).is_none());
        assert_eq!(
            members.apply_add(2, false, Some(member(2, "http://b:1", false))),
            ConfOutcome::Ignored
        );
        assert_eq!(seen.lock().len(), 4, "{:?}", seen.lock());
    }
}
