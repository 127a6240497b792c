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

/// The log filter of a binary that was not given one: latchkey's own
/// events (started, leader changes, members joining, errors) at INFO, and
/// openraft's only from WARN, because it logs every vote and replication
/// step at INFO. `--log info` shows those too.
pub const DEFAULT_LOG_FILTER: &str = "info,openraft=warn";

/// Installs the log subscriber with `filter` (an `EnvFilter` directive such
/// as `info` or `latchkey_cell=debug`). An invalid filter is an error, so a
/// typo does not silently log at another level. A second call in the same
/// process does nothing.
pub fn init_tracing(filter: &str) -> Result<(), String> {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(log_filter(filter)?)
        .with_target(false)
        .try_init();
    Ok(())
}

fn log_filter(filter: &str) -> Result<tracing_subscriber::EnvFilter, String> {
    tracing_subscriber::EnvFilter::try_new(filter)
        .map_err(|e| format!("invalid log filter {filter:?}: {e}"))
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::sync::{Arc, Mutex};

    /// Collects what a subscriber writes.
    #[derive(Clone, Default)]
    struct Captured(Arc<Mutex<Vec<u8>>>);

    impl Write for Captured {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn the_default_filter_hides_openraft_info_and_keeps_latchkey_info() {
        let captured = Captured::default();
        let writer = captured.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_env_filter(log_filter(DEFAULT_LOG_FILTER).unwrap())
            .with_writer(move || writer.clone())
            .finish();
        tracing::subscriber::with_default(subscriber, || {
            tracing::info!(target: "openraft::replication", "per-step line");
            tracing::warn!(target: "openraft::core", "openraft warning");
            tracing::info!(target: "latchkey_cell::cell", "latchkey-cell started");
        });
        let out = String::from_utf8(captured.0.lock().unwrap().clone()).unwrap();
        assert!(!out.contains("per-step line"), "{out}");
        assert!(out.contains("openraft warning"), "{out}");
        assert!(out.contains("latchkey-cell started"), "{out}");
    }

    #[test]
    fn an_invalid_filter_is_refused_by_name() {
        let refused = log_filter("latchkey_cell=loud").unwrap_err();
        assert!(refused.contains("latchkey_cell=loud"), "{refused}");
    }
}
