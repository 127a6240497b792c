//! Keeps a follower that is receiving a snapshot from campaigning.
//!
//! openraft 0.9 resets a follower's election timer on AppendEntries and
//! votes, not on snapshot chunks, and the leader's heartbeats share the
//! peer connection with chunks of megabytes, so they can come late while a
//! transfer runs. A follower several chunks into a large snapshot then
//! called an election it could not win (its log is the one behind), its
//! higher term deposed the leader through the next heartbeat's answer, and
//! the transfer started over under the next leader, again and again: a
//! follower missed 24 MiB for 30 s in CI (member log: 4 MiB chunks 370 ms
//! apart, the timer firing between two of them, terms 21 to 23).
//!
//! So each chunk holds elections off while it is handled (the last one
//! installs the whole image before it is answered) and for a linger after
//! it, if it was accepted. Sitting out costs only time: a member that does
//! not campaign cannot make two leaders. The leader-transfer hold
//! (`super::leadership::SitOutElections`) never overlaps this one: a
//! leader receives no snapshot.

use super::{NodeId, Raft};
use openraft::Vote;
use std::sync::{Arc, Mutex};
use tokio::time::{sleep_until, Instant};

pub struct SnapshotReceipt {
    raft: Raft,
    /// How long after an accepted chunk the hold lasts: long enough for
    /// the next chunk or the leader's next heartbeat.
    linger: std::time::Duration,
    state: Mutex<HoldState>,
}

#[derive(Default)]
struct HoldState {
    /// Chunks being handled now.
    in_hand: usize,
    /// The hold lasts at least until then.
    until: Option<Instant>,
    /// Whether elections are held off (this member's doing).
    held: bool,
    /// Whether a task waits to end the hold.
    release_pending: bool,
}

impl SnapshotReceipt {
    pub fn new(raft: Raft, linger: std::time::Duration) -> Arc<Self> {
        Arc::new(SnapshotReceipt {
            raft,
            linger,
            state: Mutex::new(HoldState::default()),
        })
    }

    /// Marks a chunk from a leader of `vote` in hand until the returned
    /// guard is told its outcome or dropped.
    pub fn chunk(self: &Arc<Self>, vote: Vote<NodeId>) -> ChunkInHand {
        let mut s = self.lock();
        s.in_hand += 1;
        if !s.held {
            s.held = true;
            self.raft.runtime_config().elect(false);
        }
        ChunkInHand {
            receipt: self.clone(),
            vote,
            accepted: false,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HoldState> {
        // The state is a few counters, consistent after every statement.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn chunk_done(self: &Arc<Self>, accepted: bool) {
        let mut s = self.lock();
        s.in_hand -= 1;
        if accepted {
            let until = Instant::now() + self.linger;
            s.until = Some(s.until.map_or(until, |u| u.max(until)));
        }
        if !s.release_pending {
            s.release_pending = true;
            tokio::spawn(self.clone().release_when_due());
        }
    }

    /// Ends the hold once no chunk is in hand and the linger has passed.
    async fn release_when_due(self: Arc<Self>) {
        loop {
            let wake = {
                let mut s = self.lock();
                let now = Instant::now();
                match s.until {
                    _ if s.in_hand > 0 => now + self.linger,
                    Some(until) if until > now => until,
                    _ => {
                        s.until = None;
                        s.held = false;
                        s.release_pending = false;
                        self.raft.runtime_config().elect(true);
                        return;
                    }
                }
            };
            sleep_until(wake).await;
        }
    }
}

/// One chunk being handled; see [`SnapshotReceipt::chunk`].
pub struct ChunkInHand {
    receipt: Arc<SnapshotReceipt>,
    vote: Vote<NodeId>,
    accepted: bool,
}

impl ChunkInHand {
    /// Records the vote this member answered the chunk with (none for an
    /// error): the sender's or lower when it took the chunk, higher when it
    /// refused a stale leader, whose chunks earn no linger.
    pub fn answered(mut self, vote_after: Option<&Vote<NodeId>>) {
        self.accepted = vote_after.is_some_and(|mine| self.vote >= *mine);
    }
}

impl Drop for ChunkInHand {
    fn drop(&mut self) {
        self.receipt.chunk_done(self.accepted);
    }
}
