//! Process-wide observability, installed once by a binary's `main`:
//! structured logs (`tracing`) and the Prometheus recorder behind
//! `/metrics`. Libraries (the cell, the proxy) only emit; they never
//! install anything global, so several can share one process.

use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};

/// Latency histograms in real buckets (not summaries), from 0.5 ms (an
/// fsync on a fast disk) to 10 s (past any request timeout).
const LATENCY_BUCKETS: &[f64] = &[
    0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0,
];

/// Installs the log subscriber with `filter` (an `EnvFilter` directive such
/// as `info` or `latchkey_cell=debug`; an invalid one falls back to
/// `info`). A second call in the same process does nothing.
pub fn init_tracing(filter: &str) {
    let filter = tracing_subscriber::EnvFilter::try_new(filter)
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_target(false)
        .try_init();
}

/// Installs the process's Prometheus recorder; its handle renders
/// `/metrics`. Fails if a recorder is already installed.
pub fn install_prometheus() -> Result<PrometheusHandle, String> {
    PrometheusBuilder::new()
        .set_buckets_for_metric(Matcher::Suffix("_seconds".into()), LATENCY_BUCKETS)
        .map_err(|e| format!("metric buckets: {e}"))?
        .install_recorder()
        .map_err(|e| format!("installing the metrics recorder: {e}"))
}

/// Resolves on SIGINT or SIGTERM.
pub async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = ctrl_c => {},
                    _ = term.recv() => {},
                }
            }
            Err(_) => {
                let _ = ctrl_c.await;
            }
        }
    }
    #[cfg(not(unix))]
    let _ = ctrl_c.await;
}
