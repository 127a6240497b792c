//! The HTTP/JSON API under `/v1/` (DESIGN section 6), curl-friendly:
//! keys are URL paths, values raw bodies or UTF-8 JSON strings (base64
//! only when the bytes are not UTF-8), watches Server-Sent Events, every
//! error the JSON body of the one error table with its HTTP status.
//!
//! - [`kv`]: `/v1/kv/{key}` get, put (with preconditions), delete;
//!   [`txn`]: `/v1/txn`;
//! - [`session`]: `/v1/sessions`, keep-alives answered from the table;
//! - [`watch_sse`]: `/v1/watch/{key}` as Server-Sent Events;
//! - [`locks`]: `/v1/locks/{name}`; [`elections`]: `/v1/elections/{name}`;
//!   [`audit`]: force-release and the audit stream;
//! - [`cluster`]: the cell behind the proxy, `/v1/cluster`;
//! - [`tenants`]: `/v1/admin/tenants`, tenants' prefixes, quotas and use;
//! - [`directory`]: `/v1/admin/directory`, which cell owns which prefix;
//! - [`model`]: the JSON shapes and the bytes-in-JSON rule;
//!   [`extract`]: extractors whose rejections are API errors.
//!
//! Every route is declared once, with its OpenAPI description, through
//! `utoipa_axum`'s router: the router and `/v1/openapi.json` come from the
//! same declarations, so neither has a route the other lacks.

pub mod audit;
pub mod auth;
pub mod cluster;
pub mod directory;
pub mod elections;
pub mod extract;
pub mod kv;
pub mod locks;
pub mod model;
pub mod session;
pub mod tenants;
pub mod txn;
pub mod watch_sse;

use crate::metrics_catalog::{HTTP_RESPONSES, REQUEST_SECONDS};
use crate::state::ProxyState;
use axum::extract::{DefaultBodyLimit, MatchedPath, Request, State};
use axum::http::{Method, StatusCode, Uri};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::{Extension, Router};
use latchkey_shared::ApiError;
use std::sync::Arc;
use tokio::time::Instant;
use utoipa::OpenApi;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

/// What a handler answers: JSON, or an error with its status and body.
pub type Answer<T> = Result<axum::Json<T>, ApiError>;

pub fn answer<T>(value: T) -> Answer<T> {
    Ok(axum::Json(value))
}

#[derive(OpenApi)]
#[openapi(
    info(
        title = "latchkey",
        description = "A coordination service: keys with revisions, sessions (leases), \
            transactions and watches. Keys are URL paths; values are raw bodies on the way \
            in and UTF-8 strings on the way out (base64 when the bytes are not UTF-8, as \
            `value_encoding` says). Every error is `{\"error\", \"message\", \"retry\"}`."
    ),
    tags(
        (name = "kv", description = "Keys and transactions"),
        (name = "sessions", description = "Sessions: leases that keep keys alive"),
        (name = "watch", description = "Changes as Server-Sent Events"),
        (name = "locks", description = "Locks with fencing tokens, held by sessions"),
        (name = "elections", description = "Leader elections held by sessions: campaign, proclaim, resign, observe"),
        (name = "cluster", description = "The cell behind the proxy"),
        (name = "auth", description = "Tokens: a user name and password for a token sent as Authorization: Bearer"),
        (name = "tenants", description = "Tenants: key prefixes with quotas on their keys and bytes (root only with authentication on)"),
        (name = "directory", description = "The directory of cells: which cell owns which key prefix (root only with authentication on)"),
        (name = "service", description = "The API document and health")
    )
)]
struct ApiDoc;

/// The API's routes and their OpenAPI document, from one declaration.
pub fn routes() -> (Router<Arc<ProxyState>>, serde_json::Value) {
    let (router, doc) = OpenApiRouter::with_openapi(ApiDoc::openapi())
        .routes(routes!(kv::get_kv, kv::put_kv, kv::delete_kv))
        .routes(routes!(txn::txn))
        .routes(routes!(session::create))
        .routes(routes!(session::keep_alive))
        .routes(routes!(session::info, session::revoke))
        .routes(routes!(watch_sse::watch))
        .routes(routes!(locks::acquire))
        .routes(routes!(locks::release))
        .routes(routes!(locks::state_of))
        .routes(routes!(locks::check))
        .routes(routes!(elections::campaign))
        .routes(routes!(elections::proclaim))
        .routes(routes!(elections::resign))
        .routes(routes!(elections::leader))
        .routes(routes!(elections::observe))
        .routes(routes!(audit::force_release))
        .routes(routes!(audit::records))
        .routes(routes!(cluster::status))
        .routes(routes!(tenants::list))
        .routes(routes!(tenants::get, tenants::put, tenants::delete))
        .routes(routes!(directory::show))
        .routes(routes!(directory::add_cell))
        .routes(routes!(directory::assign))
        .routes(routes!(directory::move_prefix))
        .routes(routes!(auth::token))
        .routes(routes!(openapi_json))
        .routes(routes!(healthz))
        .routes(routes!(readyz))
        .split_for_parts();
    (router, document(&doc))
}

/// The document as served: axum's catch-all `{*key}` written as
/// OpenAPI's `{key}`.
fn document(doc: &utoipa::openapi::OpenApi) -> serde_json::Value {
    let mut json = serde_json::to_value(doc).unwrap_or_default();
    if let Some(paths) = json.get_mut("paths").and_then(|p| p.as_object_mut()) {
        let renamed: serde_json::Map<String, serde_json::Value> = std::mem::take(paths)
            .into_iter()
            .map(|(path, item)| (path.replace("{*", "{"), item))
            .collect();
        *paths = renamed;
    }
    json
}

/// The HTTP API with its state, limits, metrics and JSON fallbacks.
pub fn router(state: Arc<ProxyState>) -> Router {
    let (routes, doc) = routes();
    routes
        .fallback(no_route)
        .method_not_allowed_fallback(wrong_method)
        .layer(axum::middleware::from_fn(auth::as_caller))
        .layer(axum::middleware::from_fn(track))
        .layer(DefaultBodyLimit::max(state.max_request_bytes))
        .layer(Extension(Arc::new(doc)))
        .with_state(state)
}

/// This API's OpenAPI 3.1 document.
#[utoipa::path(get, path = "/v1/openapi.json", tag = "service",
    responses((status = 200, content_type = "application/json", description = "The OpenAPI document")))]
async fn openapi_json(
    Extension(doc): Extension<Arc<serde_json::Value>>,
) -> axum::Json<serde_json::Value> {
    axum::Json((*doc).clone())
}

/// The process answers.
#[utoipa::path(get, path = "/healthz", tag = "service",
    responses((status = 200, content_type = "text/plain", description = "ok")))]
async fn healthz() -> &'static str {
    crate::admin::healthz().await
}

/// Every cell behind this proxy has a leader that answers.
#[utoipa::path(get, path = "/readyz", tag = "service",
    responses((status = 200, content_type = "text/plain", description = "ready"),
        (status = 503, content_type = "text/plain", description = "not ready, and why")))]
async fn readyz(state: State<Arc<ProxyState>>) -> (StatusCode, String) {
    crate::admin::readyz(state).await
}

/// A path the API does not have. `/v1/kv/` and `/v1/watch/` with no key
/// are an empty key, not an unknown route.
async fn no_route(method: Method, uri: Uri) -> ApiError {
    let path = uri.path();
    if matches!(path, "/v1/kv" | "/v1/kv/" | "/v1/watch" | "/v1/watch/") {
        return ApiError::key_not_provided().with_message(format!(
            "{path} needs a key: {}/KEY",
            path.trim_end_matches('/')
        ));
    }
    ApiError::route_not_found(method.as_str(), path)
}

async fn wrong_method(method: Method, uri: Uri) -> ApiError {
    ApiError::method_not_allowed(method.as_str(), uri.path())
}

/// Counts each request and its latency by route (the route's template,
/// not the key, so a million keys are one series).
async fn track(request: Request, next: Next) -> Response {
    let started = Instant::now();
    let path = request
        .extensions()
        .get::<MatchedPath>()
        .map_or("unrouted", |p| p.as_str());
    let route = format!("{} {path}", request.method());
    let response = next.run(request).await;
    let status = response.status().as_u16().to_string();
    metrics::histogram!(REQUEST_SECONDS.name, "api" => "http", "route" => route.clone())
        .record(started.elapsed().as_secs_f64());
    metrics::counter!(HTTP_RESPONSES.name, "route" => route, "status" => status).increment(1);
    response.into_response()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::session::SessionTable;
    use crate::upstream::{CellClient, Upstream};
    use axum::body::Body;
    use latchkey_shared::lifecycle::Lifecycle;
    use std::time::Duration;
    use tower::ServiceExt;

    /// The API in front of a cell that is not there: every routed request
    /// gets an answer of its own (unavailable, bad input), never "no such
    /// route".
    fn api_without_a_cell() -> Router {
        let closed = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = closed.local_addr().expect("addr").to_string();
        drop(closed);
        let cell = CellClient::new(&[addr], Duration::from_millis(300), None).expect("cell");
        let upstream = Arc::new(Upstream::new(cell, None));
        let coalescers =
            crate::watch::cell_coalescers::CellCoalescers::new(upstream.home(), 8, 8, 1 << 20);
        let cache =
            crate::cache::ReadCache::new(coalescers.home().clone(), upstream.home().clone(), 0);
        router(Arc::new(ProxyState {
            upstream,
            coalescers,
            extensions: Default::default(),
            fanout: crate::watch::fanout::Fanout::new(std::time::Duration::ZERO),
            client_watches: crate::watch::client_watches::ClientWatches::new(8, 8),
            cache,
            floors: Default::default(),
            retention: latchkey_shared::idempotency::RetentionLease::new(Duration::from_secs(60)),
            sessions: Arc::new(SessionTable::new()),
            request_timeout: Duration::from_millis(300),
            max_request_bytes: 1 << 20,
            lifecycle: Lifecycle::new(),
            auth_attempts: crate::ops::auth::attempts_per_address(),
            read_permits: Default::default(),
            tenant_limits: Arc::new(crate::tenant_limits::TenantLimits::new(1.0)),
            token_checks: crate::ops::rates::token_checks(),
        }))
    }

    async fn error_of(api: &Router, method: &str, path: &str) -> Option<String> {
        let request = axum::http::Request::builder()
            .method(method)
            .uri(path)
            .body(Body::from("{}"))
            .expect("request");
        let response = api.clone().oneshot(request).await.expect("an answer");
        let body = axum::body::to_bytes(response.into_body(), 1 << 20)
            .await
            .unwrap_or_default();
        serde_json::from_slice::<serde_json::Value>(&body)
            .ok()
            .and_then(|v| v["error"].as_str().map(str::to_string))
    }

    fn concrete(path: &str) -> String {
        path.replace("{key}", "some/key")
            .replace("{id}", "00000000000000ab")
    }

    const METHODS: [&str; 5] = ["GET", "PUT", "POST", "DELETE", "PATCH"];

    #[tokio::test]
    async fn every_documented_route_is_routed_and_every_routed_method_documented() {
        let api = api_without_a_cell();
        let (_, doc) = routes();
        let paths = doc["paths"].as_object().expect("paths");
        assert!(paths.len() >= 10, "{paths:?}");
        for (path, item) in paths {
            let documented: Vec<String> = item
                .as_object()
                .expect("a path item")
                .keys()
                .map(|m| m.to_ascii_uppercase())
                .collect();
            for method in METHODS {
                let error = error_of(&api, method, &concrete(path)).await;
                if documented.iter().any(|m| m == method) {
                    assert!(
                        !matches!(
                            error.as_deref(),
                            Some("route_not_found" | "method_not_allowed")
                        ),
                        "{method} {path} is documented but not routed: {error:?}"
                    );
                } else {
                    assert_eq!(
                        error.as_deref(),
                        Some("method_not_allowed"),
                        "{method} {path} is routed but not documented"
                    );
                }
            }
        }
    }

    #[tokio::test]
    async fn paths_outside_the_document_are_not_routed() {
        let api = api_without_a_cell();
        for path in [
            "/",
            "/v1",
            "/v1/keys/a",
            "/v1/sessions/ab/refresh",
            "/v2/kv/a",
            "/metrics",
        ] {
            for method in METHODS {
                assert_eq!(
                    error_of(&api, method, path).await.as_deref(),
                    Some("route_not_found"),
                    "{method} {path}"
                );
            }
        }
    }
}
