//! The KV service through the `etcd-client` crate on a three-member cell:
//! every RPC, its options, and its error paths.

use crate::harness::{err_text, Cluster};
use etcd_client::{
    Compare, CompareOp, DeleteOptions, GetOptions, PutOptions, SortOrder, SortTarget, Txn, TxnOp,
    TxnOpResponse,
};
use std::collections::BTreeSet;

fn follower_of(leader: u64) -> u64 {
    if leader == 1 {
        2
    } else {
        1
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kv_rpcs_and_their_errors() {
    let cluster = Cluster::start(3, &[]).await;
    let leader = cluster
        .wait_leader(std::time::Duration::from_secs(10))
        .await;
    // Through a follower, so every write and linearizable read is forwarded.
    let follower = follower_of(leader);
    let mut c = cluster.client(follower).await;

    // Put, Get and the response header.
    let put = c.put("a/1", "one", None).await.expect("put");
    let header = put.header().expect("header");
    assert!(header.revision() > 0);
    assert!(header.raft_term() > 0);
    assert_eq!(header.member_id(), follower);
    let mut other = cluster.client(leader).await;
    let got = other.get("a/1", None).await.expect("get");
    assert_eq!(
        got.header().expect("header").cluster_id(),
        header.cluster_id(),
        "one cluster id on every member"
    );
    assert_eq!(got.kvs()[0].value(), b"one");
    assert_eq!(got.kvs()[0].create_revision(), header.revision());
    assert_eq!(got.kvs()[0].version(), 1);

    // prev_kv on put; versions count up.
    let put2 = c
        .put("a/1", "uno", Some(PutOptions::new().with_prev_key()))
        .await
        .expect("put prev");
    assert_eq!(put2.prev_key().expect("prev kv").value(), b"one");
    let rev_after_uno = put2.header().expect("header").revision();
    for k in ["a/2", "a/3", "b/1"] {
        c.put(k, format!("v-{k}"), None).await.expect("put");
    }

    // Prefix, limit, sort, keys_only, count_only, serializable.
    let prefix = c
        .get("a/", Some(GetOptions::new().with_prefix()))
        .await
        .expect("prefix");
    let keys: Vec<&[u8]> = prefix.kvs().iter().map(|kv| kv.key()).collect();
    assert_eq!(keys, vec![&b"a/1"[..], b"a/2", b"a/3"]);
    let limited = c
        .get(
            "a/",
            Some(
                GetOptions::new()
                    .with_prefix()
                    .with_limit(2)
                    .with_sort(SortTarget::Key, SortOrder::Descend),
            ),
        )
        .await
        .expect("limit");
    assert_eq!(
        limited.kvs().iter().map(|kv| kv.key()).collect::<Vec<_>>(),
        vec![&b"a/3"[..], b"a/2"]
    );
    assert!(limited.more());
    assert_eq!(limited.count(), 3);
    let keys_only = c
        .get("a/", Some(GetOptions::new().with_prefix().with_keys_only()))
        .await
        .expect("keys only");
    assert!(keys_only.kvs().iter().all(|kv| kv.value().is_empty()));
    let counted = c
        .get(
            "",
            Some(GetOptions::new().with_all_keys().with_count_only()),
        )
        .await
        .expect("count");
    assert_eq!(counted.count(), 4);
    assert!(counted.kvs().is_empty());
    let ranged = c
        .get("a/2", Some(GetOptions::new().with_range("b/2")))
        .await
        .expect("range");
    assert_eq!(ranged.kvs().len(), 3);
    let serializable = c
        .get("a/1", Some(GetOptions::new().with_serializable()))
        .await
        .expect("serializable");
    assert_eq!(serializable.kvs()[0].value(), b"uno");

    // A read at an old revision sees the old value.
    let old = c
        .get(
            "a/1",
            Some(GetOptions::new().with_revision(rev_after_uno - 1)),
        )
        .await
        .expect("old rev");
    assert_eq!(old.kvs()[0].value(), b"one");

    // Future revision.
    let future = c
        .get("a/1", Some(GetOptions::new().with_revision(1_000_000)))
        .await
        .unwrap_err();
    assert_eq!(
        err_text(future),
        "OutOfRange: etcdserver: mvcc: required revision is a future revision"
    );

    // Delete with prev_kv, by prefix.
    let del = c
        .delete(
            "a/",
            Some(DeleteOptions::new().with_prefix().with_prev_key()),
        )
        .await
        .expect("delete");
    assert_eq!(del.deleted(), 3);
    let prev: BTreeSet<Vec<u8>> = del.prev_kvs().iter().map(|kv| kv.key().to_vec()).collect();
    assert_eq!(prev.len(), 3);
    assert!(c.get("a/1", None).await.expect("get").kvs().is_empty());
    let nothing = c.delete("nope", None).await.expect("delete nothing");
    assert_eq!(nothing.deleted(), 0);

    // Txn: then branch, else branch, every compare target, nested txn.
    let rev_b = c.get("b/1", None).await.expect("get").kvs()[0].mod_revision();
    let txn = Txn::new()
        .when([
            Compare::value("b/1", CompareOp::Equal, "v-b/1"),
            Compare::version("b/1", CompareOp::Equal, 1),
            Compare::mod_revision("b/1", CompareOp::Equal, rev_b),
            Compare::create_revision("b/1", CompareOp::Less, rev_b + 1),
            Compare::lease("b/1", CompareOp::Equal, 0),
        ])
        .and_then([TxnOp::put("t/then", "yes", None), TxnOp::get("b/1", None)])
        .or_else([TxnOp::put("t/else", "no", None)]);
    let resp = c.txn(txn).await.expect("txn then");
    assert!(resp.succeeded());
    match &resp.op_responses()[1] {
        TxnOpResponse::Get(g) => assert_eq!(g.kvs()[0].value(), b"v-b/1"),
        other => panic!("expected a get response, got {other:?}"),
    }
    let txn_rev = resp.header().expect("header").revision();
    let then_kv = c.get("t/then", None).await.expect("get").kvs()[0].clone();
    assert_eq!(
        then_kv.mod_revision(),
        txn_rev,
        "a txn's writes share one revision"
    );

    let else_txn = Txn::new()
        .when([Compare::value("b/1", CompareOp::NotEqual, "v-b/1")])
        .and_then([TxnOp::put("t/then2", "yes", None)])
        .or_else([
            TxnOp::put("t/else", "no", None),
            TxnOp::txn(
                Txn::new()
                    .when([Compare::version("missing", CompareOp::Equal, 0)])
                    .and_then([TxnOp::put("t/nested", "in", None)]),
            ),
        ]);
    let resp = c.txn(else_txn).await.expect("txn else");
    assert!(
        !resp.succeeded(),
        "the else branch runs when a compare fails"
    );
    assert_eq!(
        c.get("t/else", None).await.expect("get").kvs()[0].value(),
        b"no"
    );
    assert_eq!(
        c.get("t/nested", None).await.expect("get").kvs()[0].value(),
        b"in"
    );
    assert!(c.get("t/then2", None).await.expect("get").kvs().is_empty());

    let dup = Txn::new().and_then([TxnOp::put("d", "1", None), TxnOp::put("d", "2", None)]);
    assert_eq!(
        err_text(c.txn(dup).await.unwrap_err()),
        "InvalidArgument: etcdserver: duplicate key given in txn request"
    );

    // Compaction: reads below the compact revision fail, at and above work.
    let current = c
        .get("b/1", None)
        .await
        .expect("get")
        .header()
        .expect("header")
        .revision();
    c.compact(current - 1, None).await.expect("compact");
    let compacted = c
        .get("b/1", Some(GetOptions::new().with_revision(current - 2)))
        .await
        .unwrap_err();
    assert_eq!(
        err_text(compacted),
        "OutOfRange: etcdserver: mvcc: required revision has been compacted"
    );
    c.get("b/1", Some(GetOptions::new().with_revision(current - 1)))
        .await
        .expect("read at compact revision");
    let again = c.compact(current - 1, None).await.unwrap_err();
    assert_eq!(
        err_text(again),
        "OutOfRange: etcdserver: mvcc: required revision has been compacted"
    );
    let future = c.compact(current + 100, None).await.unwrap_err();
    assert_eq!(
        err_text(future),
        "OutOfRange: etcdserver: mvcc: required revision is a future revision"
    );

    // Value too large (default limit 64 KiB), and nothing was written.
    let big = vec![b'x'; 64 * 1024 + 1];
    let too_large = c.put("big", big, None).await.unwrap_err();
    assert!(
        err_text(too_large).starts_with("InvalidArgument: value of 65537 bytes exceeds"),
        "clear error"
    );
    assert!(c.get("big", None).await.expect("get").kvs().is_empty());
    c.put("big", vec![b'x'; 64 * 1024], None)
        .await
        .expect("a value at the limit is fine");

    // A request over the request size limit (1.5 MiB) is refused before
    // it is decoded, with a clear error, and writes nothing.
    let huge = c
        .put("huge", vec![b'x'; 2 * 1024 * 1024], None)
        .await
        .unwrap_err();
    let text = err_text(huge);
    assert!(text.contains("too large"), "{text}");
    assert!(c.get("huge", None).await.expect("get").kvs().is_empty());

    // Empty key.
    let empty = c.put("", "v", None).await.unwrap_err();
    assert_eq!(
        err_text(empty),
        "InvalidArgument: etcdserver: key is not provided"
    );

    // Every member serves the same data, through serializable local reads.
    let final_rev = c
        .get("b/1", None)
        .await
        .expect("get")
        .header()
        .expect("header")
        .revision();
    for id in 1..=3 {
        let mut m = cluster.client(id).await;
        // A linearizable read first, so the serializable one below is current.
        m.get("b/1", None).await.expect("linearizable");
        let local = m
            .get(
                "",
                Some(GetOptions::new().with_all_keys().with_serializable()),
            )
            .await
            .expect("local");
        assert!(local.header().expect("header").revision() >= final_rev);
        assert_eq!(local.kvs().len(), 5, "member {id}");
    }
}

/// id, name, peer URLs, client URLs, is learner.
type MemberRow = (u64, String, Vec<String>, Vec<String>, bool);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_and_member_list_describe_the_cell() {
    let cluster = Cluster::start(3, &[]).await;
    let leader = cluster
        .wait_leader(std::time::Duration::from_secs(10))
        .await;
    for id in 1..=3 {
        let mut c = cluster.client(id).await;
        let status = c.status().await.expect("status");
        assert_eq!(status.leader(), leader);
        assert_eq!(status.header().expect("header").member_id(), id);
        assert!(
            status.raft_index() >= status.raft_applied_index() && status.raft_applied_index() > 0
        );
        assert!(status.raft_term() > 0);
    }
    let mut c = cluster.client(leader).await;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let list = c.member_list().await.expect("member list");
        let mut seen: Vec<MemberRow> = list
            .members()
            .iter()
            .map(|m| {
                (
                    m.id(),
                    m.name().to_string(),
                    m.peer_urls().to_vec(),
                    m.client_urls().to_vec(),
                    m.is_learner(),
                )
            })
            .collect();
        seen.sort();
        let expected: Vec<_> = cluster
            .members
            .iter()
            .map(|m| {
                (
                    m.id,
                    format!("cell-{}", m.id),
                    vec![format!("http://{}", m.peer)],
                    vec![format!("http://{}", m.client)],
                    false,
                )
            })
            .collect();
        if seen == expected {
            break;
        }
        // Members publish their names and client URLs right after start.
        assert!(
            std::time::Instant::now() < deadline,
            "member list {seen:?} != {expected:?}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    let metrics = crate::harness::http_get(&cluster.member(leader).metrics, "/metrics")
        .await
        .expect("metrics");
    for name in [
        "latchkey_raft_term",
        "latchkey_leader_changes_total",
        "latchkey_proposal_commit_seconds_bucket",
        "latchkey_applied_index",
        "latchkey_revision",
        "latchkey_keys",
        "latchkey_leases",
    ] {
        assert!(metrics.contains(name), "/metrics lacks {name}");
    }
    let health = crate::harness::http_get(&cluster.member(leader).metrics, "/healthz")
        .await
        .expect("healthz");
    assert!(health.starts_with("HTTP/1.1 200"), "{health}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keyspace_quota_rejects_writes_until_space_is_freed() {
    let cluster = Cluster::start(1, &["--quota-bytes", "40000"]).await;
    let mut c = cluster.client(1).await;
    let value = vec![b'q'; 1000];
    let mut written = 0;
    let err = loop {
        match c.put(format!("q/{written}"), value.clone(), None).await {
            Ok(_) => written += 1,
            Err(e) => break e,
        }
        assert!(written < 100, "quota never enforced");
    };
    assert_eq!(
        err_text(err),
        "ResourceExhausted: etcdserver: mvcc: database space exceeded"
    );
    assert!(written >= 30, "writes up to the quota succeed ({written})");
    // The rejected write left nothing behind.
    assert!(c
        .get(format!("q/{written}"), None)
        .await
        .expect("get")
        .kvs()
        .is_empty());
    // Deletes still work; compaction frees the history, then writes succeed.
    let del = c
        .delete("q/", Some(DeleteOptions::new().with_prefix()))
        .await
        .expect("delete under quota");
    let rev = del.header().expect("header").revision();
    c.compact(rev, None).await.expect("compact");
    c.put("after", value, None)
        .await
        .expect("write after space was freed");
}
