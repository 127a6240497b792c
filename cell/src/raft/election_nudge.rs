//! A nudge for openraft 0.9's elections after a lagging member's campaign.
//!
//! Raft has a member that rejects a vote request for a shorter log still
//! adopt the candidate's higher term; openraft 0.9 does not. So when the
//! leader dies while one follower is an entry behind, the follower that
//! lags often campaigns first (term T) and is refused; the up-to-date one,
//! still at T-1, later campaigns at T too, and is refused because the
//! laggard voted for itself in T. It then waits a whole election timeout
//! (leader lease + timeout) before trying T+1, while the laggard, marked
//! as having seen a longer log, may take T+1 first. The safety suite
//! measured 3.5 s without writes after a leader SIGKILL this way (member
//! logs: T8, T9 refused, elected at T10).
//!
//! The nudge: a candidate refused by a member that is itself campaigning
//! (an uncommitted vote) in its term or later, with a shorter log than the
//! candidate's, campaigns again at once (after a little jitter): it has
//! adopted the refuser's term from the answer, so its next term wins that
//! vote. It does nothing when a leader is known by then.

use super::{NodeId, Raft};
use openraft::raft::{VoteRequest, VoteResponse};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

/// Shared by every peer connection of one member; the Raft handle is
/// attached once Raft runs.
#[derive(Clone, Default)]
pub struct ElectionNudge(Arc<OnceLock<Raft>>);

impl ElectionNudge {
    pub fn attach(&self, raft: Raft) {
        let _ = self.0.set(raft);
    }

    /// Called with each vote answer this member's candidacy received.
    pub fn after_vote(&self, req: &VoteRequest<NodeId>, resp: &VoteResponse<NodeId>) {
        if !worth_campaigning_again(req, resp) {
            return;
        }
        let Some(raft) = self.0.get().cloned() else {
            return;
        };
        let term = req.vote.leader_id().term;
        tokio::spawn(async move {
            // A few ms apart for members that would nudge at once.
            let jitter = 20 + u64::from(std::process::id() % 7) * 10;
            tokio::time::sleep(Duration::from_millis(jitter)).await;
            let m = raft.metrics().borrow().clone();
            if m.current_leader.is_some() || m.current_term > term + 1 {
                return;
            }
            tracing::info!(
                term,
                "campaigning again: refused by a member with a shorter log"
            );
            let _ = raft.trigger().elect().await;
        });
    }
}

/// Refused by a member that is campaigning itself (an uncommitted vote)
/// in the candidate's term or later and whose log is shorter: that member
/// can win nobody with a longer log, and the candidate can win it at a
/// higher term.
fn worth_campaigning_again(req: &VoteRequest<NodeId>, resp: &VoteResponse<NodeId>) -> bool {
    !resp.vote_granted
        && !resp.vote.is_committed()
        && resp.vote.leader_id().term >= req.vote.leader_id().term
        && resp.vote.leader_id().voted_for() != req.vote.leader_id().voted_for()
        && resp.last_log_id < req.last_log_id
}

#[cfg(test)]
mod tests {
    use super::*;
    use openraft::{CommittedLeaderId, LogId, Vote};

    fn log(term: u64, index: u64) -> Option<LogId<NodeId>> {
        Some(LogId::new(CommittedLeaderId::new(term, 0), index))
    }

    fn ask(term: u64, from: NodeId, last: Option<LogId<NodeId>>) -> VoteRequest<NodeId> {
        VoteRequest::new(Vote::new(term, from), last)
    }

    fn answer(
        vote: Vote<NodeId>,
        granted: bool,
        last: Option<LogId<NodeId>>,
    ) -> VoteResponse<NodeId> {
        VoteResponse::new(vote, last, granted)
    }

    #[test]
    fn a_candidate_refused_by_a_campaigning_member_with_a_shorter_log_tries_again() {
        // Member 2 (log 7-2353) asks for term 8; member 3 (log 7-2352)
        // already voted for itself in term 8.
        let req = ask(8, 2, log(7, 2353));
        assert!(worth_campaigning_again(
            &req,
            &answer(Vote::new(8, 3), false, log(7, 2352))
        ));
        // Not when the refuser's log is as long (it may win), when it
        // follows a leader (a committed vote), when the vote was granted,
        // or when the refuser's term is older.
        assert!(!worth_campaigning_again(
            &req,
            &answer(Vote::new(8, 3), false, log(7, 2353))
        ));
        assert!(!worth_campaigning_again(
            &req,
            &answer(Vote::new_committed(8, 3), false, log(7, 2352))
        ));
        assert!(!worth_campaigning_again(
            &req,
            &answer(Vote::new(8, 2), true, log(7, 2352))
        ));
        assert!(!worth_campaigning_again(
            &req,
            &answer(Vote::new(7, 3), false, log(7, 2352))
        ));
    }
}
