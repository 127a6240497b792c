//! Watch resources through a proxy are bounded and never leak (review
//! finding P4): catch-up watches that end give back their shared watch, a
//! member's refusal of a watch is answered at once and the proxy opens
//! another stream to that member, and a client is held to the proxy's
//! limits on watches per stream and per proxy.

use crate::t80_locks::Api;
use crate::{member_addrs, proxy_bin};
use latchkey_shared::etcd_methods::watch::WATCH;
use latchkey_shared::etcdpb::{PbWatchRequest, PbWatchRequestUnion, PbWatchResponse};
use latchkey_testkit::{cell_binary, eventually, Cluster, ProxyProcess};
use serde_json::json;
use std::time::Duration;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_stream::StreamExt;

/// One raw Watch stream through the proxy, driven request by request.
struct RawStream {
    requests: mpsc::UnboundedSender<PbWatchRequest>,
    answers: tonic::Streaming<PbWatchResponse>,
}

impl RawStream {
    async fn open(grpc: &str) -> RawStream {
        let channel = latchkey_shared::client::connect(grpc)
            .await
            .expect("connect");
        let (requests, up) = mpsc::unbounded_channel();
        let answers =
            latchkey_shared::client::call::streaming::<PbWatchRequest, PbWatchResponse, _>(
                channel,
                WATCH,
                tonic::Request::new(tokio_stream::wrappers::UnboundedReceiverStream::new(up)),
            )
            .await
            .expect("a watch stream");
        RawStream { requests, answers }
    }

    fn send(&self, request: PbWatchRequestUnion) {
        self.requests
            .send(PbWatchRequest {
                request_union: Some(request),
            })
            .expect("the stream is open");
    }

    /// Creates watch `id` of `key` from `start_revision`: its first answer.
    async fn create(&mut self, id: i64, key: &str, start_revision: i64) -> PbWatchResponse {
        let mut create = PbWatchRequestUnion::CreateRequest(Default::default());
        if let PbWatchRequestUnion::CreateRequest(c) = &mut create {
            c.key = key.as_bytes().to_vec();
            c.start_revision = start_revision;
            c.watch_id = id;
        }
        self.send(create);
        self.next_of(id).await
    }

    async fn cancel(&mut self, id: i64) {
        let mut cancel = PbWatchRequestUnion::CancelRequest(Default::default());
        if let PbWatchRequestUnion::CancelRequest(c) = &mut cancel {
            c.watch_id = id;
        }
        self.send(cancel);
        loop {
            if self.next_of(id).await.canceled {
                return;
            }
        }
    }

    /// The next answer for watch `id` (others are skipped), within 10 s.
    async fn next_of(&mut self, id: i64) -> PbWatchResponse {
        tokio::time::timeout(Duration::from_secs(10), async {
            loop {
                let resp = self
                    .answers
                    .next()
                    .await
                    .expect("the stream stays open")
                    .expect("an answer");
                if resp.watch_id == id {
                    return resp;
                }
            }
        })
        .await
        .unwrap_or_else(|_| panic!("no answer for watch {id} in 10 s"))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn catch_ups_that_end_leak_nothing_and_a_full_member_stream_is_answered_at_once() {
    let cluster = Cluster::start(cell_binary(), 1, &["--max-watches-per-stream", "50"]).await;
    let proxy = ProxyProcess::start(proxy_bin(), &member_addrs(&cluster), &[]).await;
    let api = Api::of(&proxy);
    let put = |key: String| {
        let api = api.clone();
        async move {
            let resp = api
                .http
                .put(format!("{}/kv/{key}", api.base))
                .body("v")
                .send()
                .await
                .expect("put");
            assert_eq!(resp.status(), 200);
        }
    };
    put("seed".to_string()).await;

    // 150 watches of fresh keys from revision 1 (each a catch-up: a fresh
    // key's shared watch starts at the next revision), each cancelled.
    let mut stream = RawStream::open(&proxy.grpc).await;
    for i in 0..150 {
        let created = stream.create(i + 1, &format!("x/{i}"), 1).await;
        assert!(created.created && !created.canceled, "{created:?}");
        stream.cancel(i + 1).await;
    }
    let upstream = eventually(Duration::from_secs(10), async || {
        let proxy_side = proxy.metric("latchkey_proxy_upstream_watches").await;
        let cell_side = cluster.metric(1, "latchkey_watchers").await;
        match (proxy_side, cell_side) {
            (Some(0.0), Some(0.0)) => Ok(()),
            other => Err(format!("upstream watches (proxy, cell) still {other:?}")),
        }
    })
    .await;
    let () = upstream;

    // 120 live watches of fresh keys, past the member's 50 per stream:
    // each is created at once, on as many streams as it takes.
    let mut slowest = Duration::ZERO;
    for i in 0..120 {
        let asked = Instant::now();
        let created = stream.create(1000 + i, &format!("y/{i}"), 0).await;
        slowest = slowest.max(asked.elapsed());
        assert!(created.created && !created.canceled, "{created:?}");
    }
    assert!(
        slowest < Duration::from_secs(1),
        "a watch took {slowest:?} to be created"
    );
    let streams = proxy
        .metric("latchkey_proxy_upstream_watch_streams")
        .await
        .unwrap_or(0.0);
    assert!(
        streams >= 3.0,
        "120 watches on {streams} member streams of 50"
    );
    for i in 0..120 {
        put(format!("y/{i}")).await;
        let event = stream.next_of(1000 + i).await;
        assert_eq!(event.events.len(), 1, "{event:?}");
    }

    // A contender that must wait keeps waiting (its wait is one more
    // upstream watch), and times out as asked.
    let sessions = api.sessions(2).await;
    let (status, held) = api
        .post("/locks/busy/acquire", json!({"session_id": sessions[0]}))
        .await;
    assert_eq!(status, 200, "{held}");
    let (status, waited) = api
        .post(
            "/locks/busy/acquire",
            json!({"session_id": sessions[1], "timeout_ms": 2000}),
        )
        .await;
    assert_eq!(
        (status, waited["error"].as_str()),
        (408, Some("lock_timeout")),
        "{waited}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_is_held_to_the_watch_limits_per_stream_and_per_proxy() {
    let proxy = ProxyProcess::spawn(
        proxy_bin(),
        &[
            "--dev",
            "--max-watches",
            "8",
            "--max-watches-per-stream",
            "5",
        ],
    )
    .await;
    let mut stream = RawStream::open(&proxy.grpc).await;
    for i in 1..=5 {
        let created = stream.create(i, &format!("l/{i}"), 0).await;
        assert!(created.created && !created.canceled, "{created:?}");
    }
    let refused = stream.create(6, "l/6", 0).await;
    assert!(
        refused.canceled
            && refused
                .cancel_reason
                .contains("too many watches on one stream"),
        "{refused:?}"
    );

    // Three more over SSE make eight; a ninth is refused.
    let http = reqwest::Client::new();
    let sse = |key: &str| {
        let url = format!("http://{}/v1/watch/{key}", proxy.http);
        let http = http.clone();
        async move { http.get(url).send().await.expect("watch over SSE") }
    };
    let mut open = Vec::new();
    for key in ["s/1", "s/2", "s/3"] {
        let resp = sse(key).await;
        assert_eq!(resp.status(), 200);
        open.push(resp);
    }
    let refused = sse("s/4").await;
    assert_eq!(refused.status(), 429);
    let body: serde_json::Value = refused.json().await.expect("JSON");
    assert_eq!(body["error"], "too_many_watches", "{body}");
    // A watch given back makes room.
    stream.cancel(1).await;
    let resp = eventually(Duration::from_secs(5), async || {
        let resp = sse("s/4").await;
        match resp.status().as_u16() {
            200 => Ok(resp),
            other => Err(format!("status {other}")),
        }
    })
    .await;
    open.push(resp);
}
