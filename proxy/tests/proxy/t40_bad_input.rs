//! Bad input over HTTP gets the right status and error code and changes
//! nothing: one table, walked against a `--dev` proxy, with the cell's
//! revision and a key's value checked after every row. Then the reserved
//! prefix over gRPC: no client writes, deletes or queues there.

use crate::proxy_bin;
use latchkey_testkit::ProxyProcess;
use serde_json::{json, Value};

struct Case {
    what: &'static str,
    method: &'static str,
    path: String,
    body: Vec<u8>,
    status: u16,
    code: &'static str,
}

fn case(
    what: &'static str,
    method: &'static str,
    path: &str,
    body: impl Into<Vec<u8>>,
    status: u16,
    code: &'static str,
) -> Case {
    Case {
        what,
        method,
        path: path.to_string(),
        body: body.into(),
        status,
        code,
    }
}

async fn send(
    http: &reqwest::Client,
    base: &str,
    method: &str,
    path: &str,
    body: Vec<u8>,
) -> (u16, Value) {
    let method = reqwest::Method::from_bytes(method.as_bytes()).expect("method");
    let resp = http
        .request(method, format!("http://{base}{path}"))
        .body(body)
        .send()
        .await
        .expect("an answer");
    let status = resp.status().as_u16();
    let text = resp.text().await.expect("body");
    let json =
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("{path}: not JSON ({e}): {text:?}"));
    (status, json)
}

/// The cell's revision and the value of `keep`, read linearizably.
async fn snapshot(http: &reqwest::Client, base: &str) -> (i64, Value) {
    let (status, body) = send(http, base, "GET", "/v1/kv/keep", vec![]).await;
    assert_eq!(status, 200, "{body}");
    (
        body["revision"].as_i64().expect("revision"),
        body["kvs"].clone(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_gets_its_error_and_changes_nothing() {
    let proxy = ProxyProcess::dev(proxy_bin()).await;
    let base = proxy.http.as_str();
    let http = reqwest::Client::new();
    let (status, _) = send(&http, base, "PUT", "/v1/kv/keep", b"precious".to_vec()).await;
    assert_eq!(status, 200);
    // A session that exists, and one that did and was revoked.
    let (_, live) = send(
        &http,
        base,
        "POST",
        "/v1/sessions",
        br#"{"ttl": 60}"#.to_vec(),
    )
    .await;
    let live = live["id"].as_str().expect("id").to_string();
    let (_, gone) = send(
        &http,
        base,
        "POST",
        "/v1/sessions",
        br#"{"ttl": 60}"#.to_vec(),
    )
    .await;
    let gone = gone["id"].as_str().expect("id").to_string();
    let (status, _) = send(
        &http,
        base,
        "DELETE",
        &format!("/v1/sessions/{gone}"),
        vec![],
    )
    .await;
    assert_eq!(status, 200);

    let too_many: Vec<Value> = (0..200)
        .map(|i| json!({"put": {"key": format!("k{i}"), "value": "v"}}))
        .collect();
    let cases = vec![
        case(
            "malformed JSON",
            "POST",
            "/v1/txn",
            "{\"compare\": [",
            400,
            "invalid_argument",
        ),
        case(
            "a wrong field type",
            "POST",
            "/v1/sessions",
            r#"{"ttl": "long"}"#,
            400,
            "invalid_argument",
        ),
        case(
            "an unknown field",
            "POST",
            "/v1/txn",
            r#"{"compares": []}"#,
            400,
            "invalid_argument",
        ),
        case(
            "an unknown session",
            "POST",
            "/v1/sessions/00000000000000ab/keepalive",
            "",
            404,
            "session_expired",
        ),
        case(
            "an expired session",
            "POST",
            &format!("/v1/sessions/{gone}/keepalive"),
            "",
            404,
            "session_expired",
        ),
        case(
            "an expired session's keys",
            "GET",
            &format!("/v1/sessions/{gone}"),
            "",
            404,
            "session_expired",
        ),
        case(
            "a put bound to an expired session",
            "PUT",
            &format!("/v1/kv/keep?session={gone}"),
            "x",
            404,
            "session_expired",
        ),
        case(
            "a session id that is not hex",
            "PUT",
            "/v1/kv/keep?session=zz",
            "x",
            400,
            "invalid_argument",
        ),
        case(
            "a value over the limit",
            "PUT",
            "/v1/kv/keep",
            vec![b'v'; 70 * 1024],
            413,
            "value_too_large",
        ),
        case(
            "an empty key",
            "PUT",
            "/v1/kv/",
            "x",
            400,
            "key_not_provided",
        ),
        case(
            "an empty key in a txn",
            "POST",
            "/v1/txn",
            r#"{"success": [{"put": {"key": "", "value": "x"}}]}"#,
            400,
            "key_not_provided",
        ),
        case(
            "a TTL of 0",
            "POST",
            "/v1/sessions",
            r#"{"ttl": 0}"#,
            400,
            "invalid_argument",
        ),
        case(
            "a TTL past the maximum",
            "POST",
            "/v1/sessions",
            r#"{"ttl": 90000000000}"#,
            400,
            "lease_ttl_too_large",
        ),
        case(
            "session 0",
            "PUT",
            "/v1/kv/keep?session=0",
            "x",
            400,
            "invalid_argument",
        ),
        case(
            "a misspelt precondition",
            "PUT",
            "/v1/kv/keep?if_mod_revison=1",
            "x",
            400,
            "invalid_argument",
        ),
        case(
            "a misspelt delete flag",
            "DELETE",
            "/v1/kv/keep?prefx",
            "",
            400,
            "invalid_argument",
        ),
        case(
            "a txn bound to an expired session",
            "POST",
            "/v1/txn",
            format!(
                r#"{{"success": [{{"put": {{"key": "keep", "value": "x", "session": "{gone}"}}}}]}}"#
            ),
            404,
            "session_expired",
        ),
        case(
            "an oversized body",
            "PUT",
            "/v1/kv/keep",
            vec![b'v'; 2 * 1024 * 1024],
            413,
            "request_too_large",
        ),
        case(
            "an unknown route",
            "GET",
            "/v1/keys/keep",
            "",
            404,
            "route_not_found",
        ),
        case(
            "a method the route does not take",
            "PATCH",
            "/v1/kv/keep",
            "x",
            405,
            "method_not_allowed",
        ),
        case(
            "a negative revision",
            "GET",
            "/v1/kv/keep?revision=-1",
            "",
            400,
            "invalid_argument",
        ),
        case(
            "a future revision",
            "GET",
            "/v1/kv/keep?revision=1000000",
            "",
            400,
            "future_revision",
        ),
        case(
            "a non-numeric limit",
            "GET",
            "/v1/kv/keep?limit=ten",
            "",
            400,
            "invalid_argument",
        ),
        case(
            "a non-numeric precondition",
            "PUT",
            "/v1/kv/keep?if_version=new",
            "x",
            400,
            "invalid_argument",
        ),
        case(
            "a flag that is not a flag",
            "GET",
            "/v1/kv/keep?prefix=maybe",
            "",
            400,
            "invalid_argument",
        ),
        case(
            "a failed precondition",
            "PUT",
            "/v1/kv/keep?if_absent",
            "x",
            412,
            "precondition_failed",
        ),
        case(
            "a stale mod revision",
            "PUT",
            "/v1/kv/keep?if_mod_revision=1",
            "x",
            412,
            "precondition_failed",
        ),
        case(
            "a txn with too many operations",
            "POST",
            "/v1/txn",
            json!({"success": too_many}).to_string(),
            400,
            "too_many_txn_ops",
        ),
        case(
            "a txn value that is not base64",
            "POST",
            "/v1/txn",
            r#"{"success": [{"put": {"key": "keep", "value": "%%", "value_encoding": "base64"}}]}"#,
            400,
            "invalid_argument",
        ),
        case(
            "an empty txn",
            "POST",
            "/v1/txn",
            "{}",
            400,
            "invalid_argument",
        ),
        case(
            "a put under the reserved prefix",
            "PUT",
            "/v1/kv/%00latchkey/audit/forged",
            "x",
            400,
            "invalid_argument",
        ),
        case(
            "a guarded put under the reserved prefix",
            "PUT",
            "/v1/kv/%00latchkey/idem/forged?if_absent",
            "x",
            400,
            "invalid_argument",
        ),
        case(
            "a delete of the reserved prefix",
            "DELETE",
            "/v1/kv/%00latchkey/?prefix",
            "",
            400,
            "invalid_argument",
        ),
        case(
            "a txn that writes a reserved key in its failure branch",
            "POST",
            "/v1/txn",
            r#"{"success": [{"get": {"key": "keep"}}], "failure": [{"put": {"key": "\u0000latchkey/audit/forged", "value": "x"}}]}"#,
            400,
            "invalid_argument",
        ),
        case(
            "a lock whose queue would be reserved",
            "POST",
            "/v1/locks/%00latchkey/acquire",
            format!(r#"{{"session_id": "{live}", "timeout_ms": 100}}"#),
            400,
            "invalid_argument",
        ),
        case(
            "a watch from a negative revision",
            "GET",
            "/v1/watch/keep?from_revision=-5",
            "",
            400,
            "invalid_argument",
        ),
    ];
    let mut before = snapshot(&http, base).await;
    for c in cases {
        let (status, body) = send(&http, base, c.method, &c.path, c.body).await;
        assert_eq!(
            (status, body["error"].as_str()),
            (c.status, Some(c.code)),
            "{}: {} {} answered {body}",
            c.what,
            c.method,
            c.path
        );
        assert!(
            body["message"].as_str().is_some_and(|m| !m.is_empty()),
            "{}: {body}",
            c.what
        );
        let after = snapshot(&http, base).await;
        assert_eq!(after, before, "{} changed the cell", c.what);
        before = after;
    }
    // The live session is untouched by the rows about the other one.
    let (status, body) = send(
        &http,
        base,
        "POST",
        &format!("/v1/sessions/{live}/keepalive"),
        vec![],
    )
    .await;
    assert_eq!(status, 200, "{body}");
}

/// The error of an etcd call that must fail, or a panic naming `what`.
fn refused<T: std::fmt::Debug>(what: &str, r: Result<T, etcd_client::Error>) -> tonic::Status {
    match r {
        Err(etcd_client::Error::GRpcStatus(status)) => status,
        other => panic!("{what}: expected a refusal, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_client_writes_deletes_or_queues_under_the_reserved_prefix_over_grpc() {
    use etcd_client::{Client, DeleteOptions, GetOptions, LockOptions, Txn, TxnOp};
    let proxy = ProxyProcess::dev(proxy_bin()).await;
    let mut c = Client::connect([proxy.grpc.as_str()], None)
        .await
        .expect("connect");
    let lease = c.lease_grant(60, None).await.expect("a lease").id();
    c.put("keep", "precious", None).await.expect("a put");
    let reserved = || GetOptions::new().with_prefix();
    // The audit records (the auth records under \0latchkey/auth/ are not
    // readable at all); the revision covers every other key.
    let before = c
        .get("\0latchkey/audit/", Some(reserved()))
        .await
        .expect("a read");
    let revision = |r: &etcd_client::GetResponse| r.header().map_or(0, |h| h.revision());

    let status = refused("a put", c.put("\0latchkey/audit/forged", "x", None).await);
    assert_eq!(status.code(), tonic::Code::InvalidArgument, "{status:?}");
    assert!(
        status.message().contains("latchkey's own records"),
        "{status:?}"
    );
    let status = refused(
        "a delete",
        c.delete("\0latchkey/", Some(DeleteOptions::new().with_prefix()))
            .await,
    );
    assert_eq!(status.code(), tonic::Code::InvalidArgument, "{status:?}");
    let nested = Txn::new().and_then([TxnOp::put("\0latchkey/idem/forged", "x", None)]);
    let status = refused(
        "a nested txn",
        c.txn(Txn::new().and_then([TxnOp::put("a", "b", None), TxnOp::txn(nested)]))
            .await,
    );
    assert_eq!(status.code(), tonic::Code::InvalidArgument, "{status:?}");
    let status = refused(
        "a lock",
        c.lock("\0latchkey", Some(LockOptions::new().with_lease(lease)))
            .await,
    );
    assert_eq!(status.code(), tonic::Code::InvalidArgument, "{status:?}");
    let status = refused(
        "a campaign",
        c.campaign("\0latchkey/audit", "me", lease).await,
    );
    assert_eq!(status.code(), tonic::Code::InvalidArgument, "{status:?}");

    // Nothing changed: the same reserved keys at the same revision.
    let after = c
        .get("\0latchkey/audit/", Some(reserved()))
        .await
        .expect("a read");
    assert_eq!(revision(&after), revision(&before));
    assert_eq!(after.kvs().len(), before.kvs().len());
    // Reads stay allowed, and so do writes that only look alike.
    c.put("latchkey/audit/x", "fine", None)
        .await
        .expect("a key that only looks reserved");
}
