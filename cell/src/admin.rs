//! The metrics address: `/metrics` (Prometheus text), `/healthz` (the
//! process serves) and `/readyz` (this member knows a leader, and if it is
//! the leader it has heard from a quorum within the quorum timeout).

use crate::node::CellNode;
use crate::raft::leadership::quorum_lost;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::get;
use axum::Router;
use metrics_exporter_prometheus::PrometheusHandle;
use std::sync::Arc;

#[derive(Clone)]
struct AdminState {
    node: Arc<CellNode>,
    /// The process's recorder, when its owner installed one.
    prometheus: Option<PrometheusHandle>,
}

async fn metrics_text(State(s): State<AdminState>) -> String {
    let m = s.node.raft.metrics().borrow().clone();
    metrics::gauge!("latchkey_raft_term").set(m.current_term as f64);
    metrics::gauge!("latchkey_is_leader").set(if s.node.is_leader() { 1.0 } else { 0.0 });
    metrics::gauge!("latchkey_has_leader").set(if m.current_leader.is_some() { 1.0 } else { 0.0 });
    metrics::gauge!("latchkey_last_log_index").set(m.last_log_index.unwrap_or(0) as f64);
    s.prometheus
        .as_ref()
        .map(PrometheusHandle::render)
        .unwrap_or_default()
}

async fn healthz() -> &'static str {
    "ok\n"
}

async fn readyz(State(s): State<AdminState>) -> (StatusCode, String) {
    let m = s.node.raft.metrics().borrow().clone();
    if quorum_lost(&m, s.node.id, s.node.quorum_timeout) {
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            format!(
                "not ready: leader of term {} without a quorum for {} ms\n",
                m.current_term,
                m.millis_since_quorum_ack.unwrap_or_default()
            ),
        );
    }
    match m.current_leader {
        Some(leader) => (
            StatusCode::OK,
            format!("ready: leader {leader}, term {}\n", m.current_term),
        ),
        None => (
            StatusCode::SERVICE_UNAVAILABLE,
            "not ready: no leader\n".to_string(),
        ),
    }
}

pub fn router(node: Arc<CellNode>, prometheus: Option<PrometheusHandle>) -> Router {
    Router::new()
        .route("/metrics", get(metrics_text))
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .with_state(AdminState { node, prometheus })
}
