//! Leader failure and recovery: no acknowledged write is lost, a new
//! leader is elected quickly, and a restarted member catches up by log
//! replay or, once its log has been purged on the leader, by snapshot.

use crate::CELL_BIN;
use etcd_client::GetOptions;
use latchkey_testkit::{err_text, eventually, numbered, outlier_bound, put_all, Cluster};
use tokio::time::{Duration, Instant};

async fn revision_of(cluster: &Cluster, id: u64) -> i64 {
    let mut c = cluster.client(id).await;
    c.status()
        .await
        .expect("status")
        .header()
        .expect("header")
        .revision()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_writes_survive_the_leader_and_a_restarted_member_catches_up() {
    // Small snapshot thresholds so the second half exercises log purging
    // and snapshot install within a test's budget. A snapshot every 3000
    // writes; 50 entries kept behind it (group commit puts up to 64 of the
    // concurrent writes below in one entry, so 7000 writes are at least
    // 110 entries: more than is kept).
    let mut cluster = Cluster::start(
        CELL_BIN,
        3,
        &[
            "--snapshot-entries",
            "3000",
            "--snapshot-keep-entries",
            "50",
        ],
    )
    .await;
    let leader = cluster.leader_at_start();
    let c = cluster.client(cluster.follower()).await;

    // Every write is acknowledged while the cell is healthy.
    let started = Instant::now();
    let acked = put_all(&c, numbered("k/", 10_000, "v1")).await;
    println!("wrote {} keys in {:?}", acked.len(), started.elapsed());

    // SIGKILL the leader: a new one within 3 s, and nothing acknowledged lost.
    cluster.kill(leader);
    let killed = Instant::now();
    // Both survivors agree on a leader that runs: not the killed one.
    let new_leader = cluster.wait_leader(Duration::from_secs(3)).await;
    println!("new leader {new_leader} after {:?}", killed.elapsed());
    for id in cluster.running() {
        cluster.wait_member_holds(id, "k/", &acked).await;
    }

    // Restart the old leader: it catches up from the log (it missed only a
    // few entries, well inside what the leader keeps): 20 writes, one at a
    // time, are at most 20 entries.
    let mut more = std::collections::BTreeMap::new();
    let mut c_one = c.clone();
    for (key, value) in numbered("r/", 20, "v2") {
        c_one
            .put(key.as_str(), value.as_str(), None)
            .await
            .expect("put");
        more.insert(key, value);
    }
    cluster.spawn(leader);
    cluster.wait_member_holds(leader, "k/", &acked).await;
    cluster.wait_member_holds(leader, "r/", &more).await;
    let target = revision_of(&cluster, new_leader).await;
    assert_eq!(
        revision_of(&cluster, leader).await,
        target,
        "same revision after log replay"
    );
    // The counter appears at the first install.
    let installed = cluster
        .metric(leader, "latchkey_snapshots_installed_total")
        .await;
    assert_eq!(installed, None, "caught up by log replay, not by snapshot");

    // Stop a follower, write past two snapshots so the leader purges the
    // log it missed, then restart it: only a snapshot can catch it up.
    let lagger = cluster.follower_of(new_leader);
    cluster.kill(lagger);
    // Through the new leader: the client above may point at the lagger.
    let c_leader = cluster.client(new_leader).await;
    let all_p = put_all(&c_leader, numbered("p/", 7_000, "v3")).await;
    let built = cluster
        .metric(new_leader, "latchkey_snapshots_built_total")
        .await
        .unwrap_or(0.0);
    assert!(built >= 2.0, "the leader took snapshots ({built})");
    cluster.spawn(lagger);
    cluster.wait_member_holds(lagger, "p/", &all_p).await;
    cluster.wait_member_holds(lagger, "k/", &acked).await;
    cluster.wait_member_holds(lagger, "r/", &more).await;
    let installed = cluster
        .metric(lagger, "latchkey_snapshots_installed_total")
        .await
        .unwrap_or(0.0);
    assert!(
        installed >= 1.0,
        "the restarted member caught up by snapshot install ({installed})"
    );
    let target = revision_of(&cluster, new_leader).await;
    assert_eq!(
        revision_of(&cluster, lagger).await,
        target,
        "same revision after snapshot install"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_restart_keeps_every_key_revision_and_lease() {
    let mut cluster = Cluster::start(CELL_BIN, 3, &["--snapshot-entries", "400"]).await;
    let c = cluster.client(1).await;
    let acked = put_all(&c, numbered("f/", 1_000, "before")).await;
    let mut c1 = c.clone();
    let lease = c1.lease_grant(60, None).await.expect("grant").id();
    c1.put(
        "f/leased",
        "yes",
        Some(etcd_client::PutOptions::new().with_lease(lease)),
    )
    .await
    .expect("put");
    let revision = c1
        .get("f/leased", None)
        .await
        .expect("get")
        .header()
        .expect("header")
        .revision();
    let created = c1.get("f/000007", None).await.expect("get").kvs()[0].create_revision();

    cluster.stop_all().await;
    for id in 1..=3 {
        cluster.spawn(id);
    }
    cluster.wait_leader(Duration::from_secs(20)).await;
    for id in 1..=3 {
        cluster.wait_member_holds(id, "f/0", &acked).await;
    }
    let mut c = cluster.client(2).await;
    let got = c.get("f/leased", None).await.expect("get after restart");
    assert_eq!(
        got.header().expect("header").revision(),
        revision,
        "revision kept"
    );
    assert_eq!(got.kvs()[0].lease(), lease);
    assert_eq!(
        c.get("f/000007", None).await.expect("get").kvs()[0].create_revision(),
        created
    );
    let ttl = c.lease_time_to_live(lease, None).await.expect("ttl");
    assert_eq!(ttl.granted_ttl(), 60, "the lease survived the restart");
    assert!(ttl.ttl() > 0);
    // The next write continues the revision sequence.
    let next = c
        .put("f/after", "x", None)
        .await
        .expect("put")
        .header()
        .expect("header")
        .revision();
    assert_eq!(next, revision + 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_quorum_requests_wait_then_fail_unavailable_and_recover() {
    let mut cluster = Cluster::start(CELL_BIN, 3, &["--request-timeout-ms", "1500"]).await;
    let survivor = cluster.follower();
    let mut c = cluster.client(survivor).await;
    c.put("q/before", "1", None)
        .await
        .expect("put with a quorum");
    // A linearizable read through the survivor: its own state then holds
    // the put. (A follower learns that an entry is committed from the
    // leader's next message; killed right after the put, the leader may
    // never send it, and a serializable read could then miss the put.)
    c.get("q/before", None)
        .await
        .expect("linearizable read with a quorum");

    let others: Vec<u64> = cluster
        .running()
        .into_iter()
        .filter(|id| *id != survivor)
        .collect();
    for id in &others {
        cluster.kill(*id);
    }
    let started = Instant::now();
    let err = c
        .put("q/during", "2", None)
        .await
        .expect_err("no quorum, no write");
    let waited = started.elapsed();
    let text = err_text(err);
    assert!(text.starts_with("Unavailable: "), "{text}");
    assert!(
        waited >= Duration::from_millis(1000) && waited < Duration::from_secs(5),
        "waited {waited:?}: {text}"
    );
    let err = c
        .get("q/before", None)
        .await
        .expect_err("no quorum, no linearizable read");
    let text = err_text(err);
    assert!(text.starts_with("Unavailable: "), "{text}");
    // A serializable read is still served from local state.
    let local = c
        .get("q/before", Some(GetOptions::new().with_serializable()))
        .await
        .expect("local read");
    assert_eq!(local.kvs()[0].value(), b"1");

    // Quorum back: the cell serves again and lost nothing.
    cluster.spawn(others[0]);
    cluster.wait_leader(Duration::from_secs(15)).await;
    eventually(Duration::from_secs(15), async || {
        c.put("q/after", "3", None).await.map_err(err_text)
    })
    .await;
    assert_eq!(
        c.get("q/before", None).await.expect("get").kvs()[0].value(),
        b"1"
    );
}

/// A3 (cell review): a snapshot went to a follower as one message, so one
/// over the 1 GiB peer message cap (the default quota is 2 GiB) could never
/// be sent and the follower never caught up. Snapshots now go in 4 MiB
/// chunks: here a follower that missed a purge catches up from a snapshot
/// of several chunks. It must not campaign between chunks either: it did
/// once in CI, deposed the leader, and the transfer started over under each
/// new one. (A snapshot over 1 GiB is too slow for the suite; the closing
/// note of the review issue reports one.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a3_a_snapshot_of_many_chunks_catches_a_follower_up() {
    let mut cluster = Cluster::start(
        CELL_BIN,
        3,
        &[
            "--snapshot-entries",
            "20",
            "--snapshot-keep-entries",
            "5",
            "--max-value-bytes",
            "1048576",
        ],
    )
    .await;
    let leader = cluster.leader_at_start();
    let lagger = cluster.follower();
    let lagger_last = cluster
        .metric(lagger, "latchkey_last_log_index")
        .await
        .expect("the lagger's last log index");
    cluster.kill(lagger);
    let mut c = cluster.client(leader).await;
    // 24 MiB of values: six chunks and more. One at a time: a batch of
    // large entries outlasts openraft's AppendEntries timeout of one
    // heartbeat (review P5, the performance issue).
    let value = "x".repeat(1024 * 1024);
    for (key, value) in numbered("big/", 24, &value) {
        c.put(key.as_str(), value.as_str(), None)
            .await
            .expect("put");
    }
    let small = put_all(&c, numbered("small/", 100, "s")).await;
    // Snapshots are built and the log purged in the background: once every
    // member that runs has purged past the lagger's last entry, whichever
    // leads can catch it up from a snapshot only.
    eventually(Duration::from_secs(30), async || {
        for id in cluster.running() {
            let purged = cluster
                .metric(id, "latchkey_log_purged_index")
                .await
                .unwrap_or(0.0);
            if purged <= lagger_last {
                return Err(format!(
                    "member {id} has purged up to {purged}, the lagger holds up to {lagger_last}"
                ));
            }
        }
        Ok(())
    })
    .await;
    cluster.spawn(lagger);
    cluster.wait_member_holds(lagger, "small/", &small).await;
    // Every large value, one at a time (all at once is over a client's
    // message limit).
    let mut on_lagger = cluster.client(lagger).await;
    for (key, value) in numbered("big/", 24, &value) {
        let got = on_lagger
            .get(key.as_str(), Some(GetOptions::new().with_serializable()))
            .await
            .expect("get");
        assert_eq!(
            got.kvs().first().map(|kv| kv.value()),
            Some(value.as_bytes()),
            "{key}"
        );
    }
    let installed = cluster
        .metric(lagger, "latchkey_snapshot_installed_bytes")
        .await
        .unwrap_or(0.0);
    // The snapshot holds what was applied when it was taken: at least the
    // first 20 entries (the first snapshot), so 17 MiB of values and more,
    // five 4 MiB chunks; the rest may come after it from the log.
    assert!(
        installed > 16.0 * 1024.0 * 1024.0,
        "the follower installed a snapshot of {installed} bytes"
    );
}

/// The instants at which a writer's puts were acknowledged, one writer
/// over every member, until stopped.
struct TimedWriter {
    acked: std::sync::Arc<std::sync::Mutex<Vec<Instant>>>,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    task: tokio::task::JoinHandle<usize>,
}

impl TimedWriter {
    fn start(endpoints: Vec<String>) -> TimedWriter {
        let acked = std::sync::Arc::new(std::sync::Mutex::new(vec![Instant::now()]));
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let task = tokio::spawn({
            let (acked, stop) = (acked.clone(), stop.clone());
            async move {
                let opts = etcd_client::ConnectOptions::new()
                    .with_timeout(Duration::from_secs(2))
                    .with_connect_timeout(Duration::from_millis(300));
                let mut client = etcd_client::Client::connect(endpoints, Some(opts))
                    .await
                    .expect("the writer connects");
                let mut failures = 0;
                for i in 0u64.. {
                    if stop.load(std::sync::atomic::Ordering::Relaxed) {
                        break;
                    }
                    match client.put(format!("a8/{i:08}"), "v", None).await {
                        Ok(_) => acked.lock().expect("acked").push(Instant::now()),
                        Err(_) => {
                            failures += 1;
                            tokio::time::sleep(Duration::from_millis(20)).await;
                        }
                    }
                }
                failures
            }
        });
        TimedWriter { acked, stop, task }
    }

    fn count(&self) -> usize {
        self.acked.lock().expect("acked").len()
    }

    async fn wait_for_more(&self, n: usize) {
        let target = self.count() + n;
        eventually(Duration::from_secs(30), async || {
            if self.count() >= target {
                Ok(())
            } else {
                Err("writes do not go on")
            }
        })
        .await;
    }

    /// The longest time without an acknowledged write that began in
    /// `from..to`.
    fn longest_gap(&self, from: Instant, to: Instant) -> Duration {
        let acked = self.acked.lock().expect("acked");
        acked
            .windows(2)
            .filter(|w| w[1] > from && w[0] < to)
            .map(|w| w[1] - w[0])
            .max()
            .unwrap_or_default()
    }

    async fn finish(self) -> usize {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        self.task.await.expect("the writer")
    }
}

/// A8 (cell review): under a fault schedule, a leader killed and
/// restarted within ~2.5 s left the cell 2.5 s without a successful write.
/// Ten times: SIGKILL the leader, restart it after 0.5 to 3 s; no stretch
/// without an acknowledged write may reach 3 s, or twice the median of the
/// ten when that is longer (a machine running at half speed stretches
/// every gap; one round far behind the others is the defect). The target,
/// a new leader and a write within 2 s, is the `failover` load-test
/// scenario's to report.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a8_ten_leader_kills_leave_no_write_gap_of_three_seconds() {
    let mut cluster = Cluster::start(CELL_BIN, 3, &[]).await;
    let writer = TimedWriter::start(cluster.endpoints());
    writer.wait_for_more(20).await;
    // Down times spread over 0.5-3 s, the short ones where a restarted
    // leader may come back before the others have elected anyone.
    let downs_ms = [
        500, 2_500, 1_000, 3_000, 700, 2_000, 1_500, 2_800, 900, 1_200,
    ];
    let mut gaps = Vec::new();
    for (round, down_ms) in downs_ms.into_iter().enumerate() {
        let leader = cluster.wait_leader(Duration::from_secs(10)).await;
        let killed_at = Instant::now();
        cluster.kill(leader);
        tokio::time::sleep(Duration::from_millis(down_ms)).await;
        cluster.spawn(leader);
        writer.wait_for_more(20).await;
        let gap = writer.longest_gap(killed_at, Instant::now());
        println!("round {round}: leader {leader} down {down_ms} ms, longest write gap {gap:?}");
        gaps.push(gap);
        // Let the restarted member catch up before the next kill.
        cluster.wait_leader(Duration::from_secs(10)).await;
        writer.wait_for_more(50).await;
    }
    let failures = writer.finish().await;
    let mut sorted = gaps.clone();
    sorted.sort();
    println!(
        "write gaps after a leader kill: min {:?}, median {:?}, max {:?}; {failures} failed writes",
        sorted[0],
        sorted[sorted.len() / 2],
        sorted[sorted.len() - 1]
    );
    let bound = outlier_bound(Duration::from_secs(3), &gaps);
    for (round, gap) in gaps.iter().enumerate() {
        assert!(
            *gap < bound,
            "round {round}: no write for {gap:?} after the leader was killed (bound {bound:?})"
        );
    }
}
