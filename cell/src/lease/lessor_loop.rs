//! The one task that drives the lessor, as etcd's `lessor.runLoop` does.
//! It `select!`s over:
//!
//! - leadership changes (Raft metrics): promote the lessor once this member
//!   leads and has applied an entry of its own term (its lease table is
//!   then complete); demote it as soon as it does not lead, when the term
//!   changes, or when it has not heard from a quorum for the quorum timeout
//!   (check-quorum, `crate::raft::leadership`);
//! - the checkpoint tick: leases refreshed since their last checkpoint go
//!   through Raft, many per entry;
//! - the earliest lease deadline: expired leases are proposed for expiry;
//! - shutdown.
//!
//! Every Raft write it makes is bounded by the request timeout and gives
//! way to shutdown, so the task always ends promptly when told to.

use super::lessor::Lessor;
use crate::metrics_catalog::{LEADER_CHANGES, LEASES_EXPIRED, LEASE_CHECKPOINTS, RAFT_TERM};
use crate::raft::command::Request;
use crate::raft::leadership::leads_with_quorum;
use crate::raft::{NodeId, Raft};
use crate::state_machine::store::SharedState;
use latchkey_shared::lease_id::LeaseId;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;
use tokio::time::{Instant, MissedTickBehavior};
use tokio_util::sync::CancellationToken;

/// Expiry is checked at least this often, and right at the earliest
/// deadline otherwise, so a lease expires within ~100 ms of it.
const MAX_EXPIRY_SLEEP: Duration = Duration::from_millis(100);
/// Shortest wait between two expiry checks.
const MIN_EXPIRY_SLEEP: Duration = Duration::from_millis(5);
/// Leases expired per Raft entry: bounded so one entry stays small.
const EXPIRY_BATCH: usize = 1_000;
/// Leases checkpointed per Raft entry: 10 000 leases are ~160 KB.
const CHECKPOINT_BATCH: usize = 10_000;
/// How soon a promotion that did not complete (no commit of the new term
/// yet, or the request timed out) is tried again.
const PROMOTION_RETRY: Duration = Duration::from_millis(50);

pub struct LessorLoop {
    pub id: NodeId,
    pub raft: Raft,
    pub state: SharedState,
    pub lessor: Arc<Lessor>,
    /// What a new leader gives a lease that its checkpoint says is nearly
    /// or already due (see the lessor).
    pub grace: Duration,
    pub checkpoint_interval: Duration,
    pub request_timeout: Duration,
    /// How long a leader may go without hearing from a quorum and still
    /// count as leading (`Resolved::quorum_timeout`).
    pub quorum_timeout: Duration,
}

/// What one arm of the loop asks for next.
enum Next {
    Go,
    Stop,
}

impl LessorLoop {
    pub async fn run(self, shutdown: CancellationToken) {
        let mut metrics = self.raft.metrics();
        let mut last_leader = None;
        let mut checkpoints = tokio::time::interval(self.checkpoint_interval);
        checkpoints.set_missed_tick_behavior(MissedTickBehavior::Delay);
        // Set while this member leads with a lessor not yet promoted.
        let mut promote_at: Option<Instant> = None;
        // When expiry was last checked. The next check is timed from it,
        // not from each turn of the loop: Raft's metrics change with every
        // commit, and a timer restarted on each of them would never fire
        // under a steady write load.
        let mut expiry_checked = Instant::now();
        // The term the lessor was promoted in.
        let mut primary_term = None;
        loop {
            let leading = {
                let m = metrics.borrow_and_update();
                if m.current_leader != last_leader {
                    // Every change this member observes, including losing
                    // sight of a leader.
                    last_leader = m.current_leader;
                    let leader = m
                        .current_leader
                        .map_or_else(|| "none".into(), |l| l.to_string());
                    tracing::info!(term = m.current_term, %leader, "leader changed");
                    metrics::counter!(LEADER_CHANGES.name).increment(1);
                    metrics::gauge!(RAFT_TERM.name).set(m.current_term as f64);
                }
                if self.lessor.is_primary() && primary_term != Some(m.current_term) {
                    // A new term, even one this member leads again: the
                    // lease table must be complete for it first.
                    self.lessor.demote();
                    tracing::info!(term = m.current_term, "new term; lessor demoted");
                }
                leads_with_quorum(&m, self.id, self.quorum_timeout)
            };
            if leading && !self.lessor.is_primary() {
                promote_at.get_or_insert_with(Instant::now);
            } else {
                promote_at = None;
                if !leading && self.lessor.is_primary() {
                    self.lessor.demote();
                    tracing::info!("not leading (or no quorum heard from); lessor demoted");
                }
            }
            let primary = self.lessor.is_primary();
            // The floor keeps a deadline already proposed for expiry (and
            // so still first in the queue) from spinning this loop.
            let latest = expiry_checked + MAX_EXPIRY_SLEEP;
            let expiry_at = self
                .lessor
                .next_deadline()
                .map_or(latest, |d| d.min(latest))
                .max(expiry_checked + MIN_EXPIRY_SLEEP);
            let next = tokio::select! {
                _ = shutdown.cancelled() => Next::Stop,
                changed = metrics.changed() => match changed {
                    Ok(()) => Next::Go,
                    Err(_) => Next::Stop,
                },
                _ = tokio::time::sleep_until(promote_at.unwrap_or(expiry_at)), if promote_at.is_some() => {
                    self.promote(&shutdown, &mut promote_at, &mut primary_term).await
                }
                _ = checkpoints.tick(), if primary => self.checkpoint(&shutdown).await,
                _ = tokio::time::sleep_until(expiry_at), if primary => {
                    expiry_checked = Instant::now();
                    self.expire(&shutdown).await
                }
            };
            if let Next::Stop = next {
                return;
            }
        }
    }

    /// Runs one Raft write, bounded by the request timeout and shutdown.
    /// `None` when it did not complete.
    async fn bounded<T, E: std::fmt::Display>(
        &self,
        shutdown: &CancellationToken,
        what: &str,
        work: impl Future<Output = Result<T, E>>,
    ) -> Option<T> {
        tokio::select! {
            _ = shutdown.cancelled() => None,
            r = tokio::time::timeout(self.request_timeout, work) => match r {
                Ok(Ok(v)) => Some(v),
                Ok(Err(e)) => {
                    tracing::debug!(error = %e, "{what} did not complete");
                    None
                }
                Err(_) => {
                    tracing::debug!("{what} timed out");
                    None
                }
            },
        }
    }

    async fn promote(
        &self,
        shutdown: &CancellationToken,
        promote_at: &mut Option<Instant>,
        primary_term: &mut Option<u64>,
    ) -> Next {
        // ensure_linearizable returns once the blank entry of this term is
        // applied: the lease table is then complete.
        let confirmed = self
            .bounded(shutdown, "promotion", self.raft.ensure_linearizable())
            .await
            .is_some();
        if shutdown.is_cancelled() {
            return Next::Stop;
        }
        let m = self.raft.metrics().borrow().clone();
        let still_leading = leads_with_quorum(&m, self.id, self.quorum_timeout);
        if confirmed && still_leading {
            self.state.read(|s| {
                self.lessor
                    .promote(&s.leases.seeds(), Instant::now(), self.grace)
            });
            tracing::info!(
                term = m.current_term,
                leases = self.lessor.len(),
                "became leader; lessor promoted"
            );
            *promote_at = None;
            *primary_term = Some(m.current_term);
        } else {
            *promote_at = Some(Instant::now() + PROMOTION_RETRY);
        }
        Next::Go
    }

    /// Leases refreshed since their last checkpoint go through Raft. When
    /// a write fails, the leases it carried stay un-checkpointed until they
    /// are refreshed again; that is safe: a checkpoint only ever moves a
    /// deadline a new leader starts from, and without it the new leader
    /// uses the older checkpoint plus the grace, never less than a dead
    /// lease deserves.
    async fn checkpoint(&self, shutdown: &CancellationToken) -> Next {
        loop {
            let entries = self
                .lessor
                .take_checkpoints(Instant::now(), CHECKPOINT_BATCH);
            if entries.is_empty() {
                return Next::Go;
            }
            let count = entries.len() as u64;
            let written = self
                .bounded(
                    shutdown,
                    "lease checkpoint",
                    self.raft.client_write(Request::LeaseCheckpoint { entries }),
                )
                .await;
            if shutdown.is_cancelled() {
                return Next::Stop;
            }
            if written.is_none() {
                return Next::Go;
            }
            metrics::counter!(LEASE_CHECKPOINTS.name).increment(count);
        }
    }

    /// Proposes the expiry of every lease past its deadline, a batch per
    /// entry. A proposal that fails is proposed again by the lessor after
    /// its retry interval.
    async fn expire(&self, shutdown: &CancellationToken) -> Next {
        loop {
            let ids = self.lessor.take_expired(Instant::now(), EXPIRY_BATCH);
            let Some(&first) = ids.first() else {
                return Next::Go;
            };
            tracing::info!(count = ids.len(), lease_id = %LeaseId(first), "expiring leases");
            metrics::counter!(LEASES_EXPIRED.name).increment(ids.len() as u64);
            self.bounded(
                shutdown,
                "lease expiry",
                self.raft.client_write(Request::LeaseExpire { ids }),
            )
            .await;
            if shutdown.is_cancelled() {
                return Next::Stop;
            }
        }
    }
}
