//! Fan-out through one proxy (issue 12, Done-when 1): 10 000 client
//! watches of one key, over gRPC and SSE, are ONE watch at the cell; every
//! client gets every event of 100 writes, in order; and each event's
//! delivery times spread over `--fanout-jitter`: bunched with 0, spread
//! over the window with 200 ms. The spread is a property of the fan-out,
//! asserted with generous bounds, not a speed figure.

use crate::{member_addrs, proxy_bin, raw_watch_stream};
use futures::StreamExt;
use latchkey_testkit::{cell_binary, eventually, Cluster, ProxyProcess};
use std::collections::HashMap;
use std::time::Duration;
use tokio::time::Instant;

const GRPC_STREAMS: usize = 45;
const WATCHES_PER_STREAM: usize = 200;
const SSE_CLIENTS: usize = 1000;
const WRITES: usize = 100;
const WRITE_EVERY: Duration = Duration::from_millis(100);

/// What one client watch received: each revision and when.
type Received = Vec<(i64, Instant)>;

/// Opens one gRPC stream carrying `WATCHES_PER_STREAM` watches of `key`;
/// returns once all are created, with a task collecting their events
/// until each has `WRITES` of them.
async fn grpc_stream(
    channel: tonic::transport::Channel,
    key: &str,
) -> tokio::task::JoinHandle<Vec<Received>> {
    let (requests, mut answers) = raw_watch_stream(channel, key, 0, WATCHES_PER_STREAM).await;
    tokio::spawn(async move {
        // Ends with the task: the request stream stays open until then.
        let _requests = requests;
        let mut got: HashMap<i64, Received> = HashMap::new();
        let mut complete = 0;
        while complete < WATCHES_PER_STREAM {
            let resp = answers
                .next()
                .await
                .expect("the stream stays open")
                .expect("an answer");
            assert!(!resp.canceled, "a watch was cancelled: {resp:?}");
            let now = Instant::now();
            let mine = got.entry(resp.watch_id).or_default();
            for event in &resp.events {
                mine.push((event.kv.as_ref().map_or(0, |kv| kv.mod_revision), now));
            }
            if !resp.events.is_empty() && mine.len() == WRITES {
                complete += 1;
            }
        }
        got.into_values().collect()
    })
}

/// One SSE client of `key`; returns once its stream is open, with a task
/// collecting `WRITES` events.
async fn sse_client(http: &reqwest::Client, url: &str) -> tokio::task::JoinHandle<Received> {
    let resp = http.get(url).send().await.expect("watch over SSE");
    assert_eq!(resp.status(), 200);
    let mut body = Box::pin(resp.bytes_stream());
    tokio::spawn(async move {
        let mut got = Received::new();
        let mut text = String::new();
        while got.len() < WRITES {
            let chunk = body
                .next()
                .await
                .expect("the stream stays open")
                .expect("a chunk");
            let now = Instant::now();
            text.push_str(&String::from_utf8_lossy(&chunk));
            while let Some(end) = text.find("\n\n") {
                let block: String = text.drain(..end + 2).collect();
                assert!(!block.contains("event: error"), "{block}");
                if let Some(id) = block.lines().find_map(|l| l.strip_prefix("id: ")) {
                    got.push((id.trim().parse().expect("a revision id"), now));
                }
            }
        }
        got
    })
}

/// The quantile `q` of `values`, sorted.
fn quantile(values: &[Duration], q: f64) -> Duration {
    values[((values.len() - 1) as f64 * q) as usize]
}

/// Starts a proxy with `jitter`, puts 10 000 watches of `key` on it,
/// writes `key` 100 times and checks every client got every write in
/// order. Returns each delivery's delay after the first delivery of its
/// event, sorted.
async fn fan_out(cluster: &Cluster, key: &str, jitter: &str) -> Vec<Duration> {
    let proxy = ProxyProcess::start(
        proxy_bin(),
        &member_addrs(cluster),
        &["--fanout-jitter", jitter],
    )
    .await;
    let mut grpc: Vec<(
        tonic::transport::Channel,
        tokio::task::JoinHandle<Vec<Received>>,
    )> = Vec::new();
    for i in 0..GRPC_STREAMS {
        // Three connections, 15 streams each.
        let channel = if i < 3 {
            latchkey_shared::client::connect(&proxy.grpc)
                .await
                .expect("connect")
        } else {
            grpc[i % 3].0.clone()
        };
        let task = grpc_stream(channel.clone(), key).await;
        grpc.push((channel, task));
    }
    let http = reqwest::Client::new();
    let url = format!("http://{}/v1/watch/{key}", proxy.http);
    let mut sse = Vec::new();
    for _ in 0..SSE_CLIENTS {
        sse.push(sse_client(&http, &url).await);
    }
    eventually(Duration::from_secs(10), async || {
        match cluster.metric_sum("latchkey_watchers").await {
            1.0 => Ok(()),
            n => Err(format!("the cell serves {n} watchers, not 1")),
        }
    })
    .await;
    // The proxy counts them so too.
    let grpc_watches = proxy
        .metric("latchkey_proxy_client_watches{api=\"grpc\"}")
        .await;
    let sse_watches = proxy
        .metric("latchkey_proxy_client_watches{api=\"sse\"}")
        .await;
    assert_eq!(
        (grpc_watches, sse_watches),
        (
            Some((GRPC_STREAMS * WATCHES_PER_STREAM) as f64),
            Some(SSE_CLIENTS as f64)
        )
    );
    assert_eq!(
        proxy.metric("latchkey_proxy_upstream_watches").await,
        Some(1.0)
    );
    let leader = cluster.wait_leader(Duration::from_secs(10)).await;
    let mut writer = cluster.client(leader).await;
    let mut written = Vec::new();
    for i in 0..WRITES {
        let resp = writer
            .put(key, i.to_string(), None)
            .await
            .expect("write the watched key");
        written.push(resp.header().map_or(0, |h| h.revision()));
        tokio::time::sleep(WRITE_EVERY).await;
    }
    let mut clients: Vec<Received> = Vec::new();
    let all = async {
        for (_, task) in grpc {
            clients.extend(task.await.expect("a gRPC stream's collector"));
        }
        for task in sse {
            clients.push(task.await.expect("an SSE collector"));
        }
    };
    tokio::time::timeout(Duration::from_secs(120), all)
        .await
        .expect("every client gets every event within 2 minutes");
    assert_eq!(
        clients.len(),
        GRPC_STREAMS * WATCHES_PER_STREAM + SSE_CLIENTS
    );
    let mut first: HashMap<i64, Instant> = HashMap::new();
    for client in &clients {
        let revisions: Vec<i64> = client.iter().map(|(r, _)| *r).collect();
        assert_eq!(revisions, written, "a client missed, repeated or reordered");
        for (revision, at) in client {
            let earliest = first.entry(*revision).or_insert(*at);
            *earliest = (*earliest).min(*at);
        }
    }
    let mut delays: Vec<Duration> = clients
        .iter()
        .flat_map(|c| c.iter().map(|(r, at)| *at - first[r]))
        .collect();
    delays.sort();
    eprintln!(
        "jitter {jitter}: delivery after the first of each event p10 {:?} p50 {:?} p90 {:?} max {:?}",
        quantile(&delays, 0.1),
        quantile(&delays, 0.5),
        quantile(&delays, 0.9),
        delays[delays.len() - 1]
    );
    delays
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_watchers_are_one_upstream_watch_and_get_every_event_spread_over_the_jitter() {
    let cluster = Cluster::start(cell_binary(), 3, &[]).await;
    let bunched = fan_out(&cluster, "fan/0", "0s").await;
    let spread = fan_out(&cluster, "fan/200", "200ms").await;
    // With 200 ms, the deliveries spread over the window: the middle half
    // of them spans about half of it (100 ms if perfectly even), and the
    // median moves later than without jitter. Both are lower bounds, which
    // load does not break: how soon deliveries come is speed, which the load test
    // measures (`watch-fanout`, docs/capacity.md). Clock bounds here (no
    // jitter: p50 under 80 ms; with it: the latest, then p90, at most the
    // window plus 300 ms later) failed on loaded CI runs of a debug build,
    // where the no-jitter run alone had p50 72-198 ms and a maximum of
    // 1.6-2 s, while every client still got every event in order.
    let (p25, p50, p75) = (
        quantile(&spread, 0.25),
        quantile(&spread, 0.5),
        quantile(&spread, 0.75),
    );
    eprintln!("jitter 200ms: p25 {p25:?} p50 {p50:?} p75 {p75:?}");
    assert!(
        p75 - p25 >= Duration::from_millis(50),
        "jitter 200ms: the middle half of the deliveries spans only {:?} (p25 {p25:?}, p75 {p75:?})",
        p75 - p25
    );
    assert!(
        quantile(&spread, 0.5) >= quantile(&bunched, 0.5) + Duration::from_millis(40),
        "the jitter spread nothing"
    );
}
