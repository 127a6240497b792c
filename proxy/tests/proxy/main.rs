//! The proxy's integration tests: ONE binary (it links once), numbered by
//! area. Every test starts real `latchkey-proxy` processes (and, where a
//! three-member cell is needed, real `latchkey-cell` processes through
//! `latchkey_testkit::Cluster`) on 127.0.0.1; all are killed when dropped.

mod t10_readme;
mod t20_etcdctl;
mod t30_sessions;
mod t40_bad_input;
mod t50_watch_sse;
mod t60_fanout;
mod t61_late_joiners;
mod t62_slow_watcher;
mod t70_read_cache;
mod t80_locks;
mod t81_fencing;
mod t82_idempotency;
mod t83_elections;

use latchkey_shared::etcdpb::{PbWatchRequest, PbWatchResponse};
use std::path::Path;

/// The binary under test; cargo builds it for this test binary.
pub const PROXY_BIN: &str = env!("CARGO_BIN_EXE_latchkey-proxy");

pub fn proxy_bin() -> &'static Path {
    Path::new(PROXY_BIN)
}

/// The client addresses of a cluster's members.
pub fn member_addrs(cluster: &latchkey_testkit::Cluster) -> Vec<String> {
    cluster.members.iter().map(|m| m.client.clone()).collect()
}

/// A raw etcd Watch stream on `channel` carrying `watches` watches of
/// `key` from `start_revision`, returned once all are created.
pub async fn raw_watch_stream(
    channel: tonic::transport::Channel,
    key: &str,
    start_revision: i64,
    watches: usize,
) -> (
    tokio::sync::mpsc::UnboundedSender<PbWatchRequest>,
    tonic::Streaming<PbWatchResponse>,
) {
    latchkey_shared::client::watches::open_watches(channel, key.as_bytes(), start_revision, watches)
        .await
        .expect("open a watch stream")
}
