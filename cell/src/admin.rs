//! The metrics address: `/metrics` (Prometheus text), `/healthz` (the
//! process serves) and `/readyz` (this member knows a leader, has applied
//! what it knows to be committed, and if it is the leader it has heard from
//! a quorum within the quorum timeout).

use crate::metrics_catalog::{
    HAS_LEADER, IS_LEADER, LAST_LOG_INDEX, LOG_PURGED_INDEX, LOG_STORE_MEMORY_BYTES, RAFT_TERM,
};
use crate::node::CellNode;
use crate::raft::leadership::quorum_lost;
use crate::raft::{Member, NodeId};
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::get;
use axum::Router;
use metrics_exporter_prometheus::PrometheusHandle;
use openraft::RaftMetrics;
use std::sync::Arc;
use std::time::Duration;

#[derive(Clone)]
struct AdminState {
    node: Arc<CellNode>,
    /// The process's recorder, when its owner installed one.
    prometheus: Option<PrometheusHandle>,
}

async fn metrics_text(State(s): State<AdminState>) -> String {
    let m = s.node.raft.metrics().borrow().clone();
    metrics::gauge!(RAFT_TERM.name).set(m.current_term as f64);
    metrics::gauge!(IS_LEADER.name).set(if s.node.is_leader() { 1.0 } else { 0.0 });
    metrics::gauge!(HAS_LEADER.name).set(if m.current_leader.is_some() { 1.0 } else { 0.0 });
    metrics::gauge!(LAST_LOG_INDEX.name).set(m.last_log_index.unwrap_or(0) as f64);
    // Entries up to here are gone from the log: a member behind it catches
    // up only from a snapshot.
    metrics::gauge!(LOG_PURGED_INDEX.name).set(m.purged.map_or(0, |id| id.index) as f64);
    metrics::gauge!(LOG_STORE_MEMORY_BYTES.name)
        .set(crate::storage::memory_bytes(&s.node.db) as f64);
    s.prometheus
        .as_ref()
        .map(PrometheusHandle::render)
        .unwrap_or_default()
}

async fn healthz() -> &'static str {
    "ok\n"
}

/// How long `/readyz` waits for apply to reach what this member knows is
/// committed: long enough for a busy member to finish its current batch,
/// short enough for a probe.
const READY_APPLY_WAIT: Duration = Duration::from_secs(1);

/// Why this member is not ready, from what it knows now: `committed` is
/// the log index it knows to be committed, `applied` what it has applied.
fn not_ready(
    m: &RaftMetrics<NodeId, Member>,
    id: NodeId,
    quorum_timeout: Duration,
    committed: Option<u64>,
    applied: Option<u64>,
) -> Option<String> {
    if quorum_lost(m, id, quorum_timeout) {
        return Some(format!(
            "leader of term {} without a quorum for {} ms",
            m.current_term,
            m.millis_since_quorum_ack.unwrap_or_default()
        ));
    }
    if m.current_leader.is_none() {
        return Some("no leader".to_string());
    }
    if applied < committed {
        return Some(format!(
            "applied up to log index {} of {} committed",
            applied.unwrap_or_default(),
            committed.unwrap_or_default()
        ));
    }
    None
}

async fn readyz(State(s): State<AdminState>) -> (StatusCode, String) {
    let node = &s.node;
    let committed = tokio::time::timeout(
        READY_APPLY_WAIT,
        node.raft
            .with_raft_state(|st| st.committed.map(|l| l.index)),
    )
    .await
    .ok()
    .and_then(Result::ok);
    let Some(committed) = committed else {
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            "not ready: raft does not answer\n".to_string(),
        );
    };
    // A member applying a batch is a moment behind; one that stays behind
    // is catching up and not ready.
    if let Some(index) = committed {
        let _ = tokio::time::timeout(READY_APPLY_WAIT, node.state.wait_applied(index)).await;
    }
    let m = node.raft.metrics().borrow().clone();
    let applied = m.last_applied.map(|l| l.index);
    match not_ready(&m, node.id, node.quorum_timeout, committed, applied) {
        Some(why) => (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("not ready: {why}\n"),
        ),
        None => (
            StatusCode::OK,
            format!(
                "ready: leader {}, term {}\n",
                m.current_leader.unwrap_or_default(),
                m.current_term
            ),
        ),
    }
}

pub fn router(node: Arc<CellNode>, prometheus: Option<PrometheusHandle>) -> Router {
    let router = Router::new()
        .route("/metrics", get(metrics_text))
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .with_state(AdminState { node, prometheus });
    #[cfg(debug_assertions)]
    if crate::chaos::fail_points_on() {
        return router.merge(crate::chaos::router());
    }
    router
}

#[cfg(test)]
mod tests {
    use super::*;
    use openraft::ServerState;

    fn follower_of(leader: Option<NodeId>) -> RaftMetrics<NodeId, Member> {
        let mut m = RaftMetrics::new_initial(2);
        m.state = ServerState::Follower;
        m.current_leader = leader;
        m
    }

    /// M6 (cell review): /readyz said "ready" for a member that knew a
    /// leader but had not applied the log it knew to be committed.
    #[test]
    fn m6_ready_means_a_leader_and_everything_known_committed_applied() {
        let timeout = Duration::from_secs(1);
        let m = follower_of(Some(1));
        assert_eq!(not_ready(&m, 2, timeout, Some(10), Some(10)), None);
        assert_eq!(not_ready(&m, 2, timeout, None, None), None);
        let behind = not_ready(&m, 2, timeout, Some(10), Some(7)).expect("behind");
        assert!(behind.contains("7 of 10"), "{behind}");
        let alone = not_ready(&follower_of(None), 2, timeout, Some(10), Some(10));
        assert_eq!(alone.as_deref(), Some("no leader"));
        let mut cut_off = RaftMetrics::new_initial(2);
        cut_off.state = ServerState::Leader;
        cut_off.current_leader = Some(2);
        cut_off.millis_since_quorum_ack = Some(5_000);
        let lost = not_ready(&cut_off, 2, timeout, Some(10), Some(10)).expect("lost");
        assert!(lost.contains("without a quorum"), "{lost}");
    }
}
