//! [`LeaderContact`]: how long this member has gone without a leader it
//! hears from, for etcd's require-leader: a watch stream that asked for it
//! (gRPC metadata `hasleader: true`, as etcd's `WithRequireLeader` and its
//! grpc-proxy send) is ended with `no_leader` once that is longer than
//! [`CellNode::require_leader_after`](crate::node::CellNode), so a proxy
//! moves its watches to a member that still follows the cell instead of
//! waiting on one cut off from it (proxy review P2).
//!
//! A follower counts the leader as heard when it accepts the leader's
//! AppendEntries (heartbeats included) or a snapshot chunk; openraft 0.9
//! reports no such time for followers, so the peer server records it. A
//! leader counts its own quorum's acknowledgements.

use super::leadership::leads;
use super::{Member, NodeId};
use openraft::RaftMetrics;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;
use tokio::time::Instant;

pub struct LeaderContact {
    born: Instant,
    /// When a leader was last heard, in milliseconds since `born`.
    heard_ms: AtomicU64,
}

impl Default for LeaderContact {
    fn default() -> Self {
        LeaderContact {
            born: Instant::now(),
            heard_ms: AtomicU64::new(0),
        }
    }
}

impl LeaderContact {
    /// The leader was heard just now.
    pub fn heard(&self) {
        let now = self.born.elapsed().as_millis() as u64;
        self.heard_ms.fetch_max(now, Ordering::Relaxed);
    }

    /// How long member `id`, whose Raft state is `m`, has gone without a
    /// leader: for the leader, since a quorum last acknowledged it (zero
    /// when just elected or alone); for anyone else, since it last heard
    /// a leader (or since it started, if it never has).
    pub fn silence(&self, m: &RaftMetrics<NodeId, Member>, id: NodeId) -> Duration {
        if leads(m, id) {
            return Duration::from_millis(m.millis_since_quorum_ack.unwrap_or(0));
        }
        let heard = Duration::from_millis(self.heard_ms.load(Ordering::Relaxed));
        self.born.elapsed().saturating_sub(heard)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_follower_counts_silence_from_the_last_time_it_heard_a_leader() {
        let contact = LeaderContact::default();
        let follower = RaftMetrics::<NodeId, Member>::new_initial(2);
        tokio::time::advance(Duration::from_millis(700)).await;
        assert_eq!(contact.silence(&follower, 2), Duration::from_millis(700));
        contact.heard();
        assert_eq!(contact.silence(&follower, 2), Duration::ZERO);
        tokio::time::advance(Duration::from_millis(300)).await;
        assert_eq!(contact.silence(&follower, 2), Duration::from_millis(300));
    }
}
