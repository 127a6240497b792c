//! etcd's own command-line client (Debian's etcd-client package, etcd 3.4)
//! against a three-member cell: a scripted session with outputs checked.

use crate::harness::Cluster;
use std::time::Duration;

/// Runs etcdctl against `endpoints`; returns stdout, panics with stderr on
/// failure. Bounded by a timeout.
async fn etcdctl(endpoints: &str, args: &[&str], stdin: Option<&str>) -> String {
    use tokio::io::AsyncWriteExt;
    let mut cmd = tokio::process::Command::new("etcdctl");
    cmd.env("ETCDCTL_API", "3")
        .arg(format!("--endpoints={endpoints}"))
        .arg("--command-timeout=10s")
        .args(args)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true);
    let mut child = cmd
        .spawn()
        .expect("etcdctl is installed (the README's test command installs etcd-client)");
    let mut input = child.stdin.take().expect("stdin");
    if let Some(text) = stdin {
        input.write_all(text.as_bytes()).await.expect("write stdin");
    }
    drop(input);
    let out = tokio::time::timeout(Duration::from_secs(30), child.wait_with_output())
        .await
        .expect("etcdctl finished in time")
        .expect("etcdctl ran");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(
        out.status.success(),
        "etcdctl {args:?} failed: {stderr}{stdout}"
    );
    stdout
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcdctl_scripted_session() {
    let cluster = Cluster::start(3, &[]).await;
    let all = cluster
        .members
        .iter()
        .map(|m| m.client.clone())
        .collect::<Vec<_>>()
        .join(",");
    let one = cluster.members[1].client.clone();

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
    assert!(
        listed.contains(&id),
        "lease list shows the lease: {listed:?}"
    );
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
    assert_eq!(lines.len(), 3, "{status}");
    assert_eq!(
        lines.iter().filter(|l| l.contains(", true, ")).count(),
        1,
        "one leader: {status}"
    );
    assert!(lines.iter().all(|l| l.contains("3.5.0")), "{status}");

    // Member list: three started members with their peer and client URLs.
    // Members publish their names and client URLs through Raft right
    // after start; allow that a moment.
    let mut members = String::new();
    for _ in 0..50 {
        members = etcdctl(&one, &["member", "list"], None).await;
        if !members.contains("unstarted") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(members.lines().count(), 3, "{members}");
    for m in &cluster.members {
        let line = members
            .lines()
            .find(|l| l.starts_with(&format!("{:x}, ", m.id)))
            .unwrap_or_else(|| panic!("member {} missing: {members}", m.id));
        assert!(line.contains(", started, "), "{line}");
        assert!(line.contains(&format!("http://{}", m.peer)), "{line}");
        assert!(line.contains(&format!("http://{}", m.client)), "{line}");
        assert!(line.ends_with(", false"), "voter, not learner: {line}");
    }
}

/// A long-running etcdctl (watch, lock, elect) whose output is read line by
/// line; killed when dropped.
struct Running {
    child: tokio::process::Child,
    lines: tokio::io::Lines<tokio::io::BufReader<tokio::process::ChildStdout>>,
}

impl Running {
    fn start(endpoints: &str, args: &[&str]) -> Running {
        use tokio::io::AsyncBufReadExt;
        let mut child = tokio::process::Command::new("etcdctl")
            .env("ETCDCTL_API", "3")
            .arg(format!("--endpoints={endpoints}"))
            .args(args)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .expect("etcdctl runs");
        let stdout = child.stdout.take().expect("stdout");
        Running {
            child,
            lines: tokio::io::BufReader::new(stdout).lines(),
        }
    }

    /// The next `n` lines, within 15 s.
    async fn lines(&mut self, n: usize) -> Vec<String> {
        let mut out = Vec::new();
        while out.len() < n {
            let line = tokio::time::timeout(Duration::from_secs(15), self.lines.next_line())
                .await
                .unwrap_or_else(|_| panic!("no output in time; so far {out:?}"))
                .expect("read etcdctl output")
                .unwrap_or_else(|| panic!("etcdctl ended; so far {out:?}"));
            out.push(line);
        }
        out
    }

    /// Whether a line arrives within `wait`.
    async fn quiet_for(&mut self, wait: Duration) -> bool {
        tokio::time::timeout(wait, self.lines.next_line())
            .await
            .is_err()
    }

    /// Ctrl-C: etcdctl releases its lock or leadership and exits.
    fn interrupt(&self) {
        if let Some(pid) = self.child.id() {
            let _ = std::process::Command::new("kill")
                .args(["-INT", &pid.to_string()])
                .status();
        }
    }
}

/// Waits until member `id` serves at least `n` watches (so a watch started
/// by a separate process is in place before the writes it must see).
async fn wait_watchers(cluster: &Cluster, id: u64, n: usize) {
    for _ in 0..150 {
        let metrics = cluster.metrics(id).await;
        let watchers = metrics
            .lines()
            .find_map(|l| l.strip_prefix("latchkey_watchers "))
            .and_then(|v| v.trim().parse::<f64>().ok())
            .unwrap_or(0.0);
        if watchers >= n as f64 {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("member {id} never had {n} watchers");
}

fn lines(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| s.to_string()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcdctl_watch_members_status_snapshot_lock_and_elect() {
    let mut cluster = Cluster::start(3, &[]).await;
    let all = cluster
        .members
        .iter()
        .map(|m| m.client.clone())
        .collect::<Vec<_>>()
        .join(",");
    let two = cluster.member(2).client.clone();

    // watch: live changes to one key, served by member 2.
    let mut watch = Running::start(&two, &["watch", "foo"]);
    wait_watchers(&cluster, 2, 1).await;
    etcdctl(&all, &["put", "foo", "bar"], None).await;
    etcdctl(&all, &["put", "other", "x"], None).await;
    etcdctl(&all, &["del", "foo"], None).await;
    assert_eq!(
        watch.lines(6).await,
        lines(&["PUT", "foo", "bar", "DELETE", "foo", ""])
    );
    drop(watch);

    // watch --prefix --rev N: history from N, then live.
    let json = etcdctl(&all, &["put", "pre/a", "1", "-w", "json"], None).await;
    let rev = serde_json::from_str::<serde_json::Value>(&json).expect("json")["header"]["revision"]
        .as_i64()
        .expect("revision");
    etcdctl(&all, &["put", "pre/b", "2"], None).await;
    etcdctl(&all, &["del", "pre/a"], None).await;
    let mut history = Running::start(
        &two,
        &["watch", "--prefix", "--rev", &rev.to_string(), "pre/"],
    );
    assert_eq!(
        history.lines(9).await,
        lines(&["PUT", "pre/a", "1", "PUT", "pre/b", "2", "DELETE", "pre/a", ""])
    );
    etcdctl(&all, &["put", "pre/c", "3"], None).await;
    assert_eq!(history.lines(3).await, lines(&["PUT", "pre/c", "3"]));
    drop(history);

    // member add --learner, start it with --join, promote, remove.
    let peer = format!("127.0.0.1:{}", crate::harness::free_port());
    let added = etcdctl(
        &all,
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
    let first = added.lines().next().unwrap_or_default();
    let hex = first
        .strip_prefix("Member ")
        .and_then(|s| s.split_once(" added to cluster "))
        .map(|(id, _)| id.to_string())
        .unwrap_or_else(|| panic!("unexpected member add output {added:?}"));
    assert!(added.contains("ETCD_NAME=\"newbie\""), "{added}");
    assert!(
        added.contains("ETCD_INITIAL_CLUSTER_STATE=\"existing\""),
        "{added}"
    );
    let id = u64::from_str_radix(&hex, 16).expect("hex member id");
    let listed = etcdctl(&all, &["member", "list"], None).await;
    assert!(
        listed.contains(&format!("{hex}, unstarted, , http://{peer}, , true")),
        "{listed}"
    );
    cluster.new_joiner(id, peer.clone());
    cluster.spawn(id);
    let mut promoted = String::new();
    for _ in 0..60 {
        let out = tokio::process::Command::new("etcdctl")
            .env("ETCDCTL_API", "3")
            .args([&format!("--endpoints={all}"), "member", "promote", &hex])
            .output()
            .await
            .expect("etcdctl runs");
        promoted = String::from_utf8_lossy(&out.stdout).into_owned();
        if out.status.success() {
            break;
        }
        // Not yet in sync with the leader: etcd's own refusal text.
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains("can only promote a learner member which is in sync with leader"),
            "{err}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    assert!(
        promoted.starts_with(&format!("Member {hex} promoted in cluster ")),
        "{promoted:?}"
    );
    let listed = etcdctl(&all, &["member", "list"], None).await;
    let line = listed
        .lines()
        .find(|l| l.starts_with(&hex))
        .unwrap_or_else(|| panic!("{listed}"));
    assert!(line.ends_with(", false"), "a voter now: {line}");
    let removed = etcdctl(&all, &["member", "remove", &hex], None).await;
    assert!(
        removed.starts_with(&format!("Member {hex} removed from cluster ")),
        "{removed:?}"
    );
    assert_eq!(
        etcdctl(&all, &["member", "list"], None)
            .await
            .lines()
            .count(),
        3
    );

    // endpoint status -w table: a header and one row per member, one leader.
    let table = etcdctl(&all, &["endpoint", "status", "-w", "table"], None).await;
    let rows: Vec<Vec<String>> = table
        .lines()
        .filter(|l| l.starts_with('|'))
        .map(|l| l.split('|').map(|c| c.trim().to_string()).collect())
        .collect();
    assert_eq!(rows.len(), 4, "{table}");
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

    // snapshot save: a state file a new cell can be restored from.
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("cell.snap");
    let path = path.to_str().expect("utf-8");
    let saved = etcdctl(&two, &["snapshot", "save", path], None).await;
    assert!(
        saved.contains(&format!("Snapshot saved at {path}")),
        "{saved}"
    );
    let bytes = std::fs::read(path).expect("the snapshot file");
    assert!(bytes.starts_with(b"latchkey-state-v1\n"));

    // lock: the second locker waits until the first lets go.
    let mut first = Running::start(&all, &["lock", "mylock"]);
    let held = first.lines(1).await;
    assert!(held[0].starts_with("mylock/"), "{held:?}");
    let mut second = Running::start(&all, &["lock", "mylock", "echo", "second holder"]);
    assert!(
        second.quiet_for(Duration::from_secs(2)).await,
        "two holders at once"
    );
    first.interrupt();
    assert_eq!(second.lines(1).await, lines(&["second holder"]));

    // elect: a campaigner leads, an observer sees it, a second campaigner
    // takes over when the first resigns.
    let mut p1 = Running::start(&all, &["elect", "myelection", "p1"]);
    let led = p1.lines(2).await;
    assert!(
        led[0].starts_with("myelection/") && led[1] == "p1",
        "{led:?}"
    );
    let mut observer = Running::start(&all, &["elect", "-l", "myelection"]);
    assert_eq!(observer.lines(2).await, led);
    let mut p2 = Running::start(&all, &["elect", "myelection", "p2"]);
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
