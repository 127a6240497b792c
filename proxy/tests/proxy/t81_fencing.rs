//! Fencing under pauses (issue 13, Done-when 3): three holder processes
//! take turns with one lock over HTTP, each writing to a fenced resource
//! with its token while it holds the lock. The test SIGSTOPs the current
//! holder past its session's TTL, so the lock passes on, then SIGCONTs it:
//! it goes on writing with its old token, as a paused process would. The
//! resource (a `FencedResource` behind a tiny HTTP server in this test)
//! must never accept a lower token than one it accepted, and the accepted
//! writes must come in one unbroken run per holder; stale writes must have
//! been refused (proof that the pauses bit).

use crate::{member_addrs, proxy_bin};
use latchkey_testkit::{cell_binary, Cluster, FencedLog, Holders, ProxyProcess};
use std::time::Duration;

const ROUNDS: usize = 200;
const HOLDERS: usize = 3;
/// Longer than the holders' sessions' 1 s TTL, with room for the expiry
/// to land.
const PAUSE: Duration = Duration::from_millis(2500);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paused_holders_past_their_ttl_are_fenced_off_by_their_tokens() {
    let cluster = Cluster::start(cell_binary(), 3, &["--min-ttl", "1"]).await;
    let proxy = ProxyProcess::start(
        proxy_bin(),
        &member_addrs(&cluster),
        &["--refresh-tick", "100ms"],
    )
    .await;
    let (resource, resource_addr) = FencedLog::serve().await;
    let holders = Holders::start(HOLDERS, &proxy.http, "fenced", resource_addr);
    let rounds = || resource.grants();
    let started = tokio::time::Instant::now();
    let mut pauses = 0;
    while rounds() < ROUNDS {
        assert!(
            started.elapsed() < Duration::from_secs(240),
            "only {} rounds in 4 minutes",
            rounds()
        );
        tokio::time::sleep(Duration::from_secs(2)).await;
        // Pause whoever wrote last (most likely the holder) past its TTL.
        let last = resource.last_writer();
        if let Some(pid) = last.filter(|pid| holders.pids().contains(pid)) {
            holders.signal(pid, "STOP");
            tokio::time::sleep(PAUSE).await;
            holders.signal(pid, "CONT");
            pauses += 1;
        }
    }
    drop(holders);

    let summary = resource.check().unwrap_or_else(|e| panic!("{e}"));
    eprintln!(
        "{} rounds, {} writes accepted, {} stale writes refused, {pauses} pauses",
        summary.grants, summary.accepted, summary.stale_refused
    );
    assert!(
        summary.stale_refused > 0,
        "no stale write was refused: the pauses did not bite"
    );
}
