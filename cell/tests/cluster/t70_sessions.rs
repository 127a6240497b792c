//! Sessions: batched refresh at scale through a leader kill, mass expiry
//! without stalling writers, the `Session` client through a partition, and
//! lease expiry bounded under leader churn.

use crate::harness::{grant_kept_alive, Cluster, Refresher};
use etcd_client::{Client, EventType, GetOptions, WatchOptions};
use latchkey_shared::session::{Session, SessionOptions, SessionState};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Counts delete events under `prefix` (seen by member `client`) from now on.
async fn count_deletes(
    client: &mut Client,
    prefix: &str,
) -> (Arc<AtomicUsize>, Arc<std::sync::Mutex<Option<Instant>>>) {
    let mut stream = client
        .watch(prefix, Some(WatchOptions::new().with_prefix()))
        .await
        .expect("watch");
    let created = stream.message().await.expect("watch ok").expect("created");
    assert!(created.created());
    let deletes = Arc::new(AtomicUsize::new(0));
    let last = Arc::new(std::sync::Mutex::new(None));
    tokio::spawn({
        let deletes = deletes.clone();
        let last = last.clone();
        async move {
            while let Ok(Some(resp)) = stream.message().await {
                let n = resp
                    .events()
                    .iter()
                    .filter(|e| e.event_type() == EventType::Delete)
                    .count();
                if n > 0 {
                    deletes.fetch_add(n, Ordering::SeqCst);
                    *last.lock().expect("lock") = Some(Instant::now());
                }
            }
        }
    });
    (deletes, last)
}

async fn count_keys(client: &mut Client, prefix: &str) -> i64 {
    client
        .get(
            prefix,
            Some(GetOptions::new().with_prefix().with_count_only()),
        )
        .await
        .expect("count")
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hundred_thousand_leases_refreshed_in_batches_survive_a_leader_kill() {
    const LEASES: usize = 100_000;
    const TTL: i64 = 15;
    let mut cluster = Cluster::start(3, &[]).await;
    let leader = cluster.wait_leader(Duration::from_secs(10)).await;
    let via = (1..=3).find(|id| *id != leader).expect("a follower");
    let writer = cluster.client(leader).await;
    // Refreshes go through a follower that survives the kill; one request
    // per round names all 100 000 leases.
    let addr = cluster.member(via).client.clone();
    let mut refresher = Refresher::open(&addr).await.expect("refresh stream");
    let started = Instant::now();
    let leases = grant_kept_alive(&writer, &mut refresher, LEASES, TTL, "s/").await;
    println!(
        "granted {LEASES} leases with keys in {:?}",
        started.elapsed()
    );
    // Deletes are watched through the same follower.
    let mut watcher = cluster.client(via).await;
    let (deletes, _) = count_deletes(&mut watcher, "s/").await;
    let mut rounds_after_kill = 0;
    let mut rounds_before_kill = 0;
    let mut killed_at: Option<Instant> = None;
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let t = Instant::now();
        match refresher.refresh(&leases).await {
            Ok(ttls) => {
                let dead = ttls.iter().filter(|t| **t <= 0).count();
                assert_eq!(dead, 0, "{dead} leases were gone at a refresh");
                println!("refreshed {} leases in {:?}", ttls.len(), t.elapsed());
                if killed_at.is_some() {
                    rounds_after_kill += 1;
                } else {
                    rounds_before_kill += 1;
                }
            }
            Err(e) => {
                // The leader is gone and the follower forwards to nobody
                // yet, or the stream broke: reopen and go on.
                println!("refresh failed ({e}); reopening");
                tokio::time::sleep(Duration::from_millis(200)).await;
                if let Ok(r) = Refresher::open(&addr).await {
                    refresher = r;
                }
            }
        }
        if killed_at.is_none() && rounds_before_kill >= 2 {
            // SIGKILL the leader after two rounds.
            cluster.kill(leader);
            killed_at = Some(Instant::now());
            println!("killed leader {leader}");
        }
        // Keep refreshing for longer than TTL + grace after the kill.
        if killed_at.is_some_and(|k| k.elapsed() > Duration::from_secs(TTL as u64 + 8)) {
            break;
        }
        assert!(Instant::now() < deadline, "refreshing took too long");
        let elapsed = t.elapsed();
        tokio::time::sleep(Duration::from_secs(3).saturating_sub(elapsed)).await;
    }
    assert!(rounds_after_kill >= 3, "refreshes went on after the kill");
    assert_eq!(
        deletes.load(Ordering::SeqCst),
        0,
        "no leased key was deleted"
    );
    let mut reader = cluster.client(via).await;
    assert_eq!(count_keys(&mut reader, "s/").await, LEASES as i64);
    let listed = reader.leases().await.expect("lease list").leases().len();
    assert_eq!(listed, LEASES);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_leases_expire_together_within_ttl_plus_two_seconds_without_stalling_writes() {
    const LEASES: usize = 10_000;
    const TTL: i64 = 10;
    let cluster = Cluster::start(3, &[]).await;
    let leader = cluster.wait_leader(Duration::from_secs(10)).await;
    let client = cluster.client(leader).await;
    let addr = cluster.member(leader).client.clone();
    let mut refresher = Refresher::open(&addr).await.expect("refresh stream");
    let short = grant_kept_alive(&client, &mut refresher, LEASES, TTL, "x/").await;
    let mut watcher = cluster.client(leader).await;
    let (deletes, last_delete) = count_deletes(&mut watcher, "x/").await;
    let ttls = refresher.refresh(&short).await.expect("refresh");
    assert!(
        ttls.iter().all(|t| *t == TTL),
        "all alive at the last refresh"
    );
    let stopped = Instant::now();

    // Another client writes one key at a time and records each latency.
    let mut writer = cluster.client(leader).await;
    let mut samples: Vec<(Duration, Duration)> = Vec::new();
    let until = stopped + Duration::from_secs(TTL as u64 + 4);
    let mut i = 0;
    while Instant::now() < until {
        let t = Instant::now();
        writer.put(format!("w/{i}"), "v", None).await.expect("put");
        samples.push((t.duration_since(stopped), t.elapsed()));
        i += 1;
    }
    let p99 = |from: Duration, to: Duration| {
        let mut l: Vec<Duration> = samples
            .iter()
            .filter(|(at, _)| *at >= from && *at < to)
            .map(|(_, l)| *l)
            .collect();
        l.sort();
        l.get((l.len() * 99 / 100).min(l.len().saturating_sub(1)))
            .copied()
            .unwrap_or_default()
    };
    let ttl = Duration::from_secs(TTL as u64);
    let before = p99(Duration::ZERO, ttl - Duration::from_millis(500));
    let during = p99(
        ttl - Duration::from_millis(100),
        ttl + Duration::from_secs(2),
    );
    let expired = deletes.load(Ordering::SeqCst);
    let last = last_delete
        .lock()
        .expect("lock")
        .map(|t| t.duration_since(stopped));
    println!(
        "{expired} of {LEASES} leases expired, the last {last:?} after the last refresh; \
         write p99 {before:?} before, {during:?} during the expiry ({} writes)",
        samples.len()
    );
    assert_eq!(expired, LEASES, "every key deleted");
    assert!(
        last.is_some_and(|l| l <= ttl + Duration::from_secs(2)),
        "all expired within TTL + 2 s"
    );
    let mut reader = cluster.client(leader).await;
    assert_eq!(count_keys(&mut reader, "x/").await, 0);
    // Loosely: the mass expiry costs writers at most 3x their p99 (with a
    // floor for timer noise on a busy 2-core machine).
    assert!(
        during <= (before * 3).max(Duration::from_millis(30)),
        "write p99 went from {before:?} to {during:?}"
    );
}

async fn wait_state(
    rx: &mut tokio::sync::watch::Receiver<SessionState>,
    want: impl Fn(&SessionState) -> bool,
    within: Duration,
) -> SessionState {
    let reached =
        tokio::time::timeout(within, async { rx.wait_for(|s| want(s)).await.map(|s| *s) }).await;
    match reached {
        Ok(state) => state.expect("session alive"),
        Err(_) => panic!(
            "state not reached within {within:?}; now {:?}",
            *rx.borrow()
        ),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_rides_out_a_short_partition_and_expires_in_a_long_one() {
    const TTL: i64 = 6;
    let cluster = Cluster::start(3, &["--lease-grace-ms", "2000"]).await;
    let endpoints: Vec<String> = cluster
        .members
        .iter()
        .map(|m| format!("http://{}", m.client))
        .collect();
    let session = Session::start(&endpoints, SessionOptions::with_ttl(TTL))
        .await
        .expect("session");
    let mut client = cluster.client(1).await;
    client
        .put(
            "eph/me",
            "here",
            Some(etcd_client::PutOptions::new().with_lease(session.lease_id())),
        )
        .await
        .expect("ephemeral key");
    let mut states = session.watch();
    assert!(matches!(session.state(), SessionState::Alive { ttl: TTL }));

    // Every cell stopped for less than the TTL: jeopardy, then alive again.
    cluster.signal_all("STOP");
    let stopped = Instant::now();
    let s = wait_state(
        &mut states,
        |s| *s == SessionState::Jeopardy,
        Duration::from_secs(4),
    )
    .await;
    println!("{s:?} {:?} after the cells stopped", stopped.elapsed());
    tokio::time::sleep(Duration::from_millis(3500).saturating_sub(stopped.elapsed())).await;
    cluster.signal_all("CONT");
    wait_state(
        &mut states,
        |s| matches!(s, SessionState::Alive { .. }),
        Duration::from_secs(5),
    )
    .await;
    println!(
        "alive again {:?} after the cells continued",
        stopped.elapsed()
    );
    let mut client = cluster.client(1).await;
    assert_eq!(
        count_keys(&mut client, "eph/").await,
        1,
        "the lease survived"
    );

    // Stopped for longer than the TTL: the session gives up (expired), and
    // the cell deletes the ephemeral key once it runs again.
    cluster.signal_all("STOP");
    let stopped = Instant::now();
    wait_state(
        &mut states,
        |s| *s == SessionState::Expired,
        Duration::from_secs(TTL as u64 + 2),
    )
    .await;
    println!("expired {:?} after the cells stopped", stopped.elapsed());
    tokio::time::sleep(Duration::from_secs(1)).await;
    cluster.signal_all("CONT");
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut client = cluster.client(1).await;
    while count_keys(&mut client, "eph/").await != 0 {
        assert!(
            Instant::now() < deadline,
            "the ephemeral key outlived its session"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(session.state(), SessionState::Expired);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_lease_expires_within_ttl_plus_grace_through_five_leader_changes() {
    const TTL: u64 = 4;
    const GRACE: u64 = 2;
    let cluster = Cluster::start(3, &["--lease-grace-ms", "2000"]).await;
    let mut client = cluster.client(1).await;
    let lease = client
        .lease_grant(TTL as i64, None)
        .await
        .expect("grant")
        .id();
    client
        .put(
            "dead/key",
            "x",
            Some(etcd_client::PutOptions::new().with_lease(lease)),
        )
        .await
        .expect("put");
    let (deletes, last_delete) = count_deletes(&mut client, "dead/").await;
    // The last refresh the lease will ever get.
    let addr = cluster.member(1).client.clone();
    let mut refresher = Refresher::open(&addr).await.expect("refresh stream");
    let refreshed = Instant::now();
    assert_eq!(
        refresher.refresh(&[lease]).await.expect("refresh"),
        vec![TTL as i64]
    );

    // Five leader changes, one every 900 ms, the later ones after the
    // lease's own deadline (where a restarting TTL would keep it alive).
    for change in 1..=5u32 {
        tokio::time::sleep_until(tokio::time::Instant::from_std(
            refreshed + Duration::from_millis(900) * change,
        ))
        .await;
        if deletes.load(Ordering::SeqCst) > 0 {
            break;
        }
        let leader = cluster.wait_leader(Duration::from_secs(10)).await;
        let target = leader % 3 + 1;
        let mut admin = cluster.client(target).await;
        admin.move_leader(target).await.expect("move leader");
        println!(
            "change {change}: {leader} -> {target} at {:?}",
            refreshed.elapsed()
        );
    }
    let limit = Duration::from_secs(TTL + GRACE);
    let deadline = refreshed + limit + Duration::from_secs(3);
    while deletes.load(Ordering::SeqCst) == 0 {
        assert!(Instant::now() < deadline, "the dead lease is still alive");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let took = last_delete
        .lock()
        .expect("lock")
        .map(|t| t.duration_since(refreshed))
        .expect("a delete time");
    println!("expired {took:?} after its last refresh (TTL {TTL} s + grace {GRACE} s)");
    // The expiry loop looks every 100 ms, and a commit takes a few more.
    assert!(
        took <= limit + Duration::from_millis(500),
        "expired after {took:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ttl_bounds_are_enforced_and_batched_refreshes_are_counted() {
    let cluster = Cluster::start(1, &["--min-ttl", "3", "--max-ttl", "600"]).await;
    let mut client = cluster.client(1).await;
    let short = client
        .lease_grant(2, None)
        .await
        .expect_err("below the minimum");
    assert!(
        short.to_string().contains("below the minimum of 3s"),
        "{short}"
    );
    let long = client
        .lease_grant(601, None)
        .await
        .expect_err("above the maximum");
    assert!(
        long.to_string().contains("etcdserver: too large lease TTL"),
        "{long}"
    );
    let a = client
        .lease_grant(600, None)
        .await
        .expect("at the maximum")
        .id();
    let b = client
        .lease_grant(3, None)
        .await
        .expect("at the minimum")
        .id();
    let mut refresher = Refresher::open(&cluster.member(1).client)
        .await
        .expect("refresh stream");
    // Unknown leases are answered -1, known ones with their TTL, in order.
    assert_eq!(
        refresher.refresh(&[a, 12345, b]).await.expect("refresh"),
        vec![600, -1, 3]
    );
    let metrics = cluster.metrics(1).await;
    let value = |name: &str| {
        metrics
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().parse::<f64>().ok())
    };
    assert_eq!(value("latchkey_refresh_batches_total "), Some(1.0));
    assert_eq!(value("latchkey_leases_refreshed_total "), Some(3.0));
}
