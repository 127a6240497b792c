//! The HTTP watch (Server-Sent Events): a client that leaves ends the
//! watch on the cell too, and a client that reconnects with
//! `Last-Event-ID` gets every event after the last whole revision it saw.

use crate::proxy_bin;
use futures::StreamExt;
use latchkey_testkit::{eventually, ProxyProcess};
use tokio::time::Duration;

/// Reads SSE text from `body` until `blocks` events (blank-line separated)
/// have arrived; bounded by 10 s.
pub(crate) async fn events(
    body: &mut (impl futures::Stream<Item = reqwest::Result<bytes::Bytes>> + Unpin),
    blocks: usize,
) -> Vec<String> {
    let mut text = String::new();
    let read = async {
        while text.matches("\n\n").count() < blocks {
            match body.next().await {
                Some(Ok(chunk)) => text.push_str(&String::from_utf8_lossy(&chunk)),
                other => panic!("the stream ended: {other:?} after {text:?}"),
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(10), read)
        .await
        .unwrap_or_else(|_| panic!("{blocks} events did not arrive: {text:?}"));
    text.split("\n\n")
        .filter(|b| !b.trim().is_empty() && !b.starts_with(':'))
        .map(str::to_string)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_leaves_a_watch_ends_it_on_the_cell() {
    // --dev: the cell runs in the proxy's process, so the proxy's /metrics
    // shows the cell's watchers too.
    let proxy = ProxyProcess::dev(proxy_bin()).await;
    let http = reqwest::Client::new();
    let base = format!("http://{}", proxy.http);
    http.put(format!("{base}/v1/kv/w"))
        .body("1")
        .send()
        .await
        .expect("put");
    let resp = http
        .get(format!("{base}/v1/watch/w?from_revision=1"))
        .send()
        .await
        .expect("watch");
    assert_eq!(resp.status(), 200);
    let mut body = Box::pin(resp.bytes_stream());
    let seen = events(&mut body, 1).await;
    assert!(seen[0].starts_with("event: put"), "{seen:?}");
    eventually(Duration::from_secs(10), async || {
        match proxy.metric("latchkey_watchers").await {
            Some(1.0) => Ok(()),
            other => Err(format!("the cell serves {other:?} watchers, not 1")),
        }
    })
    .await;
    drop(body);
    eventually(Duration::from_secs(10), async || {
        match proxy.metric("latchkey_watchers").await {
            Some(0.0) => Ok(()),
            other => Err(format!(
                "the cell still serves {other:?} watchers after the client left"
            )),
        }
    })
    .await;
    // Every metric this process recorded, the proxy's and the embedded
    // cell's, has its catalog entry's HELP text.
    let undescribed = latchkey_testkit::metrics::undescribed(&proxy.metrics().await);
    assert!(
        undescribed.is_empty(),
        "metrics without a description (add them to the crate's metrics_catalog): {}",
        undescribed.join(", ")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resumed_watch_gets_every_event_after_the_last_whole_revision() {
    let proxy = ProxyProcess::dev(proxy_bin()).await;
    let http = reqwest::Client::new();
    let base = format!("http://{}", proxy.http);
    // One revision that writes two keys.
    let txn = r#"{"success": [{"put": {"key": "r/a", "value": "1"}}, {"put": {"key": "r/b", "value": "2"}}]}"#;
    let answer: serde_json::Value = http
        .post(format!("{base}/v1/txn"))
        .body(txn)
        .send()
        .await
        .expect("txn")
        .json()
        .await
        .expect("json");
    let revision = answer["revision"].as_i64().expect("revision");
    let resp = http
        .get(format!("{base}/v1/watch/r/?prefix&from_revision=1"))
        .send()
        .await
        .expect("watch");
    let mut body = Box::pin(resp.bytes_stream());
    let seen = events(&mut body, 2).await;
    assert!(
        !seen[0].contains("\nid: "),
        "the first event of a revision has no id: {seen:?}"
    );
    assert!(
        seen[1].contains(&format!("\nid: {revision}\n")),
        "the last one has: {seen:?}"
    );
    drop(body);
    // Resuming after the revision before it replays both events of it.
    let resp = http
        .get(format!("{base}/v1/watch/r/?prefix"))
        .header("Last-Event-ID", (revision - 1).to_string())
        .send()
        .await
        .expect("watch");
    let mut body = Box::pin(resp.bytes_stream());
    let again = events(&mut body, 2).await;
    assert_eq!(again, seen);
}
