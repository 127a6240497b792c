//! `/v1/elections/{name}`: the shared election recipe over HTTP. A
//! session campaigns (waiting, up to `timeout_ms`, until it leads), the
//! leader proclaims values and resigns; anyone reads the leader or
//! observes every leader and value as Server-Sent Events. The leader's
//! `leader_revision` (its key's create revision) is its fencing token, as
//! a lock's.

use super::extract::{Json, Path};
use super::locks::{backend, wait_deadline};
use super::model::{parse_session, session_gone, session_id, ErrorBody, KeyValue};
use super::watch_sse::event_of;
use super::{answer, Answer};
use crate::ops::locks::permit;
use crate::state::ProxyState;
use axum::extract::State;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures::StreamExt;
use latchkey_shared::etcdpb::{PbKeyValue, PbRangeRequest};
use latchkey_shared::lock::election;
use latchkey_shared::lock::queue::queue_key;
use latchkey_shared::lock::{Access, LockBackend};
use latchkey_shared::v3electionpb::LeaderKey;
use latchkey_shared::ApiError;
use latchkey_shared::KeyRange;
use serde::{Deserialize, Serialize};
use std::sync::Arc;
use utoipa::ToSchema;

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Campaign {
    /// The session (hex id) that will lead; leadership ends with it.
    pub session_id: String,
    /// The value to lead with (UTF-8).
    #[serde(default)]
    pub value: String,
    /// How long to wait for leadership, in milliseconds (default 30 000, at
    /// most an hour); then `lock_timeout`, and the candidacy is withdrawn.
    pub timeout_ms: Option<u64>,
}

#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct Leading {
    /// The leader's key (`name/<session hex>`).
    pub key: String,
    /// The key's create revision: higher for every later leader (its
    /// fencing token).
    pub leader_revision: i64,
    pub revision: i64,
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Proclaim {
    /// The leading session.
    pub session_id: String,
    /// The campaign's `leader_revision`; absent: the session's current
    /// candidacy.
    pub leader_revision: Option<i64>,
    /// The new value (UTF-8).
    pub value: String,
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Resign {
    /// The leading (or waiting) session.
    pub session_id: String,
    /// The campaign's `leader_revision`; absent: the session's current
    /// candidacy.
    pub leader_revision: Option<i64>,
}

#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct Done {
    pub revision: i64,
}

#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct Leader {
    /// The leading session.
    pub session_id: String,
    /// The leader's key, value and revisions (`create_revision` is its
    /// `leader_revision`).
    pub kv: KeyValue,
    pub revision: i64,
}

fn leader_of(kv: &PbKeyValue, revision: i64) -> Leader {
    Leader {
        session_id: session_id(kv.lease),
        kv: KeyValue::from_pb(kv, false),
        revision,
    }
}

/// The leader key a session names: with its campaign's revision, or its
/// current candidacy (none: `election_not_leader`).
async fn leader_key(
    state: &Arc<ProxyState>,
    name: &str,
    session: &str,
    leader_revision: Option<i64>,
) -> Result<LeaderKey, ApiError> {
    let lease = parse_session(session)?.get();
    let key = queue_key(name.as_bytes(), lease);
    let rev = match leader_revision {
        Some(rev) => rev,
        None => {
            let current = latchkey_shared::lock::LockBackend::range(
                backend(state).as_ref(),
                PbRangeRequest {
                    key: key.clone(),
                    ..Default::default()
                },
            )
            .await?;
            current
                .kvs
                .first()
                .map(|kv| kv.create_revision)
                .ok_or_else(ApiError::election_not_leader)?
        }
    };
    Ok(LeaderKey {
        name: name.as_bytes().to_vec(),
        key,
        rev,
        lease,
    })
}

/// Campaign: wait until the session leads the election.
#[utoipa::path(post, path = "/v1/elections/{name}/campaign", tag = "elections",
    params(("name" = String, Path, description = "The election")),
    request_body = Campaign,
    responses((status = 200, body = Leading), (status = 408, body = ErrorBody, description = "lock_timeout: not elected in time; the candidacy was withdrawn"),
        (status = "4XX", body = ErrorBody), (status = "5XX", body = ErrorBody)))]
pub async fn campaign(
    State(state): State<Arc<ProxyState>>,
    Path(name): Path<String>,
    Json(req): Json<Campaign>,
) -> Answer<Leading> {
    permit(
        &state,
        Access::ReadWrite,
        &KeyRange::prefix(name.as_bytes()),
    )
    .await?;
    let lease = parse_session(&req.session_id)?;
    let (leader, header) = election::campaign(
        backend(&state),
        name.as_bytes(),
        lease.get(),
        req.value.into_bytes(),
        wait_deadline(req.timeout_ms),
    )
    .await
    .map_err(session_gone)?;
    answer(Leading {
        key: String::from_utf8_lossy(&leader.key).into_owned(),
        leader_revision: leader.rev,
        revision: header.revision,
    })
}

/// Proclaim: the leader publishes a new value.
#[utoipa::path(post, path = "/v1/elections/{name}/proclaim", tag = "elections",
    params(("name" = String, Path, description = "The election")),
    request_body = Proclaim,
    responses((status = 200, body = Done), (status = 412, body = ErrorBody, description = "election_not_leader: the session does not lead"),
        (status = "4XX", body = ErrorBody), (status = "5XX", body = ErrorBody)))]
pub async fn proclaim(
    State(state): State<Arc<ProxyState>>,
    Path(name): Path<String>,
    Json(req): Json<Proclaim>,
) -> Answer<Done> {
    permit(
        &state,
        Access::ReadWrite,
        &KeyRange::prefix(name.as_bytes()),
    )
    .await?;
    let leader = leader_key(&state, &name, &req.session_id, req.leader_revision).await?;
    let header =
        election::proclaim(backend(&state).as_ref(), &leader, req.value.into_bytes()).await?;
    answer(Done {
        revision: header.revision,
    })
}

/// Resign: give up leadership (or the candidacy); resigning twice is not
/// an error.
#[utoipa::path(post, path = "/v1/elections/{name}/resign", tag = "elections",
    params(("name" = String, Path, description = "The election")),
    request_body = Resign,
    responses((status = 200, body = Done), (status = "4XX", body = ErrorBody), (status = "5XX", body = ErrorBody)))]
pub async fn resign(
    State(state): State<Arc<ProxyState>>,
    Path(name): Path<String>,
    Json(req): Json<Resign>,
) -> Answer<Done> {
    permit(
        &state,
        Access::ReadWrite,
        &KeyRange::prefix(name.as_bytes()),
    )
    .await?;
    let leader = match leader_key(&state, &name, &req.session_id, req.leader_revision).await {
        Ok(leader) => leader,
        // No candidacy: nothing to resign.
        Err(e) if e.code == latchkey_shared::ErrorCode::ElectionNotLeader => {
            return answer(Done { revision: 0 })
        }
        Err(e) => return Err(e),
    };
    let header = election::resign(backend(&state).as_ref(), &leader).await?;
    answer(Done {
        revision: header.revision,
    })
}

/// The current leader (`election_no_leader` when nobody leads).
#[utoipa::path(get, path = "/v1/elections/{name}", tag = "elections",
    params(("name" = String, Path, description = "The election")),
    responses((status = 200, body = Leader), (status = 404, body = ErrorBody, description = "election_no_leader"),
        (status = "4XX", body = ErrorBody), (status = "5XX", body = ErrorBody)))]
pub async fn leader(
    State(state): State<Arc<ProxyState>>,
    Path(name): Path<String>,
) -> Answer<Leader> {
    permit(&state, Access::Read, &KeyRange::prefix(name.as_bytes())).await?;
    match election::leader(backend(&state).as_ref(), name.as_bytes()).await? {
        (Some(kv), header) => answer(leader_of(&kv, header.revision)),
        (None, _) => Err(ApiError::election_no_leader(name.as_bytes())),
    }
}

/// Every leader and every value it proclaims, as Server-Sent Events
/// (`leader` events; nothing while nobody leads; an `error` event ends
/// the stream).
#[utoipa::path(get, path = "/v1/elections/{name}/observe", tag = "elections",
    params(("name" = String, Path, description = "The election")),
    responses((status = 200, content_type = "text/event-stream", body = Leader,
        description = "One `leader` event per leader and per value it proclaims"),
        (status = "4XX", body = ErrorBody), (status = "5XX", body = ErrorBody)))]
pub async fn observe(
    State(state): State<Arc<ProxyState>>,
    Path(name): Path<String>,
) -> Result<Response, ApiError> {
    // Checked again when the cell's auth records change, as a watch is.
    let backend = backend(&state);
    let revoked = backend
        .permit_stream(&Default::default(), &KeyRange::prefix(name.as_bytes()))
        .await?;
    if name.is_empty() {
        return Err(ApiError::invalid("an election needs a name"));
    }
    let leaders = election::observe_until(backend, name.into_bytes(), revoked);
    let events = leaders.map(|observed| {
        Ok::<Event, std::convert::Infallible>(match observed {
            Ok((kv, header)) => event_of(
                "leader",
                Some(kv.mod_revision),
                serde_json::to_value(leader_of(&kv, header.revision)).unwrap_or_default(),
            ),
            Err(e) => super::watch_sse::error_event(&e),
        })
    });
    Ok(Sse::new(events)
        .keep_alive(KeepAlive::new().interval(super::watch_sse::SSE_KEEP_ALIVE))
        .into_response())
}
