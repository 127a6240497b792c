//! `/v1/locks/{name}`: the shared lock recipe over HTTP. Acquire waits (up
//! to `timeout_ms`) until the session holds the lock and answers its
//! fencing token; release is idempotent; the lock's state lists its holder
//! and waiters in queue order; `check` tells a resource whether a token is
//! the current holder's (a sequencer check, for resources that ask rather
//! than keep the highest token).

use super::extract::{KeyedJson, Path, Query};
use super::model::{parse_session, session_gone, session_id, ErrorBody};
use super::{answer, Answer};
use crate::ops::idempotency;
use crate::ops::locks::permit;
use crate::ops::locks::UpstreamLocks;
use crate::state::ProxyState;
use axum::extract::State;
use latchkey_shared::etcdpb::PbKeyValue;
use latchkey_shared::lock::mutex;
use latchkey_shared::lock::queue::{line, queue_key};
use latchkey_shared::lock::Access;
use latchkey_shared::ApiError;
use latchkey_shared::KeyRange;
use serde::{Deserialize, Serialize};
use std::sync::Arc;
use std::time::Duration;
use utoipa::{IntoParams, ToSchema};

/// How long an acquire waits when it names no timeout.
const DEFAULT_WAIT: Duration = Duration::from_secs(30);

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct AcquireLock {
    /// The session (hex id) that will hold the lock; the lock is released
    /// when the session ends.
    pub session_id: String,
    /// How long to wait for the lock, in milliseconds (default 30 000, at
    /// most an hour); then `lock_timeout`, and the place in the queue is
    /// given up.
    pub timeout_ms: Option<u64>,
    /// Lock-delay, in milliseconds (at most 60 000): if this session
    /// EXPIRES while it holds the lock (it did not release it), the lock
    /// is not granted to anyone else for this long, for resources that
    /// cannot check fencing tokens. A release hands the lock on at once.
    pub lock_delay_ms: Option<u64>,
}

#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct Granted {
    /// Higher for every later holder of this lock: hand it to the resource
    /// the lock protects with every write.
    pub fencing_token: i64,
    /// The holder's key (`name/<session hex>`).
    pub key: String,
    pub revision: i64,
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ReleaseLock {
    /// The session that holds (or waits for) the lock.
    pub session_id: String,
}

#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct Released {
    /// Whether the session held or waited for the lock (releasing twice
    /// is not an error).
    pub released: bool,
    pub revision: i64,
}

#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct Contender {
    pub session_id: String,
    pub key: String,
    /// Its key's create revision: the fencing token it holds, or will.
    pub fencing_token: i64,
}

#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct LockState {
    /// The holder, if the lock is held.
    pub holder: Option<Contender>,
    /// The waiters, in the order they will hold the lock.
    pub waiters: Vec<Contender>,
    pub revision: i64,
}

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct CheckParams {
    /// The fencing token to check.
    pub token: i64,
}

#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct Checked {
    /// Whether `token` is the current holder's.
    pub current: bool,
    /// The current holder's token, if the lock is held.
    pub holder_token: Option<i64>,
    pub revision: i64,
}

/// When a wait for a lock or leadership asked to last `timeout_ms` ends
/// (30 s by default, at most an hour).
pub fn wait_deadline(timeout_ms: Option<u64>) -> tokio::time::Instant {
    let wait = timeout_ms
        .map_or(DEFAULT_WAIT, Duration::from_millis)
        .min(latchkey_shared::lock::service::WAIT_LIMIT);
    tokio::time::Instant::now() + wait
}

/// The lock recipes' backend over this proxy's upstream.
pub fn backend(state: &Arc<ProxyState>) -> Arc<UpstreamLocks> {
    Arc::new(UpstreamLocks {
        state: state.clone(),
    })
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn contender(kv: &PbKeyValue) -> Contender {
    Contender {
        session_id: session_id(kv.lease),
        key: text(&kv.key),
        fencing_token: kv.create_revision,
    }
}

/// The lock's queue, first in line first, and the revision it was read at.
async fn queue(state: &Arc<ProxyState>, name: &str) -> Result<(Vec<PbKeyValue>, i64), ApiError> {
    let (kvs, header) = line(backend(state).as_ref(), name.as_bytes(), 0).await?;
    Ok((kvs, header.revision))
}

/// Acquire a lock for a session.
#[utoipa::path(post, path = "/v1/locks/{name}/acquire", tag = "locks",
    params(("name" = String, Path, description = "The lock"), ("Idempotency-Key" = Option<String>, Header, description = "Makes a retry safe: a retry with the same key and request gets the first answer (the same token); a different request under it is precondition_failed")),
    request_body = AcquireLock,
    responses((status = 200, body = Granted), (status = 408, body = ErrorBody, description = "lock_timeout: not granted in time; the place in the queue was given up"),
        (status = "4XX", body = ErrorBody), (status = "5XX", body = ErrorBody)))]
pub async fn acquire(
    State(state): State<Arc<ProxyState>>,
    Path(name): Path<String>,
    KeyedJson(req, keyed): KeyedJson<AcquireLock>,
) -> Answer<Granted> {
    let lease = parse_session(&req.session_id)?;
    let queue = KeyRange::prefix(name.as_bytes());
    permit(&state, Access::ReadWrite, &queue).await?;
    let deadline = wait_deadline(req.timeout_ms);
    let lock_delay = Duration::from_millis(req.lock_delay_ms.unwrap_or(0));
    let guard = idempotency::guard(&state, keyed.as_ref()).await?;
    let grant = mutex::acquire(
        backend(&state),
        name.as_bytes(),
        lease.get(),
        lock_delay,
        deadline,
        guard.as_ref(),
    )
    .await;
    let grant = idempotency::after(&state, grant)
        .await
        .map_err(session_gone)?;
    answer(Granted {
        fencing_token: grant.fencing_token,
        key: text(&grant.key),
        revision: grant.header.revision,
    })
}

/// Release a lock (or give up a place in its queue).
#[utoipa::path(post, path = "/v1/locks/{name}/release", tag = "locks",
    params(("name" = String, Path, description = "The lock"), ("Idempotency-Key" = Option<String>, Header, description = "Makes a retry safe: a retry with the same key and request gets the first answer; a different request under it is precondition_failed")),
    request_body = ReleaseLock,
    responses((status = 200, body = Released), (status = "4XX", body = ErrorBody), (status = "5XX", body = ErrorBody)))]
pub async fn release(
    State(state): State<Arc<ProxyState>>,
    Path(name): Path<String>,
    KeyedJson(req, keyed): KeyedJson<ReleaseLock>,
) -> Answer<Released> {
    let lease = parse_session(&req.session_id)?;
    let key = queue_key(name.as_bytes(), lease.get());
    permit(&state, Access::ReadWrite, &KeyRange::single(key.clone())).await?;
    let guard = idempotency::guard(&state, keyed.as_ref()).await?;
    let released = mutex::release(backend(&state).as_ref(), key, guard.as_ref()).await;
    let (header, released) = idempotency::after(&state, released).await?;
    answer(Released {
        released,
        revision: header.revision,
    })
}

/// A lock's holder and waiters.
#[utoipa::path(get, path = "/v1/locks/{name}", tag = "locks",
    params(("name" = String, Path, description = "The lock")),
    responses((status = 200, body = LockState), (status = "4XX", body = ErrorBody), (status = "5XX", body = ErrorBody)))]
pub async fn state_of(
    State(state): State<Arc<ProxyState>>,
    Path(name): Path<String>,
) -> Answer<LockState> {
    permit(&state, Access::Read, &KeyRange::prefix(name.as_bytes())).await?;
    let (kvs, revision) = queue(&state, &name).await?;
    let mut line = kvs.iter().map(contender);
    answer(LockState {
        holder: line.next(),
        waiters: line.collect(),
        revision,
    })
}

/// Whether a fencing token is the current holder's.
#[utoipa::path(get, path = "/v1/locks/{name}/check", tag = "locks",
    params(("name" = String, Path, description = "The lock"), CheckParams),
    responses((status = 200, body = Checked), (status = "4XX", body = ErrorBody), (status = "5XX", body = ErrorBody)))]
pub async fn check(
    State(state): State<Arc<ProxyState>>,
    Path(name): Path<String>,
    Query(params): Query<CheckParams>,
) -> Answer<Checked> {
    permit(&state, Access::Read, &KeyRange::prefix(name.as_bytes())).await?;
    let (kvs, revision) = queue(&state, &name).await?;
    let holder_token = kvs.first().map(|kv| kv.create_revision);
    answer(Checked {
        current: holder_token == Some(params.token),
        holder_token,
        revision,
    })
}
