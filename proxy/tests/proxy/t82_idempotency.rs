//! Retry-safe writes (issue 13): an `Idempotency-Key` makes a retried
//! acquire, release, put or txn answer what the first attempt did, with
//! nothing done twice, even when the first answer was lost with its
//! connection or its proxy; a different request under the same key is
//! refused; the records are hidden from listings and expire after the
//! retention.

use crate::{member_addrs, proxy_bin};
use etcd_client::{Client, GetOptions};
use latchkey_testkit::{cell_binary, eventually, Cluster, ProxyProcess};
use serde_json::{json, Value};
use std::time::Duration;
use tokio::io::AsyncWriteExt;

/// The proxy's HTTP API with an optional idempotency key per request.
#[derive(Clone)]
struct Api {
    http: reqwest::Client,
    addr: String,
}

impl Api {
    fn of(proxy: &ProxyProcess) -> Api {
        Api {
            http: reqwest::Client::new(),
            addr: proxy.http.clone(),
        }
    }

    /// Sends `method /v1{path}` with `body` (JSON when it is an object,
    /// raw otherwise) under `key`: the status and the JSON answer.
    async fn send(
        &self,
        method: reqwest::Method,
        path: &str,
        key: Option<&str>,
        body: Value,
    ) -> (u16, Value) {
        let mut req = self
            .http
            .request(method, format!("http://{}/v1{path}", self.addr));
        req = match body {
            Value::String(raw) => req.body(raw),
            json => req.json(&json),
        };
        if let Some(key) = key {
            req = req.header("Idempotency-Key", key);
        }
        let resp = req.send().await.expect("send");
        let status = resp.status().as_u16();
        (status, resp.json().await.expect("a JSON body"))
    }

    async fn post(&self, path: &str, key: Option<&str>, body: Value) -> (u16, Value) {
        self.send(reqwest::Method::POST, path, key, body).await
    }

    async fn get(&self, path: &str) -> Value {
        self.send(reqwest::Method::GET, path, None, Value::Null)
            .await
            .1
    }

    async fn session(&self) -> String {
        let (status, body) = self.post("/sessions", None, json!({"ttl": 60})).await;
        assert_eq!(status, 200, "{body}");
        body["id"].as_str().expect("id").to_string()
    }

    /// The sessions waiting for `lock` and their tokens, in line order.
    async fn waiters(&self, lock: &str) -> Vec<(String, i64)> {
        let state = self.get(&format!("/locks/{lock}")).await;
        state["waiters"]
            .as_array()
            .expect("waiters")
            .iter()
            .map(|w| {
                (
                    w["session_id"].as_str().expect("session").to_string(),
                    w["fencing_token"].as_i64().expect("token"),
                )
            })
            .collect()
    }

    /// Sends an acquire under `key` on a raw connection and returns the
    /// connection unread: the test then loses the answer.
    async fn acquire_unanswered(
        &self,
        lock: &str,
        key: &str,
        body: &Value,
    ) -> tokio::net::TcpStream {
        let body = body.to_string();
        let mut conn = tokio::net::TcpStream::connect(&self.addr)
            .await
            .expect("connect");
        let request = format!(
            "POST /v1/locks/{lock}/acquire HTTP/1.1\r\nHost: {}\r\n\
             Content-Type: application/json\r\nIdempotency-Key: {key}\r\n\
             Content-Length: {}\r\n\r\n{body}",
            self.addr,
            body.len()
        );
        conn.write_all(request.as_bytes()).await.expect("send");
        conn
    }

    /// Waits until `lock` has `n` waiters.
    async fn wait_for_waiters(&self, lock: &str, n: usize) -> Vec<(String, i64)> {
        eventually(Duration::from_secs(10), async || {
            let waiters = self.waiters(lock).await;
            if waiters.len() == n {
                Ok(waiters)
            } else {
                Err(format!("{} waiters, not {n}", waiters.len()))
            }
        })
        .await
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acquire_whose_answer_was_lost_is_retried_under_its_key_for_the_same_token_and_one_entry(
) {
    let cluster = Cluster::start(cell_binary(), 1, &[]).await;
    let cells = member_addrs(&cluster);
    let proxy_a = ProxyProcess::start(proxy_bin(), &cells, &[]).await;
    let mut proxy_b = ProxyProcess::start(proxy_bin(), &cells, &[]).await;
    let (a, b) = (Api::of(&proxy_a), Api::of(&proxy_b));
    let (holder, w, x) = (a.session().await, a.session().await, a.session().await);
    let (status, held) = a
        .post("/locks/jobs/acquire", None, json!({"session_id": holder}))
        .await;
    assert_eq!(status, 200, "{held}");

    // W's acquire reaches proxy B; the connection drops before the answer.
    let w_body = json!({"session_id": w, "timeout_ms": 30000});
    let conn = b.acquire_unanswered("jobs", "w-acquire", &w_body).await;
    let queued = b.wait_for_waiters("jobs", 1).await;
    drop(conn);
    // X's acquire reaches proxy B too; then proxy B is killed.
    let x_body = json!({"session_id": x, "timeout_ms": 30000});
    let _conn = b.acquire_unanswered("jobs", "x-acquire", &x_body).await;
    let queued_both = b.wait_for_waiters("jobs", 2).await;
    proxy_b.kill();
    assert_eq!(queued_both[0], queued[0]);
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        a.waiters("jobs").await,
        queued_both,
        "both places stay for the retries"
    );

    // Both retry through proxy A under their keys and wait as before.
    let retry = |key: &'static str, body: Value| {
        let a = a.clone();
        tokio::spawn(async move { a.post("/locks/jobs/acquire", Some(key), body).await })
    };
    let w_retry = retry("w-acquire", w_body.clone());
    let x_retry = retry("x-acquire", x_body.clone());
    // A different request under W's key is refused at once.
    let (status, refused) = a
        .post(
            "/locks/jobs/acquire",
            Some("w-acquire"),
            json!({"session_id": w, "timeout_ms": 20000}),
        )
        .await;
    assert_eq!(status, 412, "{refused}");
    assert_eq!(refused["error"], "precondition_failed", "{refused}");
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(a.waiters("jobs").await, queued_both, "no second entry");

    // The holder releases: W is granted the token its lost answer had.
    let (status, _) = a
        .post("/locks/jobs/release", None, json!({"session_id": holder}))
        .await;
    assert_eq!(status, 200);
    let (status, granted) = w_retry.await.expect("w");
    assert_eq!(status, 200, "{granted}");
    assert_eq!(granted["fencing_token"], queued_both[0].1);
    assert_eq!(queued_both[0].0, w);

    // W releases under a key; the retry of that release answers the same.
    let release = |key| a.post("/locks/jobs/release", Some(key), json!({"session_id": w}));
    let (status, first) = release("w-release").await;
    assert_eq!((status, &first["released"]), (200, &json!(true)), "{first}");
    assert_eq!(release("w-release").await, (200, first));
    let (status, granted) = x_retry.await.expect("x");
    assert_eq!(status, 200, "{granted}");
    assert_eq!(granted["fencing_token"], queued_both[1].1);

    // W's acquire retried after W released: nothing queues again.
    let (status, gone) = a
        .post("/locks/jobs/acquire", Some("w-acquire"), w_body)
        .await;
    assert_eq!(status, 412, "{gone}");
    assert!(a.waiters("jobs").await.is_empty());
    let state = a.get("/locks/jobs").await;
    assert_eq!(state["holder"]["session_id"], json!(x), "{state}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn puts_and_txns_replay_under_their_keys_the_records_are_hidden_and_expire() {
    let cluster = Cluster::start(cell_binary(), 1, &[]).await;
    let cells = member_addrs(&cluster);
    let proxy = ProxyProcess::start(proxy_bin(), &cells, &["--idempotency-retention", "3s"]).await;
    let api = Api::of(&proxy);
    let put = |key: Option<&'static str>, value: &str| {
        api.send(
            reqwest::Method::PUT,
            "/kv/config",
            key,
            Value::String(value.into()),
        )
    };

    // A put retried under its key writes once.
    let (status, first) = put(Some("put-1"), "v1").await;
    assert_eq!(status, 200, "{first}");
    assert_eq!(put(Some("put-1"), "v1").await, (200, first.clone()));
    let read = api.get("/kv/config").await;
    assert_eq!(read["kvs"][0]["mod_revision"], first["revision"], "{read}");
    assert_eq!(read["kvs"][0]["version"], 1, "written once: {read}");

    // The records are not in a listing of every key, but are under their
    // own prefix.
    let mut etcd = Client::connect([proxy.grpc.as_str()], None)
        .await
        .expect("connect");
    let every = etcd
        .get("", Some(GetOptions::new().with_prefix()))
        .await
        .expect("get every key");
    let keys: Vec<&[u8]> = every.kvs().iter().map(|kv| kv.key()).collect();
    assert_eq!(keys, [b"config".as_slice()]);
    let records = etcd
        .get(
            "\0latchkey/idempotency/",
            Some(GetOptions::new().with_prefix()),
        )
        .await
        .expect("get the records");
    assert_eq!(records.count(), 1);

    // A different put under the same key is refused and writes nothing.
    let (status, refused) = put(Some("put-1"), "v2").await;
    assert_eq!(status, 412, "{refused}");

    // A txn retried under its key answers the first answer, though running
    // it again would now take the other branch.
    let txn = json!({
        "compare": [{"key": "config", "target": "value", "result": "equal", "value": "v1"}],
        "success": [{"put": {"key": "config", "value": "v3"}}, {"get": {"key": "config"}}],
        "failure": [{"get": {"key": "config"}}]
    });
    let (status, ran) = api.post("/txn", Some("txn-1"), txn.clone()).await;
    assert_eq!(status, 200, "{ran}");
    assert_eq!(ran["succeeded"], true, "{ran}");
    assert_eq!(
        api.post("/txn", Some("txn-1"), txn.clone()).await,
        (200, ran.clone())
    );
    let read = api.get("/kv/config").await;
    assert_eq!(read["kvs"][0]["version"], 2, "the txn wrote once: {read}");

    // After the retention the key is free again.
    let rewritten = eventually(Duration::from_secs(15), async || {
        match put(Some("put-1"), "v2").await {
            (200, answer) => Ok(answer),
            (status, answer) => Err(format!("{status}: {answer}")),
        }
    })
    .await;
    assert!(rewritten["revision"].as_i64() > ran["revision"].as_i64());
}

/// etcd's Lock and Unlock with latchkey's `idempotency_key` field, through
/// a proxy and on a cell follower: a retry answers the first answer, a
/// different request under the key fails, a retry after the unlock does
/// not lock again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_lock_and_unlock_under_an_idempotency_key_through_a_proxy_and_on_a_follower() {
    use latchkey_shared::v3lockpb::lock_client::LockClient;
    use latchkey_shared::v3lockpb::{LockRequest, UnlockRequest};
    let cluster = Cluster::start(cell_binary(), 3, &[]).await;
    let proxy = ProxyProcess::start(proxy_bin(), &member_addrs(&cluster), &[]).await;
    let leader = cluster.wait_leader(Duration::from_secs(20)).await;
    let follower = cluster.member(cluster.follower_of(leader)).client.clone();
    // Keys are the cell's, whoever serves them: each round uses its own.
    for (round, addr) in [proxy.grpc.clone(), follower].into_iter().enumerate() {
        let (lock_key, unlock_key) = (format!("lock-{round}"), format!("unlock-{round}"));
        let mut etcd = Client::connect([addr.as_str()], None)
            .await
            .expect("connect");
        let mine = etcd.lease_grant(30, None).await.expect("grant").id();
        let other = etcd.lease_grant(30, None).await.expect("grant").id();
        let channel = latchkey_shared::client::connect(&addr)
            .await
            .expect("connect");
        let mut locks = LockClient::new(channel);
        let lock = |lease: i64| LockRequest {
            name: b"grpc-idem".to_vec(),
            lease,
            idempotency_key: lock_key.clone(),
        };
        let first = locks.lock(lock(mine)).await.expect("lock").into_inner();
        let again = locks.lock(lock(mine)).await.expect("retry").into_inner();
        assert_eq!(again.key, first.key, "{addr}");
        assert_eq!(
            again.header.map(|h| h.revision),
            first.header.map(|h| h.revision),
            "{addr}: the retry answers the first grant's revision"
        );
        let refused = locks.lock(lock(other)).await.expect_err("refused");
        assert_eq!(refused.code(), tonic::Code::FailedPrecondition, "{addr}");

        let unlock = || UnlockRequest {
            key: first.key.clone(),
            idempotency_key: unlock_key.clone(),
        };
        let released = locks.unlock(unlock()).await.expect("unlock").into_inner();
        let replayed = locks.unlock(unlock()).await.expect("retry").into_inner();
        assert_eq!(
            replayed.header.map(|h| h.revision),
            released.header.map(|h| h.revision),
            "{addr}"
        );
        // The lock's retry after the unlock does not queue again.
        let gone = locks.lock(lock(mine)).await.expect_err("gone");
        assert_eq!(gone.code(), tonic::Code::FailedPrecondition, "{addr}");
        let queued = etcd
            .get("grpc-idem/", Some(GetOptions::new().with_prefix()))
            .await
            .expect("queue");
        assert_eq!(queued.count(), 0, "{addr}");
    }
}

/// Review finding P5: a force-release names the holder it breaks by its
/// fencing token. Retried without a key after it went through, it finds
/// the next holder and breaks nobody (`precondition_failed`); retried
/// under its `Idempotency-Key`, it answers what the first did. Either way
/// one audit record per holder broken.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_force_release_breaks_only_the_holder_it_names_and_a_retry_breaks_no_other() {
    let proxy = ProxyProcess::dev(proxy_bin()).await;
    let api = Api::of(&proxy);
    let (s1, s2, s3) = (
        api.session().await,
        api.session().await,
        api.session().await,
    );
    let acquire = |session: &str| {
        let (api, body) = (
            api.clone(),
            json!({"session_id": session, "timeout_ms": 30000}),
        );
        tokio::spawn(async move { api.post("/locks/stuck/acquire", None, body).await })
    };
    let token = |granted: &Value| granted["fencing_token"].as_i64().expect("a token");
    let force = |key: Option<&'static str>, token: i64| {
        let api = api.clone();
        async move {
            api.post(
                "/admin/locks/stuck/force-release",
                key,
                json!({"reason": "hung", "operator": "ops", "fencing_token": token}),
            )
            .await
        }
    };
    let current = |token: i64| {
        let api = api.clone();
        async move { api.get(&format!("/locks/stuck/check?token={token}")).await["current"].as_bool() }
    };

    let (status, held) = acquire(&s1).await.expect("s1");
    assert_eq!(status, 200, "{held}");
    let t1 = token(&held);
    let s2_waits = acquire(&s2);
    api.wait_for_waiters("stuck", 1).await;

    // Without a key: the first breaks S1; its retry must not break S2.
    let (status, broken) = force(None, t1).await;
    assert_eq!(
        (status, broken["fencing_token"].as_i64()),
        (200, Some(t1)),
        "{broken}"
    );
    let (status, granted) = s2_waits.await.expect("s2");
    assert_eq!(status, 200, "{granted}");
    let t2 = token(&granted);
    let (status, retried) = force(None, t1).await;
    assert_eq!(
        (status, retried["error"].as_str()),
        (412, Some("precondition_failed")),
        "a retried force-release broke the next holder: {retried}"
    );
    assert_eq!(current(t2).await, Some(true), "S2 still holds the lock");

    // Under a key: the retry answers the first answer and breaks nobody.
    let s3_waits = acquire(&s3);
    api.wait_for_waiters("stuck", 1).await;
    let (status, first) = force(Some("break-s2"), t2).await;
    assert_eq!(
        (status, first["fencing_token"].as_i64()),
        (200, Some(t2)),
        "{first}"
    );
    assert_eq!(first["holder_session"].as_str(), Some(s2.as_str()));
    let (status, granted) = s3_waits.await.expect("s3");
    assert_eq!(status, 200, "{granted}");
    let t3 = token(&granted);
    assert_eq!(force(Some("break-s2"), t2).await, (200, first));
    assert_eq!(current(t3).await, Some(true), "S3 still holds the lock");
    // A token that is not the holder's breaks nobody either.
    let (status, wrong) = force(None, t3 + 1000).await;
    assert_eq!(
        (status, wrong["error"].as_str()),
        (412, Some("precondition_failed")),
        "{wrong}"
    );
    for _ in 0..2 {
        let (status, wrong) = force(Some("wrong-token"), t3 + 1000).await;
        assert_eq!(
            (status, wrong["error"].as_str()),
            (412, Some("precondition_failed")),
            "{wrong}"
        );
    }
    assert_eq!(current(t3).await, Some(true), "S3 still holds the lock");

    // One record per holder broken: S3 is broken last, and every record
    // before its record is in the stream ahead of it.
    let (status, _) = force(None, t3).await;
    assert_eq!(status, 200);
    let records = crate::audit_records_until(&api.addr, |records| {
        records.iter().any(|r| r.fencing_token == t3)
    })
    .await;
    let tokens: Vec<i64> = records.iter().map(|r| r.fencing_token).collect();
    assert_eq!(
        tokens,
        vec![t1, t2, t3],
        "one audit record per holder broken"
    );
}
