//! `/metrics`, `/healthz` and `/readyz` on `--metrics-addr`; the last two
//! are also on the HTTP API's address.

use crate::state::ProxyState;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::get;
use axum::Router;
use metrics_exporter_prometheus::PrometheusHandle;
use std::sync::Arc;

/// Alive: the process answers.
pub async fn healthz() -> &'static str {
    "ok\n"
}

/// Ready: every cell behind the proxy has a leader that answers.
pub async fn readyz(State(state): State<Arc<ProxyState>>) -> (StatusCode, String) {
    match state.upstream.not_ready() {
        Some(why) => (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("not ready: {why}\n"),
        ),
        None => (StatusCode::OK, "ready\n".to_string()),
    }
}

pub fn router(state: Arc<ProxyState>, prometheus: Option<PrometheusHandle>) -> Router {
    Router::new()
        .route(
            "/metrics",
            get(move || {
                let text = prometheus.as_ref().map(|p| p.render()).unwrap_or_default();
                async move { text }
            }),
        )
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .with_state(state)
}
