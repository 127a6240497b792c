//! A member cut off from its peers (review finding P2; issue 28, Done-when
//! 2). Its client port still answers the proxy, and it keeps serving its
//! own frozen state: the proxy's watches on it must move to a member that
//! follows the cell (the member ends require-leader streams once it has
//! gone two election timeouts without a leader), and the read cache must
//! not keep answering from it. Each part is placed on the cut member on
//! purpose: the lock waiter's watch picks the member to cut, and watchers
//! and cached ranges are opened until one of each sits there.

use crate::t80_locks::Api;
use crate::{member_addrs, proxy_bin, raw_watch_stream};
use futures::StreamExt;
use latchkey_testkit::{cell_binary, eventually, Cluster, PeerBlackhole, ProxyProcess};
use serde_json::json;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::time::Instant;

/// Events received by the watchers, by key: (revision, when).
type Deliveries = Arc<Mutex<HashMap<String, Vec<(i64, Instant)>>>>;

/// The watches each member holds (`latchkey_watchers`), by member id.
async fn watchers(cluster: &Cluster) -> HashMap<u64, f64> {
    let mut by_member = HashMap::new();
    for m in &cluster.members {
        let n = cluster
            .metric(m.id, "latchkey_watchers")
            .await
            .unwrap_or(0.0);
        by_member.insert(m.id, n);
    }
    by_member
}

/// Waits until one member holds one watch more than in `before`: that
/// member.
async fn member_that_gained(cluster: &Cluster, before: &HashMap<u64, f64>) -> u64 {
    eventually(Duration::from_secs(10), async || {
        let now = watchers(cluster).await;
        now.iter()
            .find(|(id, n)| **n > before[*id])
            .map(|(id, _)| *id)
            .ok_or_else(|| format!("no member gained a watch: {now:?}"))
    })
    .await
}

/// Runs `open(i)` for i = 0, 1, ... (each opens one watch of a key of its
/// own and returns the key) until a watch lands on member `target`: the
/// keys opened.
async fn open_until_on<F, Fut>(
    cluster: &Cluster,
    target: u64,
    what: &str,
    mut open: F,
) -> Vec<String>
where
    F: FnMut(usize) -> Fut,
    Fut: std::future::Future<Output = String>,
{
    let mut keys = Vec::new();
    for i in 0..30 {
        let before = watchers(cluster).await;
        keys.push(open(i).await);
        if member_that_gained(cluster, &before).await == target {
            return keys;
        }
    }
    panic!("no {what} landed on member {target} in 30 tries");
}

/// An SSE watch of `key` through the proxy at `http`, recording into `got`.
async fn sse_watch(http: &str, key: &str, got: Deliveries) {
    let resp = reqwest::get(format!("http://{http}/v1/watch/{key}"))
        .await
        .expect("watch over SSE");
    assert_eq!(resp.status(), 200);
    let mut body = Box::pin(resp.bytes_stream());
    let key = key.to_string();
    tokio::spawn(async move {
        let mut text = String::new();
        while let Some(Ok(chunk)) = body.next().await {
            text.push_str(&String::from_utf8_lossy(&chunk));
            while let Some(end) = text.find("\n\n") {
                let block: String = text.drain(..end + 2).collect();
                if let Some(id) = block.lines().find_map(|l| l.strip_prefix("id: ")) {
                    let revision = id.trim().parse().expect("a revision id");
                    let mut got = got.lock().unwrap();
                    got.entry(key.clone())
                        .or_default()
                        .push((revision, Instant::now()));
                }
            }
        }
    });
}

/// A gRPC watch of `key` through the proxy at `grpc`, recording into `got`.
async fn grpc_watch(grpc: &str, key: &str, got: Deliveries) {
    let channel = latchkey_shared::client::connect(grpc)
        .await
        .expect("connect");
    let (requests, mut answers) = raw_watch_stream(channel, key, 0, 1).await;
    let key = key.to_string();
    tokio::spawn(async move {
        let _requests = requests;
        while let Some(Ok(resp)) = answers.next().await {
            let mut got = got.lock().unwrap();
            for event in &resp.events {
                let revision = event.kv.as_ref().map_or(0, |kv| kv.mod_revision);
                got.entry(key.clone())
                    .or_default()
                    .push((revision, Instant::now()));
            }
        }
    });
}

/// A serializable read of `key` on a connection of its own (no floor): its
/// value (None: the key is absent), or the error answered.
async fn fresh_serializable_get(api: &Api, key: &str) -> Result<Option<String>, String> {
    let fresh = Api {
        http: reqwest::Client::new(),
        base: api.base.clone(),
    };
    let body = fresh.get(&format!("/kv/{key}?serializable")).await?;
    if body.get("error").is_some() {
        return Err(body.to_string());
    }
    Ok(body["kvs"][0]["value"].as_str().map(str::to_string))
}

async fn put(api: &Api, key: &str, value: &str) -> i64 {
    let resp = api
        .http
        .put(format!("{}/kv/{key}", api.base))
        .body(value.to_string())
        .send()
        .await
        .expect("put");
    assert_eq!(resp.status(), 200);
    let body: serde_json::Value = resp.json().await.expect("JSON");
    body["revision"].as_i64().expect("a revision")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn locks_watches_and_cached_reads_move_off_a_member_cut_off_from_its_peers() {
    let cluster = Cluster::start_apart(cell_binary(), 3, &[]).await;
    let proxy = ProxyProcess::start(proxy_bin(), &member_addrs(&cluster), &[]).await;
    let api = Api::of(&proxy);
    let sessions = api.sessions(2).await;
    let (status, held) = api
        .post("/locks/part/acquire", json!({"session_id": sessions[0]}))
        .await;
    assert_eq!(status, 200, "{held}");

    // The waiter's watch picks the member to cut.
    let before = watchers(&cluster).await;
    let waiter = {
        let (api, body) = (
            api.clone(),
            json!({"session_id": sessions[1], "timeout_ms": 30000}),
        );
        tokio::spawn(async move {
            let answer = api.post("/locks/part/acquire", body).await;
            (answer, Instant::now())
        })
    };
    let cut = member_that_gained(&cluster, &before).await;

    // SSE and gRPC watchers, and cached ranges, until one of each is on
    // the member to cut.
    let got = Deliveries::default();
    let sse_keys = open_until_on(&cluster, cut, "SSE watch", |i| {
        let (key, got) = (format!("part/sse/{i}"), got.clone());
        let http = proxy.http.clone();
        async move {
            sse_watch(&http, &key, got).await;
            key
        }
    })
    .await;
    let grpc_keys = open_until_on(&cluster, cut, "gRPC watch", |i| {
        let (key, got) = (format!("part/grpc/{i}"), got.clone());
        let grpc = proxy.grpc.clone();
        async move {
            grpc_watch(&grpc, &key, got).await;
            key
        }
    })
    .await;
    let cached_keys = open_until_on(&cluster, cut, "cached range", |i| {
        let (key, api) = (format!("part/cached/{i}"), api.clone());
        async move {
            put(&api, &key, "old").await;
            // A fresh connection has no floor: its serializable read may
            // come from a member (or a range being filled from one) that
            // has not applied the put yet, as etcd's may, so "old" is
            // waited for, up to 1 s. The second miss caches the range.
            let (written, old) = (Instant::now(), Ok(Some("old".to_string())));
            for reads in 1.. {
                let answer = fresh_serializable_get(&api, &key).await;
                if answer == old && reads >= 2 {
                    break;
                }
                assert!(
                    written.elapsed() < Duration::from_secs(1),
                    "{key}: {answer:?} 1 s after \"old\" was acknowledged"
                );
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            key
        }
    })
    .await;

    let blackhole = PeerBlackhole::cut(&cluster, cut);

    // The holder releases on the majority side (again while the answer
    // is a timeout: the cut member may have led, and a release is safe to
    // repeat): the waiter is granted within 2 s of the answer.
    let started = Instant::now();
    let released_at = loop {
        let (status, released) = api
            .post("/locks/part/release", json!({"session_id": sessions[0]}))
            .await;
        if status == 200 {
            break Instant::now();
        }
        assert!(
            released["error"] == "timeout" && started.elapsed() < Duration::from_secs(20),
            "{released}"
        );
    };
    let ((status, granted), granted_at) = tokio::time::timeout(Duration::from_secs(10), waiter)
        .await
        .unwrap_or_else(|_| panic!("the waiter was not granted 10 s after the release"))
        .expect("the waiter");
    assert_eq!(status, 200, "{granted}");
    let waited = granted_at - released_at;
    assert!(
        waited < Duration::from_secs(2),
        "granted {waited:?} after the release, with member {cut} cut off"
    );

    eprintln!("member {cut} cut off: the waiter was granted {waited:?} after the release");

    // Every watcher gets its write within 2 s.
    let mut acked = Vec::new();
    for key in sse_keys.iter().chain(&grpc_keys) {
        let revision = put(&api, key, "new").await;
        acked.push((key.clone(), revision, Instant::now()));
    }
    tokio::time::sleep(Duration::from_secs(3)).await;
    {
        let got = got.lock().unwrap();
        for (key, revision, at) in &acked {
            let delivered = got
                .get(key)
                .and_then(|events| events.iter().find(|(r, _)| r == revision))
                .map(|(_, when)| when.saturating_duration_since(*at));
            eprintln!("the watcher of {key} got its write after {delivered:?}");
            assert!(
                delivered.is_some_and(|d| d < Duration::from_secs(2)),
                "the watcher of {key} got revision {revision} after {delivered:?} \
                 (None: not within 3 s), with member {cut} cut off"
            );
        }
    }

    // A fresh connection's serializable read stops returning the old value
    // within 1 s of the new one's acknowledgement.
    for key in &cached_keys {
        put(&api, key, "new").await;
        let acked = Instant::now();
        let mut last_old = None;
        while acked.elapsed() < Duration::from_millis(2500) {
            let value = fresh_serializable_get(&api, key).await;
            let now = acked.elapsed();
            if value.as_ref().is_ok_and(|v| v.as_deref() == Some("old")) {
                last_old = Some(now);
            }
            assert!(
                value.as_ref().is_ok_and(|v| v.as_deref() == Some("new"))
                    || now < Duration::from_secs(1),
                "{key}: {value:?} {now:?} after \"new\" was acknowledged, with member {cut} \
                 cut off"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        eprintln!("{key}: the old value was last read {last_old:?} after the new one's ack");
    }
    blackhole.heal();
}

/// Review finding P9: a shared watch whose member is lost, and whose next
/// revision was compacted meanwhile, cannot resume; its gRPC clients are
/// cancelled with the compact revision, as a member would cancel them, so
/// etcd's clients raise ErrCompacted instead of a plain cancel.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_that_meets_compaction_while_it_resumes_tells_grpc_clients_the_compact_revision() {
    let mut cluster = Cluster::start(cell_binary(), 3, &[]).await;
    let proxy = ProxyProcess::start(proxy_bin(), &member_addrs(&cluster), &[]).await;
    let channel = latchkey_shared::client::connect(&proxy.grpc)
        .await
        .expect("connect");
    let before = watchers(&cluster).await;
    let (_requests, mut answers) = raw_watch_stream(channel, "compacted/k", 0, 1).await;
    let serving = member_that_gained(&cluster, &before).await;

    // The serving member stops (its stream stays open, silent); the others
    // write on and compact past what the watch has delivered.
    cluster.signal(serving, "STOP");
    let other = cluster
        .members
        .iter()
        .map(|m| m.id)
        .find(|id| *id != serving)
        .expect("another member");
    let mut client = cluster.client(other).await;
    let mut last = 0;
    for i in 0..3 {
        let put = eventually(Duration::from_secs(10), async || {
            client
                .put("compacted/k", format!("v{i}"), None)
                .await
                .map_err(|e| e.to_string())
        })
        .await;
        last = put.header().expect("header").revision();
    }
    client.compact(last, None).await.expect("compact");
    // Then it dies: the shared watch resumes from a compacted revision.
    cluster.kill(serving);

    let cancelled = tokio::time::timeout(Duration::from_secs(20), async {
        loop {
            let resp = answers
                .next()
                .await
                .expect("the stream stays open")
                .expect("an answer");
            if resp.canceled {
                return resp;
            }
            assert!(
                resp.events.is_empty(),
                "events after a compaction: {resp:?}"
            );
        }
    })
    .await
    .expect("the watch is cancelled");
    assert_eq!(
        cancelled.compact_revision, last,
        "cancelled without the compact revision: {cancelled:?}"
    );
}
