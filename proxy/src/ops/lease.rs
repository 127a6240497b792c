//! etcd's lease operations through the proxy, for both faces: grant and
//! revoke on the home cell with the session table kept in step (a revoke
//! also revokes the session's extensions in other cells), and
//! time-to-live. Keep-alives are the session table's
//! ([`session`](crate::session)).

use crate::ops::auth::call_for_client;
use crate::session::extensions::LeaseExtensions;
use crate::state::ProxyState;
use crate::upstream::Kind;
use latchkey_shared::etcd_methods::lease::{GRANT, REVOKE, TIME_TO_LIVE};
use latchkey_shared::etcdpb::{
    PbLeaseGrantRequest, PbLeaseGrantResponse, PbLeaseRevokeRequest, PbLeaseRevokeResponse,
    PbLeaseTimeToLiveRequest, PbLeaseTimeToLiveResponse,
};
use latchkey_shared::{ApiError, ErrorCode, LeaseId};
use tokio::time::Instant;

/// Grants a lease on the cell and enters it in the session table.
pub async fn grant(
    state: &ProxyState,
    request: PbLeaseGrantRequest,
) -> Result<PbLeaseGrantResponse, ApiError> {
    let cell = state.upstream.home();
    let sent = Instant::now();
    let granted: PbLeaseGrantResponse = call_for_client(cell, Kind::Write, GRANT, request).await?;
    if granted.error.is_empty() {
        state
            .sessions
            .granted(LeaseId::from(granted.id), granted.ttl, sent);
    }
    Ok(granted)
}

/// Revokes a lease on the cell and drops it from the session table.
pub async fn revoke(state: &ProxyState, id: LeaseId) -> Result<PbLeaseRevokeResponse, ApiError> {
    // Where the session is extended, from the home cell's records (this
    // proxy may not have made them): they go with the session.
    if let Err(e) = state.extensions.adopt(&state.upstream, id).await {
        tracing::warn!(lease_id = %id, error = %e, "reading a session's cells before its revoke");
    }
    // Taken before home's revoke: its records' deletion makes every
    // proxy's follower forget them.
    let extended = state.extensions.take(id);
    let request = PbLeaseRevokeRequest { id: id.get() };
    let result = call_for_client(state.upstream.home(), Kind::Write, REVOKE, request).await;
    match &result {
        Ok(_)
        | Err(ApiError {
            code: ErrorCode::LeaseNotFound,
            ..
        }) => {
            state.sessions.revoked(id);
            // Then in every other cell the session was extended to. The
            // revoke is done (home's is the session's); an extension that
            // could not be revoked expires within its TTL, unrefreshed.
            if let Err(e) = LeaseExtensions::revoke_in(id, extended).await {
                tracing::warn!(lease_id = %id, error = %e, "an extension of a revoked session expires on its own");
            }
        }
        Err(e) if e.retry() != latchkey_shared::Retry::Never => {
            state.sessions.unsure(id);
            state.extensions.give_back(id, &extended);
        }
        Err(_) => state.extensions.give_back(id, &extended),
    }
    result
}

/// A lease's time left (TTL -1 if it does not exist, as etcd answers) and,
/// if asked, its keys.
pub async fn time_to_live(
    state: &ProxyState,
    request: PbLeaseTimeToLiveRequest,
) -> Result<PbLeaseTimeToLiveResponse, ApiError> {
    call_for_client(state.upstream.home(), Kind::Read, TIME_TO_LIVE, request).await
}
