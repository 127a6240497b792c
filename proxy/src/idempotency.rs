//! Idempotency keys on the proxy: the retention lease their records are
//! written with, and the [`Guard`] of a request that names one (see
//! `latchkey_shared::idempotency` for what the guard does in the cell).
//!
//! The retention lease is a plain cell lease that nobody keeps alive: it
//! is granted with `--idempotency-retention` as its TTL and used for a
//! tenth of it, so every record lives between the retention and 1.1 times
//! it, and the cell deletes the records with their lease (no sweeper).
//! One grant per proxy per tenth of the retention.

use crate::grpc::kv::TXN;
use crate::state::ProxyState;
use crate::upstream::{Cell, Kind, Route};
use latchkey_shared::etcdpb::{
    PbLeaseGrantRequest, PbLeaseGrantResponse, PbResponseHeader, PbTxnRequest, PbTxnResponse,
};
use latchkey_shared::idempotency::{Guard, Outcome, Record};
use latchkey_shared::ApiError;
use std::time::Duration;
use tokio::sync::Mutex;
use tokio::time::Instant;

/// A request that names an idempotency key: the key, and every part that
/// makes the request what it is (method, path with query, body).
#[derive(Debug, Clone)]
pub struct Keyed {
    pub key: String,
    pub request: Vec<Vec<u8>>,
}

pub struct RetentionLease {
    retention: Duration,
    /// The lease in use and when it was granted.
    current: Mutex<Option<(i64, Instant)>>,
}

impl RetentionLease {
    pub fn new(retention: Duration) -> Self {
        RetentionLease {
            retention,
            current: Mutex::new(None),
        }
    }

    /// The lease for a record written now: granted at most a tenth of the
    /// retention ago.
    async fn lease(&self, state: &ProxyState) -> Result<i64, ApiError> {
        let mut current = self.current.lock().await;
        if let Some((id, granted)) = *current {
            if granted.elapsed() < self.retention / 10 {
                return Ok(id);
            }
        }
        let granted_at = Instant::now();
        // Straight to the cell, not through the session table: this lease
        // must run out.
        let granted: PbLeaseGrantResponse = state
            .upstream
            .home()
            .call(
                Route::Leader,
                Kind::Write,
                crate::grpc::lease::GRANT,
                PbLeaseGrantRequest {
                    ttl: self.retention.as_secs().max(1) as i64,
                    id: 0,
                },
            )
            .await?;
        if !granted.error.is_empty() {
            return Err(ApiError::internal(format!(
                "the idempotency retention lease was refused: {}",
                granted.error
            )));
        }
        *current = Some((granted.id, granted_at));
        Ok(granted.id)
    }

    /// Forgets the lease in use, when the cell says it is gone (it is
    /// revoked by hand, or the cell was restored from an old backup).
    pub async fn forget(&self) {
        *self.current.lock().await = None;
    }
}

/// The guard of a request that names an idempotency key (none without).
pub async fn guard(state: &ProxyState, keyed: Option<&Keyed>) -> Result<Option<Guard>, ApiError> {
    let Some(keyed) = keyed else {
        return Ok(None);
    };
    // Check the key before a lease is granted for it.
    latchkey_shared::idempotency::check_key(&keyed.key)?;
    let lease = state.retention.lease(state).await?;
    let parts: Vec<&[u8]> = keyed.request.iter().map(Vec::as_slice).collect();
    Guard::new(&keyed.key, &parts, lease).map(Some)
}

/// The result of a (possibly) guarded write, passed on; when the cell
/// says a lease is missing, it may be the retention lease, which the next
/// request then grants again.
pub async fn after<T>(state: &ProxyState, result: Result<T, ApiError>) -> Result<T, ApiError> {
    if let Err(e) = &result {
        if e.code == latchkey_shared::ErrorCode::LeaseNotFound {
            state.retention.forget().await;
        }
    }
    result
}

/// What a (possibly guarded) txn came to.
pub enum Committed {
    /// It ran now.
    Now(PbTxnResponse),
    /// It ran before under the same idempotency key and request: its
    /// record, and a header with the revision it committed at.
    Before(Record, PbResponseHeader),
}

/// Runs `txn` on `cell`'s leader, guarded when the request named an
/// idempotency key.
pub async fn txn(
    state: &ProxyState,
    cell: &Cell,
    guard: Option<&Guard>,
    txn: PbTxnRequest,
) -> Result<Committed, ApiError> {
    let Some(guard) = guard else {
        let resp = cell.call(Route::Leader, Kind::Write, TXN, txn).await?;
        return Ok(Committed::Now(resp));
    };
    let resp = cell
        .call(Route::Leader, Kind::Write, TXN, guard.guard(txn))
        .await;
    Ok(match guard.outcome(after(state, resp).await?)? {
        Outcome::Done(resp) => Committed::Now(resp),
        Outcome::Replay(record, header) => Committed::Before(record, header),
    })
}

/// Stores the answer of a guarded txn that committed at `revision` in its
/// record, for a retry to replay. Best effort: a retry that finds no
/// answer is told what committed and that the answer was not kept.
pub async fn remember(
    cell: &Cell,
    guard: &Guard,
    revision: i64,
    succeeded: bool,
    answer: serde_json::Value,
) {
    let store = guard.remember(revision, succeeded, answer);
    let stored: Result<PbTxnResponse, ApiError> =
        cell.call(Route::Leader, Kind::Write, TXN, store).await;
    if let Err(e) = stored {
        tracing::warn!(error = %e, revision, "an idempotent txn's answer was not kept");
    }
}
