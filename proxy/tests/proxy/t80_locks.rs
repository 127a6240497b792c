//! Locks (issue 13): etcd's `v3lockpb.Lock` served by the shared lock
//! recipe, through a proxy and by a cell member alike. The etcd-client crate's lock and unlock work; a
//! queue of contenders is granted in the order it joined, with strictly
//! increasing fencing tokens (the keys' create revisions); a contender
//! whose deadline passes leaves the queue; a holder whose session ends
//! hands the lock on.

use crate::{member_addrs, proxy_bin};
use etcd_client::{Client, GetOptions, LockOptions};
use latchkey_shared::v3lockpb::lock_client::LockClient;
use latchkey_shared::v3lockpb::LockRequest;
use latchkey_testkit::{cell_binary, eventually, Cluster, ProxyProcess};
use std::time::Duration;

pub(crate) async fn lease(client: &mut Client, ttl: i64) -> i64 {
    client.lease_grant(ttl, None).await.expect("grant").id()
}

/// The fencing token of a granted key: its create revision.
async fn token(client: &mut Client, key: &[u8]) -> i64 {
    let resp = client.get(key, None).await.expect("get the lock key");
    resp.kvs()
        .first()
        .expect("the lock key exists")
        .create_revision()
}

/// Keys queued on the lock `name`.
async fn queued(client: &mut Client, name: &str) -> usize {
    let prefix = format!("{name}/");
    client
        .get(
            prefix.as_str(),
            Some(GetOptions::new().with_prefix().with_count_only()),
        )
        .await
        .expect("count the queue")
        .count() as usize
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn through_a_proxy_contenders_are_granted_in_queue_order_and_leave_on_timeout() {
    let cluster = Cluster::start(cell_binary(), 3, &[]).await;
    let proxy = ProxyProcess::start(proxy_bin(), &member_addrs(&cluster), &[]).await;
    contenders(&proxy.grpc).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_cell_follower_contenders_are_granted_in_queue_order_and_leave_on_timeout() {
    let cluster = Cluster::start(cell_binary(), 3, &[]).await;
    let leader = cluster.wait_leader(Duration::from_secs(20)).await;
    let follower = cluster.member(cluster.follower_of(leader)).client.clone();
    contenders(&follower).await;
}

/// Contenders on one lock at `addr` (a proxy's or a member's gRPC address).
async fn contenders(addr: &str) {
    let endpoint = format!("http://{addr}");
    let mut client = Client::connect([endpoint.as_str()], None)
        .await
        .expect("connect");

    // The first contender holds at once.
    let first_lease = lease(&mut client, 30).await;
    let held = client
        .lock("jobs", Some(LockOptions::new().with_lease(first_lease)))
        .await
        .expect("lock");
    assert_eq!(
        held.key(),
        format!("jobs/{first_lease:x}").as_bytes(),
        "etcd's key: the name, a slash, the lease in hex"
    );
    let mut tokens = vec![token(&mut client, held.key()).await];

    // Eight more queue up, one after another, and wait.
    let (granted_tx, mut granted) = tokio::sync::mpsc::unbounded_channel();
    for i in 0..8 {
        let mut contender = Client::connect([endpoint.as_str()], None)
            .await
            .expect("connect");
        let id = lease(&mut contender, 30).await;
        let granted_tx = granted_tx.clone();
        tokio::spawn(async move {
            let resp = contender
                .lock("jobs", Some(LockOptions::new().with_lease(id)))
                .await
                .expect("lock");
            let _ = granted_tx.send((i, resp.key().to_vec(), contender));
        });
        let want = i + 2;
        eventually(Duration::from_secs(10), async || {
            match queued(&mut client, "jobs").await {
                n if n == want => Ok(()),
                n => Err(format!("{n} queued, not {want}")),
            }
        })
        .await;
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        granted.try_recv().is_err(),
        "granted while the lock was held"
    );

    // A contender with a short deadline gives up and leaves the queue.
    let impatient_lease = lease(&mut client, 30).await;
    let channel = latchkey_shared::client::connect(addr)
        .await
        .expect("connect");
    let mut request = tonic::Request::new(LockRequest {
        name: b"jobs".to_vec(),
        lease: impatient_lease,
        ..Default::default()
    });
    request.set_timeout(Duration::from_millis(500));
    let refused = LockClient::new(channel).lock(request).await;
    assert!(
        refused.is_err(),
        "granted while the lock was held: {refused:?}"
    );
    eventually(Duration::from_secs(10), async || {
        match queued(&mut client, "jobs").await {
            9 => Ok(()),
            n => Err(format!("{n} queued after the impatient one left, not 9")),
        }
    })
    .await;

    // Each release wakes the next in queue order, and only it.
    client.unlock(held.key()).await.expect("unlock");
    for want in 0..8 {
        let (i, key, mut holder) = tokio::time::timeout(Duration::from_secs(10), granted.recv())
            .await
            .expect("the next contender is granted")
            .expect("granted");
        assert_eq!(i, want, "granted out of queue order");
        tokens.push(token(&mut client, &key).await);
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(granted.try_recv().is_err(), "two holders after one release");
        holder.unlock(key).await.expect("unlock");
    }
    assert!(
        tokens.windows(2).all(|w| w[0] < w[1]),
        "fencing tokens do not rise: {tokens:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_whose_session_ends_hands_the_lock_to_the_next() {
    let cluster = Cluster::start(cell_binary(), 3, &[]).await;
    let proxy = ProxyProcess::start(proxy_bin(), &member_addrs(&cluster), &[]).await;
    let endpoint = format!("http://{}", proxy.grpc);
    let mut client = Client::connect([endpoint.as_str()], None)
        .await
        .expect("connect");
    let holder = lease(&mut client, 30).await;
    let held = client
        .lock("leader", Some(LockOptions::new().with_lease(holder)))
        .await
        .expect("lock");
    let held_token = token(&mut client, held.key()).await;
    let mut next = client.clone();
    let waiter = lease(&mut client, 30).await;
    let waiting = tokio::spawn(async move {
        next.lock("leader", Some(LockOptions::new().with_lease(waiter)))
            .await
            .expect("lock")
            .key()
            .to_vec()
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!waiting.is_finished());
    client.lease_revoke(holder).await.expect("revoke");
    let key = tokio::time::timeout(Duration::from_secs(10), waiting)
        .await
        .expect("the waiter is granted once the holder's session ends")
        .expect("waiter");
    assert_eq!(key, format!("leader/{waiter:x}").as_bytes());
    assert!(token(&mut client, &key).await > held_token);
}

/// The proxy's HTTP API, for the HTTP lock tests.
#[derive(Clone)]
pub(crate) struct Api {
    pub(crate) http: reqwest::Client,
    pub(crate) base: String,
}

impl Api {
    pub(crate) fn of(proxy: &ProxyProcess) -> Api {
        Api {
            http: reqwest::Client::new(),
            base: format!("http://{}/v1", proxy.http),
        }
    }

    /// POSTs `body` to `/v1{path}`: the status and the JSON answer.
    pub(crate) async fn post(
        &self,
        path: &str,
        body: serde_json::Value,
    ) -> (u16, serde_json::Value) {
        let resp = self
            .http
            .post(format!("{}{path}", self.base))
            .json(&body)
            .send()
            .await
            .expect("post");
        let status = resp.status().as_u16();
        (status, resp.json().await.expect("a JSON body"))
    }

    /// The JSON answer of `GET /v1{path}`.
    pub(crate) async fn get(&self, path: &str) -> Result<serde_json::Value, String> {
        self.http
            .get(format!("{}{path}", self.base))
            .send()
            .await
            .map_err(|e| e.to_string())?
            .json()
            .await
            .map_err(|e| e.to_string())
    }

    /// `n` new sessions with a 30 s TTL.
    pub(crate) async fn sessions(&self, n: usize) -> Vec<String> {
        let mut ids = Vec::new();
        for _ in 0..n {
            let (status, body) = self.post("/sessions", serde_json::json!({"ttl": 30})).await;
            assert_eq!(status, 200, "{body}");
            ids.push(body["id"].as_str().expect("id").to_string());
        }
        ids
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_locks_grant_fencing_tokens_that_fence_off_an_old_holder() {
    use latchkey_shared::lock::FencedResource;
    use serde_json::{json, Value};
    let proxy = ProxyProcess::dev(proxy_bin()).await;
    let api = Api::of(&proxy);
    let sessions = api.sessions(2).await;
    let (status, first) = api
        .post("/locks/db/acquire", json!({"session_id": sessions[0]}))
        .await;
    assert_eq!(status, 200, "{first}");
    let first_token = first["fencing_token"].as_i64().expect("a token");

    // The second session cannot have it while it is held...
    let (status, body) = api
        .post(
            "/locks/db/acquire",
            json!({"session_id": sessions[1], "timeout_ms": 300}),
        )
        .await;
    assert_eq!(
        (status, body["error"].as_str()),
        (408, Some("lock_timeout")),
        "{body}"
    );
    // Its place is gone when it is told so: the same session may queue
    // again at once, under the same key, and a removal still in flight
    // would take the new place (seen: the waiter below told its session
    // had expired).
    let state = api.get("/locks/db").await.expect("the lock");
    assert_eq!(state["waiters"], json!([]), "{state}");
    // ...and waits for it in line.
    let waiting = {
        let (api, body) = (
            api.clone(),
            json!({"session_id": sessions[1], "timeout_ms": 10000}),
        );
        tokio::spawn(async move { api.post("/locks/db/acquire", body).await })
    };
    eventually(Duration::from_secs(10), async || {
        let state = api.get("/locks/db").await?;
        let waiters = state["waiters"].as_array().map_or(0, Vec::len);
        match (state["holder"]["session_id"].as_str(), waiters) {
            (Some(holder), 1) if holder == sessions[0] => Ok(()),
            _ => Err(format!("the lock is {state}")),
        }
    })
    .await;
    let check = async |token: i64| -> bool {
        let body: Value = api
            .get(&format!("/locks/db/check?token={token}"))
            .await
            .expect("check");
        body["current"].as_bool().expect("current")
    };
    assert!(check(first_token).await);

    // The resource the lock protects keeps the highest token it accepted.
    let resource = FencedResource::new();
    resource
        .accept("db", first_token)
        .expect("the holder writes");
    let (status, released) = api
        .post("/locks/db/release", json!({"session_id": sessions[0]}))
        .await;
    assert_eq!((status, released["released"].as_bool()), (200, Some(true)));
    let (status, second) = waiting.await.expect("the waiter");
    assert_eq!(status, 200, "{second}");
    let second_token = second["fencing_token"].as_i64().expect("a token");
    assert!(second_token > first_token);
    assert!(
        !check(first_token).await,
        "the old token is no longer the holder's"
    );
    assert!(check(second_token).await);
    resource
        .accept("db", second_token)
        .expect("the new holder writes");
    let stale = resource.accept("db", first_token);
    assert!(stale.is_err(), "the old holder's write was accepted");
    // Releasing again is not an error.
    let (status, again) = api
        .post("/locks/db/release", json!({"session_id": sessions[0]}))
        .await;
    assert_eq!((status, again["released"].as_bool()), (200, Some(false)));
}

/// One contender's grant: which contender of its lock, when, and token.
struct Granted {
    lock: usize,
    joined: usize,
    token: i64,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn through_two_proxies_grants_follow_the_queue_and_each_release_wakes_one_waiter() {
    // 32 contenders on one lock, and 8 more locks with 4 each, half the
    // contenders on each of two proxies.
    const LOCKS: [usize; 9] = [32, 4, 4, 4, 4, 4, 4, 4, 4];
    let cluster = Cluster::start(cell_binary(), 3, &[]).await;
    let proxies = [
        ProxyProcess::start(proxy_bin(), &member_addrs(&cluster), &[]).await,
        ProxyProcess::start(proxy_bin(), &member_addrs(&cluster), &[]).await,
    ];
    let mut admin = Client::connect([format!("http://{}", proxies[0].grpc)], None)
        .await
        .expect("connect");
    let (granted_tx, mut granted_rx) = tokio::sync::mpsc::unbounded_channel::<Granted>();
    let mut gates = Vec::new();
    let mut contenders = 0;
    for (lock, &n) in LOCKS.iter().enumerate() {
        let name = format!("fair/{lock}");
        // The first contender holds the lock while the others line up.
        let gate_lease = lease(&mut admin, 30).await;
        let gate = admin
            .lock(
                name.as_str(),
                Some(LockOptions::new().with_lease(gate_lease)),
            )
            .await
            .expect("the gate holds");
        gates.push(gate.key().to_vec());
        for joined in 1..n {
            let proxy = &proxies[contenders % 2];
            contenders += 1;
            let mut client = Client::connect([format!("http://{}", proxy.grpc)], None)
                .await
                .expect("connect");
            let id = lease(&mut client, 30).await;
            let granted_tx = granted_tx.clone();
            let lock_name = name.clone();
            tokio::spawn(async move {
                let resp = client
                    .lock(lock_name.as_str(), Some(LockOptions::new().with_lease(id)))
                    .await
                    .expect("lock");
                let token = token(&mut client, resp.key()).await;
                let _ = granted_tx.send(Granted {
                    lock,
                    joined,
                    token,
                });
                tokio::time::sleep(Duration::from_millis(10)).await;
                client.unlock(resp.key()).await.expect("unlock");
            });
            eventually(Duration::from_secs(10), async || {
                match queued(&mut admin, &name).await {
                    q if q == joined + 1 => Ok(()),
                    q => Err(format!("{q} in line for {name}, not {}", joined + 1)),
                }
            })
            .await;
        }
    }
    let wakeups = async |proxies: &[ProxyProcess; 2]| {
        let mut sum = 0.0;
        for proxy in proxies {
            sum += proxy
                .metric("latchkey_lock_wakeups_total")
                .await
                .unwrap_or(0.0);
        }
        sum
    };
    assert_eq!(
        wakeups(&proxies).await,
        0.0,
        "a waiter woke while nothing moved"
    );
    // The waiters of one lock on one proxy share one watch of its queue,
    // on the leader (a follower would wake them a message later): at most
    // one upstream watch per lock and proxy, however many wait.
    let leader = cluster.wait_leader(Duration::from_secs(10)).await;
    eventually(Duration::from_secs(10), async || {
        let mut on = Vec::new();
        for id in cluster.running() {
            let watchers = cluster.metric(id, "latchkey_watchers").await;
            on.push((id, watchers.unwrap_or(0.0)));
        }
        let on_leader = on.iter().find(|(id, _)| *id == leader).map_or(0.0, |w| w.1);
        let elsewhere: f64 = on.iter().filter(|(id, _)| *id != leader).map(|w| w.1).sum();
        let most = (LOCKS.len() * proxies.len()) as f64;
        match (on_leader, elsewhere) {
            (l, 0.0) if l >= LOCKS.len() as f64 && l <= most => Ok(()),
            _ => Err(format!(
                "watches per member {on:?} (leader {leader}), {contenders} waiting: want \
                 {} to {most} on the leader, none elsewhere",
                LOCKS.len()
            )),
        }
    })
    .await;
    for gate in gates {
        admin.unlock(gate).await.expect("open the gate");
    }
    let mut grants: Vec<Vec<(usize, i64)>> = vec![Vec::new(); LOCKS.len()];
    for _ in 0..contenders {
        let g = tokio::time::timeout(Duration::from_secs(30), granted_rx.recv())
            .await
            .expect("every contender is granted in time")
            .expect("granted");
        grants[g.lock].push((g.joined, g.token));
    }
    for (lock, got) in grants.iter().enumerate() {
        let order: Vec<usize> = got.iter().map(|(joined, _)| *joined).collect();
        let want: Vec<usize> = (1..LOCKS[lock]).collect();
        assert_eq!(order, want, "lock {lock}: granted out of queue order");
        assert!(
            got.windows(2).all(|w| w[0].1 < w[1].1),
            "lock {lock}: tokens do not rise: {got:?}"
        );
    }
    // Every waiter was woken once: by its predecessor's release.
    assert_eq!(wakeups(&proxies).await, contenders as f64);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lock_delay_holds_the_lock_after_an_expiry_but_not_after_a_release() {
    use serde_json::json;
    use tokio::time::Instant;
    let proxy = ProxyProcess::dev(proxy_bin()).await;
    let api = Api::of(&proxy);
    let sessions = api.sessions(4).await;
    let delay = Duration::from_millis(1500);
    for (lock, holder, waiter, ends_by_expiry) in [
        ("expired", &sessions[0], &sessions[1], true),
        ("released", &sessions[2], &sessions[3], false),
    ] {
        let (status, body) = api
            .post(
                &format!("/locks/{lock}/acquire"),
                json!({"session_id": holder, "lock_delay_ms": delay.as_millis() as u64}),
            )
            .await;
        assert_eq!(status, 200, "{body}");
        let waiting = {
            let (api, body) = (
                api.clone(),
                json!({"session_id": waiter, "timeout_ms": 10000}),
            );
            let path = format!("/locks/{lock}/acquire");
            tokio::spawn(async move { api.post(&path, body).await })
        };
        eventually(Duration::from_secs(10), async || {
            let state = api.get(&format!("/locks/{lock}")).await?;
            match state["waiters"].as_array().map_or(0, Vec::len) {
                1 => Ok(()),
                n => Err(format!("{n} waiters")),
            }
        })
        .await;
        let ended = Instant::now();
        if ends_by_expiry {
            // The holder's session ends without a release.
            let resp = api
                .http
                .delete(format!("{}/sessions/{holder}", api.base))
                .send()
                .await
                .expect("revoke");
            assert_eq!(resp.status(), 200);
        } else {
            let (status, _) = api
                .post(
                    &format!("/locks/{lock}/release"),
                    json!({"session_id": holder}),
                )
                .await;
            assert_eq!(status, 200);
        }
        let (status, body) = waiting.await.expect("waiter");
        assert_eq!(status, 200, "{body}");
        let waited = ended.elapsed();
        if ends_by_expiry {
            assert!(
                waited >= delay,
                "granted {waited:?} after the holder expired"
            );
        } else {
            assert!(
                waited < Duration::from_millis(1000),
                "a released lock waited {waited:?}"
            );
        }
    }
}

/// P1: the lock-delay a departed holder asked for is owed by whoever
/// becomes first after it, even when the waiter that was first gives up
/// while it waits the delay out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lock_delay_is_owed_by_whoever_is_first_when_the_waiter_owing_it_gives_up() {
    use serde_json::json;
    use tokio::time::Instant;
    let proxy = ProxyProcess::dev(proxy_bin()).await;
    let api = Api::of(&proxy);
    let sessions = api.sessions(3).await;
    let (holder, first, second) = (&sessions[0], &sessions[1], &sessions[2]);
    let delay = Duration::from_millis(3000);
    let (status, body) = api
        .post(
            "/locks/p1/acquire",
            json!({"session_id": holder, "lock_delay_ms": delay.as_millis() as u64}),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    let waiters = async |n: usize| {
        eventually(Duration::from_secs(10), async || {
            let state = api.get("/locks/p1").await?;
            match state["waiters"].as_array().map_or(0, Vec::len) {
                m if m == n => Ok(()),
                m => Err(format!("{m} waiters, {n} expected")),
            }
        })
        .await
    };
    let wait_for = |session: &String, timeout_ms: u64| {
        let (api, body) = (
            api.clone(),
            json!({"session_id": session, "timeout_ms": timeout_ms}),
        );
        tokio::spawn(async move { api.post("/locks/p1/acquire", body).await })
    };
    // The first waiter gives up before the delay is over; the second does not.
    let gives_up = wait_for(first, 2000);
    waiters(1).await;
    let stays = wait_for(second, 20000);
    waiters(2).await;
    let ended = Instant::now();
    // The holder's session ends without a release.
    let resp = api
        .http
        .delete(format!("{}/sessions/{holder}", api.base))
        .send()
        .await
        .expect("revoke");
    assert_eq!(resp.status(), 200);
    let (status, body) = gives_up.await.expect("first waiter");
    assert_ne!(
        status, 200,
        "the first waiter was granted inside the delay: {body}"
    );
    let (status, body) = stays.await.expect("second waiter");
    assert_eq!(status, 200, "{body}");
    let waited = ended.elapsed();
    assert!(
        waited >= delay,
        "granted {waited:?} after the holder expired, inside its {delay:?} lock-delay"
    );
}

/// A holder with a lock-delay expires while nobody waits: the next
/// contender to come along is not granted before the delay has passed;
/// once it released, the one after it is granted at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lock_delay_holds_off_a_newcomer_after_an_expiry_with_nobody_waiting() {
    use serde_json::json;
    use tokio::time::Instant;
    let proxy = ProxyProcess::dev(proxy_bin()).await;
    let api = Api::of(&proxy);
    let sessions = api.sessions(3).await;
    let delay = Duration::from_millis(1500);
    let acquire = |session: &str| {
        api.post(
            "/locks/lonely/acquire",
            json!({"session_id": session, "lock_delay_ms": delay.as_millis() as u64, "timeout_ms": 10000}),
        )
    };
    let (status, body) = acquire(&sessions[0]).await;
    assert_eq!(status, 200, "{body}");
    // The holder's session ends without a release; nobody waits.
    let resp = api
        .http
        .delete(format!("{}/sessions/{}", api.base, sessions[0]))
        .send()
        .await
        .expect("revoke");
    assert_eq!(resp.status(), 200);
    let expired = Instant::now();
    let (status, body) = acquire(&sessions[1]).await;
    assert_eq!(status, 200, "{body}");
    let waited = expired.elapsed();
    assert!(
        waited >= delay,
        "a newcomer was granted {waited:?} after the expiry"
    );
    // Released on purpose: the next newcomer does not wait.
    let (status, _) = api
        .post("/locks/lonely/release", json!({"session_id": sessions[1]}))
        .await;
    assert_eq!(status, 200);
    let released = Instant::now();
    let (status, body) = acquire(&sessions[2]).await;
    assert_eq!(status, 200, "{body}");
    let waited = released.elapsed();
    assert!(
        waited < Duration::from_millis(1000),
        "granted {waited:?} after a release"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_force_release_fences_off_the_holder_and_is_in_the_audit_stream() {
    use latchkey_shared::lock::FencedResource;
    use serde_json::json;
    let proxy = ProxyProcess::dev(proxy_bin()).await;
    let api = Api::of(&proxy);
    let sessions = api.sessions(2).await;
    let (status, held) = api
        .post("/locks/stuck/acquire", json!({"session_id": sessions[0]}))
        .await;
    assert_eq!(status, 200, "{held}");
    let old_token = held["fencing_token"].as_i64().expect("token");
    let resource = FencedResource::new();
    resource
        .accept("stuck", old_token)
        .expect("the holder writes");
    let waiting = {
        let (api, body) = (
            api.clone(),
            json!({"session_id": sessions[1], "timeout_ms": 10000}),
        );
        tokio::spawn(async move { api.post("/locks/stuck/acquire", body).await })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!waiting.is_finished());

    // No reason, no release.
    let (status, body) = api
        .post(
            "/admin/locks/stuck/force-release",
            json!({"reason": " ", "fencing_token": old_token}),
        )
        .await;
    assert_eq!(
        (status, body["error"].as_str()),
        (400, Some("invalid_argument"))
    );
    let (status, broken) = api
        .post(
            "/admin/locks/stuck/force-release",
            json!({"reason": "holder hung in GC", "operator": "alice", "fencing_token": old_token}),
        )
        .await;
    assert_eq!(status, 200, "{broken}");
    assert_eq!(broken["fencing_token"].as_i64(), Some(old_token));
    assert_eq!(
        broken["holder_session"].as_str(),
        Some(sessions[0].as_str())
    );

    // The next waiter holds it with a higher token; the old one is fenced off.
    let (status, granted) = waiting.await.expect("waiter");
    assert_eq!(status, 200, "{granted}");
    let new_token = granted["fencing_token"].as_i64().expect("token");
    assert!(new_token > old_token);
    let check = api
        .get(&format!("/locks/stuck/check?token={old_token}"))
        .await
        .expect("check");
    assert_eq!(check["current"].as_bool(), Some(false));
    resource
        .accept("stuck", new_token)
        .expect("the new holder writes");
    assert!(resource.accept("stuck", old_token).is_err());
    // A lock nobody holds cannot be broken.
    let (status, _) = api
        .post(
            "/admin/locks/free/force-release",
            json!({"reason": "why not", "fencing_token": old_token}),
        )
        .await;
    assert_eq!(status, 412);

    // The audit stream replays the record.
    let records = crate::audit_records_until(&proxy.http, |records| !records.is_empty()).await;
    let record = &records[0];
    assert_eq!(
        (
            record.action.as_str(),
            record.lock.as_str(),
            record.reason.as_str(),
            record.operator.as_str(),
            record.fencing_token,
            record.holder_session.as_str()
        ),
        (
            "force_release",
            "stuck",
            "holder hung in GC",
            "alice",
            old_token,
            sessions[0].as_str()
        )
    );
}
