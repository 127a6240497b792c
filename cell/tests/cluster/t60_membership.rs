//! Membership changes under load, MoveLeader, and a new cell restored from
//! a Maintenance snapshot.

use crate::CELL_BIN;
use etcd_client::{Client, GetOptions, MemberAddOptions};
use latchkey_shared::ApiError;
use latchkey_testkit::{err_text, eventually, free_port, BackgroundWriter, Cluster};
use std::collections::BTreeMap;
use tokio::time::{Duration, Instant};

/// How long a membership call may keep finding the cell busy, or the
/// learner not yet caught up, before the test gives up.
const MEMBERSHIP_WITHIN: Duration = Duration::from_secs(60);

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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cell_grows_from_three_to_five_with_join_under_writes_and_shrinks_losing_nothing() {
    let mut cluster = Cluster::start(CELL_BIN, 3, &[]).await;
    let writer = BackgroundWriter::start(cluster.endpoints(), "grow/");
    writer.wait_for_more(50).await;
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
    eventually(Duration::from_secs(30), async || {
        let got = learner
            .get("grow/000000", Some(GetOptions::new().with_serializable()))
            .await
            .map_err(err_text)?;
        match got.count() {
            1 => Ok(()),
            _ => Err("the learner has not caught up".to_string()),
        }
    })
    .await;
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
    eventually(MEMBERSHIP_WITHIN, async || {
        admin.member_promote(id4).await.map_err(err_text)
    })
    .await;
    writer.wait_for_more(50).await;

    // Member 5: added directly as a voter, then started.
    let peer5 = format!("127.0.0.1:{}", free_port());
    let added = eventually(MEMBERSHIP_WITHIN, async || {
        admin
            .member_add([format!("http://{peer5}")], None)
            .await
            .map_err(err_text)
    })
    .await;
    let id5 = added.member().expect("the new member").id();
    cluster.new_joiner(id5, peer5);
    cluster.spawn(id5);
    writer.wait_for_more(50).await;
    let five = members(&mut admin).await;
    assert_eq!(five.len(), 5, "{five:?}");
    assert!(
        five.values().all(|learner| !learner),
        "all voters: {five:?}"
    );

    // Remove the leader: the hardest member to lose. Asked through another
    // member; a retry after an ambiguous failure may find it gone.
    let victim = cluster.wait_leader(Duration::from_secs(10)).await;
    let via = cluster.follower_of(victim);
    let mut admin = cluster.client(via).await;
    println!("removing the leader, member {victim}, through member {via}");
    eventually(MEMBERSHIP_WITHIN, async || {
        match admin.member_remove(victim).await.map_err(err_text) {
            Err(e) if e == "NotFound: etcdserver: member not found" => Ok(()),
            other => other.map(|_| ()),
        }
    })
    .await;
    writer.wait_for_more(50).await;
    // A removed member stops by itself, as in etcd.
    eventually(Duration::from_secs(15), async || {
        if cluster.exited(victim) {
            Ok(())
        } else {
            Err("the removed member kept running")
        }
    })
    .await;
    cluster.kill(victim);
    writer.wait_for_more(50).await;
    let acked = writer.finish().await;
    let four = members(&mut admin).await;
    assert_eq!(four.len(), 4, "{four:?}");
    assert!(!four.contains_key(&victim));

    // Every acknowledged write is on every remaining member.
    for id in cluster.running() {
        cluster.wait_member_holds(id, "grow/", &acked).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn move_leader_hands_leadership_to_the_chosen_voter() {
    let cluster = Cluster::start(CELL_BIN, 3, &[]).await;
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
    // etcd's code and text.
    assert_eq!(
        err_text(err),
        format!(
            "FailedPrecondition: {}",
            ApiError::bad_leader_transferee().message
        )
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s2_a_restored_cell_and_a_member_that_joins_it_serve_the_same_keys_and_revision() {
    let old = Cluster::start(CELL_BIN, 3, &[]).await;
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

    let (_keep, path) = save_snapshot(&mut client).await;
    drop(old);

    let path_arg = path.to_str().expect("utf-8 path").to_string();
    let mut restored = Cluster::start(CELL_BIN, 3, &["--restore", &path_arg]).await;
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

    // S2 (cell review): a member added to the restored cell was sent the
    // log from its start and replayed it onto an empty state, so it held
    // only the keys written after the restore, from revision 1 on.
    let peer = format!("127.0.0.1:{}", free_port());
    let added = client
        .member_add(
            [format!("http://{peer}")],
            Some(MemberAddOptions::new().with_is_learner()),
        )
        .await
        .expect("member add --learner");
    let joiner = added.member().expect("the new member").id();
    restored.new_joiner(joiner, peer);
    restored.spawn(joiner);
    let everything = client
        .get("r/", Some(GetOptions::new().with_prefix()))
        .await
        .expect("get");
    let mut on_joiner = restored.client(joiner).await;
    eventually(Duration::from_secs(30), async || {
        let got = on_joiner
            .get(
                "r/",
                Some(GetOptions::new().with_prefix().with_serializable()),
            )
            .await
            .map_err(|e| e.to_string())?;
        let revision = got.header().map_or(0, |h| h.revision());
        if pairs(&got) == pairs(&everything) && revision >= revision_of(&everything) {
            Ok(())
        } else {
            Err(format!(
                "the joiner holds {} keys at revision {revision}; the cell {} at {}",
                got.count(),
                everything.count(),
                revision_of(&everything)
            ))
        }
    })
    .await;
    // History too: the joiner reads the restored revisions.
    let old_read = on_joiner
        .get(
            "r/000",
            Some(GetOptions::new().with_revision(5).with_serializable()),
        )
        .await
        .expect("an old revision on the joiner");
    assert_eq!(old_read.kvs()[0].value_str().ok(), Some("v0"));

    // S2, second half: a member whose data directory disagrees with the
    // cell about the restore (wiped, then started without --restore)
    // belongs to another cell: its peers refuse it, so it never serves a
    // state without the restored keys.
    let leader = restored.wait_leader(Duration::from_secs(10)).await;
    let stray = restored.follower_of(leader);
    restored.kill(stray);
    std::fs::remove_dir_all(&restored.member(stray).data_dir).expect("wipe its data");
    restored.set_extra_args(&[]);
    restored.spawn(stray);
    let mut leader_client = restored.client(leader).await;
    leader_client.put("r/after", "a", None).await.expect("put");
    eventually(Duration::from_secs(20), async || {
        match restored
            .metric(stray, "latchkey_peer_requests_refused_total")
            .await
        {
            Some(n) if n > 0.0 => Ok(()),
            _ => Err("the stray member has not refused its peers yet"),
        }
    })
    .await;
    let mut on_stray = restored.client(stray).await;
    let got = on_stray
        .get(
            "r/",
            Some(GetOptions::new().with_prefix().with_serializable()),
        )
        .await
        .expect("a serializable read on the stray member");
    assert_eq!(
        got.count(),
        0,
        "the stray member replicated the restored cell's log"
    );
}

fn revision_of(r: &etcd_client::GetResponse) -> i64 {
    r.header().map_or(0, |h| h.revision())
}

/// A6 (cell review): a removed follower never learned of its removal (the
/// leader stops replicating to it) and went on serving stale reads. It
/// must find out from its peers and stop.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a6_a_removed_follower_finds_out_and_stops() {
    let mut cluster = Cluster::start(CELL_BIN, 3, &[]).await;
    let leader = cluster.leader_at_start();
    let victim = cluster.follower();
    let mut admin = cluster.client(leader).await;
    admin.put("before", "1", None).await.expect("put");
    admin
        .member_remove(victim)
        .await
        .expect("remove the follower");
    admin
        .put("after", "2", None)
        .await
        .expect("two members still commit");
    eventually(Duration::from_secs(20), async || {
        if cluster.exited(victim) {
            Ok(())
        } else {
            Err("the removed follower kept running")
        }
    })
    .await;
    cluster.kill(victim);
    let members = admin.member_list().await.expect("member list");
    assert_eq!(members.members().len(), 2);
}

/// A5 (cell review): with one of three voters down, adding a voter that
/// has not started made a configuration of four that needs three up: the
/// change never committed, and every write after it timed out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a5_adding_a_voter_while_another_is_down_is_refused_and_writes_go_on() {
    let mut cluster = Cluster::start(CELL_BIN, 3, &[]).await;
    let leader = cluster.leader_at_start();
    cluster.kill(cluster.follower());
    let mut admin = cluster.client(leader).await;
    admin
        .put("a", "1", None)
        .await
        .expect("two of three commit");
    let refused = admin
        .member_add([format!("http://127.0.0.1:{}", free_port())], None)
        .await
        .expect_err("the change is refused");
    assert_eq!(
        err_text(refused),
        "FailedPrecondition: etcdserver: re-configuration failed due to not enough started members"
    );
    // Nothing was proposed: writes go on, and a learner may still be added.
    admin.put("b", "2", None).await.expect("writes go on");
    admin
        .member_add(
            [format!("http://127.0.0.1:{}", free_port())],
            Some(MemberAddOptions::new().with_is_learner()),
        )
        .await
        .expect("a learner needs no quorum of its own");
    admin.put("c", "3", None).await.expect("writes go on");
    assert_eq!(members(&mut admin).await.len(), 4);
}

/// Kubernetes gives a pod a new IP whenever it is recreated, but a stable
/// DNS name: members bind wildcard addresses and advertise names, the
/// cell forms over the names, MemberList publishes them, and a restart of
/// every member at once comes back with its data.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn members_bound_to_wildcards_find_each_other_by_advertised_names() {
    use std::process::{Child, Command, Stdio};
    let dir = tempfile::tempdir().expect("temp dir");
    let ports: Vec<(u16, u16, u16)> = (0..3)
        .map(|_| (free_port(), free_port(), free_port()))
        .collect();
    let initial = ports
        .iter()
        .enumerate()
        .map(|(i, p)| format!("{}=localhost:{}", i + 1, p.1))
        .collect::<Vec<_>>()
        .join(",");
    let spawn = |i: usize| -> Child {
        let (client, peer, metrics) = ports[i];
        Command::new(CELL_BIN)
            .args(["--id", &(i + 1).to_string()])
            .arg("--data-dir")
            .arg(dir.path().join(format!("m{i}")))
            .args(["--initial-cluster", &initial])
            .args(["--client-addr", &format!("0.0.0.0:{client}")])
            .args(["--advertise-client-addr", &format!("localhost:{client}")])
            .args(["--peer-addr", &format!("0.0.0.0:{peer}")])
            .args(["--advertise-peer-addr", &format!("localhost:{peer}")])
            .args(["--metrics-addr", &format!("127.0.0.1:{metrics}")])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start a member")
    };
    struct Members(Vec<Child>);
    impl Drop for Members {
        fn drop(&mut self) {
            for c in &mut self.0 {
                let _ = c.kill();
                let _ = c.wait();
            }
        }
    }
    let mut members = Members((0..3).map(spawn).collect());
    let endpoint = format!("http://127.0.0.1:{}", ports[0].0);
    let write = async || {
        let mut c = etcd_client::Client::connect([endpoint.as_str()], None)
            .await
            .map_err(|e| e.to_string())?;
        c.put("named/k", "v", None)
            .await
            .map_err(|e| e.to_string())?;
        Ok::<_, String>(c)
    };
    let mut c = eventually(Duration::from_secs(20), write).await;
    let mut want: Vec<String> = ports
        .iter()
        .map(|p| format!("http://localhost:{}", p.0))
        .collect();
    want.sort();
    // Each member publishes its client URL once it runs.
    eventually(Duration::from_secs(10), async || {
        let list = c.member_list().await.map_err(|e| e.to_string())?;
        let mut urls: Vec<String> = list
            .members()
            .iter()
            .flat_map(|m| m.client_urls().to_vec())
            .collect();
        urls.sort();
        if urls == want {
            Ok(())
        } else {
            Err(format!(
                "MemberList publishes {urls:?}, not the advertised {want:?}"
            ))
        }
    })
    .await;

    // Every member at once, as when every pod is recreated.
    for c in &mut members.0 {
        let _ = c.kill();
        let _ = c.wait();
    }
    members.0 = (0..3).map(spawn).collect();
    let read = async || {
        let mut c = etcd_client::Client::connect([endpoint.as_str()], None)
            .await
            .map_err(|e| e.to_string())?;
        let got = c.get("named/k", None).await.map_err(|e| e.to_string())?;
        match got.kvs().first().map(|kv| kv.value().to_vec()) {
            Some(v) if v == b"v" => Ok(()),
            other => Err(format!("named/k after the restart: {other:?}")),
        }
    };
    eventually(Duration::from_secs(30), read).await;
}

/// Review finding P9: a cell restored from a backup issues revisions again
/// that the old cell issued after the backup (fencing tokens among them,
/// which a resource accepts when equal). `--restore-bump-revision` moves
/// the restored revision past them and compacts before it, as etcdutl's
/// `--bump-revision --mark-compacted`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restore_with_a_bump_issues_no_revision_the_old_cell_issued_after_the_backup() {
    let old = Cluster::start(CELL_BIN, 1, &[]).await;
    let mut client = old.client(1).await;
    client.put("b/before", "x", None).await.expect("put");
    let (_keep, path) = save_snapshot(&mut client).await;
    // The old cell goes on after the backup: these revisions are out there.
    let mut issued = 0;
    for i in 0..5 {
        let put = client
            .put(format!("b/after/{i}"), "y", None)
            .await
            .expect("put");
        issued = put.header().expect("header").revision();
    }
    drop(old);

    let path_arg = path.to_str().expect("utf-8 path").to_string();
    let restored = Cluster::start(
        CELL_BIN,
        1,
        &["--restore", &path_arg, "--restore-bump-revision", "1000"],
    )
    .await;
    let mut client = restored.client(1).await;
    let next = client.put("b/new", "z", None).await.expect("put");
    let next = next.header().expect("header").revision();
    assert!(
        next > issued,
        "the restored cell's first write got revision {next}, which the old cell had already \
         issued (up to {issued})"
    );
    // The restored key is there; its history before the bump is compacted.
    let read = client.get("b/before", None).await.expect("get");
    assert_eq!(read.kvs()[0].value_str().ok(), Some("x"));
    let old_read = client
        .get("b/before", Some(GetOptions::new().with_revision(issued)))
        .await
        .expect_err("a revision before the bump is compacted");
    let text = err_text(old_read);
    assert!(text.contains("compacted"), "{text}");
}

/// `etcdctl snapshot save` through `client`: the file, in a directory kept
/// while the first value lives.
async fn save_snapshot(client: &mut Client) -> (tempfile::TempDir, std::path::PathBuf) {
    let mut stream = client.snapshot().await.expect("snapshot");
    let mut file = Vec::new();
    while let Some(chunk) = stream.message().await.expect("snapshot chunk") {
        file.extend_from_slice(chunk.blob());
    }
    let keep = tempfile::tempdir().expect("temp dir");
    let path = keep.path().join("state.snap");
    std::fs::write(&path, &file).expect("save the snapshot");
    (keep, path)
}
