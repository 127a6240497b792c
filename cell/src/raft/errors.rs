//! The one map from openraft's errors to the API's errors.
//!
//! For a read-index round, openraft's "not the leader" (`ForwardToLeader`)
//! is safe to retry elsewhere; for a proposal it is not (see
//! [`client_write`]). A `Fatal` error means Raft on this member has
//! stopped, which is a fault of this member.

use super::{Member, NodeId};
use latchkey_shared::{ApiError, MemberId};
use openraft::error::{
    ChangeMembershipError, CheckIsLeaderError, ClientWriteError, ForwardToLeader, RaftError,
};

fn not_leader(f: &ForwardToLeader<NodeId, Member>) -> ApiError {
    ApiError::not_leader(f.leader_id)
}

/// Raft on this member has stopped: nothing it answers can be trusted.
pub fn fatal(e: impl std::fmt::Display) -> ApiError {
    ApiError::member_stopped(format!("raft stopped: {e}"))
}

/// A proposal's failure. openraft answers `ForwardToLeader` both when
/// this member did not lead as the proposal arrived (nothing appended) and
/// when a new leader truncated the appended entry, which may still commit
/// elsewhere (cell review S4: with five voters the truncated entry can
/// commit after all, and a resent copy would apply twice). The two cannot
/// be told apart, so a write that met a leader change has an unknown
/// outcome, as etcd's "leader changed" has.
pub fn client_write(e: RaftError<NodeId, ClientWriteError<NodeId, Member>>) -> ApiError {
    match e {
        RaftError::APIError(ClientWriteError::ForwardToLeader(f)) => {
            ApiError::write_outcome_unknown(format!(
                "leadership moved to {:?} while the write was in flight; it may or may not \
                 have been applied",
                f.leader_id
            ))
        }
        RaftError::APIError(ClientWriteError::ChangeMembershipError(c)) => match c {
            ChangeMembershipError::InProgress(_) => {
                ApiError::unavailable("another membership change is in progress; retry")
            }
            ChangeMembershipError::EmptyMembership(_) => {
                ApiError::invalid("the cell must keep at least one voting member")
            }
            ChangeMembershipError::LearnerNotFound(e) => {
                ApiError::member_not_found(MemberId(e.node_id))
            }
        },
        RaftError::Fatal(e) => fatal(e),
    }
}

pub fn check_is_leader(e: RaftError<NodeId, CheckIsLeaderError<NodeId, Member>>) -> ApiError {
    match e {
        RaftError::APIError(CheckIsLeaderError::ForwardToLeader(f)) => not_leader(&f),
        // The leader could not reach a quorum in time: nothing happened.
        RaftError::APIError(e @ CheckIsLeaderError::QuorumNotEnough(_)) => {
            ApiError::unavailable(e.to_string())
        }
        RaftError::Fatal(e) => fatal(e),
    }
}
