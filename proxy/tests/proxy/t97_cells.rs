//! Several cells behind the proxies (DESIGN section 9): the directory
//! says which cell owns which prefix; the proxies route every KV request to
//! that cell, refuse one that spans cells, and a request routed by a proxy
//! that has not seen a change is refused by the old cell (nothing applied
//! there) and routed again. Watches join the shared watches of their
//! range's cell.

use crate::{member_addrs, proxy_bin};
use etcd_client::{Compare, CompareOp, GetOptions, Txn, TxnOp, WatchOptions};
use futures::StreamExt;
use latchkey_testkit::auth_matrix::{code, connect_anonymous};
use latchkey_testkit::{cell_binary, Cluster, ProxyProcess};
use serde_json::{json, Value};
use tonic::Code;

/// `key` as a member of `cluster` holds it, or the code it refuses with
/// (`FailedPrecondition`: the cell does not own the key).
async fn value_in(cluster: &Cluster, key: &str) -> Result<Option<String>, Code> {
    let mut client = connect_anonymous(&format!("http://{}", cluster.members[0].client)).await;
    let resp = client
        .get(key, Some(GetOptions::new().with_serializable()))
        .await
        .map_err(|e| code(&e))?;
    Ok(resp
        .kvs()
        .first()
        .map(|kv| kv.value_str().expect("utf-8").to_string()))
}

/// `key` once a member of `cluster` has applied its put (serializable
/// reads of a follower may lag the leader's answer by a moment).
async fn eventually_in(cluster: &Cluster, key: &str) -> Option<String> {
    for _ in 0..50 {
        if let Ok(Some(v)) = value_in(cluster, key).await {
            return Some(v);
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    None
}

/// A directory change through proxy `p`: `PUT /v1/admin/directory{path}`
/// with `body`; the answer's status and body.
async fn change(p: &ProxyProcess, path: &str, body: Value) -> (u16, Value) {
    let resp = reqwest::Client::new()
        .put(format!("http://{}/v1/admin/directory{path}", p.http))
        .json(&body)
        .send()
        .await
        .expect("directory change");
    let status = resp.status().as_u16();
    (status, resp.json().await.expect("json"))
}

/// The revision of `cluster` (its leader's): every write raises it.
async fn revision_of(cluster: &Cluster) -> i64 {
    let endpoints: Vec<String> = member_addrs(cluster)
        .iter()
        .map(|a| format!("http://{a}"))
        .collect();
    let mut client = etcd_client::Client::connect(endpoints, None)
        .await
        .expect("connect");
    let resp = client
        .get("config/a", None)
        .await
        .expect("linearizable read");
    resp.header().expect("header").revision()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_go_to_the_cell_that_owns_their_prefix() {
    let home = Cluster::start(cell_binary(), 3, &[]).await;
    let mut other = Cluster::start(cell_binary(), 3, &[]).await;
    let p1 = ProxyProcess::start(proxy_bin(), &member_addrs(&home), &[]).await;
    // Reads the directory only when a cell refuses a request's keys.
    let p2 = ProxyProcess::start(
        proxy_bin(),
        &member_addrs(&home),
        &["--directory-interval", "1h"],
    )
    .await;
    let http = reqwest::Client::new();

    // p2 routes by the empty directory it read at its start.
    let mut c2 = connect_anonymous(&format!("http://{}", p2.grpc)).await;
    c2.put("config/a", "1", None).await.expect("put through p2");

    let (status, body) = change(&p1, "/cells/b", json!({"endpoints": member_addrs(&other)})).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["version"], 1, "{body}");
    assert_eq!(body["cells"][0]["name"], "b", "{body}");

    // The home cell again under another name, or a cell that does not
    // answer, is not added.
    let (status, body) = change(&p1, "/cells/c", json!({"endpoints": member_addrs(&home)})).await;
    assert_eq!(status, 400, "{body}");
    assert!(
        body["message"]
            .as_str()
            .is_some_and(|m| m.contains("are cell \"home\"")),
        "{body}"
    );
    let closed = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let nobody = closed.local_addr().expect("addr").to_string();
    drop(closed);
    let (status, body) = change(&p1, "/cells/c", json!({"endpoints": [nobody]})).await;
    assert_eq!(status, 412, "{body}");

    // A prefix holding keys in its owner is not assigned (no keys move).
    let mut c1 = connect_anonymous(&format!("http://{}", p1.grpc)).await;
    c1.put("jobs/0", "x", None).await.expect("put");
    let (status, body) = change(&p1, "/prefixes", json!({"prefix": "jobs/", "cell": "b"})).await;
    assert_eq!(status, 412, "{body}");
    assert!(
        body["message"]
            .as_str()
            .is_some_and(|m| m.contains("holds 1 keys in cell home")),
        "{body}"
    );
    c1.put("config/b", "2", None)
        .await
        .expect("home still owns it all");
    c1.delete("jobs/0", None).await.expect("delete");
    let (status, body) = change(&p1, "/prefixes", json!({"prefix": "jobs/", "cell": "b"})).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["version"], 2, "{body}");
    assert_eq!(body["prefixes"], json!([{"prefix": "jobs/", "cell": "b"}]));

    // Through p1, which made the change: each key in its cell only.
    c1.put("jobs/1", "in b", None).await.expect("put jobs/1");
    c1.put("config/c", "in home", None)
        .await
        .expect("put config/c");
    assert_eq!(
        eventually_in(&other, "jobs/1").await.as_deref(),
        Some("in b")
    );
    let not_owned = Err(Code::FailedPrecondition);
    assert_eq!(
        value_in(&home, "jobs/1").await,
        not_owned,
        "home refuses b's keys"
    );
    assert_eq!(
        eventually_in(&home, "config/c").await.as_deref(),
        Some("in home")
    );
    assert_eq!(value_in(&other, "config/c").await, not_owned);
    let got = http
        .get(format!("http://{}/v1/kv/jobs/1", p1.http))
        .send()
        .await
        .expect("http get");
    let body: Value = got.json().await.expect("json");
    assert_eq!(body["kvs"][0]["value"], "in b", "{body}");

    // p2 has not read the directory since: it sends jobs/2 to home, which
    // refuses it; p2 reads the directory and puts it in b.
    let home_revision = revision_of(&home).await;
    c2.put("jobs/2", "routed again", None)
        .await
        .expect("put through the proxy that had not seen the change");
    assert_eq!(
        eventually_in(&other, "jobs/2").await.as_deref(),
        Some("routed again")
    );
    assert_eq!(
        revision_of(&home).await,
        home_revision,
        "nothing was applied in home"
    );
    let body: Value = http
        .get(format!("http://{}/v1/admin/directory", p2.http))
        .send()
        .await
        .expect("show")
        .json()
        .await
        .expect("json");
    assert_eq!(body["version"], 2, "p2 routes by the new directory: {body}");
    for c in [&mut c1, &mut c2] {
        let got = c
            .get("jobs/", Some(GetOptions::new().with_prefix()))
            .await
            .expect("range of b's prefix");
        assert_eq!(got.kvs().len(), 2, "jobs/1 and jobs/2 from b");
        let got = c
            .get(
                "config/",
                Some(GetOptions::new().with_prefix().with_serializable()),
            )
            .await
            .expect("range of home's");
        assert_eq!(got.kvs().len(), 3, "config/a, b and c from home");
    }

    // A member of home refuses b's keys from any client.
    let mut direct = connect_anonymous(&format!("http://{}", home.members[0].client)).await;
    let e = direct
        .put("jobs/3", "x", None)
        .await
        .expect_err("not home's");
    assert_eq!(code(&e), Code::FailedPrecondition, "{e}");
    assert!(e.to_string().contains("not in this cell"), "{e}");

    // Requests over both cells are refused whole, naming the cells.
    let txn = Txn::new()
        .when([Compare::version("config/a", CompareOp::Greater, 0)])
        .and_then([TxnOp::put("jobs/4", "x", None)]);
    let e = c1.txn(txn).await.expect_err("a txn over two cells");
    assert_eq!(code(&e), Code::InvalidArgument, "{e}");
    assert!(e.to_string().contains("cells b, home"), "{e}");
    let e = c1
        .get("", Some(GetOptions::new().with_all_keys()))
        .await
        .expect_err("every key");
    assert_eq!(code(&e), Code::InvalidArgument, "{e}");
    let resp = http
        .get(format!("http://{}/v1/kv/j?prefix=true", p1.http))
        .send()
        .await
        .expect("http range");
    assert_eq!(resp.status().as_u16(), 400);
    let body: Value = resp.json().await.expect("json");
    assert_eq!(body["error"], "cross_cell", "{body}");
    assert_eq!(
        value_in(&other, "jobs/4").await,
        Ok(None),
        "nothing half-applied"
    );

    // A txn within b's prefix runs in b.
    let txn = Txn::new()
        .when([Compare::version("jobs/1", CompareOp::Greater, 0)])
        .and_then([TxnOp::put("jobs/5", "txn in b", None)]);
    let resp = c2.txn(txn).await.expect("a txn in b");
    assert!(resp.succeeded());
    assert_eq!(
        eventually_in(&other, "jobs/5").await.as_deref(),
        Some("txn in b")
    );

    // A watch joins the shared watches of the cell that owns its range;
    // one over both cells is refused.
    let next_put = |mut events: etcd_client::WatchStream| async move {
        let created = events.message().await.expect("created").expect("message");
        assert!(created.created() && !created.canceled(), "{created:?}");
        let resp = tokio::time::timeout(std::time::Duration::from_secs(10), events.message())
            .await
            .expect("an event within 10 s")
            .expect("stream")
            .expect("message");
        let kv = resp.events()[0].kv().expect("kv").clone();
        (
            kv.key_str().unwrap().to_string(),
            kv.value_str().unwrap().to_string(),
        )
    };
    let jobs = c1
        .watch("jobs/", Some(WatchOptions::new().with_prefix()))
        .await
        .expect("watch b's prefix");
    let config = c1
        .watch("config/", Some(WatchOptions::new().with_prefix()))
        .await
        .expect("watch home's");
    let sse = http
        .get(format!("http://{}/v1/watch/jobs/?prefix=true", p2.http))
        .send()
        .await
        .expect("SSE watch of b's prefix");
    assert_eq!(sse.status().as_u16(), 200);
    let writer = async {
        tokio::time::sleep(std::time::Duration::from_millis(300)).await;
        c2.put("jobs/7", "watched in b", None).await.expect("put");
        c2.put("config/d", "watched in home", None)
            .await
            .expect("put");
    };
    let (_, in_b, in_home) = tokio::join!(writer, next_put(jobs), next_put(config));
    assert_eq!(in_b, ("jobs/7".to_string(), "watched in b".to_string()));
    assert_eq!(
        in_home,
        ("config/d".to_string(), "watched in home".to_string())
    );
    let mut body = Box::pin(sse.bytes_stream());
    let mut text = String::new();
    while !text.contains("watched in b") {
        let chunk = tokio::time::timeout(std::time::Duration::from_secs(10), body.next())
            .await
            .expect("an SSE event within 10 s")
            .expect("open")
            .expect("chunk");
        text.push_str(&String::from_utf8_lossy(&chunk));
    }
    let mut both = c1
        .watch("", Some(WatchOptions::new().with_all_keys()))
        .await
        .expect("watch stream");
    let refused = both.message().await.expect("answer").expect("message");
    assert!(refused.canceled(), "{refused:?}");
    assert!(
        refused.cancel_reason().contains("cells b, home"),
        "{refused:?}"
    );

    // A change made through p2 reaches p1 with no request of p1's: it
    // reads the directory every 500 ms.
    let (status, body) = change(&p2, "/prefixes", json!({"prefix": "queue/", "cell": "b"})).await;
    assert_eq!(status, 200, "{body}");
    let version = body["version"].as_f64().expect("version");
    let mut seen = 0.0;
    for _ in 0..40 {
        seen = p1
            .metric("latchkey_proxy_directory_version")
            .await
            .unwrap_or(0.0);
        if seen == version {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert_eq!(seen, version, "p1 routes by the new directory within 2 s");
    assert_eq!(p1.metric("latchkey_proxy_directory_cells").await, Some(2.0));

    // Back to home: refused while b holds keys under it.
    let (status, body) = change(&p2, "/prefixes", json!({"prefix": "jobs/", "cell": "home"})).await;
    assert_eq!(status, 412, "{body}");
    assert!(
        body["message"]
            .as_str()
            .is_some_and(|m| m.contains("in cell b")),
        "{body}"
    );
    c2.put("jobs/6", "b still owns it", None)
        .await
        .expect("a refused change gives the keys back");

    // A move that fails (its target is down) is undone: home keeps the
    // prefix and every key of it.
    for id in other.running() {
        other.kill(id);
    }
    let resp = http
        .post(format!("http://{}/v1/admin/directory/moves", p1.http))
        .json(&json!({"prefix": "config/", "cell": "b"}))
        .send()
        .await
        .expect("move");
    assert_ne!(resp.status().as_u16(), 200, "the target is down");
    let got = c1
        .get("config/", Some(GetOptions::new().with_prefix()))
        .await
        .expect("home still serves config/");
    assert_eq!(got.kvs().len(), 4, "config/a, b, c and d kept");
    c1.put("config/e", "after", None)
        .await
        .expect("and takes writes");
}

/// The live keys of `key` through the proxy at `grpc`, with their leases.
async fn leases_of(client: &mut etcd_client::Client, key: &[u8]) -> Vec<i64> {
    let resp = client.get(key, None).await.expect("read through the proxy");
    resp.kvs().iter().map(|kv| kv.lease()).collect()
}

/// Keeps session `lease` alive through `client` every second until
/// aborted; a keep-alive that fails (a leader change) is sent again at the
/// next second, the session's TTL covering several.
fn keep_alive(mut client: etcd_client::Client, lease: i64) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let Ok((mut keeper, mut acks)) = client.lease_keep_alive(lease).await else {
            return;
        };
        while keeper.keep_alive().await.is_ok() {
            let _ = tokio::time::timeout(std::time::Duration::from_secs(1), acks.message()).await;
            tokio::time::sleep(std::time::Duration::from_secs(1)).await;
        }
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_session_holds_locks_in_two_cells_through_leader_kills() {
    let mut home = Cluster::start(cell_binary(), 3, &[]).await;
    let mut other = Cluster::start(cell_binary(), 3, &[]).await;
    let p = ProxyProcess::start(proxy_bin(), &member_addrs(&home), &[]).await;
    let q = ProxyProcess::start(proxy_bin(), &member_addrs(&home), &[]).await;
    let (status, body) = change(&p, "/cells/b", json!({"endpoints": member_addrs(&other)})).await;
    assert_eq!(status, 200, "{body}");
    let (status, body) = change(&p, "/prefixes", json!({"prefix": "jobs/", "cell": "b"})).await;
    assert_eq!(status, 200, "{body}");

    let mut client = connect_anonymous(&format!("http://{}", p.grpc)).await;
    // The session is granted and kept alive through q; its locks are taken
    // through p, which extends it to b: q learns that from home's records
    // and refreshes it in b too.
    let mut through_q = connect_anonymous(&format!("http://{}", q.grpc)).await;
    let lease = through_q.lease_grant(5, None).await.expect("grant").id();
    let keeping = keep_alive(through_q.clone(), lease);
    let with_lease = || Some(etcd_client::LockOptions::new().with_lease(lease));
    let in_b = client
        .lock("jobs/lock", with_lease())
        .await
        .expect("lock in b");
    let in_home = client
        .lock("config/lock", with_lease())
        .await
        .expect("lock in home");
    let (in_b, in_home) = (in_b.key().to_vec(), in_home.key().to_vec());
    assert_eq!(leases_of(&mut client, &in_b).await, vec![lease]);
    assert_eq!(leases_of(&mut client, &in_home).await, vec![lease]);
    let b_key = String::from_utf8(in_b.clone()).expect("utf-8");
    assert_eq!(
        eventually_in(&other, &b_key).await.as_deref(),
        Some(""),
        "the lock's key is in b"
    );

    // Each cell's leader dies in turn; the session outlives both by more
    // than its TTL.
    for cluster in [&mut other, &mut home] {
        let leader = cluster
            .wait_leader(std::time::Duration::from_secs(10))
            .await;
        cluster.kill(leader);
        cluster
            .wait_leader(std::time::Duration::from_secs(10))
            .await;
        tokio::time::sleep(std::time::Duration::from_secs(6)).await;
        assert_eq!(
            leases_of(&mut client, &in_b).await,
            vec![lease],
            "b's lock held"
        );
        assert_eq!(
            leases_of(&mut client, &in_home).await,
            vec![lease],
            "home's lock held"
        );
    }

    // A revoke through p (which does not keep the session) releases both:
    // another session takes each lock.
    keeping.abort();
    client.lease_revoke(lease).await.expect("revoke");
    let _ = &mut through_q;
    assert!(
        leases_of(&mut client, &in_b).await.is_empty(),
        "released in b"
    );
    assert!(leases_of(&mut client, &in_home).await.is_empty());
    let next = client.lease_grant(5, None).await.expect("grant").id();
    let opts = Some(etcd_client::LockOptions::new().with_lease(next));
    let taken = tokio::time::timeout(std::time::Duration::from_secs(5), async {
        client
            .lock("jobs/lock", opts.clone())
            .await
            .expect("lock b's again");
        client
            .lock("config/lock", opts)
            .await
            .expect("lock home's again");
    })
    .await;
    assert!(taken.is_ok(), "both locks free within 5 s of the revoke");
}

/// One writer's puts through one proxy, each of a new key under `prefix`
/// (`prefix/000001`, ...), for as long as `run` says: how many were
/// acknowledged (keys 1 to that), and when each acknowledgement came with
/// how long it took.
async fn write_until(
    mut client: etcd_client::Client,
    prefix: String,
    run: std::sync::Arc<std::sync::atomic::AtomicBool>,
) -> (u64, Vec<(std::time::Instant, std::time::Duration)>) {
    let (mut n, mut acked) = (0u64, Vec::new());
    while run.load(std::sync::atomic::Ordering::Relaxed) {
        let sent = std::time::Instant::now();
        let key = format!("{prefix}/{:06}", n + 1);
        // A write that fails is sent again, same key and value, until one
        // is acknowledged.
        if client.put(key, "v", None).await.is_ok() {
            n += 1;
            acked.push((std::time::Instant::now(), sent.elapsed()));
        }
    }
    (n, acked)
}

/// [`write_until`] over HTTP with `?if_absent=true` (a txn in the proxy):
/// how many keys were written (a 412 is a write whose earlier answer was
/// lost, already there), and every other status answered.
async fn http_write_until(
    http: String,
    prefix: String,
    run: std::sync::Arc<std::sync::atomic::AtomicBool>,
) -> (u64, Vec<u16>) {
    let client = reqwest::Client::new();
    let (mut n, mut other) = (0u64, Vec::new());
    while run.load(std::sync::atomic::Ordering::Relaxed) {
        let url = format!("http://{http}/v1/kv/{prefix}/{:06}?if_absent=true", n + 1);
        match client.put(url).body("v").send().await.map(|r| r.status()) {
            Ok(s) if s == 200 || s == 412 => n += 1,
            Ok(s) => other.push(s.as_u16()),
            Err(_) => {}
        }
    }
    (n, other)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prefix_moves_under_load_losing_nothing() {
    let home = Cluster::start(cell_binary(), 3, &[]).await;
    let other = Cluster::start(cell_binary(), 3, &[]).await;
    let p1 = ProxyProcess::start(proxy_bin(), &member_addrs(&home), &[]).await;
    let p2 = ProxyProcess::start(proxy_bin(), &member_addrs(&home), &[]).await;
    let (status, body) = change(&p1, "/cells/b", json!({"endpoints": member_addrs(&other)})).await;
    assert_eq!(status, 200, "{body}");
    let c1 = connect_anonymous(&format!("http://{}", p1.grpc)).await;
    let c2 = connect_anonymous(&format!("http://{}", p2.grpc)).await;

    // Before: keys, a session's key and lock, a waiter behind it, all in home.
    let mut setup = c1.clone();
    for i in 0..200 {
        setup
            .put(format!("jobs/seed/{i:03}"), "s", None)
            .await
            .expect("seed");
    }
    let session = setup.lease_grant(10, None).await.expect("grant").id();
    let (mut keeper, mut acks) = setup.lease_keep_alive(session).await.expect("keep-alive");
    let keeping = tokio::spawn(async move {
        while keeper.keep_alive().await.is_ok() {
            let _ = acks.message().await;
            tokio::time::sleep(std::time::Duration::from_secs(1)).await;
        }
    });
    let mut bound = etcd_client::PutOptions::new().with_lease(session);
    setup
        .put("jobs/ephemeral", "bound", Some(bound.clone()))
        .await
        .expect("a session's key");
    bound = bound.with_prev_key();
    let _ = bound;
    let holder = setup
        .lock(
            "jobs/lk",
            Some(etcd_client::LockOptions::new().with_lease(session)),
        )
        .await
        .expect("lock");
    let holder_key = holder.key().to_vec();
    let holder_token = setup
        .get(holder_key.clone(), None)
        .await
        .expect("holder key")
        .kvs()[0]
        .create_revision();
    let waiter_session = setup.lease_grant(30, None).await.expect("grant").id();
    let mut waiter_client = c2.clone();
    let waiter = tokio::spawn(async move {
        // A wait cut by the move (its watch was on home) is taken up again.
        loop {
            let opts = etcd_client::LockOptions::new().with_lease(waiter_session);
            match waiter_client.lock("jobs/lk", Some(opts)).await {
                Ok(resp) => return resp.key().to_vec(),
                Err(_) => tokio::time::sleep(std::time::Duration::from_millis(50)).await,
            }
        }
    });

    // Load on the moving prefix through both proxies, and on another.
    let run = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
    let mut writers = Vec::new();
    for (i, client) in [c1.clone(), c2.clone(), c1.clone(), c2.clone()]
        .into_iter()
        .enumerate()
    {
        writers.push(tokio::spawn(write_until(
            client,
            format!("jobs/w/{i}"),
            run.clone(),
        )));
    }
    let elsewhere = tokio::spawn(write_until(c1.clone(), "config/w".into(), run.clone()));
    // Conditional puts over HTTP (a txn in the proxy) on the prefix too.
    let conditional = tokio::spawn(http_write_until(
        p1.http.clone(),
        "jobs/h".into(),
        run.clone(),
    ));
    tokio::time::sleep(std::time::Duration::from_millis(800)).await;

    let started = std::time::Instant::now();
    let resp = reqwest::Client::new()
        .post(format!("http://{}/v1/admin/directory/moves", p2.http))
        .json(&json!({"prefix": "jobs/", "cell": "b"}))
        .send()
        .await
        .expect("move");
    let status = resp.status().as_u16();
    let moved: Value = resp.json().await.expect("json");
    let ended = std::time::Instant::now();
    assert_eq!(status, 200, "{moved}");
    assert_eq!(moved["from"], "home", "{moved}");
    assert_eq!(
        moved["directory"]["prefixes"],
        json!([{"prefix": "jobs/", "cell": "b"}])
    );
    assert!(moved["copied"].as_u64().unwrap() >= 203, "{moved}");
    let pause_ms = moved["pause_ms"].as_u64().expect("pause");
    tokio::time::sleep(std::time::Duration::from_millis(800)).await;
    run.store(false, std::sync::atomic::Ordering::Relaxed);

    // Nothing acknowledged is lost: every key a writer was told it wrote
    // is there, through either proxy, in b.
    let mut slowest = std::time::Duration::ZERO;
    let mut reader = c1.clone();
    let mut written = 0;
    for (i, writer) in writers.into_iter().enumerate() {
        let (last, acked) = writer.await.expect("writer");
        assert!(last > 0, "writer {i} wrote");
        let prefix = format!("jobs/w/{i}/");
        let got = reader
            .get(
                prefix.as_str(),
                Some(GetOptions::new().with_prefix().with_keys_only()),
            )
            .await
            .expect("read");
        let keys: std::collections::BTreeSet<String> = got
            .kvs()
            .iter()
            .map(|kv| kv.key_str().unwrap().to_string())
            .collect();
        let lost: Vec<String> = (1..=last)
            .map(|n| format!("{prefix}{n:06}"))
            .filter(|k| !keys.contains(k))
            .collect();
        assert!(lost.is_empty(), "acknowledged and lost: {lost:?}");
        written += last;
        slowest = slowest.max(
            acked
                .iter()
                .map(|(_, took)| *took)
                .max()
                .unwrap_or_default(),
        );
    }
    let first_of_0 = "jobs/w/0/000001";
    assert_eq!(
        eventually_in(&other, first_of_0).await.as_deref(),
        Some("v"),
        "in b"
    );
    assert_eq!(
        value_in(&home, first_of_0).await,
        Err(Code::FailedPrecondition),
        "home gave the prefix away"
    );
    let seeds = reader
        .get(
            "jobs/seed/",
            Some(GetOptions::new().with_prefix().with_count_only()),
        )
        .await
        .expect("count");
    assert_eq!(seeds.count(), 200);

    // HTTP's conditional puts waited out the pause as the others did:
    // none was refused as another cell's, none acknowledged was lost.
    let (last, refused) = conditional.await.expect("http writer");
    assert!(last > 0, "the HTTP writer wrote");
    assert!(
        refused.is_empty(),
        "HTTP conditional puts answered other than 200 or 412: {refused:?}"
    );
    let got = reader
        .get(
            "jobs/h/",
            Some(GetOptions::new().with_prefix().with_count_only()),
        )
        .await
        .expect("count");
    assert!(got.count() as u64 >= last, "{} of {last}", got.count());

    // The other prefix went on while this one paused.
    let (_, config_acks) = elsewhere.await.expect("writer");
    let during = config_acks
        .iter()
        .filter(|(at, _)| *at > started && *at < ended)
        .count();
    assert!(
        during > 0,
        "writes elsewhere were acknowledged during the move"
    );

    // The session lives, its key and its lock too, in b; its unlock hands
    // the lock to the waiter with a higher token.
    let ttl = reader
        .lease_time_to_live(session, None)
        .await
        .expect("ttl")
        .ttl();
    assert!(ttl > 0, "the session outlived the move");
    let eph = reader.get("jobs/ephemeral", None).await.expect("read");
    assert_eq!(eph.kvs()[0].lease(), session);
    let held = reader.get(holder_key.clone(), None).await.expect("holder");
    assert_eq!(held.kvs()[0].lease(), session, "the holder still holds");
    assert_eq!(
        held.kvs()[0].create_revision(),
        holder_token,
        "its token kept"
    );
    assert!(!waiter.is_finished(), "the waiter still waits");
    // A read or a watch of the prefix at a revision of home's (from before
    // the move) is refused as compacted: it would miss b's changes.
    let e = reader
        .get(
            "jobs/",
            Some(GetOptions::new().with_prefix().with_revision(holder_token)),
        )
        .await
        .expect_err("a read at home's revision");
    assert_eq!(code(&e), Code::OutOfRange, "{e}");
    let mut old = reader
        .watch(
            "jobs/",
            Some(
                WatchOptions::new()
                    .with_prefix()
                    .with_start_revision(holder_token),
            ),
        )
        .await
        .expect("watch stream");
    let mut compacted = 0;
    while let Ok(Some(resp)) = old.message().await {
        if resp.canceled() {
            compacted = resp.compact_revision();
            break;
        }
    }
    assert!(
        compacted > holder_token,
        "cancelled as compacted: {compacted}"
    );
    reader.unlock(holder_key).await.expect("unlock");
    let next_key = tokio::time::timeout(std::time::Duration::from_secs(10), waiter)
        .await
        .expect("the waiter gets the lock")
        .expect("waiter");
    let next_token = reader.get(next_key, None).await.expect("next").kvs()[0].create_revision();
    assert!(
        next_token > holder_token,
        "fencing tokens rise across the move: {holder_token} then {next_token}"
    );
    keeping.abort();
    println!(
        "moved jobs/ under load: pause {pause_ms} ms; {written} acknowledged writes of the \
         prefix, none lost, the slowest {} ms; {during} writes elsewhere during the move",
        slowest.as_millis()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_directory_command_line_shows_and_changes_the_directory() {
    let home = Cluster::start(cell_binary(), 1, &[]).await;
    let other = Cluster::start(cell_binary(), 1, &[]).await;
    let p = ProxyProcess::start(proxy_bin(), &member_addrs(&home), &[]).await;
    let cli = |args: &[&str]| {
        let out = std::process::Command::new(proxy_bin())
            .arg("directory")
            .args(args)
            .args(["--proxy", p.http.as_str()])
            .output()
            .expect("run latchkey-proxy directory");
        let answer: Value = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        (out.status.code(), answer, stderr)
    };

    let endpoints = member_addrs(&other).join(",");
    let (code, answer, err) = cli(&["add-cell", "b", &endpoints]);
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(answer["cells"][0]["name"], "b", "{answer}");
    let (code, answer, err) = cli(&["assign", "jobs/", "b"]);
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(
        answer["prefixes"],
        json!([{"prefix": "jobs/", "cell": "b"}])
    );

    // A prefix with a key moves with it; and a lock-delay owed under it.
    let mut client = connect_anonymous(&format!("http://{}", p.grpc)).await;
    client.put("mv/1", "here", None).await.expect("put");
    let http = reqwest::Client::new();
    let api = format!("http://{}/v1", p.http);
    let session = || async {
        let resp = http
            .post(format!("{api}/sessions"))
            .json(&json!({"ttl": 30}))
            .send()
            .await
            .expect("session");
        let body: Value = resp.json().await.expect("json");
        body["id"].as_str().expect("id").to_string()
    };
    let (holder, newcomer) = (session().await, session().await);
    let delay = std::time::Duration::from_millis(3000);
    let acquire = |s: String| {
        let req = http
            .post(format!("{api}/locks/mv%2Flk/acquire"))
            .json(&json!({"session_id": s, "lock_delay_ms": delay.as_millis() as u64, "timeout_ms": 20000}));
        async move { req.send().await.expect("acquire").status().as_u16() }
    };
    assert_eq!(acquire(holder.clone()).await, 200);
    // The holder's session ends without a release: the delay is owed.
    let ended = http
        .delete(format!("{api}/sessions/{holder}"))
        .send()
        .await
        .expect("revoke");
    assert_eq!(ended.status().as_u16(), 200);
    let expired = std::time::Instant::now();
    let (code, answer, err) = cli(&["move", "mv/", "b"]);
    assert_eq!(code, Some(0), "{err}");
    // In b, the lock is not granted before the delay has passed.
    assert_eq!(acquire(newcomer).await, 200);
    let waited = expired.elapsed();
    assert!(
        waited >= delay,
        "granted in b {waited:?} after the holder's expiry, inside its {delay:?} lock-delay"
    );
    assert_eq!(answer["from"], "home", "{answer}");
    assert!(answer["pause_ms"].as_u64().is_some(), "{answer}");
    assert_eq!(value_in(&other, "mv/1").await, Ok(Some("here".into())));
    let got = client
        .get("mv/1", None)
        .await
        .expect("read through the proxy");
    assert_eq!(got.kvs()[0].value_str().expect("utf-8"), "here");

    let (code, answer, err) = cli(&["show"]);
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(answer["version"], 3, "{answer}");
    assert_eq!(
        answer["prefixes"],
        json!([{"prefix": "jobs/", "cell": "b"}, {"prefix": "mv/", "cell": "b"}])
    );

    // Refused by the proxy: exit 1 with its reason, nothing changed.
    let (code, _, err) = cli(&["move", "mv/", "nowhere"]);
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("nowhere"), "{err}");
    assert_eq!(cli(&["show"]).1["version"], 3);
    // No proxy there, or a wrong command line: exit 2.
    let closed = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let nobody = closed.local_addr().expect("addr").to_string();
    drop(closed);
    let out = std::process::Command::new(proxy_bin())
        .args(["directory", "show", "--proxy", nobody.as_str()])
        .output()
        .expect("run");
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("no answer from the proxy"));
    assert_eq!(cli(&["add-cell", "c"]).0, Some(2), "no endpoints");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_cells_with_authentication_on_route_act_as_the_client_and_move() {
    use latchkey_testkit::auth_matrix::{self, NOBODY, PROXY, READER, ROOT, WORKER};
    // Each cell has the same users and roles and authentication on (set
    // up in each: one set for every cell is not built); b's keys the
    // matrix writes are removed, so b starts empty.
    let home = Cluster::start(cell_binary(), 1, &[]).await;
    let other = Cluster::start(cell_binary(), 1, &[]).await;
    for cell in [&home, &other] {
        auth_matrix::configure(&format!("http://{}", cell.members[0].client)).await;
    }
    let mut root_b =
        auth_matrix::connect_as(&format!("http://{}", other.members[0].client), ROOT).await;
    for prefix in ["jobs/", "config/"] {
        root_b
            .delete(
                prefix,
                Some(etcd_client::DeleteOptions::new().with_prefix()),
            )
            .await
            .expect("empty b");
    }
    let dir = tempfile::tempdir().expect("temp dir");
    let password = dir.path().join("cell-password");
    std::fs::write(&password, format!("{}\n", PROXY.1)).expect("password file");
    let p = ProxyProcess::start(
        proxy_bin(),
        &member_addrs(&home),
        &[
            "--cell-user",
            PROXY.0,
            "--cell-password-file",
            password.to_str().expect("utf-8"),
        ],
    )
    .await;
    let grpc = format!("http://{}", p.grpc);
    auth_matrix::wait_until_proxy_enforces(&grpc).await;

    // The directory is root's: another user's token is refused, with the
    // command line too.
    let http = reqwest::Client::new();
    let token = |who: (&'static str, &'static str)| {
        let http = http.clone();
        let url = format!("http://{}/v1/auth/token", p.http);
        async move {
            let resp = http
                .post(url)
                .json(&json!({"name": who.0, "password": who.1}))
                .send()
                .await
                .expect("token");
            let body: Value = resp.json().await.expect("json");
            body["token"].as_str().expect("token").to_string()
        }
    };
    let (root, worker) = (token(ROOT).await, token(WORKER).await);
    let admin = |path: &str, body: Value, bearer: &str| {
        let req = http
            .request(
                if path.ends_with("moves") {
                    reqwest::Method::POST
                } else {
                    reqwest::Method::PUT
                },
                format!("http://{}/v1/admin/directory{path}", p.http),
            )
            .bearer_auth(bearer)
            .json(&body);
        async move {
            let resp = req.send().await.expect("directory change");
            let status = resp.status().as_u16();
            (status, resp.json::<Value>().await.unwrap_or(Value::Null))
        }
    };
    let endpoints = json!({"endpoints": member_addrs(&other)});
    let (status, body) = admin("/cells/b", endpoints.clone(), &worker).await;
    assert_eq!(status, 403, "{body}");
    let (status, body) = admin("/cells/b", endpoints, &root).await;
    assert_eq!(status, 200, "{body}");
    let cli = |bearer: Option<&str>| {
        let mut cmd = std::process::Command::new(proxy_bin());
        cmd.args(["directory", "show", "--proxy", p.http.as_str()]);
        if let Some(t) = bearer {
            cmd.args(["--token", t]);
        }
        cmd.output().expect("run").status.code()
    };
    assert_eq!(cli(Some(&root)), Some(0));
    assert_eq!(cli(None), Some(1), "no token: refused");

    // jobs/ moves to b with its key (written by root in home).
    let (status, body) = admin("/moves", json!({"prefix": "jobs/", "cell": "b"}), &root).await;
    assert_eq!(status, 200, "{body}");

    // In b, each request runs as its client: the worker reads and writes
    // jobs/ and takes a lock there on a session; the reader may not write
    // it; nobody may not read it.
    let mut w = auth_matrix::connect_as(&grpc, WORKER).await;
    let moved = w
        .get("jobs/a", None)
        .await
        .expect("worker reads jobs/ in b");
    assert_eq!(moved.kvs()[0].value_str().expect("utf-8"), "root-job");
    w.put("jobs/b", "by the worker", None)
        .await
        .expect("worker writes jobs/ in b");
    assert_eq!(
        eventually_in(&other, "jobs/b").await,
        None,
        "anonymous reads of b are refused with authentication on"
    );
    let in_b = root_b.get("jobs/b", None).await.expect("root reads b");
    assert_eq!(in_b.kvs()[0].value_str().expect("utf-8"), "by the worker");
    let lease = w.lease_grant(30, None).await.expect("grant").id();
    let opts = etcd_client::LockOptions::new().with_lease(lease);
    let held = w.lock("jobs/lock", Some(opts)).await.expect("lock in b");
    assert!(held.key().starts_with(b"jobs/lock/"));
    let mut r = auth_matrix::connect_as(&grpc, READER).await;
    let refused = r.put("jobs/c", "no", None).await.expect_err("reader");
    assert_eq!(code(&refused), Code::PermissionDenied, "{refused}");
    let mut n = auth_matrix::connect_as(&grpc, NOBODY).await;
    let refused = n.get("jobs/a", None).await.expect_err("nobody");
    assert_eq!(code(&refused), Code::PermissionDenied, "{refused}");
    // A watch of b's prefix is allowed as the client: the worker's sees
    // its own write; nobody's is refused.
    let mut watching = w
        .watch("jobs/", Some(WatchOptions::new().with_prefix()))
        .await
        .expect("worker watches jobs/ in b");
    let created = watching.message().await.expect("watch").expect("created");
    assert!(!created.canceled(), "{created:?}");
    w.put("jobs/watched", "seen", None).await.expect("put");
    let seen = tokio::time::timeout(std::time::Duration::from_secs(10), watching.message())
        .await
        .expect("an event within 10 s")
        .expect("watch")
        .expect("event");
    assert_eq!(seen.events()[0].kv().expect("kv").key(), b"jobs/watched");
    let mut refused = n
        .watch("jobs/", Some(WatchOptions::new().with_prefix()))
        .await
        .expect("watch stream");
    let first = refused.message().await.expect("watch").expect("answer");
    assert!(
        first.canceled(),
        "nobody's watch of jobs/ is refused: {first:?}"
    );
    // Home's keys are still home's, under the same rules.
    let mut reader_home = r.clone();
    let config = reader_home
        .get("config/a", None)
        .await
        .expect("reader reads config/ in home");
    assert_eq!(config.kvs()[0].value_str().expect("utf-8"), "root-config");
    w.unlock(held.key()).await.expect("unlock");
    // The worker may revoke its own session, which spans both cells
    // (latchkey's record of that in home is not a key it must be allowed
    // to write); it ends in b too.
    w.lease_revoke(lease).await.expect("revoke");
    let mut gone = false;
    for _ in 0..50 {
        let ttl = root_b.lease_time_to_live(lease, None).await.expect("ttl");
        if ttl.ttl() < 0 {
            gone = true;
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert!(gone, "the session ended in b within 5 s of its revoke");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_on_a_member_ends_at_the_revision_its_cell_stops_owning_the_range() {
    // A watch straight to a member of home, then jobs/ to b and straight
    // back (well within the cell's one-second recheck), then a write under
    // jobs/ in home: the watch ended when home stopped owning jobs/, in
    // order with the changes, and saw nothing of the later write.
    let home = Cluster::start(cell_binary(), 1, &[]).await;
    let other = Cluster::start(cell_binary(), 1, &[]).await;
    let p = ProxyProcess::start(proxy_bin(), &member_addrs(&home), &[]).await;
    let (status, body) = change(&p, "/cells/b", json!({"endpoints": member_addrs(&other)})).await;
    assert_eq!(status, 200, "{body}");
    let mut direct = connect_anonymous(&format!("http://{}", home.members[0].client)).await;
    let mut stream = direct
        .watch("jobs/", Some(WatchOptions::new().with_prefix()))
        .await
        .expect("watch");
    let created = stream.message().await.expect("watch").expect("created");
    assert!(created.created() && !created.canceled(), "{created:?}");
    for cell in ["b", "home"] {
        let (status, body) =
            change(&p, "/prefixes", json!({"prefix": "jobs/", "cell": cell})).await;
        assert_eq!(status, 200, "{body}");
    }
    let mut client = connect_anonymous(&format!("http://{}", p.grpc)).await;
    client
        .put("jobs/after", "x", None)
        .await
        .expect("put in home");
    let answer = tokio::time::timeout(std::time::Duration::from_secs(5), stream.message())
        .await
        .expect("an answer within 5 s")
        .expect("watch")
        .expect("answer");
    assert!(answer.events().is_empty(), "{answer:?}");
    assert!(answer.canceled(), "{answer:?}");
    assert!(
        latchkey_shared::directory::moved_away(answer.cancel_reason()),
        "{}",
        answer.cancel_reason()
    );
}
