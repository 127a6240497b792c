//! Lease requests only the leader may answer: refresh (one lease or a
//! batch) and time-to-live. A new leader answers them once its lessor is
//! promoted (after its first commit of the term); until then they wait, up
//! to the request timeout, for that promotion rather than failing.
//!
//! Time is granted only under leadership a quorum confirmed after the
//! request arrived, with this member's state caught up to that moment
//! (etcd 3.5's `LeaseRenew` does the same). Without it a leader cut off
//! from its quorum went on granting time while the majority elected a new
//! leader that expired the lease and gave its lock to someone else (cell
//! review S1). Confirmations are shared by all requests waiting at once
//! (see `crate::raft::read_index`), so a stream of keep-alives costs one
//! quorum round per round trip.

use super::lessor::{Lessor, RefreshError};
use crate::raft::errors;
use crate::raft::leadership::leads;
use crate::raft::read_index::ReadIndex;
use crate::raft::{NodeId, Raft};
use crate::state_machine::store::SharedState;
use latchkey_shared::lease_id::LeaseId;
use latchkey_shared::ApiError;
use serde::{Deserialize, Serialize};
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

/// Lease ids refreshed per hold of the lessor's lock: bounded so apply
/// (which also takes that lock) never waits long behind a big batch.
const REFRESH_CHUNK: usize = 4096;

/// What TimeToLive reports about a lease.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct LeaseTtl {
    pub remaining: i64,
    pub granted: i64,
    pub keys: Vec<Vec<u8>>,
}

pub struct LeaderLeases {
    pub id: NodeId,
    pub raft: Raft,
    pub state: SharedState,
    pub lessor: Arc<Lessor>,
    pub read_index: Arc<ReadIndex>,
    pub request_timeout: Duration,
    /// How long a grant of time may wait for a quorum to confirm this
    /// leadership: one election timeout, so a keep-alive to a leader cut
    /// off from its quorum fails within it and the client goes elsewhere.
    pub confirm_timeout: Duration,
}

impl LeaderLeases {
    /// Whether openraft has this member leading (quorum or not: that is
    /// what a confirmation round finds out).
    fn leads(&self) -> bool {
        leads(&self.raft.metrics().borrow(), self.id)
    }

    /// When leadership was last confirmed for this request: a quorum round
    /// that began after the call, with the state applied up to its index
    /// (so a lease revoked or expired before it is known to be gone).
    /// Bounded by the confirm timeout: a leader that cannot reach a quorum
    /// in that long may be deposed already, and answers `unavailable` (not
    /// `not_leader`, so the request is not sent round again here) for the
    /// client to try another member.
    async fn confirmed(&self) -> Result<Instant, ApiError> {
        if !self.leads() {
            return Err(ApiError::not_leader(None));
        }
        if crate::chaos::broken(crate::chaos::Break::UnconfirmedKeepAlives) {
            return Ok(Instant::now());
        }
        let confirmed = tokio::time::timeout(self.confirm_timeout, self.read_index.confirm())
            .await
            .map_err(|_| {
                ApiError::unavailable(format!(
                    "leadership not confirmed by a quorum within {:?}",
                    self.confirm_timeout
                ))
            })??;
        match tokio::time::timeout(
            self.request_timeout,
            self.state.wait_applied(confirmed.index),
        )
        .await
        {
            Ok(true) => Ok(confirmed.started),
            Ok(false) => Err(errors::fatal("the state machine stopped")),
            Err(_) => Err(ApiError::timeout()),
        }
    }

    /// Waits for the lessor's promotion (a new leader's first commit, or a
    /// quorum heard from again) while this member leads; fails `not_leader`
    /// when it does not lead, `unavailable` when not promoted in time.
    async fn await_primary(&self, deadline: Instant) -> Result<(), ApiError> {
        if !self.leads() {
            return Err(ApiError::not_leader(None));
        }
        if self.lessor.wait_primary(deadline).await {
            Ok(())
        } else {
            Err(ApiError::unavailable(
                "this leader's lessor was not promoted in time",
            ))
        }
    }

    pub async fn refresh(&self, id: i64) -> Result<i64, ApiError> {
        let deadline = Instant::now() + self.request_timeout;
        loop {
            let at = self.confirmed().await?;
            match self.lessor.refresh(id, at) {
                Ok(ttl) => return Ok(ttl),
                Err(RefreshError::NotFound) => return Err(ApiError::lease_not_found(LeaseId(id))),
                Err(RefreshError::NotPrimary) => self.await_primary(deadline).await?,
            }
        }
    }

    /// Per id its TTL, or -1 where the lease does not exist.
    pub async fn refresh_batch(&self, ids: &[i64]) -> Result<Vec<i64>, ApiError> {
        let deadline = Instant::now() + self.request_timeout;
        loop {
            let at = self.confirmed().await?;
            // 100 000 refreshes take a while: off the async workers (which
            // also run Raft's heartbeats).
            let lessor = self.lessor.clone();
            let batch = ids.to_vec();
            let refreshed = tokio::task::spawn_blocking(move || {
                let mut ttls = Vec::with_capacity(batch.len());
                for chunk in batch.chunks(REFRESH_CHUNK) {
                    ttls.extend(lessor.refresh_many(chunk, at)?);
                }
                Ok::<_, RefreshError>(ttls)
            })
            .await
            .map_err(|e| ApiError::internal(e.to_string()))?;
            match refreshed {
                Ok(ttls) => return Ok(ttls),
                Err(_) => self.await_primary(deadline).await?,
            }
        }
    }

    pub async fn time_to_live(&self, id: i64) -> Result<LeaseTtl, ApiError> {
        let deadline = Instant::now() + self.request_timeout;
        self.confirmed().await?;
        let remaining = loop {
            match self.lessor.remaining(id, Instant::now()) {
                Ok(r) => break r,
                Err(RefreshError::NotFound) => return Err(ApiError::lease_not_found(LeaseId(id))),
                Err(RefreshError::NotPrimary) => self.await_primary(deadline).await?,
            }
        };
        self.state.read(|s| match s.leases.get(id) {
            Some(l) => Ok(LeaseTtl {
                remaining,
                granted: l.ttl,
                keys: l.keys.iter().cloned().collect(),
            }),
            None => Err(ApiError::lease_not_found(LeaseId(id))),
        })
    }
}
