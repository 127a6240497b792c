//! Check-quorum, which openraft 0.9 lacks: a leader that has not heard
//! from a quorum for the quorum timeout (`Resolved::quorum_timeout`, a few
//! election timeouts) no longer counts as leading here.
//! By then the others may have elected a new leader, which can expire
//! leases and commit writes; this member must not grant time or answer as
//! leader (readiness included) until it hears from a quorum again or learns
//! of the new term.

use super::{Member, NodeId, Raft};
use openraft::{RaftMetrics, ServerState};
use std::time::Duration;

/// Whether `m` shows member `id` leading, as openraft sees it (quorum or
/// not).
pub fn leads(m: &RaftMetrics<NodeId, Member>, id: NodeId) -> bool {
    m.state == ServerState::Leader && m.current_leader == Some(id)
}

/// Whether `m` shows member `id` as a leader that has heard from no quorum
/// for longer than `quorum_timeout`. A leader just elected, not yet acked
/// by anyone, has lost nothing.
pub fn quorum_lost(m: &RaftMetrics<NodeId, Member>, id: NodeId, quorum_timeout: Duration) -> bool {
    m.state == ServerState::Leader
        && m.current_leader == Some(id)
        && m.millis_since_quorum_ack
            .is_some_and(|ms| u128::from(ms) > quorum_timeout.as_millis())
}

/// Whether `m` shows member `id` leading, its quorum not lost.
pub fn leads_with_quorum(
    m: &RaftMetrics<NodeId, Member>,
    id: NodeId,
    quorum_timeout: Duration,
) -> bool {
    leads(m, id) && !quorum_lost(m, id, quorum_timeout)
}

/// Keeps this member from campaigning while it lives: the old leader
/// during a leader transfer. Not nested with the other hold, a follower's
/// while it receives a snapshot (`super::snapshot_receipt`): the two never
/// overlap on one member (a leader receives no snapshot), and if they did,
/// the first to end would let the member campaign again, which costs only
/// time.
pub struct SitOutElections(Raft);

impl SitOutElections {
    pub fn new(raft: &Raft) -> Self {
        raft.runtime_config().elect(false);
        SitOutElections(raft.clone())
    }
}

impl Drop for SitOutElections {
    fn drop(&mut self) {
        self.0.runtime_config().elect(true);
    }
}
