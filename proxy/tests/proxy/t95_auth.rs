//! Identities through a proxy: the permission matrix over gRPC with the
//! proxy acting for each client (its Auth API, KV and lease calls carry the
//! client's token; shared watches, keep-alives and the lock and election
//! recipes run only after the cell has said the client may), etcdctl's
//! auth commands, and the HTTP face's tokens with 401 and 403.

use crate::{member_addrs, proxy_bin};
use latchkey_testkit::auth_matrix::{self, PROXY, ROOT, WORKER};
use latchkey_testkit::{cell_binary, Cluster, ProxyProcess};
use serde_json::{json, Value};

/// A proxy in front of `cluster` that authenticates to it as its own user
/// (root and the proxy role).
async fn proxy_as_root(cluster: &Cluster, dir: &tempfile::TempDir) -> ProxyProcess {
    let password = dir.path().join("cell-password");
    std::fs::write(&password, format!("{}\n", PROXY.1)).expect("password file");
    let password = password.to_str().expect("utf8 path").to_string();
    ProxyProcess::start(
        proxy_bin(),
        &member_addrs(cluster),
        &["--cell-user", PROXY.0, "--cell-password-file", &password],
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn permission_matrix_through_a_proxy_over_grpc() {
    let cluster = Cluster::start(cell_binary(), 3, &[]).await;
    let dir = tempfile::tempdir().expect("temp dir");
    let proxy = proxy_as_root(&cluster, &dir).await;
    let ep = format!("http://{}", proxy.grpc);
    // Users, roles and auth on through the proxy's Auth API.
    auth_matrix::configure(&ep).await;
    auth_matrix::wait_until_proxy_enforces(&ep).await;
    auth_matrix::check(&ep).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcdctl_auth_commands_through_a_proxy() {
    let cluster = Cluster::start(cell_binary(), 1, &[]).await;
    let proxy = ProxyProcess::start(proxy_bin(), &member_addrs(&cluster), &[]).await;
    auth_matrix::etcdctl_session(&proxy.grpc).await;
}

/// `POST /v1/auth/token`, then `Authorization: Bearer`: allowed, 403 and
/// 401 answers with the error table's names, for keys, sessions, locks,
/// watches and the admin routes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_tokens_and_permissions() {
    let cluster = Cluster::start(cell_binary(), 1, &[]).await;
    let dir = tempfile::tempdir().expect("temp dir");
    let proxy = proxy_as_root(&cluster, &dir).await;
    auth_matrix::configure(&format!("http://{}", proxy.grpc)).await;
    auth_matrix::wait_until_proxy_enforces(&format!("http://{}", proxy.grpc)).await;
    let http = reqwest::Client::new();
    let base = format!("http://{}", proxy.http);
    let call =
        async |method: reqwest::Method, path: &str, token: Option<&str>, body: Option<Value>| {
            let mut req = http.request(method, format!("{base}{path}"));
            if let Some(t) = token {
                req = req.bearer_auth(t);
            }
            if let Some(b) = body {
                req = req.json(&b);
            }
            let resp = req.send().await.expect("request");
            let status = resp.status().as_u16();
            let text = resp.text().await.unwrap_or_default();
            let json: Value = serde_json::from_str(&text).unwrap_or(Value::String(text));
            (status, json)
        };
    let token_of = async |name: &str, password: &str| {
        let (status, body) = call(
            reqwest::Method::POST,
            "/v1/auth/token",
            None,
            Some(json!({"name": name, "password": password})),
        )
        .await;
        (status, body)
    };
    let (status, body) = token_of(WORKER.0, WORKER.1).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["ttl_seconds"], 300);
    let worker = body["token"].as_str().expect("token").to_string();
    let (status, body) = token_of(ROOT.0, ROOT.1).await;
    assert_eq!(status, 200, "{body}");
    let root = body["token"].as_str().expect("token").to_string();
    // Wrong password and unknown user: the same 401.
    for (name, password) in [(WORKER.0, "wrong"), ("mallory", "wrong")] {
        let (status, body) = token_of(name, password).await;
        assert_eq!(
            (status, body["error"].as_str()),
            (401, Some("auth_failed")),
            "{body}"
        );
    }

    let put = reqwest::Method::PUT;
    let get = reqwest::Method::GET;
    let post = reqwest::Method::POST;
    let (status, body) = call(
        put.clone(),
        "/v1/kv/jobs/h1",
        Some(&worker),
        Some(json!({"value": "x"})),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let (status, body) = call(
        put.clone(),
        "/v1/kv/config/h1",
        Some(&worker),
        Some(json!({"value": "x"})),
    )
    .await;
    assert_eq!(
        (status, body["error"].as_str()),
        (403, Some("permission_denied")),
        "{body}"
    );
    assert_eq!(body["retry"], "never");
    let (status, body) = call(get.clone(), "/v1/kv/jobs/h1", None, None).await;
    assert_eq!(
        (status, body["error"].as_str()),
        (401, Some("user_empty")),
        "{body}"
    );
    let (status, body) = call(get.clone(), "/v1/kv/jobs/h1", Some("not.a-token"), None).await;
    assert_eq!(
        (status, body["error"].as_str()),
        (401, Some("invalid_auth_token")),
        "{body}"
    );
    let (status, body) = call(get.clone(), "/v1/kv/config/h1", Some(&root), None).await;
    assert_eq!(
        (status, &body["count"]),
        (200, &json!(0)),
        "root may read config/: {body}"
    );

    // A session, and a lock inside and outside the worker's prefix.
    let (status, body) = call(
        post.clone(),
        "/v1/sessions",
        Some(&worker),
        Some(json!({"ttl": 30})),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let session = body["id"].as_str().expect("session id").to_string();
    let (status, body) = call(
        post.clone(),
        &format!("/v1/sessions/{session}/keepalive"),
        Some(&worker),
        None,
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let (status, body) = call(
        post.clone(),
        &format!("/v1/sessions/{session}/keepalive"),
        None,
        None,
    )
    .await;
    assert_eq!(status, 401, "an anonymous keep-alive: {body}");
    let acquire = json!({"session_id": session, "timeout_ms": 5000});
    let (status, body) = call(
        post.clone(),
        "/v1/locks/jobs%2Flock/acquire",
        Some(&worker),
        Some(acquire.clone()),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let (status, body) = call(
        post.clone(),
        "/v1/locks/config%2Flock/acquire",
        Some(&worker),
        Some(acquire),
    )
    .await;
    assert_eq!(
        (status, body["error"].as_str()),
        (403, Some("permission_denied")),
        "{body}"
    );
    let (status, body) = call(get.clone(), "/v1/locks/config%2Flock", Some(&worker), None).await;
    assert_eq!(status, 403, "{body}");

    // A watch the worker may not make is refused before it streams.
    let (status, body) = call(
        get.clone(),
        "/v1/watch/config/?prefix=true",
        Some(&worker),
        None,
    )
    .await;
    assert_eq!(
        (status, body["error"].as_str()),
        (403, Some("permission_denied")),
        "{body}"
    );

    // Admin routes: the audit stream and force-release.
    let (status, body) = call(get.clone(), "/v1/audit", Some(&worker), None).await;
    assert_eq!(
        (status, body["error"].as_str()),
        (403, Some("permission_denied")),
        "{body}"
    );
    let audit = http
        .get(format!("{base}/v1/audit?from_revision=1"))
        .bearer_auth(&root)
        .send()
        .await
        .expect("audit");
    assert_eq!(audit.status().as_u16(), 200);
    drop(audit);
    // Guessing from one address: 429 with Retry-After within the burst
    // (the proxy limits per address, the cell per user and per address).
    let mut limited = None;
    for i in 0..300 {
        let resp = http
            .post(format!("{base}/v1/auth/token"))
            .json(&json!({"name": format!("guess-{i}"), "password": "x"}))
            .send()
            .await
            .expect("token request");
        if resp.status().as_u16() == 429 {
            limited = Some(resp);
            break;
        }
        assert_eq!(resp.status().as_u16(), 401);
    }
    let limited = limited.expect("429 within 300 attempts from one address");
    let wait: u64 = limited.headers()["retry-after"]
        .to_str()
        .expect("ascii")
        .parse()
        .expect("seconds");
    assert!((1..=2).contains(&wait), "Retry-After {wait}");
    let body: Value = limited.json().await.expect("json");
    assert_eq!(body["error"], "rate_limited");

    let force = json!({"fencing_token": 1, "reason": "test"});
    let (status, body) = call(
        post.clone(),
        "/v1/admin/locks/jobs%2Flock/force-release",
        Some(&worker),
        Some(force),
    )
    .await;
    assert_eq!(
        (status, body["error"].as_str()),
        (403, Some("permission_denied")),
        "{body}"
    );
}
