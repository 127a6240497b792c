//! Leader failure and recovery: no acknowledged write is lost, a new
//! leader is elected quickly, and a restarted member catches up by log
//! replay or, once its log has been purged on the leader, by snapshot.

use crate::harness::Cluster;
use etcd_client::{Client, GetOptions};
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

/// Writes `n` keys `prefix{i}` with 64 requests in flight; returns the
/// acknowledged values.
async fn write_keys(c: &Client, prefix: &str, n: usize, value: &str) -> BTreeMap<String, String> {
    let results = futures::future::join_all((0..64).map(|w| {
        let mut c = c.clone();
        let prefix = prefix.to_string();
        let value = value.to_string();
        async move {
            let mut acked = Vec::new();
            for i in (w..n).step_by(64) {
                let key = format!("{prefix}{i:05}");
                if c.put(key.clone(), value.clone(), None).await.is_ok() {
                    acked.push((key, value.clone()));
                }
            }
            acked
        }
    }))
    .await;
    results.into_iter().flatten().collect()
}

/// Every acknowledged key with its value, read from member `id` alone
/// (a serializable read: what that member itself holds).
async fn check_member_has(
    cluster: &Cluster,
    id: u64,
    prefix: &str,
    expected: &BTreeMap<String, String>,
) {
    let mut c = cluster.client(id).await;
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        // A member just restarted may not listen yet: retry until the deadline.
        let held: BTreeMap<String, String> = match c
            .get(
                prefix,
                Some(GetOptions::new().with_prefix().with_serializable()),
            )
            .await
        {
            Ok(got) => got
                .kvs()
                .iter()
                .map(|kv| {
                    (
                        kv.key_str().expect("utf-8").to_string(),
                        kv.value_str().expect("utf-8").to_string(),
                    )
                })
                .collect(),
            Err(e) => {
                assert!(
                    Instant::now() < deadline,
                    "member {id} does not answer: {e}"
                );
                tokio::time::sleep(Duration::from_millis(200)).await;
                continue;
            }
        };
        let missing = expected
            .iter()
            .filter(|(k, v)| held.get(*k) != Some(v))
            .count();
        if missing == 0 {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "member {id} is missing {missing} acknowledged writes"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The value of a metric without labels in Prometheus text; 0 if absent.
fn metric_value(text: &str, name: &str) -> f64 {
    text.lines()
        .filter_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
        .next()
        .unwrap_or(0.0)
}

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
    // and snapshot install within a test's budget.
    let mut cluster = Cluster::start(
        3,
        &[
            "--snapshot-entries",
            "3000",
            "--snapshot-keep-entries",
            "500",
        ],
    )
    .await;
    let leader = cluster.wait_leader(Duration::from_secs(10)).await;
    let follower = if leader == 1 { 2 } else { 1 };
    let c = cluster.client(follower).await;

    let started = Instant::now();
    let acked = write_keys(&c, "k/", 10_000, "v1").await;
    println!("wrote {} keys in {:?}", acked.len(), started.elapsed());
    assert_eq!(
        acked.len(),
        10_000,
        "every write is acknowledged while the cell is healthy"
    );

    // SIGKILL the leader: a new one within 3 s, and nothing acknowledged lost.
    cluster.kill(leader);
    let killed = Instant::now();
    let survivors: Vec<u64> = cluster.running();
    let new_leader = loop {
        let mut seen = Vec::new();
        for id in &survivors {
            seen.push(cluster.leader_seen_by(*id).await);
        }
        if let Some(Some(l)) = seen.first() {
            if *l != leader && seen.iter().all(|s| s == &Some(*l)) {
                break *l;
            }
        }
        assert!(
            killed.elapsed() < Duration::from_secs(3),
            "no new leader 3 s after the kill: {seen:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    println!("new leader {new_leader} after {:?}", killed.elapsed());
    for id in &survivors {
        check_member_has(&cluster, *id, "k/", &acked).await;
    }

    // Restart the old leader: it catches up from the log (it missed only a
    // few entries, well inside what the leader keeps).
    let more = write_keys(&c, "r/", 500, "v2").await;
    cluster.spawn(leader);
    check_member_has(&cluster, leader, "k/", &acked).await;
    check_member_has(&cluster, leader, "r/", &more).await;
    let target = revision_of(&cluster, new_leader).await;
    assert_eq!(
        revision_of(&cluster, leader).await,
        target,
        "same revision after log replay"
    );
    let installed = metric_value(
        &cluster.metrics(leader).await,
        "latchkey_snapshots_installed_total",
    );
    assert_eq!(installed, 0.0, "caught up by log replay, not by snapshot");

    // Stop a follower, write past two snapshots so the leader purges the
    // log it missed, then restart it: only a snapshot can catch it up.
    let lagger = survivors
        .iter()
        .copied()
        .find(|id| *id != new_leader)
        .expect("a follower");
    cluster.kill(lagger);
    // Through the new leader: the client above may point at the lagger.
    let c_leader = cluster.client(new_leader).await;
    let all_p = write_keys(&c_leader, "p/", 7_000, "v3").await;
    assert_eq!(all_p.len(), 7_000);
    let built = metric_value(
        &cluster.metrics(new_leader).await,
        "latchkey_snapshots_built_total",
    );
    assert!(built >= 2.0, "the leader took snapshots ({built})");
    cluster.spawn(lagger);
    check_member_has(&cluster, lagger, "p/", &all_p).await;
    check_member_has(&cluster, lagger, "k/", &acked).await;
    check_member_has(&cluster, lagger, "r/", &more).await;
    let installed = metric_value(
        &cluster.metrics(lagger).await,
        "latchkey_snapshots_installed_total",
    );
    assert!(
        installed >= 1.0,
        "the restarted member caught up by snapshot install"
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
    let mut cluster = Cluster::start(3, &["--snapshot-entries", "400"]).await;
    let c = cluster.client(1).await;
    let acked = write_keys(&c, "f/", 1_000, "before").await;
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
    let created = c1.get("f/00007", None).await.expect("get").kvs()[0].create_revision();

    cluster.stop_all();
    for id in 1..=3 {
        cluster.spawn(id);
    }
    cluster.wait_leader(Duration::from_secs(20)).await;
    for id in 1..=3 {
        check_member_has(&cluster, id, "f/0", &acked).await;
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
        c.get("f/00007", None).await.expect("get").kvs()[0].create_revision(),
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
    let mut cluster = Cluster::start(3, &["--request-timeout-ms", "1500"]).await;
    let leader = cluster.wait_leader(Duration::from_secs(10)).await;
    let survivor = if leader == 1 { 2 } else { 1 };
    let mut c = cluster.client(survivor).await;
    c.put("q/before", "1", None)
        .await
        .expect("put with a quorum");

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
    let text = crate::harness::err_text(err);
    assert!(text.starts_with("Unavailable: "), "{text}");
    assert!(
        waited >= Duration::from_millis(1000) && waited < Duration::from_secs(5),
        "waited {waited:?}"
    );
    let err = c
        .get("q/before", None)
        .await
        .expect_err("no quorum, no linearizable read");
    assert!(crate::harness::err_text(err).starts_with("Unavailable: "));
    // A serializable read is still served from local state.
    let local = c
        .get("q/before", Some(GetOptions::new().with_serializable()))
        .await
        .expect("local read");
    assert_eq!(local.kvs()[0].value(), b"1");

    // Quorum back: the cell serves again and lost nothing.
    cluster.spawn(others[0]);
    cluster.wait_leader(Duration::from_secs(15)).await;
    let deadline = Instant::now() + Duration::from_secs(15);
    while c.put("q/after", "3", None).await.is_err() {
        assert!(Instant::now() < deadline, "the cell did not recover");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(
        c.get("q/before", None).await.expect("get").kvs()[0].value(),
        b"1"
    );
}
