//! Membership changes under load, MoveLeader, and a new cell restored from
//! a Maintenance snapshot.

use crate::harness::{free_port, Cluster};
use etcd_client::{Client, GetOptions, MemberAddOptions};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Every member id and whether it is a learner, as `via` sees them.
async fn members(via: &mut Client) -> BTreeMap<u64, bool> {
    via.member_list()
        .await
        .expect("member list")
        .members()
        .iter()
        .map(|m| (m.id(), m.is_learner()))
        .collect()
}

/// Retries `op` (a membership call that may find the cell busy, or the
/// learner not yet caught up) for up to 60 s.
async fn retry<T, F, Fut>(what: &str, mut op: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, etcd_client::Error>>,
{
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        match op().await {
            Ok(v) => return v,
            Err(e) if Instant::now() < deadline => {
                println!("{what}: {e}; retrying");
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            Err(e) => panic!("{what} kept failing: {e}"),
        }
    }
}

/// Keys written and acknowledged by a background writer.
struct Writer {
    acked: Arc<Mutex<Vec<String>>>,
    stop: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<usize>,
}

impl Writer {
    /// Writes `grow/N` keys one after another through `endpoints`,
    /// recording each acknowledged one; failures (elections, membership
    /// changes) are counted, not acknowledged.
    fn start(endpoints: Vec<String>) -> Writer {
        let acked = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let task = tokio::spawn({
            let acked = acked.clone();
            let stop = stop.clone();
            async move {
                let opts = etcd_client::ConnectOptions::new()
                    .with_timeout(Duration::from_secs(5))
                    .with_connect_timeout(Duration::from_secs(1));
                let mut client = Client::connect(endpoints, Some(opts))
                    .await
                    .expect("writer connects");
                let mut failures = 0;
                let mut i = 0;
                while !stop.load(Ordering::Relaxed) {
                    let key = format!("grow/{i:06}");
                    match client.put(key.as_str(), format!("v{i}"), None).await {
                        Ok(_) => acked.lock().expect("lock").push(key),
                        Err(e) => {
                            if failures < 5 {
                                println!("write {key} failed: {e}");
                            }
                            failures += 1;
                            tokio::time::sleep(Duration::from_millis(50)).await;
                        }
                    }
                    i += 1;
                }
                failures
            }
        });
        Writer { acked, stop, task }
    }

    fn count(&self) -> usize {
        self.acked.lock().expect("lock").len()
    }

    async fn finish(self) -> Vec<String> {
        self.stop.store(true, Ordering::Relaxed);
        let failures = self.task.await.expect("writer task");
        let acked = self.acked.lock().expect("lock").clone();
        println!("writer: {} acknowledged, {failures} failed", acked.len());
        acked
    }
}

/// Waits until `n` more writes have been acknowledged (bounded).
async fn wait_writes(writer: &Writer, n: usize) {
    let target = writer.count() + n;
    let deadline = Instant::now() + Duration::from_secs(60);
    while writer.count() < target {
        assert!(Instant::now() < deadline, "writes stalled");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cell_grows_from_three_to_five_with_join_under_writes_and_shrinks_losing_nothing() {
    let mut cluster = Cluster::start(3, &[]).await;
    let endpoints: Vec<String> = cluster
        .members
        .iter()
        .map(|m| format!("http://{}", m.client))
        .collect();
    let writer = Writer::start(endpoints);
    wait_writes(&writer, 50).await;
    let mut admin = cluster.client(1).await;

    // Member 4: added as a learner, started with --join, promoted once it
    // has caught up.
    let peer4 = format!("127.0.0.1:{}", free_port());
    let added = admin
        .member_add(
            [format!("http://{peer4}")],
            Some(MemberAddOptions::new().with_is_learner()),
        )
        .await
        .expect("member add --learner");
    let id4 = added.member().expect("the new member").id();
    assert_eq!(members(&mut admin).await.get(&id4), Some(&true));
    cluster.new_joiner(id4, peer4);
    cluster.spawn(id4);
    // A learner serves serializable reads from its own copy.
    let mut learner = cluster.client(id4).await;
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let got = learner
            .get("grow/000000", Some(GetOptions::new().with_serializable()))
            .await;
        if got.is_ok_and(|r| r.count() == 1) {
            break;
        }
        assert!(Instant::now() < deadline, "the learner never caught up");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // ...and watches: the writer's next puts reach a watch on the learner.
    let mut watch = learner
        .watch(
            "grow/",
            Some(etcd_client::WatchOptions::new().with_prefix()),
        )
        .await
        .expect("watch on the learner");
    let mut got_event = false;
    while !got_event {
        let resp = tokio::time::timeout(Duration::from_secs(10), watch.message())
            .await
            .expect("an event from the learner within 10 s")
            .expect("watch ok")
            .expect("watch open");
        got_event = !resp.events().is_empty();
    }
    // A learner does not vote: still one learner among four members.
    let listed = members(&mut admin).await;
    assert_eq!(listed.values().filter(|l| **l).count(), 1, "{listed:?}");
    retry("promote", || {
        let mut c = admin.clone();
        async move { c.member_promote(id4).await }
    })
    .await;
    wait_writes(&writer, 50).await;

    // Member 5: added directly as a voter, then started.
    let peer5 = format!("127.0.0.1:{}", free_port());
    let added = retry("member add", || {
        let mut c = admin.clone();
        let url = format!("http://{peer5}");
        async move { c.member_add([url], None).await }
    })
    .await;
    let id5 = added.member().expect("the new member").id();
    cluster.new_joiner(id5, peer5);
    cluster.spawn(id5);
    wait_writes(&writer, 50).await;
    let five = members(&mut admin).await;
    assert_eq!(five.len(), 5, "{five:?}");
    assert!(
        five.values().all(|learner| !learner),
        "all voters: {five:?}"
    );

    // Remove the leader: the hardest member to lose. Asked through another
    // member; a retry after an ambiguous failure may find it gone.
    let victim = cluster.wait_leader(Duration::from_secs(10)).await;
    let via = *cluster
        .running()
        .iter()
        .find(|id| **id != victim)
        .expect("another member");
    let mut admin = cluster.client(via).await;
    println!("removing the leader, member {victim}, through member {via}");
    retry("member remove", || {
        let mut c = admin.clone();
        async move {
            match c.member_remove(victim).await {
                Err(e) if e.to_string().contains("member not found") => Ok(()),
                other => other.map(|_| ()),
            }
        }
    })
    .await;
    wait_writes(&writer, 50).await;
    // A removed member stops by itself, as in etcd.
    let deadline = Instant::now() + Duration::from_secs(15);
    while !cluster.exited(victim) {
        assert!(Instant::now() < deadline, "the removed member kept running");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    cluster.kill(victim);
    wait_writes(&writer, 50).await;
    let acked = writer.finish().await;
    let four = members(&mut admin).await;
    assert_eq!(four.len(), 4, "{four:?}");
    assert!(!four.contains_key(&victim));

    // Every acknowledged write is on every remaining member.
    let leader = cluster.wait_leader(Duration::from_secs(10)).await;
    let mut lead = cluster.client(leader).await;
    let revision = lead
        .get(
            "grow/",
            Some(GetOptions::new().with_prefix().with_count_only()),
        )
        .await
        .expect("linearizable read")
        .header()
        .expect("header")
        .revision();
    for id in cluster.running() {
        let mut c = cluster.client(id).await;
        let deadline = Instant::now() + Duration::from_secs(20);
        let resp = loop {
            let resp = c
                .get(
                    "grow/",
                    Some(GetOptions::new().with_prefix().with_serializable()),
                )
                .await
                .expect("serializable read");
            if resp.header().expect("header").revision() >= revision || Instant::now() > deadline {
                break resp;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        let have: std::collections::HashSet<String> = resp
            .kvs()
            .iter()
            .map(|kv| kv.key_str().expect("utf-8").to_string())
            .collect();
        let lost: Vec<&String> = acked.iter().filter(|k| !have.contains(*k)).collect();
        assert!(
            lost.is_empty(),
            "member {id} lost {} acknowledged writes: {:?}",
            lost.len(),
            &lost[..lost.len().min(5)]
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn move_leader_hands_leadership_to_the_chosen_voter() {
    let cluster = Cluster::start(3, &[]).await;
    // Around the cell three times, each time asked through the member that
    // is neither leader nor target (the request is forwarded).
    for round in 0..3 {
        let leader = cluster.wait_leader(Duration::from_secs(10)).await;
        let target = leader % 3 + 1;
        let via = target % 3 + 1;
        let mut client = cluster.client(via).await;
        client.put("before", "move", None).await.expect("put");
        let started = Instant::now();
        client.move_leader(target).await.expect("move leader");
        println!(
            "round {round}: moved from {leader} to {target} in {:?}",
            started.elapsed()
        );
        assert_eq!(cluster.wait_leader(Duration::from_secs(10)).await, target);
        client
            .put("after", "move", None)
            .await
            .expect("put after the move");
    }
    let mut client = cluster.client(1).await;
    let err = client.move_leader(12345).await.expect_err("not a member");
    assert!(err.to_string().contains("bad leader transferee"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_cell_restored_from_a_snapshot_serves_the_same_keys_and_revision() {
    let old = Cluster::start(3, &[]).await;
    let mut client = old.client(2).await;
    for i in 0..200 {
        client
            .put(format!("r/{i:03}"), format!("v{i}"), None)
            .await
            .expect("put");
    }
    client.put("r/000", "rewritten", None).await.expect("put");
    client.delete("r/199", None).await.expect("delete");
    let lease = client.lease_grant(600, None).await.expect("grant").id();
    client
        .put(
            "r/leased",
            "x",
            Some(etcd_client::PutOptions::new().with_lease(lease)),
        )
        .await
        .expect("put");
    let before = client
        .get("r/", Some(GetOptions::new().with_prefix()))
        .await
        .expect("get");
    let revision = before.header().expect("header").revision();

    let mut stream = client.snapshot().await.expect("snapshot");
    let mut file = Vec::new();
    while let Some(chunk) = stream.message().await.expect("snapshot chunk") {
        file.extend_from_slice(chunk.blob());
    }
    let keep = tempfile::tempdir().expect("temp dir");
    let path = keep.path().join("state.snap");
    std::fs::write(&path, &file).expect("save the snapshot");
    drop(old);

    let path_arg = path.to_str().expect("utf-8 path").to_string();
    let restored = Cluster::start(3, &["--restore", &path_arg]).await;
    let mut client = restored.client(3).await;
    let after = client
        .get("r/", Some(GetOptions::new().with_prefix()))
        .await
        .expect("get from the restored cell");
    assert_eq!(after.header().expect("header").revision(), revision);
    let pairs = |r: &etcd_client::GetResponse| -> Vec<(String, String, i64, i64)> {
        r.kvs()
            .iter()
            .map(|kv| {
                (
                    kv.key_str().expect("utf-8").into(),
                    kv.value_str().expect("utf-8").into(),
                    kv.create_revision(),
                    kv.mod_revision(),
                )
            })
            .collect()
    };
    assert_eq!(pairs(&after), pairs(&before));
    assert_eq!(after.count(), 200);
    // History came along: an old revision reads as it did.
    let old_read = client
        .get("r/000", Some(GetOptions::new().with_revision(5)))
        .await
        .expect("read an old revision");
    assert_eq!(old_read.kvs()[0].value_str().ok(), Some("v0"));
    // The lease came along with its key, and the next write follows on.
    let ttl = client.lease_time_to_live(lease, None).await.expect("ttl");
    assert!(ttl.ttl() > 0, "the lease survives a restore");
    let next = client.put("r/new", "n", None).await.expect("put");
    assert_eq!(next.header().expect("header").revision(), revision + 1);
}
