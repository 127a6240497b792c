//! The Lease service: every RPC and its errors, expiry by the leader in one
//! revision, and leases kept alive through a leader's death.

use crate::CELL_BIN;
use etcd_client::{GetOptions, LeaseGrantOptions, LeaseTimeToLiveOptions, PutOptions};
use latchkey_shared::client::KeepAliveStream;
use latchkey_testkit::{
    attach_keys, count_keys, err_text, eventually, grant_leases, Cluster, CLOCK_SLACK,
};
use tokio::time::{Duration, Instant};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lease_rpcs_and_their_errors() {
    let cluster = Cluster::start(CELL_BIN, 3, &[]).await;
    let mut c = cluster.client(cluster.follower()).await;

    // Server-chosen and client-chosen ids.
    let granted = c.lease_grant(30, None).await.expect("grant");
    assert!(granted.id() > 0);
    assert_eq!(granted.ttl(), 30);
    let chosen = c
        .lease_grant(20, Some(LeaseGrantOptions::new().with_id(4242)))
        .await
        .expect("grant with id");
    assert_eq!(chosen.id(), 4242);
    let dup = c
        .lease_grant(20, Some(LeaseGrantOptions::new().with_id(4242)))
        .await
        .unwrap_err();
    assert_eq!(
        err_text(dup),
        "FailedPrecondition: etcdserver: lease already exists"
    );
    // M4 (cell review): a TTL below the minimum is raised to it, as etcd
    // does, not refused.
    let short = c.lease_grant(1, None).await.expect("grant");
    assert_eq!(short.ttl(), 2);

    // Keys attached to a lease; TimeToLive with keys; Leases.
    let id = granted.id();
    for k in ["l/a", "l/b"] {
        c.put(k, "v", Some(PutOptions::new().with_lease(id)))
            .await
            .expect("put with lease");
    }
    let ttl = c
        .lease_time_to_live(id, Some(LeaseTimeToLiveOptions::new().with_keys()))
        .await
        .expect("ttl");
    assert_eq!(ttl.granted_ttl(), 30);
    assert!(ttl.ttl() > 25 && ttl.ttl() <= 30, "remaining {}", ttl.ttl());
    let mut keys: Vec<Vec<u8>> = ttl.keys().to_vec();
    keys.sort();
    assert_eq!(keys, vec![b"l/a".to_vec(), b"l/b".to_vec()]);
    let listed: Vec<i64> = c
        .leases()
        .await
        .expect("leases")
        .leases()
        .iter()
        .map(|l| l.id())
        .collect();
    assert!(listed.contains(&id) && listed.contains(&4242));

    // Keep-alive once, through the follower (forwarded to the leader).
    let (mut keeper, mut stream) = c.lease_keep_alive(id).await.expect("keep-alive stream");
    keeper.keep_alive().await.expect("send keep-alive");
    let resp = stream
        .message()
        .await
        .expect("keep-alive reply")
        .expect("a reply");
    assert_eq!((resp.id(), resp.ttl()), (id, 30));

    // A put on a lease that does not exist.
    let orphan = c
        .put("l/x", "v", Some(PutOptions::new().with_lease(999_999)))
        .await
        .unwrap_err();
    assert_eq!(
        err_text(orphan),
        "NotFound: etcdserver: requested lease not found"
    );

    // Revoke deletes every attached key in one revision.
    let before = c
        .get("l/", Some(GetOptions::new().with_prefix()))
        .await
        .expect("get");
    let rev_before = before.header().expect("header").revision();
    let revoked = c.lease_revoke(id).await.expect("revoke");
    let rev_revoke = revoked.header().expect("header").revision();
    assert_eq!(
        rev_revoke,
        rev_before + 1,
        "both keys deleted in one revision"
    );
    assert!(c
        .get("l/", Some(GetOptions::new().with_prefix()))
        .await
        .expect("get")
        .kvs()
        .is_empty());
    let missing = c.lease_revoke(id).await.unwrap_err();
    assert_eq!(
        err_text(missing),
        "NotFound: etcdserver: requested lease not found"
    );
    let gone = c
        .lease_time_to_live(id, None)
        .await
        .expect("ttl of a revoked lease");
    assert_eq!(gone.ttl(), -1, "etcd reports a missing lease as TTL -1");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_abandoned_lease_expires_within_ttl_plus_one_second_in_one_revision() {
    let cluster = Cluster::start(CELL_BIN, 3, &[]).await;
    let mut c = cluster.client(1).await;
    let ttl = Duration::from_secs(3);
    let lease = c
        .lease_grant(ttl.as_secs() as i64, None)
        .await
        .expect("grant")
        .id();
    // Keep it alive once more, then abandon it. The cell handles that
    // keep-alive after `refresh_sent` and before `abandoned`, so the lease
    // must live until refresh_sent + TTL, and die by abandoned + TTL + 1 s.
    let (mut keeper, mut stream) = c.lease_keep_alive(lease).await.expect("keep-alive");
    let refresh_sent = Instant::now();
    keeper.keep_alive().await.expect("send");
    stream.message().await.expect("reply").expect("a reply");
    let abandoned = Instant::now();
    drop((keeper, stream));
    // The slowest of these writes is this run's pace: the expiry is a
    // write too (a revoke through Raft), and seeing it gone is a read.
    let mut slowest_write = Duration::ZERO;
    for (k, lease) in [
        ("e/1", lease),
        ("e/2", lease),
        ("e/3", lease),
        ("e/keep", 0),
    ] {
        let t = Instant::now();
        c.put(k, "v", Some(PutOptions::new().with_lease(lease)))
            .await
            .expect("put");
        slowest_write = slowest_write.max(t.elapsed());
    }
    let last_rev = c
        .get("e/", Some(GetOptions::new().with_prefix()))
        .await
        .expect("get")
        .header()
        .expect("h")
        .revision();

    // Seen gone at the end of the first read that no longer finds the
    // keys: no earlier than the expiry itself.
    let gone_seen = eventually(ttl + Duration::from_secs(5), async || {
        match count_keys(&c, "e/").await {
            1 => Ok(Instant::now()),
            left => Err(format!(
                "{left} keys left under e/: the lease never expired"
            )),
        }
    })
    .await;
    println!(
        "lease with TTL {ttl:?} seen gone {:?} after the keep-alive was sent",
        gone_seen - refresh_sent
    );
    assert!(
        gone_seen >= refresh_sent + ttl - CLOCK_SLACK,
        "expired early: gone {:?} after its last keep-alive was sent (TTL {ttl:?})",
        gone_seen - refresh_sent
    );
    // Late by at most 1 s, plus three of this run's slowest writes (the
    // revoke, and the read that sees it): a loaded machine slows both the
    // expiry and its observation, and not the bound without this.
    let late_bound = ttl + Duration::from_secs(1) + 3 * slowest_write;
    assert!(
        gone_seen <= abandoned + late_bound,
        "expired late: gone {:?} after its last keep-alive was answered (bound {late_bound:?}: \
         TTL + 1 s + 3 x the slowest write, {slowest_write:?})",
        gone_seen - abandoned
    );

    // All three keys went in ONE revision: right before it all three are
    // visible, at it none is.
    let now = c
        .get("e/keep", None)
        .await
        .expect("get")
        .header()
        .expect("h")
        .revision();
    let mut deletion_rev = None;
    for rev in (last_rev + 1)..=now {
        let at = c
            .get(
                "e/",
                Some(GetOptions::new().with_prefix().with_revision(rev)),
            )
            .await
            .expect("get at rev");
        if at.kvs().len() == 1 {
            let before = c
                .get(
                    "e/",
                    Some(GetOptions::new().with_prefix().with_revision(rev - 1)),
                )
                .await
                .expect("get");
            assert_eq!(
                before.kvs().len(),
                4,
                "all leased keys were live one revision earlier"
            );
            deletion_rev = Some(rev);
            break;
        }
        assert_eq!(
            at.kvs().len(),
            4,
            "keys disappeared one at a time at revision {rev}"
        );
    }
    assert!(deletion_rev.is_some());
    assert_eq!(
        c.lease_time_to_live(lease, None).await.expect("ttl").ttl(),
        -1
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_the_leader_expires_none_of_ten_thousand_kept_alive_leases() {
    const LEASES: usize = 10_000;
    // Longer than granting and attaching keys take (~10 s here), so the
    // first refresh round finds every lease alive.
    const TTL: i64 = 20;
    let mut cluster = Cluster::start(CELL_BIN, 3, &[]).await;
    let leader = cluster.leader_at_start();
    let survivor = cluster.follower();
    let c = cluster.client(survivor).await;

    // Grant the leases and give each a key, 64 requests in flight.
    let started = Instant::now();
    let ids = grant_leases(&c, LEASES, TTL).await;
    attach_keys(&c, "s/", &ids).await;
    println!(
        "granted {} leases with keys in {:?}",
        ids.len(),
        started.elapsed()
    );

    // One stream refreshes them all every 2 s through a surviving member.
    let addr = cluster.member(survivor).client.clone();
    let refresher = {
        let ids = ids.clone();
        tokio::spawn(async move {
            let mut stream = KeepAliveStream::open(&addr)
                .await
                .expect("keep-alive stream");
            let mut rounds = 0;
            // Refresh until more than a TTL after the kill (which comes 3 s
            // after refreshing starts).
            let until = Instant::now() + Duration::from_secs(TTL as u64 + 8);
            while Instant::now() < until {
                match stream.refresh(&ids, Duration::from_secs(8)).await {
                    Ok(ttls) => {
                        let lost = ttls.values().filter(|t| **t <= 0).count();
                        assert_eq!(lost, 0, "{lost} leases reported gone in round {rounds}");
                        rounds += 1;
                    }
                    // During the election a round may fail; the next
                    // one reopens the stream.
                    Err(e) => {
                        println!("refresh round failed ({e}); trying again");
                        tokio::time::sleep(Duration::from_millis(200)).await;
                        continue;
                    }
                }
                tokio::time::sleep(Duration::from_secs(2)).await;
            }
            rounds
        })
    };
    tokio::time::sleep(Duration::from_secs(3)).await;
    cluster.kill(leader);
    let killed = Instant::now();
    let new_leader = cluster.wait_leader(Duration::from_secs(10)).await;
    println!("new leader {new_leader} after {:?}", killed.elapsed());

    let rounds = refresher.await.expect("refresher");
    assert!(rounds >= 4, "only {rounds} full refresh rounds");
    // More than a TTL has passed since the kill: every lease and key lives.
    let mut c = cluster.client(survivor).await;
    assert_eq!(
        count_keys(&c, "s/").await as usize,
        LEASES,
        "keys of kept-alive leases were deleted"
    );
    let listed = c.leases().await.expect("leases").leases().len();
    assert_eq!(listed, LEASES);
}
