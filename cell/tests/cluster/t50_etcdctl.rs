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
