//! What members ask each other besides Raft: a request only the leader may
//! serve, forwarded by the member that received it, and its reply. Both
//! travel bincode-encoded in the `Forward` RPC of `proto/peer.proto`.

use crate::lease::leader_leases::LeaseTtl;
use crate::raft::command::{Request, Response};
use crate::raft::NodeId;
use latchkey_shared::{ApiError, ErrorCode, Retry};
use serde::{Deserialize, Serialize};
use std::future::Future;

/// A request a follower sends to the leader. The wire carries a variant
/// by its position: add new ones at the end (a test pins every position).
#[derive(Debug, Serialize, Deserialize)]
pub enum Forward {
    Write(Request),
    ReadIndex,
    KeepAlive {
        id: i64,
    },
    /// Many leases refreshed at once (the sessions extension).
    RefreshBatch {
        ids: Vec<i64>,
    },
    TimeToLive {
        id: i64,
    },
    Membership(MembershipChange),
    MoveLeader {
        target: NodeId,
    },
    /// Sent to one member (not the leader): start an election now.
    Campaign,
    /// Sent to any member: the membership it has committed. A member that
    /// stops hearing from a leader asks, to learn whether it was removed.
    CommittedMembership,
    /// Writes that arrived at a follower together, forwarded in one
    /// message (each answered on its own, in order).
    Writes(Vec<Request>),
}

impl Forward {
    /// Whether serving this twice is the same as serving it once. Only
    /// such a request is resent when its first attempt may have arrived.
    pub fn is_idempotent(&self) -> bool {
        !matches!(
            self,
            Forward::Write(_) | Forward::Writes(_) | Forward::Membership(_)
        )
    }

    /// Whether this request, having failed with `e`, may be sent again (to
    /// whoever leads by then). Served here, only when leadership moved
    /// (`not_leader`); any other failure here is this member's answer.
    /// Sent to another member: when nothing happened, or when it may have
    /// been served but serving it twice is harmless and what broke was the
    /// way there, not the member (a stopped member or a timeout is an
    /// answer in itself).
    pub fn may_resend_after(&self, e: &ApiError, served_here: bool) -> bool {
        if served_here {
            return e.code == ErrorCode::NotLeader;
        }
        match e.retry() {
            Retry::Safe => true,
            Retry::OutcomeUnknown => {
                self.is_idempotent() && e.code == ErrorCode::WriteOutcomeUnknown
            }
            Retry::Never => false,
        }
    }
}

#[derive(Debug, Serialize, Deserialize)]
pub enum ForwardReply {
    /// A write's answer and the log index it was applied at: the member
    /// that forwarded it answers its client only once it has applied that
    /// index too, so the client reads its own write there (as etcd answers
    /// a write on the member that received it).
    Written {
        index: u64,
        response: Response,
    },
    ReadIndex(u64),
    KeepAlive {
        ttl: i64,
    },
    /// Per requested id: its TTL, or -1 if it does not exist.
    Refreshed {
        ttls: Vec<i64>,
    },
    TimeToLive(LeaseTtl),
    Done,
    /// The responder's committed membership: the log index it was
    /// committed at and every member in it (voters and learners).
    Membership {
        index: Option<u64>,
        members: Vec<NodeId>,
    },
    /// [`Forward::Writes`]' answers: per write, what `Written` carries or
    /// its error.
    WrittenMany(Vec<Result<(u64, Response), ApiError>>),
}

/// A change of the cell's membership (etcd's Cluster service).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum MembershipChange {
    Add {
        id: NodeId,
        peer_addr: String,
        learner: bool,
    },
    Promote {
        id: NodeId,
    },
    Remove {
        id: NodeId,
    },
    Update {
        id: NodeId,
        peer_addr: String,
    },
}
/// Whoever serves forwarded requests on this member (the node). The peer
/// server sits below it and reaches it only through this trait.
pub trait ForwardHandler: Send + Sync + 'static {
    fn serve_forwarded<'a>(
        &'a self,
        req: &'a Forward,
    ) -> impl Future<Output = Result<ForwardReply, ApiError>> + Send + 'a;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::raft::errors::{check_is_leader, client_write};
    use crate::raft::Member;
    use crate::storage::codec::variant_position as position;
    use openraft::error::{CheckIsLeaderError, ClientWriteError, ForwardToLeader, RaftError};

    /// S4 (cell review): a proposal answered "not leader" after a new
    /// leader truncated its entry was resent, and with five voters the
    /// truncated entry could still commit: the write applied twice. A
    /// write that met a leader change now has an unknown outcome and is
    /// never resent; a read-index round that met one is (nothing happened).
    #[test]
    fn s4_a_write_that_met_a_leader_change_is_never_resent() {
        let moved = || {
            ForwardToLeader::new(
                2,
                Member {
                    peer_addr: "127.0.0.1:2".into(),
                },
            )
        };
        let write = client_write(RaftError::APIError(ClientWriteError::ForwardToLeader(
            moved(),
        )));
        assert_eq!(write.code, ErrorCode::WriteOutcomeUnknown);
        let put = Forward::Write(Request::Compact { revision: 1 });
        assert!(!put.may_resend_after(&write, true), "served here");
        assert!(!put.may_resend_after(&write, false), "forwarded");
        let read = check_is_leader(RaftError::APIError(CheckIsLeaderError::ForwardToLeader(
            moved(),
        )));
        assert_eq!(read.code, ErrorCode::NotLeader);
        assert!(Forward::ReadIndex.may_resend_after(&read, true));
    }

    #[test]
    fn forwarded_requests_and_replies_keep_their_wire_positions() {
        let requests = [
            (Forward::Write(Request::Compact { revision: 1 }), 0),
            (Forward::ReadIndex, 1),
            (Forward::KeepAlive { id: 1 }, 2),
            (Forward::RefreshBatch { ids: vec![] }, 3),
            (Forward::TimeToLive { id: 1 }, 4),
            (Forward::Membership(MembershipChange::Promote { id: 1 }), 5),
            (Forward::MoveLeader { target: 1 }, 6),
            (Forward::Campaign, 7),
            (Forward::CommittedMembership, 8),
            (Forward::Writes(vec![]), 9),
        ];
        for (request, want) in requests {
            assert_eq!(position(&request), want, "{request:?}");
        }
        let changes = [
            (
                MembershipChange::Add {
                    id: 1,
                    peer_addr: String::new(),
                    learner: true,
                },
                0,
            ),
            (MembershipChange::Promote { id: 1 }, 1),
            (MembershipChange::Remove { id: 1 }, 2),
            (
                MembershipChange::Update {
                    id: 1,
                    peer_addr: String::new(),
                },
                3,
            ),
        ];
        for (change, want) in changes {
            assert_eq!(position(&change), want, "{change:?}");
        }
        let replies = [
            (
                ForwardReply::Written {
                    index: 1,
                    response: Response {
                        revision: 1,
                        result: Ok(crate::raft::command::Reply::None),
                    },
                },
                0,
            ),
            (ForwardReply::ReadIndex(1), 1),
            (ForwardReply::KeepAlive { ttl: 1 }, 2),
            (ForwardReply::Refreshed { ttls: vec![] }, 3),
            (ForwardReply::Done, 5),
            (
                ForwardReply::Membership {
                    index: None,
                    members: vec![],
                },
                6,
            ),
            (ForwardReply::WrittenMany(vec![]), 7),
        ];
        for (reply, want) in replies {
            assert_eq!(position(&reply), want, "{reply:?}");
        }
    }
}
