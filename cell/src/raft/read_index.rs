//! The leader's read index: the commit index at a moment when a quorum
//! confirmed this member still leads. A member that has applied up to it
//! reflects every write acknowledged before the read began, with no log
//! write (etcd's ReadIndex).
//!
//! Confirmations are shared, as etcd's linearizable read loop shares them:
//! one quorum round at a time, and every caller that arrives while a round
//! is in flight is answered by the next round, which starts after it
//! arrived. A burst of reads or keep-alives costs one round per round trip,
//! not one each.

use super::{errors, Raft};
use crate::metrics_catalog::{READ_INDEX_ROUNDS, READ_INDEX_WAITS};
use latchkey_shared::ApiError;
use std::sync::atomic::{AtomicU64, Ordering};
use tokio::time::Instant;

/// The read index, on the leader, from a round of its own. Fails
/// `not_leader` elsewhere.
pub async fn read_index(raft: &Raft) -> Result<u64, ApiError> {
    let (read_log_id, _applied) = raft
        .get_read_log_id()
        .await
        .map_err(errors::check_is_leader)?;
    Ok(read_log_id.map_or(0, |l| l.index))
}

/// A leadership confirmation: when its round started and the index it
/// confirmed. Leadership held at `started` (the quorum acknowledged
/// heartbeats sent after it).
#[derive(Debug, Clone, Copy)]
pub struct Confirmed {
    pub started: Instant,
    pub index: u64,
    /// Callers whose ticket is below this arrived before the round began.
    covers: u64,
}

/// Rounds shared by every caller: one round at a time, and every caller
/// that arrives while a round is in flight is answered by the next round,
/// which starts after it arrived. Used for the leader's own quorum rounds
/// and for a follower's read-index requests to the leader alike.
#[derive(Default)]
pub struct SharedRounds {
    /// Tickets in arrival order.
    tickets: AtomicU64,
    /// The last successful round. A tokio mutex held for the whole round:
    /// it is what makes rounds one at a time, and callers queue on it in
    /// arrival order.
    last: tokio::sync::Mutex<Option<Confirmed>>,
}

impl SharedRounds {
    /// A confirmation from a round that began after this call did; `round`
    /// runs one if none that qualifies is done.
    pub async fn join<Fut>(&self, round: impl FnOnce() -> Fut) -> Result<Confirmed, ApiError>
    where
        Fut: std::future::Future<Output = Result<u64, ApiError>>,
    {
        metrics::counter!(READ_INDEX_WAITS.name).increment(1);
        let ticket = self.tickets.fetch_add(1, Ordering::SeqCst);
        let mut last = self.last.lock().await;
        if let Some(done) = *last {
            if done.covers > ticket {
                return Ok(done);
            }
        }
        let covers = self.tickets.load(Ordering::SeqCst);
        let started = Instant::now();
        metrics::counter!(READ_INDEX_ROUNDS.name).increment(1);
        let index = round().await?;
        let done = Confirmed {
            started,
            index,
            covers,
        };
        *last = Some(done);
        Ok(done)
    }
}

/// Shared leadership confirmations for one member.
pub struct ReadIndex {
    raft: Raft,
    rounds: SharedRounds,
}

impl ReadIndex {
    pub fn new(raft: Raft) -> Self {
        ReadIndex {
            raft,
            rounds: SharedRounds::default(),
        }
    }

    /// A confirmation from a round that began after this call did.
    pub async fn confirm(&self) -> Result<Confirmed, ApiError> {
        self.rounds.join(|| read_index(&self.raft)).await
    }
}
