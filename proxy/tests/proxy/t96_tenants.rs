//! Tenants through a proxy: the tenants API passed through to the cell,
//! and a tenant's quota refusing a write over gRPC (ResourceExhausted, as
//! etcd's "database space exceeded") and over HTTP (429 `quota_exceeded`,
//! retry never, naming the tenant), another tenant unaffected.

use crate::{member_addrs, proxy_bin};
use latchkey_shared::tenants_pb::tenants_client::TenantsClient;
use latchkey_shared::tenants_pb::{Tenant, TenantGetRequest, TenantPutRequest};
use latchkey_testkit::auth_matrix::{code, connect_anonymous};
use latchkey_testkit::{cell_binary, Cluster, ProxyProcess};
use serde_json::Value;
use tonic::Code;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenants_quota_through_a_proxy_on_both_faces() {
    let cluster = Cluster::start(cell_binary(), 1, &[]).await;
    let proxy = ProxyProcess::start(proxy_bin(), &member_addrs(&cluster), &[]).await;
    let grpc = format!("http://{}", proxy.grpc);
    let mut admin = TenantsClient::connect(grpc.clone()).await.expect("connect");
    for (name, prefix) in [("acme", "acme/"), ("globex", "globex/")] {
        admin
            .put(TenantPutRequest {
                tenant: Some(Tenant {
                    name: name.into(),
                    prefixes: vec![prefix.as_bytes().to_vec()],
                    max_keys: 1,
                    ..Default::default()
                }),
            })
            .await
            .expect("tenant put through the proxy");
    }
    let mut kv = connect_anonymous(&grpc).await;
    kv.put("acme/1", "v", None).await.expect("the one key");
    let e = kv.put("acme/2", "v", None).await.expect_err("a second");
    assert_eq!(code(&e), Code::ResourceExhausted, "{e}");

    let resp = reqwest::Client::new()
        .put(format!("http://{}/v1/kv/acme/3", proxy.http))
        .body("v")
        .send()
        .await
        .expect("http put");
    assert_eq!(resp.status().as_u16(), 429);
    let body: Value = resp.json().await.expect("json");
    assert_eq!(body["error"], "quota_exceeded", "{body}");
    assert_eq!(body["retry"], "never", "{body}");
    assert!(
        body["message"]
            .as_str()
            .is_some_and(|m| m.contains("tenant acme")),
        "{body}"
    );
    kv.put("globex/1", "v", None)
        .await
        .expect("another tenant's first key");
    let usage = admin
        .get(TenantGetRequest {
            name: "acme".into(),
        })
        .await
        .expect("tenant get")
        .into_inner()
        .info
        .and_then(|i| i.usage)
        .expect("usage");
    assert_eq!(usage.keys, 1);

    // The HTTP routes: put, read, list, delete.
    let http = reqwest::Client::new();
    let url = |path: &str| format!("http://{}{path}", proxy.http);
    let resp = http
        .put(url("/v1/admin/tenants/initech"))
        .json(&serde_json::json!({"prefixes": ["initech/"], "max_keys": 1}))
        .send()
        .await
        .expect("put");
    assert_eq!(resp.status().as_u16(), 200);
    let resp = http
        .put(url("/v1/admin/tenants/initech2"))
        .json(&serde_json::json!({"prefixes": ["initech/x"]}))
        .send()
        .await
        .expect("put");
    assert_eq!(resp.status().as_u16(), 400, "an overlapping prefix");
    kv.put("initech/1", "v", None).await.expect("its one key");
    let state: Value = http
        .get(url("/v1/admin/tenants/initech"))
        .send()
        .await
        .expect("get")
        .json()
        .await
        .expect("json");
    assert_eq!(
        (state["keys"].as_u64(), state["bytes"].as_u64()),
        (Some(1), Some(10)),
        "{state}"
    );
    let list: Value = http
        .get(url("/v1/admin/tenants"))
        .send()
        .await
        .expect("list")
        .json()
        .await
        .expect("json");
    let names: Vec<&str> = list["tenants"]
        .as_array()
        .expect("tenants")
        .iter()
        .filter_map(|t| t["name"].as_str())
        .collect();
    assert_eq!(names, ["acme", "globex", "initech"]);
    let resp = http
        .delete(url("/v1/admin/tenants/initech"))
        .send()
        .await
        .expect("delete");
    assert_eq!(resp.status().as_u16(), 200);
    let resp = http
        .get(url("/v1/admin/tenants/initech"))
        .send()
        .await
        .expect("get");
    assert_eq!(resp.status().as_u16(), 404);
    let body: Value = resp.json().await.expect("json");
    assert_eq!(body["error"], "tenant_not_found", "{body}");
}

/// A tenant's request rate at a proxy with `--rate-share 0.5`: 10/s for
/// the tenant is 5/s here, a burst of 5; past it gRPC answers
/// ResourceExhausted and HTTP 429 `rate_limited` with Retry-After, while
/// another tenant's requests, sent at the same time, all pass. A third
/// tenant's `max_watches` of 2 is 1 here: a second watch is refused on
/// both faces until the first ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenants_request_rate_and_watches_at_a_proxy_from_its_share() {
    use std::time::{Duration, Instant};

    let cluster = Cluster::start(cell_binary(), 1, &[]).await;
    let proxy = ProxyProcess::start(
        proxy_bin(),
        &member_addrs(&cluster),
        &["--rate-share", "0.5"],
    )
    .await;
    let grpc = format!("http://{}", proxy.grpc);
    let mut admin = TenantsClient::connect(grpc.clone()).await.expect("connect");
    let tenants = [
        ("acme", "acme/", 10, 0),
        ("globex", "globex/", 0, 0),
        ("initech", "initech/", 0, 2),
    ];
    for (name, prefix, rate, watches) in tenants {
        let tenant = Tenant {
            name: name.into(),
            prefixes: vec![prefix.as_bytes().to_vec()],
            requests_per_second: rate,
            max_watches: watches,
            ..Default::default()
        };
        admin
            .put(TenantPutRequest {
                tenant: Some(tenant),
            })
            .await
            .expect("tenant put");
    }
    let http = reqwest::Client::new();
    let url = |path: &str| format!("http://{}{path}", proxy.http);
    // The proxy reads the tenants every second: over HTTP, until a 429.
    // Reads, many at once: a put may take longer than 1/rate by itself.
    let deadline = Instant::now() + Duration::from_secs(10);
    let limited = 'found: loop {
        let reads = (0..20).map(|_| http.get(url("/v1/kv/acme/h")).send());
        for resp in futures::future::join_all(reads).await {
            let resp = resp.expect("http get");
            match resp.status().as_u16() {
                429 => break 'found resp,
                status => assert!(status == 200 || status == 404, "{status}"),
            }
        }
        assert!(Instant::now() < deadline, "no 429 within 10 s");
    };
    let wait: u64 = limited.headers()["retry-after"]
        .to_str()
        .expect("ascii")
        .parse()
        .expect("seconds");
    assert!((1..=2).contains(&wait), "Retry-After {wait}");
    let body: Value = limited.json().await.expect("json");
    assert_eq!(body["error"], "rate_limited", "{body}");
    assert!(
        body["message"].as_str().is_some_and(|m| m.contains("acme")),
        "{body}"
    );

    // A full bucket again, then 40 reads for each tenant at once.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let client = connect_anonymous(&grpc).await;
    let started = Instant::now();
    let read = |key: String| {
        let mut client = client.clone();
        async move { client.get(key, None).await }
    };
    let acme_run = futures::future::join_all((0..40).map(|i| read(format!("acme/{i}"))));
    let globex_run = futures::future::join_all((0..40).map(|i| read(format!("globex/{i}"))));
    let (acme, globex) = tokio::join!(acme_run, globex_run);
    let took = started.elapsed();
    for answer in globex {
        answer.expect("another tenant is never refused");
    }
    let (mut passed, mut refused) = (0u32, 0u32);
    for answer in acme {
        match answer {
            Ok(_) => passed += 1,
            Err(e) => {
                assert_eq!(code(&e), Code::ResourceExhausted, "{e}");
                refused += 1;
            }
        }
    }
    // 5 at once and 5 a second after, however long the run took.
    let most = 5.0 + 5.0 * took.as_secs_f64() + 1.0;
    assert!(
        passed >= 5 && f64::from(passed) <= most,
        "{passed} passed, {refused} refused in {took:?} (at most {most})"
    );
    assert_eq!(passed + refused, 40);

    let metrics = http
        .get(format!("http://{}/metrics", proxy.metrics))
        .send()
        .await
        .expect("metrics")
        .text()
        .await
        .expect("text");
    assert!(
        metrics
            .lines()
            .any(|l| l.starts_with("latchkey_proxy_rate_limited_total")
                && l.contains("tenant=\"acme\"")),
        "{metrics}"
    );

    // Watches: one here (2 x 0.5); the second is refused on both faces.
    let mut watcher = client.clone();
    let mut first_events = watcher
        .watch(
            "initech/",
            Some(etcd_client::WatchOptions::new().with_prefix()),
        )
        .await
        .expect("watch");
    let created = first_events
        .message()
        .await
        .expect("created")
        .expect("message");
    assert!(created.created() && !created.canceled(), "{created:?}");
    let mut second_events = watcher
        .watch("initech/x", None)
        .await
        .expect("watch stream");
    let refused = second_events
        .message()
        .await
        .expect("answer")
        .expect("message");
    assert!(refused.canceled(), "{refused:?}");
    // etcd's words for a quota, which its clients know.
    assert_eq!(
        refused.cancel_reason(),
        "etcdserver: mvcc: database space exceeded"
    );
    let resp = http
        .get(url("/v1/watch/initech/y"))
        .send()
        .await
        .expect("SSE watch");
    assert_eq!(resp.status().as_u16(), 429);
    let body: Value = resp.json().await.expect("json");
    assert_eq!(body["error"], "quota_exceeded", "{body}");
    assert!(
        body["message"]
            .as_str()
            .is_some_and(|m| m.contains("initech")),
        "{body}"
    );
    // The first ends: its place is free again.
    drop(first_events);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let resp = http
            .get(url("/v1/watch/initech/y"))
            .send()
            .await
            .expect("SSE watch");
        if resp.status().as_u16() == 200 {
            break;
        }
        assert_eq!(resp.status().as_u16(), 429);
        assert!(Instant::now() < deadline, "the place was not given back");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
