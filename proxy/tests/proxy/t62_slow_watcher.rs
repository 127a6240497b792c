//! A client that stops reading (issue 12, Done-when 3): once its buffer
//! (`--watch-buffer` revisions) is full it is cancelled, with a reason
//! that names the revision to resume from; the other clients of the same
//! shared watch get every event; and the proxy's memory stops growing
//! with the writes that follow.

use crate::{member_addrs, proxy_bin, raw_watch_stream};
use futures::StreamExt;
use latchkey_testkit::{cell_binary, Cluster, ProxyProcess};
use std::time::Duration;
use tokio::sync::mpsc;

const KEY: &str = "slow/k";
const VALUE_BYTES: usize = 60 * 1024;

/// The proxy's resident memory, in bytes.
fn rss(pid: u32) -> u64 {
    latchkey_testkit::process::rss_bytes(pid).expect("the proxy is running")
}

async fn write(writer: &mut etcd_client::Client, n: usize, written: &mut Vec<i64>) {
    let value = vec![b'x'; VALUE_BYTES];
    for _ in 0..n {
        let resp = writer.put(KEY, value.clone(), None).await.expect("put");
        written.push(resp.header().map_or(0, |h| h.revision()));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_stops_reading_is_cancelled_and_slows_nobody_else() {
    let cluster = Cluster::start(cell_binary(), 3, &[]).await;
    let leader = cluster.wait_leader(Duration::from_secs(20)).await;
    let proxy = ProxyProcess::start(
        proxy_bin(),
        &member_addrs(&cluster),
        &["--watch-buffer", "64", "--fanout-jitter", "0s"],
    )
    .await;
    // The slow client: a watch it never reads past "created".
    let channel = latchkey_shared::client::connect(&proxy.grpc)
        .await
        .expect("connect");
    let (requests, mut slow) = raw_watch_stream(channel, KEY, 0, 1).await;

    // Five clients that keep reading, each on its own connection.
    let mut readers = Vec::new();
    for _ in 0..5 {
        let mut client = etcd_client::Client::connect([format!("http://{}", proxy.grpc)], None)
            .await
            .expect("connect");
        let mut stream = client.watch(KEY, None).await.expect("watch");
        let (tx, rx) = mpsc::unbounded_channel();
        tokio::spawn(async move {
            let _keep = client;
            while let Ok(Some(resp)) = stream.message().await {
                for event in resp.events() {
                    if let Some(kv) = event.kv() {
                        let _ = tx.send(kv.mod_revision());
                    }
                }
                if resp.canceled() {
                    return;
                }
            }
        });
        readers.push(rx);
    }

    let mut writer = cluster.client(leader).await;
    let mut written = Vec::new();
    let mut dropped = false;
    while written.len() < 3000 && !dropped {
        write(&mut writer, 50, &mut written).await;
        dropped = proxy
            .metric("latchkey_proxy_slow_watchers_total")
            .await
            .unwrap_or(0.0)
            >= 1.0;
    }
    assert!(
        dropped,
        "{} writes of {VALUE_BYTES} bytes and the client that does not read is still served",
        written.len()
    );
    let at_drop = rss(proxy.pid());
    write(&mut writer, 1000, &mut written).await;
    let after = rss(proxy.pid());
    eprintln!(
        "dropped after {} writes; proxy RSS {} MiB then {} MiB after 1000 more writes of {} KiB",
        written.len() - 1000,
        at_drop >> 20,
        after >> 20,
        VALUE_BYTES >> 10
    );
    assert!(
        after < at_drop + (32 << 20),
        "the proxy grew from {} MiB to {} MiB",
        at_drop >> 20,
        after >> 20
    );

    // The slow client reads again: what was queued for it, in order, then
    // the cancel that says where to resume.
    let mut got = Vec::new();
    let reason = loop {
        let resp = tokio::time::timeout(Duration::from_secs(30), slow.next())
            .await
            .expect("the slow stream answers")
            .expect("an answer")
            .expect("not an error");
        got.extend(
            resp.events
                .iter()
                .filter_map(|e| e.kv.as_ref().map(|kv| kv.mod_revision)),
        );
        if resp.canceled {
            break resp.cancel_reason;
        }
    };
    assert_eq!(
        got,
        written[..got.len()].to_vec(),
        "in order, from the first write"
    );
    assert!(
        reason.contains(&format!(
            "watch again from revision {}",
            got.last().map_or(0, |r| r + 1)
        )),
        "the cancel reason: {reason:?}"
    );
    drop(requests);
    // The others got everything, in order.
    let last = *written.last().expect("writes");
    for mut reader in readers {
        let mut got = Vec::new();
        while got.last() != Some(&last) {
            match tokio::time::timeout(Duration::from_secs(60), reader.recv()).await {
                Ok(Some(revision)) => got.push(revision),
                other => panic!(
                    "a reading client stopped after {} events: {other:?}",
                    got.len()
                ),
            }
        }
        assert_eq!(got, written, "a reading client missed or reordered events");
    }
}
