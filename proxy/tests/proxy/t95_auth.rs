//! Identities through a proxy: the permission matrix over gRPC with the
//! proxy acting for each client (its Auth API, KV and lease calls carry the
//! client's token; shared watches, keep-alives and the lock and election
//! recipes run only after the cell has said the client may), etcdctl's
//! auth commands, the permission matrix over HTTP, and the HTTP face's
//! tokens with 401 and 403.

use crate::{member_addrs, proxy_bin};
use latchkey_testkit::auth_matrix::{self, NOBODY, PROXY, READER, ROOT, WORKER};
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

/// A cell of `members` with the matrix's users and roles and
/// authentication on, configured through a proxy that enforces it.
struct AuthOn {
    _cluster: Cluster,
    _dir: tempfile::TempDir,
    proxy: ProxyProcess,
    /// The proxy's gRPC address as a URL.
    grpc: String,
}

impl AuthOn {
    async fn start(members: usize) -> AuthOn {
        let cluster = Cluster::start(cell_binary(), members, &[]).await;
        let dir = tempfile::tempdir().expect("temp dir");
        let proxy = proxy_as_root(&cluster, &dir).await;
        let grpc = format!("http://{}", proxy.grpc);
        // Users, roles and auth on through the proxy's Auth API.
        auth_matrix::configure(&grpc).await;
        auth_matrix::wait_until_proxy_enforces(&grpc).await;
        AuthOn {
            _cluster: cluster,
            _dir: dir,
            proxy,
            grpc,
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn permission_matrix_through_a_proxy_over_grpc() {
    let on = AuthOn::start(3).await;
    auth_matrix::check(&on.grpc).await;
}

/// The HTTP face of one proxy, calling with a bearer token.
struct Http {
    client: reqwest::Client,
    base: String,
}

/// What one HTTP operation did: allowed, or refused with a status and the
/// error table's name.
type HttpOutcome = Result<(), (u16, String)>;

impl Http {
    async fn send(
        &self,
        method: reqwest::Method,
        path: &str,
        token: &str,
        body: Option<Value>,
    ) -> reqwest::Response {
        let mut req = self
            .client
            .request(method, format!("{}{path}", self.base))
            .bearer_auth(token)
            .timeout(std::time::Duration::from_secs(20));
        if let Some(b) = body {
            req = req.json(&b);
        }
        req.send().await.unwrap_or_else(|e| panic!("{path}: {e}"))
    }

    /// A unary call: its status and JSON body.
    async fn call(
        &self,
        method: reqwest::Method,
        path: &str,
        token: &str,
        body: Option<Value>,
    ) -> (u16, Value) {
        let resp = self.send(method, path, token, body).await;
        let status = resp.status().as_u16();
        let text = resp.text().await.unwrap_or_default();
        (
            status,
            serde_json::from_str(&text).unwrap_or(Value::String(text)),
        )
    }

    /// A call whose answer is only allowed or refused.
    async fn outcome(
        &self,
        method: reqwest::Method,
        path: &str,
        token: &str,
        body: Option<Value>,
    ) -> HttpOutcome {
        outcome_of(self.call(method, path, token, body).await)
    }

    /// A stream (a watch, the audit log): allowed when it starts.
    async fn stream_outcome(&self, path: &str, token: &str) -> HttpOutcome {
        let resp = self.send(reqwest::Method::GET, path, token, None).await;
        let status = resp.status().as_u16();
        if status == 200 {
            return Ok(());
        }
        let body: Value = resp.json().await.unwrap_or(Value::Null);
        Err((
            status,
            body["error"].as_str().unwrap_or_default().to_string(),
        ))
    }

    async fn token(&self, (name, password): (&str, &str)) -> String {
        let resp = self
            .client
            .post(format!("{}/v1/auth/token", self.base))
            .json(&json!({"name": name, "password": password}))
            .send()
            .await
            .expect("token request");
        assert_eq!(resp.status().as_u16(), 200, "a token for {name}");
        let body: Value = resp.json().await.expect("json");
        body["token"].as_str().expect("token").to_string()
    }

    /// A new session of `token`'s user (30 s), or why not.
    async fn session(&self, token: &str) -> Result<String, (u16, String)> {
        let (status, body) = self
            .call(
                reqwest::Method::POST,
                "/v1/sessions",
                token,
                Some(json!({"ttl": 30})),
            )
            .await;
        outcome_of((status, body.clone()))?;
        Ok(body["id"].as_str().expect("session id").to_string())
    }
}

fn outcome_of((status, body): (u16, Value)) -> HttpOutcome {
    if (200..300).contains(&status) {
        Ok(())
    } else {
        Err((
            status,
            body["error"].as_str().unwrap_or_default().to_string(),
        ))
    }
}

/// Every operation the HTTP API has, and who may do it (root, reader,
/// worker, nobody): the rows of the gRPC matrix it shares
/// (`auth_matrix::ALLOWED`), plus force-release and the audit stream, which
/// need root. Member add, snapshots, auth changes and compaction are gRPC
/// only.
const HTTP_OPERATIONS: [(&str, [bool; 4]); 15] = [
    ("range config/", [true, true, false, false]),
    ("range jobs/", [true, false, true, false]),
    ("put config/", [true, false, false, false]),
    ("put jobs/", [true, false, true, false]),
    ("delete jobs/", [true, false, true, false]),
    ("txn on jobs/", [true, false, true, false]),
    ("txn writing config/", [true, false, false, false]),
    ("watch config/", [true, true, false, false]),
    ("session create, keep-alive, read", [true, true, true, true]),
    (
        "session revoke with a jobs/ key",
        [true, false, true, false],
    ),
    ("lock jobs/", [true, false, true, false]),
    ("election jobs/", [true, false, true, false]),
    ("cluster (member list)", [true, true, true, true]),
    ("force-release", [true, false, false, false]),
    ("audit stream", [true, false, false, false]),
];

/// Runs HTTP operation `op` as `user` (token `t`); `root` sets up what an
/// operation needs that the user may not create.
async fn http_op(http: &Http, op: usize, user: &str, t: &str, root: &str) -> HttpOutcome {
    use reqwest::Method;
    match op {
        0 => http.outcome(Method::GET, "/v1/kv/config/a", t, None).await,
        1 => {
            http.outcome(Method::GET, "/v1/kv/jobs/?prefix=true", t, None)
                .await
        }
        2 => {
            let body = json!({"value": format!("by {user}")});
            http.outcome(Method::PUT, "/v1/kv/config/a", t, Some(body))
                .await
        }
        3 => {
            let path = format!("/v1/kv/jobs/{user}");
            http.outcome(Method::PUT, &path, t, Some(json!({"value": "v"})))
                .await
        }
        4 => {
            let path = format!("/v1/kv/jobs/gone-{user}");
            http.outcome(Method::DELETE, &path, t, None).await
        }
        5 => {
            let txn = json!({
                "compare": [{"key": "jobs/a", "target": "version", "result": "greater", "value": 0}],
                "success": [{"put": {"key": format!("jobs/txn-{user}"), "value": "v"}}],
            });
            http.outcome(Method::POST, "/v1/txn", t, Some(txn)).await
        }
        6 => {
            let txn = json!({
                "compare": [{"key": "jobs/a", "target": "version", "result": "equal", "value": 0}],
                "failure": [{"put": {"key": "config/a", "value": format!("txn by {user}")}}],
            });
            http.outcome(Method::POST, "/v1/txn", t, Some(txn)).await
        }
        7 => {
            http.stream_outcome("/v1/watch/config/?prefix=true", t)
                .await
        }
        8 => {
            let id = http.session(t).await?;
            let keepalive = format!("/v1/sessions/{id}/keepalive");
            http.outcome(Method::POST, &keepalive, t, None).await?;
            http.outcome(Method::GET, &format!("/v1/sessions/{id}"), t, None)
                .await
        }
        9 => {
            let id = http.session(root).await.expect("root's session");
            let path = format!("/v1/kv/jobs/leased-{user}?session={id}");
            http.outcome(Method::PUT, &path, root, Some(json!({"value": "v"})))
                .await
                .expect("root puts");
            let session = format!("/v1/sessions/{id}");
            let got = http.outcome(Method::DELETE, &session, t, None).await;
            if got.is_err() {
                http.outcome(Method::DELETE, &session, root, None)
                    .await
                    .expect("root revokes");
            }
            got
        }
        10 => {
            let lock = "/v1/locks/jobs%2Flock";
            take_and_give_back(
                http,
                t,
                &format!("{lock}/acquire"),
                None,
                &format!("{lock}/release"),
            )
            .await
        }
        11 => {
            let election = "/v1/elections/jobs%2Felection";
            let campaign = format!("{election}/campaign");
            let resign = format!("{election}/resign");
            take_and_give_back(http, t, &campaign, Some(("value", user)), &resign).await
        }
        12 => http.outcome(Method::GET, "/v1/cluster", t, None).await,
        13 => {
            // Root holds a lock; the user breaks it by its fencing token.
            let id = http.session(root).await.expect("root's session");
            let lock = format!("/v1/locks/jobs%2Fheld-{user}");
            let (status, granted) = http
                .call(
                    Method::POST,
                    &format!("{lock}/acquire"),
                    root,
                    Some(json!({"session_id": id, "timeout_ms": 5000})),
                )
                .await;
            assert_eq!(status, 200, "root acquires: {granted}");
            let force = json!({"fencing_token": granted["fencing_token"], "reason": "matrix"});
            let path = format!("/v1/admin/locks/jobs%2Fheld-{user}/force-release");
            let got = http.outcome(Method::POST, &path, t, Some(force)).await;
            let (_, state) = http.call(Method::GET, &lock, root, None).await;
            assert_eq!(
                state["holder"].is_null(),
                got.is_ok(),
                "the lock is free exactly when the force-release was allowed: {state}"
            );
            http.outcome(Method::DELETE, &format!("/v1/sessions/{id}"), root, None)
                .await
                .expect("root revokes");
            got
        }
        14 => http.stream_outcome("/v1/audit?from_revision=1", t).await,
        _ => unreachable!("no operation {op}"),
    }
}

/// In a new session of `t`'s user: `take` (a lock's acquire, an
/// election's campaign, with `extra` in its body) and, if allowed, `give`
/// (release, resign); the session ends either way.
async fn take_and_give_back(
    http: &Http,
    t: &str,
    take: &str,
    extra: Option<(&str, &str)>,
    give: &str,
) -> HttpOutcome {
    use reqwest::Method;
    let id = http.session(t).await?;
    let mut body = json!({"session_id": id, "timeout_ms": 5000});
    if let Some((field, value)) = extra {
        body[field] = json!(value);
    }
    let got = match http.outcome(Method::POST, take, t, Some(body)).await {
        Ok(()) => {
            let body = json!({"session_id": id});
            http.outcome(Method::POST, give, t, Some(body)).await
        }
        refused => refused,
    };
    let _ = http
        .outcome(Method::DELETE, &format!("/v1/sessions/{id}"), t, None)
        .await;
    got
}

/// Done-when 1 over HTTP: the four users with tokens from
/// `POST /v1/auth/token`, every operation of the HTTP API allowed or
/// refused with 403 `permission_denied`, and afterwards (read as root over
/// gRPC) nothing a refused write named changed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn permission_matrix_through_a_proxy_over_http() {
    let on = AuthOn::start(1).await;
    let (proxy, grpc) = (&on.proxy, on.grpc.clone());
    let http = Http {
        client: reqwest::Client::new(),
        base: format!("http://{}", proxy.http),
    };
    let root = http.token(ROOT).await;
    let mut failures = Vec::new();
    for (column, who) in [ROOT, READER, WORKER, NOBODY].into_iter().enumerate() {
        let token = http.token(who).await;
        for (op, (name, allowed)) in HTTP_OPERATIONS.iter().enumerate() {
            let got = http_op(&http, op, who.0, &token, &root).await;
            match (&got, allowed[column]) {
                (Ok(()), true) => {}
                (Err((403, e)), false) if e == "permission_denied" => {}
                (_, allowed) => failures.push(format!(
                    "{name} as {}: expected {}, got {got:?}",
                    who.0,
                    if allowed {
                        "allowed"
                    } else {
                        "403 permission_denied"
                    }
                )),
            }
        }
    }
    assert!(
        failures.is_empty(),
        "permission matrix over HTTP:\n{}",
        failures.join("\n")
    );
    let mut root = auth_matrix::connect_as(&grpc, ROOT).await;
    auth_matrix::nothing_refused_was_written(&mut root).await;
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
    let on = AuthOn::start(1).await;
    let proxy = &on.proxy;
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

/// Watches the proxy serves from its own shared watch end when their
/// client's permission goes: a worker's gRPC watch and its SSE watch on
/// `jobs/`, and its observers of an election under it on both faces, end
/// with the cell's reason once its role loses `jobs/`, a root watch on the same range (the same shared watch) goes
/// on, and nothing written after the cancel reaches the worker. Then
/// root's audit stream ends when root's role is taken from its user.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watches_through_a_proxy_end_when_their_permission_is_revoked() {
    use crate::t50_watch_sse::events;
    use etcd_client::WatchOptions;
    use futures::StreamExt;
    use std::time::{Duration, Instant};

    let on = AuthOn::start(1).await;
    let (proxy, grpc) = (&on.proxy, on.grpc.clone());
    let mut worker = auth_matrix::connect_as(&grpc, WORKER).await;
    let mut root = auth_matrix::connect_as(&grpc, ROOT).await;
    let prefix = || Some(WatchOptions::new().with_prefix());
    let mut worker_events = worker.watch("jobs/", prefix()).await.expect("watch");
    let mut root_events = root.watch("jobs/", prefix()).await.expect("watch");
    for events in [&mut worker_events, &mut root_events] {
        let created = events.message().await.expect("created").expect("message");
        assert!(created.created() && !created.canceled(), "{created:?}");
    }
    let http = reqwest::Client::new();
    let base = format!("http://{}", proxy.http);
    let token = async |(name, password): (&str, &str)| {
        let resp = http
            .post(format!("{base}/v1/auth/token"))
            .json(&json!({"name": name, "password": password}))
            .send()
            .await
            .expect("token request");
        let body: Value = resp.json().await.expect("json");
        body["token"].as_str().expect("token").to_string()
    };
    let sse = http
        .get(format!("http://{}/v1/watch/jobs/?prefix=true", proxy.http))
        .bearer_auth(token(WORKER).await)
        .send()
        .await
        .expect("SSE watch");
    assert_eq!(sse.status().as_u16(), 200);
    let mut sse = Box::pin(sse.bytes_stream());
    // An election's observers on both faces stand on permits too.
    let mut observed = worker.observe("jobs/e").await.expect("observe");
    let observe_sse = http
        .get(format!(
            "http://{}/v1/elections/jobs%2Fe/observe",
            proxy.http
        ))
        .bearer_auth(token(WORKER).await)
        .send()
        .await
        .expect("SSE observe");
    assert_eq!(observe_sse.status().as_u16(), 200);
    let mut observe_sse = Box::pin(observe_sse.bytes_stream());

    root.put("jobs/seen", "1", None).await.expect("put");
    for events in [&mut worker_events, &mut root_events] {
        let seen = events.message().await.expect("event").expect("message");
        assert_eq!(seen.events().len(), 1, "{seen:?}");
    }
    let seen = events(&mut sse, 1).await;
    assert!(seen[0].contains("jobs/seen"), "{seen:?}");

    let revoked_at = Instant::now();
    root.role_revoke_permission(
        "jobs-rw",
        "jobs/",
        Some(etcd_client::RoleRevokePermissionOptions::new().with_prefix()),
    )
    .await
    .expect("revoke");
    let ended = tokio::time::timeout(Duration::from_secs(10), worker_events.message())
        .await
        .expect("the gRPC watch ends within 10 s")
        .expect("a message")
        .expect("not the end of the stream");
    let took = revoked_at.elapsed();
    assert!(ended.canceled(), "{ended:?}");
    assert!(
        ended.cancel_reason().contains("permission denied"),
        "{}",
        ended.cancel_reason()
    );
    let refused = events(&mut sse, 1).await;
    assert!(
        refused[0].starts_with("event: error") && refused[0].contains("permission_denied"),
        "{refused:?}"
    );
    let e = tokio::time::timeout(Duration::from_secs(10), observed.message())
        .await
        .expect("the gRPC observe ends within 10 s")
        .expect_err("an error");
    assert!(
        e.to_string().contains("permission denied"),
        "the observe stream: {e}"
    );
    let refused = events(&mut observe_sse, 1).await;
    assert!(
        refused[0].starts_with("event: error") && refused[0].contains("permission_denied"),
        "{refused:?}"
    );
    // The proxy looks for auth changes every 250 ms and asks the cell in
    // one round trip; a loaded machine adds to both, so the bound here is
    // loose and the figure is printed.
    eprintln!("the worker's watch ended {took:?} after the revoke was acknowledged");
    assert!(took < Duration::from_secs(10));

    // Root's watch, on the same shared watch, goes on; the worker's SSE
    // stream has ended.
    root.put("jobs/after", "2", None).await.expect("put");
    let after = root_events
        .message()
        .await
        .expect("event")
        .expect("message");
    assert_eq!(
        after.events()[0].kv().map(|kv| kv.key()),
        Some(&b"jobs/after"[..])
    );
    let rest = tokio::time::timeout(Duration::from_secs(5), sse.next())
        .await
        .expect("the SSE stream closes");
    assert!(rest.is_none(), "{rest:?}");

    // The audit stream is root's: it ends when the user loses root.
    let audit = http
        .get(format!("http://{}/v1/audit", proxy.http))
        .bearer_auth(token(WORKER).await)
        .send()
        .await
        .expect("audit");
    assert_eq!(audit.status().as_u16(), 403);
    root.user_add("auditor", "auditor-secret", None)
        .await
        .expect("user add");
    root.user_grant_role("auditor", "root")
        .await
        .expect("grant root");
    let audit = http
        .get(format!("http://{}/v1/audit", proxy.http))
        .bearer_auth(token(("auditor", "auditor-secret")).await)
        .send()
        .await
        .expect("audit");
    assert_eq!(audit.status().as_u16(), 200);
    let mut audit = Box::pin(audit.bytes_stream());
    root.user_revoke_role("auditor", "root")
        .await
        .expect("revoke root");
    // The revoke's own audit record may come first.
    let mut text = String::new();
    let read = async {
        while !text.contains("event: error") || !text.ends_with("\n\n") {
            match audit.next().await {
                Some(Ok(chunk)) => text.push_str(&String::from_utf8_lossy(&chunk)),
                other => panic!("the audit stream ended: {other:?} after {text:?}"),
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(10), read)
        .await
        .unwrap_or_else(|_| panic!("no error event: {text:?}"));
    let refused = &text[text.find("event: error").expect("error event")..];
    assert!(refused.contains("permission_denied"), "{text}");
}

/// A tenant's rate per user, with authentication on: the worker's reads
/// past its 2 a second are refused, naming it, and root's read of the same
/// tenant's keys right after passes (each user has its own bucket; the
/// tenant as a whole has no limit).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenants_rate_per_user_through_a_proxy() {
    use latchkey_shared::tenants_pb::tenants_client::TenantsClient;
    use latchkey_shared::tenants_pb::{Tenant, TenantPutRequest};
    use std::time::{Duration, Instant};

    let on = AuthOn::start(1).await;
    let mut root = auth_matrix::connect_as(&on.grpc, ROOT).await;
    let worker = auth_matrix::connect_as(&on.grpc, WORKER).await;
    let root_token = root
        .auth_client()
        .authenticate(ROOT.0.into(), ROOT.1.into())
        .await
        .expect("authenticate")
        .token()
        .to_string();
    let mut admin = TenantsClient::connect(on.grpc.clone())
        .await
        .expect("connect");
    let mut put = tonic::Request::new(TenantPutRequest {
        tenant: Some(Tenant {
            name: "jobs".into(),
            prefixes: vec![b"jobs/".to_vec()],
            user_requests_per_second: 2,
            ..Default::default()
        }),
    });
    put.metadata_mut()
        .insert("token", root_token.parse().expect("ascii"));
    admin.put(put).await.expect("tenant put as root");

    let reads = |client: &etcd_client::Client| {
        let client = client.clone();
        futures::future::join_all((0..20).map(move |i| {
            let mut client = client.clone();
            async move { client.get(format!("jobs/{i}"), None).await }
        }))
    };
    // The proxy reads the tenants every second.
    let deadline = Instant::now() + Duration::from_secs(10);
    let refused = loop {
        let refusal = reads(&worker).await.into_iter().find_map(Result::err);
        if let Some(e) = refusal {
            break e;
        }
        assert!(Instant::now() < deadline, "no refusal within 10 s");
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    // The worker's bucket is empty; root's is its own.
    root.get("jobs/0", None)
        .await
        .expect("root's read has a bucket of its own");
    assert_eq!(
        auth_matrix::code(&refused),
        tonic::Code::ResourceExhausted,
        "{refused}"
    );
    assert!(refused.to_string().contains("worker"), "{refused}");
}
