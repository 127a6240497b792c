//! What the cell's speed rests on, asserted as behaviour, not as speed:
//! concurrent writes share log entries and fsyncs (group commit),
//! concurrent linearizable reads share leadership rounds, and concurrent
//! keep-alives on a follower share peer calls to the leader. Each check
//! also asserts that sharing lost nothing: every write has its own revision
//! and is read back, every read sees the write acknowledged before it
//! began, every keep-alive is answered for its own lease.

use crate::CELL_BIN;
use etcd_client::{Client, GetOptions};
use latchkey_testkit::Cluster;
use std::collections::BTreeSet;

const CONCURRENT: usize = 64;
const ROUNDS: usize = 5;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_writes_share_fsyncs_and_concurrent_reads_share_leadership_rounds() {
    let cluster = Cluster::start(CELL_BIN, 3, &[]).await;
    let leader = cluster.leader_at_start();
    let follower = cluster.follower();
    let c = cluster.client(leader).await;

    check_concurrent_writes_share_fsyncs(&cluster, leader, &c).await;
    check_concurrent_reads_share_rounds(&cluster, follower, &c).await;
    check_concurrent_keep_alives_share_peer_calls(&cluster, follower).await;
}

async fn check_concurrent_writes_share_fsyncs(cluster: &Cluster, leader: u64, c: &Client) {
    let mut revisions = BTreeSet::new();
    for round in 0..ROUNDS {
        let puts = (0..CONCURRENT).map(|i| {
            let mut c = c.clone();
            async move {
                let key = format!("gc/{round}/{i}");
                c.put(key.as_str(), format!("v{i}"), None)
                    .await
                    .map(|r| (key, r.header().map(|h| h.revision())))
            }
        });
        for put in futures::future::join_all(puts).await {
            let (key, revision) = put.expect("every concurrent put succeeds");
            let revision = revision.expect("a put answers with a header");
            assert!(
                revisions.insert(revision),
                "{key}: revision {revision} given twice"
            );
        }
    }
    assert_eq!(revisions.len(), ROUNDS * CONCURRENT);
    let mut c = c.clone();
    let all = c
        .get("gc/", Some(GetOptions::new().with_prefix()))
        .await
        .expect("read back");
    assert_eq!(all.kvs().len(), ROUNDS * CONCURRENT, "every write is there");
    let by_revision: BTreeSet<i64> = all.kvs().iter().map(|kv| kv.mod_revision()).collect();
    assert_eq!(
        by_revision, revisions,
        "each key holds the revision its put answered"
    );

    let metrics = cluster.metrics(leader).await;
    let writes = latchkey_testkit::metric_value(&metrics, "latchkey_log_writes_per_fsync_sum")
        .expect("writes per fsync exported");
    let fsyncs = latchkey_testkit::metric_value(&metrics, "latchkey_log_writes_per_fsync_count")
        .expect("fsyncs exported");
    assert!(
        writes >= (ROUNDS * CONCURRENT) as f64 && writes / fsyncs > 1.0,
        "{writes} writes in {fsyncs} fsyncs: concurrent writes did not share them"
    );
}

async fn check_concurrent_reads_share_rounds(cluster: &Cluster, follower: u64, c: &Client) {
    let before = read_index_counts(cluster).await;
    let via_follower = cluster.client(follower).await;
    for round in 0..ROUNDS {
        let mut w = c.clone();
        let value = format!("r{round}");
        w.put("shared-read", value.as_str(), None)
            .await
            .expect("put");
        let reads = (0..CONCURRENT).map(|i| {
            // Half through the leader, half forwarded by a follower.
            let mut c = if i % 2 == 0 {
                c.clone()
            } else {
                via_follower.clone()
            };
            async move { c.get("shared-read", None).await }
        });
        for got in futures::future::join_all(reads).await {
            let got = got.expect("every concurrent linearizable read succeeds");
            assert_eq!(
                got.kvs().first().and_then(|kv| kv.value_str().ok()),
                Some(value.as_str()),
                "a linearizable read missed the write acknowledged before it"
            );
        }
    }
    let after = read_index_counts(cluster).await;
    let (reads, rounds) = (after.0 - before.0, after.1 - before.1);
    assert!(
        reads >= (ROUNDS * CONCURRENT) as f64,
        "{reads} read-index waits counted for {} reads",
        ROUNDS * CONCURRENT
    );
    assert!(
        rounds >= 1.0 && rounds < reads / 2.0,
        "{reads} read-index waits took {rounds} rounds: they did not share them"
    );
}

/// Read-index waits (a read, or a follower's request served by the
/// leader) and the rounds run for them, summed over the members: the
/// leader's quorum rounds and the followers' requests to the leader.
async fn read_index_counts(cluster: &Cluster) -> (f64, f64) {
    let mut counts = (0.0, 0.0);
    for id in cluster.running() {
        counts.0 += cluster
            .metric(id, "latchkey_read_index_waits_total")
            .await
            .unwrap_or(0.0);
        counts.1 += cluster
            .metric(id, "latchkey_read_index_rounds_total")
            .await
            .unwrap_or(0.0);
    }
    counts
}

/// Keep-alives on a follower, one stream per lease as etcd's clients keep
/// them: those sent at once reach the leader in shared refresh batches,
/// and each is answered with its own lease's TTL (0 for a revoked one).
async fn check_concurrent_keep_alives_share_peer_calls(cluster: &Cluster, follower: u64) {
    let mut c = cluster.client(follower).await;
    let mut streams = Vec::new();
    for i in 0..CONCURRENT {
        let ttl = 30 + i as i64;
        let id = c.lease_grant(ttl, None).await.expect("grant").id();
        streams.push((id, ttl, c.lease_keep_alive(id).await.expect("stream")));
    }
    let (revoked, _, _) = streams[0];
    c.lease_revoke(revoked).await.expect("revoke");
    let before = forwarded_keep_alive_counts(cluster, follower).await;
    for _ in 0..ROUNDS {
        let rounds = streams
            .iter_mut()
            .map(|(id, ttl, (keeper, stream))| async move {
                keeper.keep_alive().await.expect("send a keep-alive");
                let resp = stream
                    .message()
                    .await
                    .expect("a keep-alive answer")
                    .expect("the stream stays open");
                (*id, *ttl, resp.id(), resp.ttl())
            });
        for (id, ttl, answered_id, answered_ttl) in futures::future::join_all(rounds).await {
            let expected = if id == revoked { 0 } else { ttl };
            assert_eq!(
                (answered_id, answered_ttl),
                (id, expected),
                "lease {id} (TTL {ttl}) was answered for another lease or with another TTL"
            );
        }
    }
    let after = forwarded_keep_alive_counts(cluster, follower).await;
    let (keep_alives, batches) = (after.0 - before.0, after.1 - before.1);
    assert!(
        keep_alives >= (ROUNDS * CONCURRENT) as f64,
        "{keep_alives} keep-alives forwarded for {} sent to a follower",
        ROUNDS * CONCURRENT
    );
    assert!(
        batches >= 1.0 && batches < keep_alives / 2.0,
        "{keep_alives} forwarded keep-alives took {batches} peer calls: they did not share them"
    );
}

/// Keep-alives `follower` sent on to the leader, and the peer calls that
/// carried them.
async fn forwarded_keep_alive_counts(cluster: &Cluster, follower: u64) -> (f64, f64) {
    let keep_alives = cluster
        .metric(follower, "latchkey_forwarded_keep_alives_total")
        .await
        .unwrap_or(0.0);
    let batches = cluster
        .metric(follower, "latchkey_forwarded_keep_alive_batches_total")
        .await
        .unwrap_or(0.0);
    (keep_alives, batches)
}
