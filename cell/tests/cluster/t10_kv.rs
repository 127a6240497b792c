//! The KV service through the `etcd-client` crate on a three-member cell:
//! every RPC, its options, and its error paths.

use crate::CELL_BIN;
use etcd_client::{
    Client, Compare, CompareOp, DeleteOptions, GetOptions, PutOptions, SortOrder, SortTarget, Txn,
    TxnOp, TxnOpResponse,
};
use latchkey_shared::ApiError;
use latchkey_testkit::{err_text, eventually, http_get, metric_value, Cluster};
use std::collections::BTreeSet;
use tokio::time::Duration;

/// One three-member cell, every check through a follower, so every write
/// and linearizable read is forwarded to the leader. Each block is a named
/// check so a failure names the part that broke.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kv_rpcs_and_their_errors() {
    let cluster = Cluster::start(CELL_BIN, 3, &[]).await;
    let follower = cluster.follower();
    let mut c = cluster.client(follower).await;

    check_put_get_and_the_response_header(&cluster, &mut c).await;
    let rev_after_uno = check_prev_kv_and_versions(&mut c).await;
    check_range_options(&mut c).await;
    check_old_and_future_revisions(&mut c, rev_after_uno).await;
    check_delete(&mut c).await;
    check_txn_branches(&mut c).await;
    check_compaction(&mut c).await;
    check_size_limits(&mut c).await;
    check_empty_key(&mut c).await;
    check_every_member_serves_the_same_data(&cluster, &mut c).await;
    check_a_write_through_a_follower_is_read_there_at_once(&mut c).await;
}

/// A client that writes through a follower reads its write there at once,
/// serializably, as with etcd (which answers a write on the member that
/// received it only once that member has applied it). Before, the follower
/// answered as soon as the leader had, and a read right after could miss
/// the write (the etcd Go client suite saw a progress notification older
/// than the client's own put).
async fn check_a_write_through_a_follower_is_read_there_at_once(c: &mut Client) {
    for i in 0..100 {
        let value = format!("v{i}");
        let put = c.put("ryw", value.as_str(), None).await.expect("put");
        let revision = put.header().expect("header").revision();
        let got = c
            .get("ryw", Some(GetOptions::new().with_serializable()))
            .await
            .expect("get");
        assert!(
            got.header().expect("header").revision() >= revision,
            "round {i}: a serializable read after a put at {revision} is at {}",
            got.header().expect("header").revision()
        );
        assert_eq!(
            got.kvs()[0].value_str().ok(),
            Some(value.as_str()),
            "round {i}"
        );
    }
}

/// Put, Get and the response header, seen through two members.
async fn check_put_get_and_the_response_header(cluster: &Cluster, c: &mut Client) {
    let put = c.put("a/1", "one", None).await.expect("put");
    let header = put.header().expect("header");
    assert!(header.revision() > 0);
    assert!(header.raft_term() > 0);
    assert_eq!(header.member_id(), cluster.follower());
    let mut other = cluster.client(cluster.leader_at_start()).await;
    let got = other.get("a/1", None).await.expect("get");
    assert_eq!(
        got.header().expect("header").cluster_id(),
        header.cluster_id(),
        "one cluster id on every member"
    );
    assert_eq!(got.kvs()[0].value(), b"one");
    assert_eq!(got.kvs()[0].create_revision(), header.revision());
    assert_eq!(got.kvs()[0].version(), 1);
}

/// prev_kv on put; versions count up. Returns the revision of the second
/// put of `a/1`.
async fn check_prev_kv_and_versions(c: &mut Client) -> i64 {
    let put2 = c
        .put("a/1", "uno", Some(PutOptions::new().with_prev_key()))
        .await
        .expect("put prev");
    assert_eq!(put2.prev_key().expect("prev kv").value(), b"one");
    let rev_after_uno = put2.header().expect("header").revision();
    assert_eq!(c.get("a/1", None).await.expect("get").kvs()[0].version(), 2);
    for k in ["a/2", "a/3", "b/1"] {
        c.put(k, format!("v-{k}"), None).await.expect("put");
    }
    rev_after_uno
}

/// Prefix, limit, sort, keys_only, count_only, range, serializable.
async fn check_range_options(c: &mut Client) {
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
}

/// A read at an old revision sees the old value; a future one is refused.
async fn check_old_and_future_revisions(c: &mut Client, rev_after_uno: i64) {
    let old = c
        .get(
            "a/1",
            Some(GetOptions::new().with_revision(rev_after_uno - 1)),
        )
        .await
        .expect("old rev");
    assert_eq!(old.kvs()[0].value(), b"one");
    let future = c
        .get("a/1", Some(GetOptions::new().with_revision(1_000_000)))
        .await
        .unwrap_err();
    assert_eq!(
        err_text(future),
        "OutOfRange: etcdserver: mvcc: required revision is a future revision"
    );
}

/// Delete with prev_kv, by prefix; deleting nothing is no error.
async fn check_delete(c: &mut Client) {
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
}

/// Txn: then branch, else branch, every compare target, nested txn, and a
/// duplicate key refused.
async fn check_txn_branches(c: &mut Client) {
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
}

/// Compaction: reads below the compact revision fail, at and above work;
/// compacting again or into the future is refused.
async fn check_compaction(c: &mut Client) {
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
}

/// A value over the limit (64 KiB by default) and a request over the
/// request limit (1.5 MiB) are refused with their exact errors and write
/// nothing; a value at the limit is fine.
async fn check_size_limits(c: &mut Client) {
    let big = vec![b'x'; 64 * 1024 + 1];
    let too_large = c.put("big", big, None).await.unwrap_err();
    assert_eq!(
        err_text(too_large),
        "InvalidArgument: value of 65537 bytes exceeds the limit of 65536 bytes"
    );
    assert!(c.get("big", None).await.expect("get").kvs().is_empty());
    c.put("big", vec![b'x'; 64 * 1024], None)
        .await
        .expect("a value at the limit is fine");

    // Over the request limit (1.5 MiB) but within what the transport
    // takes (another 512 KiB, as etcd): etcd's own error, which clients
    // know. Values under the value limit, so only the request is too large.
    let ops: Vec<TxnOp> = (0..25)
        .map(|i| TxnOp::put(format!("part/{i}"), vec![b'x'; 64 * 1024], None))
        .collect();
    let too_large = c.txn(Txn::new().and_then(ops)).await.unwrap_err();
    assert_eq!(
        err_text(too_large),
        format!("InvalidArgument: {}", ApiError::request_too_large().message)
    );
    let parts = c
        .get("part/", Some(GetOptions::new().with_prefix()))
        .await
        .expect("get");
    assert!(parts.kvs().is_empty(), "nothing of it was written");

    // Over the request limit and the transport's allowance past it: the
    // code and text etcd's gRPC transport answers with. The encoded
    // PutRequest is 2 097 163 bytes: key (2 + 4), value (1 + 4 + 2 MiB).
    let huge = c
        .put("huge", vec![b'x'; 2 * 1024 * 1024], None)
        .await
        .unwrap_err();
    assert_eq!(
        err_text(huge),
        "ResourceExhausted: grpc: received message larger than max (2097163 vs. 2097152)"
    );
    assert!(c.get("huge", None).await.expect("get").kvs().is_empty());
}

async fn check_empty_key(c: &mut Client) {
    let empty = c.put("", "v", None).await.unwrap_err();
    assert_eq!(
        err_text(empty),
        "InvalidArgument: etcdserver: key is not provided"
    );
}

/// Every member serves the same data through serializable local reads
/// (after a linearizable read, so the local one is current).
async fn check_every_member_serves_the_same_data(cluster: &Cluster, c: &mut Client) {
    let final_rev = c
        .get("b/1", None)
        .await
        .expect("get")
        .header()
        .expect("header")
        .revision();
    for id in 1..=3 {
        let mut m = cluster.client(id).await;
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
    let cluster = Cluster::start(CELL_BIN, 3, &[]).await;
    let leader = cluster.leader_at_start();
    let mut term = 0;
    let mut applied = 0;
    for id in 1..=3 {
        let c = cluster.client(id).await;
        // A follower learns that the leader's first entry committed with
        // the next heartbeat; until then it has applied only index 0 (the
        // first membership), which is what it reports.
        let status = eventually(Duration::from_secs(5), async || {
            let status = c.clone().status().await.map_err(|e| e.to_string())?;
            if status.raft_applied_index() > 0 {
                Ok(status)
            } else {
                Err(format!("member {id} has applied nothing past index 0 yet"))
            }
        })
        .await;
        assert_eq!(status.leader(), leader);
        assert_eq!(status.header().expect("header").member_id(), id);
        assert!(
            status.raft_index() >= status.raft_applied_index() && status.raft_applied_index() > 0
        );
        assert!(status.raft_term() > 0);
        if id == leader {
            (term, applied) = (status.raft_term(), status.raft_applied_index());
        }
    }
    let mut c = cluster.client(leader).await;
    let expected: Vec<MemberRow> = cluster
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
    // Members publish their names and client URLs right after start.
    eventually(Duration::from_secs(10), async || {
        let list = c.member_list().await.map_err(|e| e.to_string())?;
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
        if seen == expected {
            Ok(())
        } else {
            Err(format!("member list {seen:?} != {expected:?}"))
        }
    })
    .await;

    // The leader's metrics tell the same story, after one write of ours.
    let put = c.put("m/1", "v", None).await.expect("put");
    let revision = put.header().expect("header").revision();
    let metrics = http_get(&cluster.member(leader).metrics, "/metrics")
        .await
        .expect("metrics");
    let value = |series: &str| {
        metric_value(&metrics, series).unwrap_or_else(|| panic!("/metrics lacks {series}"))
    };
    // Every metric recorded has its catalog entry's HELP text.
    let undescribed = latchkey_testkit::metrics::undescribed(&metrics);
    assert!(
        undescribed.is_empty(),
        "metrics without a description (add them to the crate's metrics_catalog): {}",
        undescribed.join(", ")
    );
    assert_eq!(value("latchkey_raft_term"), term as f64);
    assert!(
        value("latchkey_leader_changes_total") >= 1.0,
        "the leader saw itself become leader"
    );
    assert!(value("latchkey_proposal_commit_seconds_count") >= 1.0);
    assert_eq!(
        value("latchkey_proposal_commit_seconds_bucket{le=\"+Inf\"}"),
        value("latchkey_proposal_commit_seconds_count")
    );
    assert!(value("latchkey_applied_index") > applied as f64);
    assert_eq!(value("latchkey_revision"), revision as f64);
    assert_eq!(value("latchkey_keys"), 1.0);
    assert_eq!(value("latchkey_leases"), 0.0);
    // The log's memory tables hold the entries just written, within the
    // limits the log store sets (two 8 MiB tables per family, 16 MiB in all,
    // and an 8 MiB block cache).
    let log_store = value("latchkey_log_store_memory_bytes");
    assert!(
        log_store > 0.0 && log_store <= (24 << 20) as f64,
        "log store memory {log_store} bytes"
    );
    let health = http_get(&cluster.member(leader).metrics, "/healthz")
        .await
        .expect("healthz");
    assert!(health.starts_with("HTTP/1.1 200"), "{health}");
    assert!(health.ends_with("\r\n\r\nok\n"), "{health}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keyspace_quota_rejects_writes_until_space_is_freed() {
    let cluster = Cluster::start(CELL_BIN, 1, &["--quota-bytes", "40000"]).await;
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
