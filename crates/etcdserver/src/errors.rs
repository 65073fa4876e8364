//! The one place where internal errors become etcd's client-visible errors.

use api::rpctypes::{self, EtcdError};

pub fn from_mvcc(e: &mvcc::MvccError) -> EtcdError {
    match e {
        mvcc::MvccError::Compacted => rpctypes::COMPACTED,
        mvcc::MvccError::FutureRev => rpctypes::FUTURE_REV,
        mvcc::MvccError::KeyNotFound => rpctypes::KEY_NOT_FOUND,
        mvcc::MvccError::LeaseNotFound => rpctypes::LEASE_NOT_FOUND,
        other => {
            tracing::error!(error = %other, "backend failure");
            rpctypes::CORRUPT
        }
    }
}

pub fn from_consensus(e: &consensus::ConsensusError) -> EtcdError {
    match e {
        consensus::ConsensusError::NoLeader => rpctypes::NO_LEADER,
        consensus::ConsensusError::Stopped => rpctypes::STOPPED,
        consensus::ConsensusError::ProposalDropped => rpctypes::TIMEOUT,
        consensus::ConsensusError::LeaderChanged => rpctypes::LEADER_CHANGED,
        consensus::ConsensusError::Timeout => rpctypes::TIMEOUT,
        other => {
            tracing::error!(error = %other, "consensus failure");
            rpctypes::STOPPED
        }
    }
}
