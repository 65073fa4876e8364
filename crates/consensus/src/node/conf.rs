//! Which membership (ConfState) was in force from which index: a snapshot
//! records the one in force at its index. No I/O.

use raft::eraftpb::ConfState;

/// (index, conf state in force from that index), oldest first; the first
/// element is at or below the last snapshot.
pub(super) struct ConfHistory {
    changes: Vec<(u64, ConfState)>,
}

impl ConfHistory {
    /// Starting from the conf state in force at `index` (a snapshot's).
    pub(super) fn new(index: u64, conf: ConfState) -> ConfHistory {
        ConfHistory {
            changes: vec![(index, conf)],
        }
    }

    /// A conf change applied at `index`.
    pub(super) fn push(&mut self, index: u64, conf: ConfState) {
        self.changes.push((index, conf));
    }

    /// The conf state in force at `index`.
    pub(super) fn at(&self, index: u64) -> ConfState {
        self.changes
            .iter()
            .rev()
            .find(|(i, _)| *i <= index)
            .map(|(_, cs)| cs.clone())
            .unwrap_or_default()
    }

    /// A snapshot at `index` was taken: what came before it is no longer
    /// asked for (the state in force at it is kept).
    pub(super) fn release_below(&mut self, index: u64) {
        let keep_from = self
            .changes
            .iter()
            .rposition(|(i, _)| *i <= index)
            .unwrap_or(0);
        self.changes.drain(..keep_from);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn voters(ids: &[u64]) -> ConfState {
        ConfState {
            voters: ids.to_vec(),
            ..Default::default()
        }
    }

    #[test]
    fn the_conf_in_force_at_an_index_survives_releasing_what_came_before() {
        let mut history = ConfHistory::new(10, voters(&[1]));
        history.push(20, voters(&[1, 2]));
        history.push(30, voters(&[1, 2, 3]));
        assert_eq!(history.at(15).voters, [1]);
        assert_eq!(history.at(20).voters, [1, 2]);
        assert_eq!(history.at(99).voters, [1, 2, 3]);
        history.release_below(25);
        assert_eq!(
            history.at(25).voters,
            [1, 2],
            "the state in force at 25 is kept"
        );
        assert_eq!(history.at(31).voters, [1, 2, 3]);
    }
}
