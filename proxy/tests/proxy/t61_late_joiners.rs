//! Late joiners and a member's death (issue 12, Done-when 2): 50 client
//! watches that start from older revisions while the shared watch is live
//! (some inside the proxy's history, most before it, so they catch up on
//! their own first) each receive exactly the events after their start
//! once; meanwhile the member serving the shared watch is SIGKILLed, and
//! no client sees a gap or a duplicate.

use crate::{member_addrs, proxy_bin, raw_watch_stream};
use futures::StreamExt;
use latchkey_testkit::{cell_binary, Cluster, ProxyProcess};
use std::time::Duration;
use tokio::sync::mpsc;

const KEY: &str = "late/k";
const WRITES: usize = 200;
const JOINERS: usize = 50;

/// Forwards the revisions of every event a raw watch stream receives,
/// until the stream ends or is cancelled.
fn collect(
    requests: mpsc::UnboundedSender<latchkey_shared::etcdpb::PbWatchRequest>,
    mut answers: tonic::Streaming<latchkey_shared::etcdpb::PbWatchResponse>,
) -> mpsc::UnboundedReceiver<i64> {
    let (tx, rx) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        let _open = requests;
        while let Some(Ok(resp)) = answers.next().await {
            for event in &resp.events {
                let _ = tx.send(event.kv.as_ref().map_or(0, |kv| kv.mod_revision));
            }
            if resp.canceled {
                eprintln!("cancelled: {resp:?}");
                return;
            }
        }
    });
    rx
}

/// Everything `rx` receives up to and including `last`.
async fn until(rx: &mut mpsc::UnboundedReceiver<i64>, last: i64, who: &str) -> Vec<i64> {
    let mut got = Vec::new();
    while got.last().is_none_or(|r| *r < last) {
        match tokio::time::timeout(Duration::from_secs(60), rx.recv()).await {
            Ok(Some(revision)) => got.push(revision),
            other => panic!("{who} stopped after {got:?}: {other:?}"),
        }
    }
    got
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn late_joiners_get_every_event_after_their_start_once_across_a_member_kill() {
    let mut cluster = Cluster::start(cell_binary(), 3, &[]).await;
    cluster.wait_leader(Duration::from_secs(20)).await;
    // A short history: most joiners start before it and catch up first.
    let proxy = ProxyProcess::start(
        proxy_bin(),
        &member_addrs(&cluster),
        &["--watch-history", "16", "--fanout-jitter", "20ms"],
    )
    .await;
    let channel = latchkey_shared::client::connect(&proxy.grpc)
        .await
        .expect("connect");
    let (requests, answers) = raw_watch_stream(channel.clone(), KEY, 0, 1).await;
    let mut reference = collect(requests, answers);
    // The member serving the shared watch: the only one with a watcher.
    let mut host = None;
    for id in cluster.running() {
        if cluster.metric(id, "latchkey_watchers").await == Some(1.0) {
            host = Some(id);
        }
    }
    let host = host.expect("a member serves the shared watch");

    let mut writer = etcd_client::Client::connect([format!("http://{}", proxy.grpc)], None)
        .await
        .expect("connect the writer");
    let mut rng = 0x9e37_79b9_u64;
    let mut next = move |n: u64| {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng % n
    };
    let mut first = None;
    let mut current = 0;
    let mut joiners = Vec::new();
    let mut unknown = 0;
    for i in 0..WRITES {
        if i == WRITES / 2 {
            eprintln!("killing member {host}, which serves the shared watch");
            cluster.kill(host);
        }
        let key = if next(3) == 0 { "late/other" } else { KEY };
        match writer.put(key, i.to_string(), None).await {
            Ok(resp) => {
                current = resp.header().map_or(0, |h| h.revision());
                first.get_or_insert(current);
            }
            Err(_) => unknown += 1,
        }
        if i % (WRITES / JOINERS) == 0 {
            if let Some(first) = first {
                let start = first + next((current - first + 1) as u64) as i64;
                let (requests, answers) = raw_watch_stream(channel.clone(), KEY, start, 1).await;
                joiners.push((start, collect(requests, answers)));
            }
        }
        tokio::time::sleep(Duration::from_millis(next(30))).await;
    }
    let last = writer
        .put(KEY, "end", None)
        .await
        .expect("the last write")
        .header()
        .map_or(0, |h| h.revision());
    let seen = until(&mut reference, last, "the live watch").await;
    assert!(
        seen.windows(2).all(|w| w[0] < w[1]),
        "the live watch repeated or reordered: {seen:?}"
    );
    assert!(
        seen.len() + unknown >= WRITES * 6 / 10,
        "the live watch saw only {} events",
        seen.len()
    );
    assert_eq!(joiners.len(), JOINERS);
    for (start, mut rx) in joiners {
        let got = until(&mut rx, last, &format!("the joiner from {start}")).await;
        let want: Vec<i64> = seen.iter().copied().filter(|r| *r >= start).collect();
        assert_eq!(got, want, "the joiner from {start}");
    }
}
