//! etcd's own command-line client (Debian's etcd-client package, etcd 3.4)
//! against a three-member cell, straight or through a proxy: scripted
//! sessions with their outputs checked. The same sessions run against both,
//! so a proxy is held to exactly what the cell answers.

use crate::cluster::Cluster;
use crate::etcdctl::{etcdctl, member_id_in, try_etcdctl, EtcdctlProcess};
use crate::eventually::eventually;
use crate::ports::free_port;
use tokio::time::Duration;

/// Where the sessions send their commands.
pub struct Target<'a> {
    /// The cell (members are added to it and removed; watchers counted).
    pub cluster: &'a mut Cluster,
    /// One endpoint: a member's client address, or a proxy's gRPC address.
    pub one: String,
    /// The endpoints of commands given several, comma separated: every
    /// member's, or the proxy's.
    pub all: String,
}

impl<'a> Target<'a> {
    /// The cell's members themselves: member 2 alone, or all three.
    pub fn members(cluster: &'a mut Cluster) -> Target<'a> {
        let one = cluster.member(2).client.clone();
        let all = cluster.client_addrs();
        Target { cluster, one, all }
    }

    /// A proxy's gRPC address in front of `cluster`.
    pub fn proxy(cluster: &'a mut Cluster, grpc: &str) -> Target<'a> {
        Target {
            cluster,
            one: grpc.to_string(),
            all: grpc.to_string(),
        }
    }

    fn endpoints(&self) -> usize {
        self.all.split(',').count()
    }
}

/// put/get/del, txn from stdin, leases, compaction, endpoint status and
/// member list.
pub async fn scripted_session(t: &mut Target<'_>) {
    let (one, all, cluster) = (t.one.clone(), t.all.clone(), &*t.cluster);

    assert_eq!(etcdctl(&one, &["put", "foo", "bar"], None).await, "OK\n");
    assert_eq!(etcdctl(&one, &["put", "foo2", "baz"], None).await, "OK\n");
    assert_eq!(etcdctl(&all, &["get", "foo"], None).await, "foo\nbar\n");
    assert_eq!(
        etcdctl(&one, &["get", "--prefix", "foo"], None).await,
        "foo\nbar\nfoo2\nbaz\n"
    );
    assert_eq!(
        etcdctl(&one, &["get", "--prefix", "--keys-only", "foo"], None).await,
        "foo\n\nfoo2\n\n"
    );
    assert_eq!(etcdctl(&one, &["del", "foo2"], None).await, "1\n");
    assert_eq!(etcdctl(&one, &["get", "foo2"], None).await, "");

    // Interactive txn from stdin: compares, success ops, failure ops.
    let txn = "value(\"foo\") = \"bar\"\n\nput t1 yes\n\nput t1 no\n\n";
    assert_eq!(etcdctl(&one, &["txn"], Some(txn)).await, "SUCCESS\n\nOK\n");
    let txn = "value(\"foo\") = \"nope\"\n\nput t2 yes\n\nput t2 no\n\n";
    assert_eq!(etcdctl(&one, &["txn"], Some(txn)).await, "FAILURE\n\nOK\n");
    assert_eq!(etcdctl(&one, &["get", "t2"], None).await, "t2\nno\n");

    // Leases: grant, attach, keep-alive once, time-to-live with keys.
    let granted = etcdctl(&one, &["lease", "grant", "100"], None).await;
    let id = granted
        .strip_prefix("lease ")
        .and_then(|s| s.strip_suffix(" granted with TTL(100s)\n"))
        .unwrap_or_else(|| panic!("unexpected grant output {granted:?}"))
        .to_string();
    assert_eq!(
        etcdctl(&one, &["put", "--lease", &id, "leased", "v"], None).await,
        "OK\n"
    );
    let kept = etcdctl(&one, &["lease", "keep-alive", "--once", &id], None).await;
    assert_eq!(kept, format!("lease {id} keepalived with TTL(100)\n"));
    let ttl = etcdctl(&one, &["lease", "timetolive", "--keys", &id], None).await;
    assert!(
        ttl.starts_with(&format!("lease {id} granted with TTL(100s), remaining("))
            && ttl.ends_with("s), attached keys([leased])\n"),
        "unexpected timetolive output {ttl:?}"
    );
    let listed = etcdctl(&one, &["lease", "list"], None).await;
    assert_eq!(listed, format!("found 1 leases\n{id}\n"));
    assert_eq!(
        etcdctl(&one, &["lease", "revoke", &id], None).await,
        format!("lease {id} revoked\n")
    );
    assert_eq!(etcdctl(&one, &["get", "leased"], None).await, "");

    // Compaction at the revision before the current one.
    let json = etcdctl(&one, &["get", "foo", "-w", "json"], None).await;
    let rev: i64 = serde_json::from_str::<serde_json::Value>(&json).expect("json")["header"]
        ["revision"]
        .as_i64()
        .expect("revision");
    assert_eq!(
        etcdctl(&one, &["compaction", &(rev - 1).to_string()], None).await,
        format!("compacted revision {}\n", rev - 1)
    );

    // Endpoint status: one line per member, exactly one leader.
    let status = etcdctl(&all, &["endpoint", "status"], None).await;
    let lines: Vec<&str> = status.lines().collect();
    assert_eq!(lines.len(), t.endpoints(), "{status}");
    assert_eq!(
        lines.iter().filter(|l| l.contains(", true, ")).count(),
        1,
        "one leader: {status}"
    );
    assert!(lines.iter().all(|l| l.contains("3.5.0")), "{status}");

    // Member list: three started members with their peer and client URLs
    // (`%x` ids, unpadded). Members publish their names and client URLs
    // through Raft right after start; allow that a moment.
    let mut expected: Vec<String> = cluster
        .members
        .iter()
        .map(|m| {
            format!(
                "{:x}, started, cell-{}, http://{}, http://{}, false",
                m.id, m.id, m.peer, m.client
            )
        })
        .collect();
    expected.sort();
    eventually(Duration::from_secs(10), async || {
        let members = etcdctl(&one, &["member", "list"], None).await;
        let mut lines: Vec<&str> = members.lines().collect();
        lines.sort();
        if lines == expected {
            Ok(())
        } else {
            Err(format!("member list {lines:?}, expected {expected:?}"))
        }
    })
    .await;
}

/// Waits until the cell's members serve at least `n` watches between them
/// (so a watch started by a separate process is in place before the
/// writes it must see).
async fn wait_watchers(cluster: &Cluster, n: usize) {
    eventually(Duration::from_secs(15), async || {
        let sum = cluster.metric_sum("latchkey_watchers").await;
        if sum >= n as f64 {
            Ok(())
        } else {
            Err(format!("the members serve {sum} watchers, not {n}"))
        }
    })
    .await
}

fn lines(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| s.to_string()).collect()
}

/// watch, member add/promote/remove, endpoint status, snapshot, lock and
/// elect.
pub async fn watch_members_status_snapshot_lock_and_elect(t: &mut Target<'_>) {
    // The three founding members, also after a fourth came and went.
    let (one, all) = (t.one.clone(), t.all.clone());
    check_watch(t.cluster, &one, &all).await;
    check_watch_from_a_revision(&one, &all).await;
    check_member_add_promote_remove(t.cluster, &all).await;
    check_endpoint_status_table(&all, t.endpoints()).await;
    check_snapshot_save(&one).await;
    check_lock(&all).await;
    check_elect(&all).await;
}

/// watch: live changes to one key, watched through `one`.
async fn check_watch(cluster: &Cluster, one: &str, all: &str) {
    let mut watch = EtcdctlProcess::start(one, &["watch", "foo"]);
    wait_watchers(cluster, 1).await;
    etcdctl(all, &["put", "foo", "bar"], None).await;
    etcdctl(all, &["put", "other", "x"], None).await;
    etcdctl(all, &["del", "foo"], None).await;
    assert_eq!(
        watch.lines(6).await,
        lines(&["PUT", "foo", "bar", "DELETE", "foo", ""])
    );
    drop(watch);
}

/// watch --prefix --rev N: history from N, then live.
async fn check_watch_from_a_revision(one: &str, all: &str) {
    let json = etcdctl(all, &["put", "pre/a", "1", "-w", "json"], None).await;
    let rev = serde_json::from_str::<serde_json::Value>(&json).expect("json")["header"]["revision"]
        .as_i64()
        .expect("revision");
    etcdctl(all, &["put", "pre/b", "2"], None).await;
    etcdctl(all, &["del", "pre/a"], None).await;
    let mut history = EtcdctlProcess::start(
        one,
        &["watch", "--prefix", "--rev", &rev.to_string(), "pre/"],
    );
    assert_eq!(
        history.lines(9).await,
        lines(&["PUT", "pre/a", "1", "PUT", "pre/b", "2", "DELETE", "pre/a", ""])
    );
    etcdctl(all, &["put", "pre/c", "3"], None).await;
    assert_eq!(history.lines(3).await, lines(&["PUT", "pre/c", "3"]));
    drop(history);
}

/// member add --learner, start it with --join, promote, remove.
async fn check_member_add_promote_remove(cluster: &mut Cluster, all: &str) {
    let peer = format!("127.0.0.1:{}", free_port());
    let added = etcdctl(
        all,
        &[
            "member",
            "add",
            "newbie",
            &format!("--peer-urls=http://{peer}"),
            "--learner",
        ],
        None,
    )
    .await;
    // "Member %16x added to cluster %16x": space-padded below 2^60.
    let id = member_id_in(&added);
    assert!(
        added.starts_with(&format!("Member {id:16x} added to cluster ")),
        "{added:?}"
    );
    let hex = format!("{id:x}");
    assert!(added.contains("ETCD_NAME=\"newbie\""), "{added}");
    assert!(
        added.contains("ETCD_INITIAL_CLUSTER_STATE=\"existing\""),
        "{added}"
    );
    let listed = etcdctl(all, &["member", "list"], None).await;
    assert!(
        listed
            .lines()
            .any(|l| l == format!("{hex}, unstarted, , http://{peer}, , true")),
        "{listed}"
    );
    cluster.new_joiner(id, peer.clone());
    cluster.spawn(id);
    // Refused with etcd's own text until the learner is in sync.
    let promoted = eventually(Duration::from_secs(30), async || {
        let out = try_etcdctl(all, &["member", "promote", &hex], None).await;
        if let Err(e) = &out {
            assert!(
                e.contains(
                    "etcdserver: can only promote a learner member which is in sync with leader"
                ),
                "{e}"
            );
        }
        out
    })
    .await;
    assert!(
        promoted.starts_with(&format!("Member {id:16x} promoted in cluster ")),
        "{promoted:?}"
    );
    let listed = etcdctl(all, &["member", "list"], None).await;
    let line = listed
        .lines()
        .find(|l| l.starts_with(&format!("{hex}, ")))
        .unwrap_or_else(|| panic!("{listed}"));
    assert!(
        line.contains(&format!(", http://{peer}, ")) && line.ends_with(", false"),
        "a voter now: {line}"
    );
    let removed = etcdctl(all, &["member", "remove", &hex], None).await;
    assert!(
        removed.starts_with(&format!("Member {id:16x} removed from cluster ")),
        "{removed:?}"
    );
    assert_eq!(
        etcdctl(all, &["member", "list"], None)
            .await
            .lines()
            .count(),
        3
    );
}

/// endpoint status -w table: a header and one row per member, one leader.
async fn check_endpoint_status_table(all: &str, endpoints: usize) {
    let table = etcdctl(all, &["endpoint", "status", "-w", "table"], None).await;
    let rows: Vec<Vec<String>> = table
        .lines()
        .filter(|l| l.starts_with('|'))
        .map(|l| l.split('|').map(|c| c.trim().to_string()).collect())
        .collect();
    assert_eq!(rows.len(), 1 + endpoints, "{table}");
    let header = &rows[0];
    for col in [
        "ENDPOINT",
        "ID",
        "VERSION",
        "DB SIZE",
        "IS LEADER",
        "IS LEARNER",
        "RAFT TERM",
        "RAFT INDEX",
        "RAFT APPLIED INDEX",
        "ERRORS",
    ] {
        assert!(header.contains(&col.to_string()), "{col} in {table}");
    }
    let leader_col = header
        .iter()
        .position(|c| c == "IS LEADER")
        .expect("column");
    assert_eq!(
        rows[1..].iter().filter(|r| r[leader_col] == "true").count(),
        1,
        "{table}"
    );
}

/// snapshot save: a state file a new cell can be restored from.
async fn check_snapshot_save(one: &str) {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("cell.snap");
    let path = path.to_str().expect("utf-8");
    let saved = etcdctl(one, &["snapshot", "save", path], None).await;
    assert!(
        saved.contains(&format!("Snapshot saved at {path}")),
        "{saved}"
    );
    let bytes = std::fs::read(path).expect("the snapshot file");
    assert!(bytes.starts_with(b"latchkey-state-v2\n"));
}

/// lock: the second locker waits until the first lets go.
async fn check_lock(all: &str) {
    let mut first = EtcdctlProcess::start(all, &["lock", "mylock"]);
    let held = first.lines(1).await;
    assert!(held[0].starts_with("mylock/"), "{held:?}");
    let mut second = EtcdctlProcess::start(all, &["lock", "mylock", "echo", "second holder"]);
    assert!(
        second.quiet_for(Duration::from_secs(2)).await,
        "two holders at once"
    );
    first.interrupt();
    assert_eq!(second.lines(1).await, lines(&["second holder"]));
}

/// elect: a campaigner leads, an observer sees it, a second campaigner
/// takes over when the first resigns.
async fn check_elect(all: &str) {
    let mut p1 = EtcdctlProcess::start(all, &["elect", "myelection", "p1"]);
    let led = p1.lines(2).await;
    assert!(
        led[0].starts_with("myelection/") && led[1] == "p1",
        "{led:?}"
    );
    let mut observer = EtcdctlProcess::start(all, &["elect", "-l", "myelection"]);
    assert_eq!(observer.lines(2).await, led);
    let mut p2 = EtcdctlProcess::start(all, &["elect", "myelection", "p2"]);
    assert!(
        p2.quiet_for(Duration::from_secs(2)).await,
        "two leaders at once"
    );
    p1.interrupt();
    let next = p2.lines(2).await;
    assert!(
        next[0].starts_with("myelection/") && next[1] == "p2",
        "{next:?}"
    );
    assert_eq!(observer.lines(2).await, next);
}
