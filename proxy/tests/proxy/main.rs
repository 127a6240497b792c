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
mod t63_watch_limits;
mod t70_read_cache;
mod t80_locks;
mod t81_fencing;
mod t82_idempotency;
mod t83_elections;
mod t84_partition;
mod t90_tls;
mod t95_auth;
mod t96_tenants;
mod t97_cells;

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

/// The audit records `GET /v1/audit?from_revision=1` streams from the
/// proxy at `http` (host:port), read until `enough` holds for those read.
pub async fn audit_records_until(
    http: &str,
    enough: impl Fn(&[latchkey_shared::lock::audit::AuditRecord]) -> bool,
) -> Vec<latchkey_shared::lock::audit::AuditRecord> {
    use futures::StreamExt;
    let resp = reqwest::get(format!("http://{http}/v1/audit?from_revision=1"))
        .await
        .expect("audit stream");
    assert_eq!(resp.status(), 200);
    let mut body = Box::pin(resp.bytes_stream());
    let mut text = String::new();
    tokio::time::timeout(std::time::Duration::from_secs(10), async {
        loop {
            let chunk = body.next().await.expect("open").expect("chunk");
            text.push_str(&String::from_utf8_lossy(&chunk));
            // Whole events only: a chunk may end inside one.
            let whole = &text[..text.rfind("\n\n").unwrap_or(0)];
            let records: Vec<_> = whole
                .lines()
                .filter_map(|l| l.strip_prefix("data: "))
                .map(|data| {
                    let event: serde_json::Value = serde_json::from_str(data).expect("an event");
                    let value = event["kv"]["value"].as_str().expect("a value");
                    serde_json::from_str(value).expect("a record")
                })
                .collect();
            if enough(&records) {
                return records;
            }
        }
    })
    .await
    .expect("the audit records are streamed")
}
