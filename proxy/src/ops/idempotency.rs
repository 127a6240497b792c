//! Idempotency keys on the proxy: the [`Guard`] of a request that names
//! one, its records written with the proxy's retention lease
//! (`--idempotency-retention`; see `latchkey_shared::idempotency` for what
//! the guard does in the cell).

use crate::state::ProxyState;
use crate::upstream::{Cell, Kind, Route};
use latchkey_shared::etcd_methods::kv::TXN;
use latchkey_shared::etcdpb::{
    PbLeaseGrantRequest, PbLeaseGrantResponse, PbResponseHeader, PbTxnRequest, PbTxnResponse,
};
use latchkey_shared::idempotency::{Guard, Outcome, Record};
use latchkey_shared::ApiError;
use std::net::SocketAddr;

/// A request that names an idempotency key: the key, and every part that
/// makes the request what it is (method, path with query, body).
#[derive(Debug, Clone)]
pub struct Keyed {
    pub key: String,
    pub request: Vec<Vec<u8>>,
}

/// The guard of a request that names an idempotency key (none without).
pub async fn guard(state: &ProxyState, keyed: Option<&Keyed>) -> Result<Option<Guard>, ApiError> {
    let Some(keyed) = keyed else {
        return Ok(None);
    };
    // Check the key before a lease is granted for it.
    latchkey_shared::idempotency::check_key(&keyed.key)?;
    let lease = state
        .retention
        .lease(|ttl| async move {
            // Straight to the cell, not through the session table: this
            // lease must run out.
            let granted: PbLeaseGrantResponse = state
                .upstream
                .home()
                .call(
                    Route::Leader,
                    Kind::Write,
                    latchkey_shared::etcd_methods::lease::GRANT,
                    PbLeaseGrantRequest { ttl, id: 0 },
                )
                .await?;
            if granted.error.is_empty() {
                Ok(granted.id)
            } else {
                Err(ApiError::internal(format!(
                    "the idempotency retention lease was refused: {}",
                    granted.error
                )))
            }
        })
        .await?;
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

/// Runs `txn` from `client` on `cell`'s leader, guarded when the request
/// named an idempotency key; refused if it writes a reserved key. The
/// revision it committed at (now or before) becomes the client's floor, as
/// any write's does ([`super::kv::wrote`]).
pub async fn txn(
    state: &ProxyState,
    client: Option<SocketAddr>,
    cell: &Cell,
    guard: Option<&Guard>,
    txn: PbTxnRequest,
) -> Result<Committed, ApiError> {
    // The client's own operations; the guard's record is ours to write.
    latchkey_shared::reserved::check_txn(&txn)?;
    let home = std::sync::Arc::ptr_eq(cell, state.upstream.home());
    if guard.is_some() && !home {
        // The record lives on the retention lease, which is the home cell's.
        return Err(ApiError::invalid(
            "an Idempotency-Key is served for the home cell's keys only: these keys are \
             another cell's (send the write without the key, or read before retrying)",
        ));
    }
    let committed = match guard {
        None => {
            let leases = super::kv::txn_leases(&txn);
            state
                .extensions
                .ensure_all(&state.upstream, cell, &leases)
                .await?;
            let token = super::auth::client_token();
            let who = crate::upstream::Who::Client(token.as_deref());
            Committed::Now(
                cell.call_as(who, Route::Leader, Kind::Write, TXN, txn)
                    .await?,
            )
        }
        Some(guard) => {
            // Guarded, it runs with the proxy's identity (the record is
            // ours): the cell first says the client may run it.
            super::auth::require_txn(cell, &txn).await?;
            let resp = cell
                .call(Route::Leader, Kind::Write, TXN, guard.guard(txn))
                .await;
            match guard.outcome(after(state, resp).await?)? {
                Outcome::Done(resp) => Committed::Now(resp),
                Outcome::Replay(record, header) => Committed::Before(record, header),
            }
        }
    };
    let revision = match &committed {
        Committed::Now(resp) => resp.header.as_ref().map_or(0, |h| h.revision),
        Committed::Before(_, header) => header.revision,
    };
    super::kv::wrote(state, client, cell, revision);
    Ok(committed)
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
