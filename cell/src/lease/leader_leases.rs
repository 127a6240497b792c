//! Lease requests only the leader may answer: refresh (one lease or a
//! batch) and time-to-live. A new leader answers them once its lessor is
//! promoted (after its first commit of the term); until then they wait, up
//! to the request timeout, for that promotion rather than failing.

use super::lessor::{Lessor, RefreshError};
use crate::raft::read_index::read_index;
use crate::raft::{NodeId, Raft};
use crate::state_machine::store::SharedState;
use latchkey_shared::lease_id::LeaseId;
use latchkey_shared::ApiError;
use openraft::ServerState;
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
    pub request_timeout: Duration,
}

impl LeaderLeases {
    fn is_leader(&self) -> bool {
        let m = self.raft.metrics();
        let m = m.borrow();
        m.state == ServerState::Leader && m.current_leader == Some(self.id)
    }

    /// Waits for the lessor's promotion while this member leads; fails
    /// `not_leader` when it does not lead or is not promoted in time.
    async fn await_primary(&self, deadline: Instant) -> Result<(), ApiError> {
        if self.is_leader() && self.lessor.wait_primary(deadline).await {
            Ok(())
        } else {
            Err(ApiError::not_leader(None))
        }
    }

    pub async fn refresh(&self, id: i64) -> Result<i64, ApiError> {
        let deadline = Instant::now() + self.request_timeout;
        loop {
            match self.lessor.refresh(id, Instant::now()) {
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
            // 100 000 refreshes take a while: off the async workers (which
            // also run Raft's heartbeats).
            let lessor = self.lessor.clone();
            let batch = ids.to_vec();
            let refreshed = tokio::task::spawn_blocking(move || {
                let mut ttls = Vec::with_capacity(batch.len());
                for chunk in batch.chunks(REFRESH_CHUNK) {
                    ttls.extend(lessor.refresh_many(chunk, Instant::now())?);
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
        read_index(&self.raft).await?;
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
