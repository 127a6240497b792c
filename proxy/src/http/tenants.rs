//! Operators' routes for tenants, passed to the cell's `Tenants` service as
//! the client (root only once authentication is on):
//! `GET /v1/admin/tenants`, and `GET`, `PUT` and `DELETE`
//! `/v1/admin/tenants/{name}`. A tenant owns key prefixes; the cell
//! refuses a write that would take it past `max_keys` live keys or
//! `max_bytes` bytes of live keys and values (`quota_exceeded`).

use super::extract::{Json, Path};
use super::model::ErrorBody;
use super::{answer, Answer};
use crate::ops::auth::call_for_client;
use crate::state::ProxyState;
use crate::upstream::Kind;
use axum::extract::State;
use latchkey_shared::etcd_methods::tenants::{DELETE, GET, LIST, PUT};
use latchkey_shared::tenants_pb::*;
use serde::{Deserialize, Serialize};
use std::sync::Arc;
use utoipa::ToSchema;

/// A tenant's settings.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct TenantSettings {
    /// Key prefixes it owns: none a prefix of another tenant's.
    pub prefixes: Vec<String>,
    /// Most live keys under its prefixes; 0 or absent: no limit.
    #[serde(default)]
    pub max_keys: u64,
    /// Most bytes of live keys and values under its prefixes; 0 or
    /// absent: no limit.
    #[serde(default)]
    pub max_bytes: u64,
    /// Requests per second naming its keys, across all proxies; 0 or
    /// absent: no limit (`rate_limited` past it).
    #[serde(default)]
    pub requests_per_second: u64,
    /// Requests per second naming its keys by one user; 0 or absent: no
    /// limit.
    #[serde(default)]
    pub user_requests_per_second: u64,
    /// Most client watches on its keys open at once through the proxies;
    /// 0 or absent: no limit (`quota_exceeded` past it).
    #[serde(default)]
    pub max_watches: u64,
}

/// A tenant's settings and what its keys use now.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct TenantState {
    pub name: String,
    pub prefixes: Vec<String>,
    pub max_keys: u64,
    pub max_bytes: u64,
    pub requests_per_second: u64,
    pub user_requests_per_second: u64,
    pub max_watches: u64,
    /// Live keys under its prefixes.
    pub keys: u64,
    /// Bytes of those keys and their values.
    pub bytes: u64,
}

#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct TenantList {
    pub tenants: Vec<TenantState>,
    pub revision: i64,
}

#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct TenantChanged {
    /// The revision of the change and its audit record.
    pub revision: i64,
}

fn state_of(info: TenantInfo) -> TenantState {
    let t = info.tenant.unwrap_or_default();
    let u = info.usage.unwrap_or_default();
    TenantState {
        name: t.name,
        prefixes: t
            .prefixes
            .iter()
            .map(|p| String::from_utf8_lossy(p).into_owned())
            .collect(),
        max_keys: t.max_keys,
        max_bytes: t.max_bytes,
        requests_per_second: t.requests_per_second,
        user_requests_per_second: t.user_requests_per_second,
        max_watches: t.max_watches,
        keys: u.keys,
        bytes: u.bytes,
    }
}

/// Every tenant, by name, with what it uses.
#[utoipa::path(get, path = "/v1/admin/tenants", tag = "tenants",
    responses((status = 200, body = TenantList), (status = "4XX", body = ErrorBody), (status = "5XX", body = ErrorBody)))]
pub async fn list(State(state): State<Arc<ProxyState>>) -> Answer<TenantList> {
    let resp: TenantListResponse = call_for_client(
        state.upstream.home(),
        Kind::Read,
        LIST,
        TenantListRequest {},
    )
    .await?;
    answer(TenantList {
        tenants: resp.tenants.into_iter().map(state_of).collect(),
        revision: resp.header.map_or(0, |h| h.revision),
    })
}

/// One tenant's settings and what it uses.
#[utoipa::path(get, path = "/v1/admin/tenants/{name}", tag = "tenants",
    params(("name" = String, Path, description = "The tenant")),
    responses((status = 200, body = TenantState), (status = 404, body = ErrorBody, description = "tenant_not_found"),
        (status = "4XX", body = ErrorBody), (status = "5XX", body = ErrorBody)))]
pub async fn get(
    State(state): State<Arc<ProxyState>>,
    Path(name): Path<String>,
) -> Answer<TenantState> {
    let resp: TenantGetResponse = call_for_client(
        state.upstream.home(),
        Kind::Read,
        GET,
        TenantGetRequest { name },
    )
    .await?;
    answer(state_of(resp.info.unwrap_or_default()))
}

/// Add a tenant or replace its settings, with an audit record.
#[utoipa::path(put, path = "/v1/admin/tenants/{name}", tag = "tenants",
    params(("name" = String, Path, description = "The tenant: 1-128 visible ASCII characters, no '/'")),
    request_body = TenantSettings,
    responses((status = 200, body = TenantChanged), (status = "4XX", body = ErrorBody), (status = "5XX", body = ErrorBody)))]
pub async fn put(
    State(state): State<Arc<ProxyState>>,
    Path(name): Path<String>,
    Json(settings): Json<TenantSettings>,
) -> Answer<TenantChanged> {
    let tenant = Tenant {
        name,
        prefixes: settings
            .prefixes
            .into_iter()
            .map(String::into_bytes)
            .collect(),
        max_keys: settings.max_keys,
        max_bytes: settings.max_bytes,
        requests_per_second: settings.requests_per_second,
        user_requests_per_second: settings.user_requests_per_second,
        max_watches: settings.max_watches,
    };
    let request = TenantPutRequest {
        tenant: Some(tenant),
    };
    let resp: TenantPutResponse =
        call_for_client(state.upstream.home(), Kind::Write, PUT, request).await?;
    answer(TenantChanged {
        revision: resp.header.map_or(0, |h| h.revision),
    })
}

/// Remove a tenant, with an audit record; its keys stay, counted by no one.
#[utoipa::path(delete, path = "/v1/admin/tenants/{name}", tag = "tenants",
    params(("name" = String, Path, description = "The tenant")),
    responses((status = 200, body = TenantChanged), (status = 404, body = ErrorBody, description = "tenant_not_found"),
        (status = "4XX", body = ErrorBody), (status = "5XX", body = ErrorBody)))]
pub async fn delete(
    State(state): State<Arc<ProxyState>>,
    Path(name): Path<String>,
) -> Answer<TenantChanged> {
    let request = TenantDeleteRequest { name };
    let resp: TenantDeleteResponse =
        call_for_client(state.upstream.home(), Kind::Write, DELETE, request).await?;
    answer(TenantChanged {
        revision: resp.header.map_or(0, |h| h.revision),
    })
}
