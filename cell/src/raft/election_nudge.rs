//! Nudges for openraft 0.9's elections where its timers stall them.
//!
//! 1. After a lagging member's campaign. Raft has a member that rejects a
//!    vote request for a shorter log still adopt the candidate's higher
//!    term; openraft 0.9 does not. So when the leader dies while one
//!    follower is an entry behind, the follower that lags often campaigns
//!    first (term T) and is refused; the up-to-date one, still at T-1,
//!    later campaigns at T too, and is refused because the laggard voted
//!    for itself in T. It then waits a whole election timeout (leader
//!    lease + timeout) before trying T+1, while the laggard, marked as
//!    having seen a longer log, may take T+1 first. The safety suite
//!    measured 3.5 s without writes after a leader SIGKILL this way
//!    (member logs: T8, T9 refused, elected at T10).
//!    The nudge: a candidate refused by a member that is itself
//!    campaigning (an uncommitted vote) in its term or later, with a
//!    shorter log than the candidate's, campaigns again at once (after a
//!    little jitter): it has adopted the refuser's term from the answer,
//!    so its next term wins that vote.
//! 2. After a split vote. openraft 0.9 draws each member's election
//!    timeout once, at start, and checks it on a tick of 1.5 heartbeats
//!    (225 ms by default), so members' timeouts fall into a couple of
//!    tick buckets, and members started together tick in step. Two such
//!    candidates with equal logs vote for themselves in the same term,
//!    refuse each other, and do it again every election timeout, as long
//!    as the third member is away: the safety suite measured 4.4 s
//!    without writes after a leader SIGSTOP that followed a full-cell
//!    restart (member logs: members 1 and 2 campaigning 5 ms apart in
//!    terms 22 to 28).
//!    The nudge: a candidate refused by a member campaigning in the same
//!    term with a log equal to its own campaigns again after a
//!    random delay (fresh each time, up to [`SPLIT_VOTE_SPREAD`]); the
//!    first to do so wins the other's vote.
//!
//! Neither does anything when a leader is known by then. Campaigning is
//! safe at any time; these only choose when.

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
        let Some(why) = campaign_again(req, resp) else {
            return;
        };
        let Some(raft) = self.0.get().cloned() else {
            return;
        };
        let term = req.vote.leader_id().term;
        let delay = match why {
            // A few ms apart for members that would nudge at once.
            Again::RefuserLags => Duration::from_millis(fastrand::u64(20..60)),
            Again::SplitVote => {
                Duration::from_millis(fastrand::u64(0..SPLIT_VOTE_SPREAD.as_millis() as u64))
            }
        };
        tokio::spawn(async move {
            tokio::time::sleep(delay).await;
            let m = raft.metrics().borrow().clone();
            // Not once a leader is known, nor when this member has moved
            // on since (its own timer, or the other's candidacy).
            if m.current_leader.is_some() || m.current_term > term + 1 {
                return;
            }
            tracing::info!(term, reason = ?why, "campaigning again");
            let _ = raft.trigger().elect().await;
        });
    }
}

/// The most a candidate waits after a split vote before it campaigns
/// again: far above a vote's round trip between members (so one of two
/// such candidates is usually first by more than that), far below an
/// election timeout.
pub const SPLIT_VOTE_SPREAD: Duration = Duration::from_millis(150);

/// Why a refused candidate campaigns again at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Again {
    /// The refuser campaigns with a shorter log: it cannot win.
    RefuserLags,
    /// The refuser campaigns in the same term with an equal log: neither
    /// can win this term.
    SplitVote,
}

/// Whether and why a candidate refused with `resp` campaigns again before
/// its timer says so: only when the refuser is campaigning itself (an
/// uncommitted vote for another member, in the candidate's term or later).
/// With a shorter log it can win nobody with a longer one, and the
/// candidate can win it at a higher term; with an equal log in the same
/// term the two split the vote.
fn campaign_again(req: &VoteRequest<NodeId>, resp: &VoteResponse<NodeId>) -> Option<Again> {
    let ours = req.vote.leader_id();
    let theirs = resp.vote.leader_id();
    let rival_campaign = !resp.vote_granted
        && !resp.vote.is_committed()
        && theirs.term >= ours.term
        && theirs.voted_for() != ours.voted_for();
    if !rival_campaign {
        None
    } else if resp.last_log_id < req.last_log_id {
        Some(Again::RefuserLags)
    } else if resp.last_log_id == req.last_log_id && theirs.term == ours.term {
        Some(Again::SplitVote)
    } else {
        None
    }
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
        assert_eq!(
            campaign_again(&req, &answer(Vote::new(8, 3), false, log(7, 2352))),
            Some(Again::RefuserLags)
        );
        assert_eq!(
            campaign_again(&req, &answer(Vote::new(9, 3), false, log(7, 2352))),
            Some(Again::RefuserLags)
        );
        // Not when the refuser's log is longer (it may win), when it
        // follows a leader (a committed vote), when the vote was granted,
        // or when the refuser's term is older.
        assert_eq!(
            campaign_again(&req, &answer(Vote::new(8, 3), false, log(7, 2354))),
            None
        );
        assert_eq!(
            campaign_again(
                &req,
                &answer(Vote::new_committed(8, 3), false, log(7, 2352))
            ),
            None
        );
        assert_eq!(
            campaign_again(&req, &answer(Vote::new(8, 2), true, log(7, 2352))),
            None
        );
        assert_eq!(
            campaign_again(&req, &answer(Vote::new(7, 3), false, log(7, 2352))),
            None
        );
    }

    #[test]
    fn two_candidates_with_equal_logs_in_one_term_try_again() {
        // Members 1 and 2 (both at 21-512) each voted for themselves in 22.
        let req = ask(22, 1, log(21, 512));
        assert_eq!(
            campaign_again(&req, &answer(Vote::new(22, 2), false, log(21, 512))),
            Some(Again::SplitVote)
        );
        // A rival already in a later term with an equal log wins this
        // member's vote when it asks; a follower of a leader, none.
        assert_eq!(
            campaign_again(&req, &answer(Vote::new(23, 2), false, log(21, 512))),
            None
        );
        assert_eq!(
            campaign_again(
                &req,
                &answer(Vote::new_committed(22, 2), false, log(21, 512))
            ),
            None
        );
    }
}
