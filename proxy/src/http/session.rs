//! `/v1/sessions`: sessions are etcd leases. Create one with a TTL, keep it
//! alive (answered by this proxy at once from its session table), look at
//! its time left and attached keys, revoke it (its keys go in one
//! revision).

use super::extract::{Json, Path};
use super::model::{encode, parse_session, session_gone, session_id, Encoding, ErrorBody};
use super::{answer, Answer};
use crate::metrics_catalog::KEEPALIVES;
use crate::ops::lease;
use crate::session;
use crate::state::ProxyState;
use axum::extract::State;
use latchkey_shared::etcdpb::{PbLeaseGrantRequest, PbLeaseTimeToLiveRequest};
use latchkey_shared::limits::MAX_TTL_SECS;
use latchkey_shared::{ApiError, ErrorCode};
use serde::{Deserialize, Serialize};
use std::sync::Arc;
use utoipa::ToSchema;

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateSession {
    /// Seconds the session lives without a keep-alive (the cell raises
    /// it to its minimum, 2 s by default).
    pub ttl: i64,
    /// The id to give the session (hex); absent, the cell picks one. An id
    /// already in use is refused with `lease_exists`.
    pub id: Option<String>,
}

#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct SessionAnswer {
    /// The session id, 16 hex digits.
    pub id: String,
    /// Seconds left, as the cell confirmed them.
    pub ttl: i64,
}

#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct SessionInfo {
    pub id: String,
    /// Seconds left.
    pub ttl: i64,
    /// The TTL the session was created with.
    pub granted_ttl: i64,
    /// The keys bound to the session.
    pub keys: Vec<String>,
    pub keys_encoding: Vec<Encoding>,
}

#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct Revoked {
    pub id: String,
    /// The revision that deleted the session's keys.
    pub revision: i64,
}

/// Create a session.
#[utoipa::path(post, path = "/v1/sessions", tag = "sessions",
    request_body = CreateSession,
    responses((status = 200, body = SessionAnswer), (status = "4XX", body = ErrorBody), (status = "5XX", body = ErrorBody)))]
pub async fn create(
    State(state): State<Arc<ProxyState>>,
    Json(req): Json<CreateSession>,
) -> Answer<SessionAnswer> {
    if req.ttl < 1 {
        return Err(ApiError::invalid(format!(
            "ttl must be 1 to {MAX_TTL_SECS} seconds, not {}",
            req.ttl
        )));
    }
    if req.ttl > MAX_TTL_SECS {
        return Err(ApiError::lease_ttl_too_large().with_message(format!(
            "ttl must be at most {MAX_TTL_SECS} seconds, not {}",
            req.ttl
        )));
    }
    let granted = lease::grant(
        &state,
        PbLeaseGrantRequest {
            ttl: req.ttl,
            id: match &req.id {
                Some(id) => parse_session(id)?.get(),
                None => 0,
            },
        },
    )
    .await?;
    if !granted.error.is_empty() {
        return Err(ApiError::invalid(granted.error));
    }
    answer(SessionAnswer {
        id: session_id(granted.id),
        ttl: granted.ttl,
    })
}

/// Keep a session alive. Answered at once with the time the cell
/// confirmed; a session this proxy does not know yet (its client came
/// from another proxy) is confirmed with the cell first.
#[utoipa::path(post, path = "/v1/sessions/{id}/keepalive", tag = "sessions",
    params(("id" = String, Path, description = "The session id (hex)")),
    responses((status = 200, body = SessionAnswer), (status = 404, body = ErrorBody, description = "session_expired"),
        (status = "4XX", body = ErrorBody), (status = "5XX", body = ErrorBody)))]
pub async fn keep_alive(
    State(state): State<Arc<ProxyState>>,
    Path(id): Path<String>,
) -> Answer<SessionAnswer> {
    let id = parse_session(&id)?;
    // Kept alive by the proxy's batches: the cell first says the client
    // is someone.
    crate::ops::auth::require_authenticated(state.upstream.home()).await?;
    metrics::counter!(KEEPALIVES.name, "api" => "http").increment(1);
    let ttl = session::keep_alive(&state.sessions, id, state.request_timeout).await?;
    answer(SessionAnswer {
        id: id.to_string(),
        ttl,
    })
}

/// A session's time left and the keys bound to it.
#[utoipa::path(get, path = "/v1/sessions/{id}", tag = "sessions",
    params(("id" = String, Path, description = "The session id (hex)")),
    responses((status = 200, body = SessionInfo), (status = 404, body = ErrorBody, description = "session_expired"),
        (status = "4XX", body = ErrorBody), (status = "5XX", body = ErrorBody)))]
pub async fn info(
    State(state): State<Arc<ProxyState>>,
    Path(id): Path<String>,
) -> Answer<SessionInfo> {
    let id = parse_session(&id)?;
    let request = PbLeaseTimeToLiveRequest {
        id: id.get(),
        keys: true,
    };
    let resp = lease::time_to_live(&state, request)
        .await
        .map_err(session_gone)?;
    // etcd answers TTL -1 for a lease that does not exist.
    if resp.ttl < 0 {
        return Err(ApiError::session_expired(id));
    }
    let (keys, keys_encoding) = resp.keys.iter().map(|k| encode(k)).unzip();
    answer(SessionInfo {
        id: id.to_string(),
        ttl: resp.ttl,
        granted_ttl: resp.granted_ttl,
        keys,
        keys_encoding,
    })
}

/// End a session: its keys are deleted in one revision.
#[utoipa::path(delete, path = "/v1/sessions/{id}", tag = "sessions",
    params(("id" = String, Path, description = "The session id (hex)")),
    responses((status = 200, body = Revoked), (status = 404, body = ErrorBody, description = "session_expired"),
        (status = "4XX", body = ErrorBody), (status = "5XX", body = ErrorBody)))]
pub async fn revoke(
    State(state): State<Arc<ProxyState>>,
    Path(id): Path<String>,
) -> Answer<Revoked> {
    let id = parse_session(&id)?;
    match lease::revoke(&state, id).await {
        Ok(resp) => answer(Revoked {
            id: id.to_string(),
            revision: resp.header.map_or(0, |h| h.revision),
        }),
        Err(e) if e.code == ErrorCode::LeaseNotFound => Err(ApiError::session_expired(id)),
        Err(e) => Err(e),
    }
}
