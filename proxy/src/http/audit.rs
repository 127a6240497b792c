//! Operators' routes: `POST /v1/admin/locks/{name}/force-release` breaks a
//! stuck lock and writes its audit record in the same txn;
//! `GET /v1/audit` streams the audit records (Server-Sent Events, each an
//! ordinary watch event whose value is the record's JSON) from any
//! revision, so every privileged operation can be replayed.

use super::extract::{Client, KeyedJson, Path, Query};
use super::model::ErrorBody;
use super::watch_sse::{serve, start_revision, WatchEvent};
use super::{answer, Answer};
use crate::ops::idempotency;
use crate::ops::locks::UpstreamLocks;
use crate::state::ProxyState;
use crate::watch::WatchKey;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::Response;
use latchkey_shared::lock::audit::{self, AuditRecord};
use latchkey_shared::ApiError;
use serde::{Deserialize, Serialize};
use std::sync::Arc;
use utoipa::{IntoParams, ToSchema};

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ForceRelease {
    /// The fencing token of the holder to break (`GET /v1/locks/{name}`
    /// shows it): any other holder is left alone, and the request is
    /// `precondition_failed`.
    pub fencing_token: i64,
    /// Why the lock is broken: kept in the audit record.
    pub reason: String,
    /// Who breaks it (default: the request's address).
    pub operator: Option<String>,
}

#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct ForceReleased {
    /// The session that held the lock.
    pub holder_session: String,
    /// Its fencing token: every later holder's is higher.
    pub fencing_token: i64,
    /// The revision of the release and its audit record.
    pub revision: i64,
}

/// Break a stuck lock's holder, named by its fencing token, with an audit
/// record.
#[utoipa::path(post, path = "/v1/admin/locks/{name}/force-release", tag = "locks",
    params(("name" = String, Path, description = "The lock"), ("Idempotency-Key" = Option<String>, Header, description = "Makes a retry safe: a retry with the same key and request gets the first answer and writes no second record; a different request under it is precondition_failed")),
    request_body = ForceRelease,
    responses((status = 200, body = ForceReleased), (status = 412, body = ErrorBody, description = "The lock is not held under that fencing token (nobody holds it, another holder does, or it was already broken); nothing was released"),
        (status = "4XX", body = ErrorBody), (status = "5XX", body = ErrorBody)))]
pub async fn force_release(
    State(state): State<Arc<ProxyState>>,
    Path(name): Path<String>,
    Client(client): Client,
    KeyedJson(req, keyed): KeyedJson<ForceRelease>,
) -> Answer<ForceReleased> {
    crate::ops::auth::require_admin(state.upstream.home()).await?;
    let operator = req
        .operator
        .filter(|o| !o.trim().is_empty())
        .or_else(|| client.map(|c| c.to_string()))
        .unwrap_or_else(|| "unknown".to_string());
    let at_unix_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    let record = AuditRecord {
        action: "force_release".to_string(),
        lock: name.clone(),
        holder_session: String::new(),
        fencing_token: 0,
        reason: req.reason,
        operator,
        at_unix_ms,
    };
    let backend = UpstreamLocks {
        state: state.clone(),
    };
    let guard = idempotency::guard(&state, keyed.as_ref()).await?;
    let released = audit::force_release(
        &backend,
        name.as_bytes(),
        req.fencing_token,
        record,
        guard.as_ref(),
    )
    .await;
    let (record, revision) = idempotency::after(&state, released).await?;
    tracing::warn!(lock = %name, holder = %record.holder_session, token = record.fencing_token,
        operator = %record.operator, reason = %record.reason, "lock force-released");
    answer(ForceReleased {
        holder_session: record.holder_session,
        fencing_token: record.fencing_token,
        revision,
    })
}

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct AuditParams {
    /// Records from this revision on, then live ones (absent: live only).
    pub from_revision: Option<i64>,
}

/// The audit records, as Server-Sent Events.
#[utoipa::path(get, path = "/v1/audit", tag = "locks",
    params(AuditParams,
        ("Last-Event-ID" = Option<i64>, Header, description = "Resume after this revision")),
    responses((status = 200, content_type = "text/event-stream", body = WatchEvent,
        description = "One `put` event per record; its value is the record (AuditRecord) as JSON"),
        (status = "4XX", body = ErrorBody), (status = "5XX", body = ErrorBody)))]
pub async fn records(
    State(state): State<Arc<ProxyState>>,
    Query(params): Query<AuditParams>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let start = start_revision(&headers, params.from_revision)?;
    let range = audit::range();
    // Root only, checked again whenever the cell's auth records change.
    let permit = crate::ops::auth::admin_permit(&state, &range).await?;
    let key = WatchKey::new(range.start, range.end, &[], false)?;
    serve(&state, key, start, permit).await
}
