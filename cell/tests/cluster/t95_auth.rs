//! Identities and permissions on a cell: the permission matrix against a
//! follower and the leader, etcdctl's auth commands and `--user`, a watch
//! ended by a revoked permission, tokens that stop working, and the auth
//! records out of every client's reach.

use crate::CELL_BIN;
use etcd_client::{GetOptions, WatchOptions};
use latchkey_shared::auth_pb::auth_client::AuthClient;
use latchkey_shared::auth_pb::{AuthUserGetRequest, AuthenticateRequest};
use latchkey_testkit::auth_matrix::{self, code, connect_anonymous, connect_as, ROOT, WORKER};
use latchkey_testkit::Cluster;
use std::time::{Duration, Instant};
use tonic::Code;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn permission_matrix_on_a_follower_and_the_leader() {
    let cluster = Cluster::start(CELL_BIN, 3, &[]).await;
    let leader = cluster.wait_leader(Duration::from_secs(10)).await;
    let follower = cluster.follower_of(leader);
    // Configured through the leader, checked on a follower (which applies
    // the auth records from the log) and on the leader.
    auth_matrix::configure(&cluster.url(leader)).await;
    auth_matrix::check(&cluster.url(follower)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcdctl_auth_commands_and_user_flag() {
    let cluster = Cluster::start(CELL_BIN, 1, &[]).await;
    auth_matrix::etcdctl_session(&cluster.member(1).client).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_ends_when_its_permission_is_revoked() {
    let cluster = Cluster::start(CELL_BIN, 1, &[]).await;
    let ep = cluster.url(1);
    auth_matrix::configure(&ep).await;
    let mut worker = connect_as(&ep, WORKER).await;
    let mut root = connect_as(&ep, ROOT).await;
    let mut events = worker
        .watch("jobs/", Some(WatchOptions::new().with_prefix()))
        .await
        .expect("watch");
    let created = events.message().await.expect("created").expect("message");
    assert!(created.created() && !created.canceled());
    root.put("jobs/seen", "1", None).await.expect("put");
    let seen = events.message().await.expect("event").expect("message");
    assert_eq!(seen.events().len(), 1);

    let revoked_at = Instant::now();
    root.role_revoke_permission(
        "jobs-rw",
        "jobs/",
        Some(etcd_client::RoleRevokePermissionOptions::new().with_prefix()),
    )
    .await
    .expect("revoke");
    let ended = tokio::time::timeout(Duration::from_secs(10), events.message())
        .await
        .expect("the watch ends within 10 s")
        .expect("a message")
        .expect("not the end of the stream");
    assert!(ended.canceled(), "{ended:?}");
    assert!(
        ended.cancel_reason().contains("permission denied"),
        "{}",
        ended.cancel_reason()
    );
    // The stream checks every second; a loaded machine may add to it, so
    // the bound here is loose and the note gives the interval.
    assert!(revoked_at.elapsed() < Duration::from_secs(10));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_end_with_their_user_or_password_and_cannot_be_forged() {
    let cluster = Cluster::start(CELL_BIN, 1, &[]).await;
    let ep = cluster.url(1);
    auth_matrix::configure(&ep).await;
    let mut auth = AuthClient::connect(ep.clone()).await.expect("connect");
    let authenticate = |name: &str, password: &str| AuthenticateRequest {
        name: name.into(),
        password: password.into(),
    };
    let worker_token = auth
        .authenticate(authenticate(WORKER.0, WORKER.1))
        .await
        .expect("authenticate")
        .into_inner()
        .token;
    // UserGet on oneself needs only a valid token.
    let asker = auth.clone();
    let who_am_i = async |token: &str| {
        let mut auth = asker.clone();
        let mut request = tonic::Request::new(AuthUserGetRequest {
            name: WORKER.0.into(),
        });
        request
            .metadata_mut()
            .insert("token", token.parse().expect("ascii token"));
        auth.user_get(request).await.map(|r| r.into_inner().roles)
    };
    assert_eq!(who_am_i(&worker_token).await.expect("valid"), ["jobs-rw"]);

    // A changed payload under the same signature.
    let (payload, mac) = worker_token.split_once('.').expect("payload.mac");
    let mut forged: Vec<u8> = payload.bytes().collect();
    forged[3] ^= 1;
    let forged = format!("{}.{mac}", String::from_utf8(forged).expect("ascii"));
    let e = who_am_i(&forged).await.expect_err("forged");
    assert_eq!(e.code(), Code::Unauthenticated, "{e:?}");
    assert_eq!(e.message(), "etcdserver: invalid auth token");

    // A password change ends the tokens issued under the old password.
    let mut root = connect_as(&ep, ROOT).await;
    root.user_change_password(WORKER.0, "changed")
        .await
        .expect("change");
    let e = who_am_i(&worker_token)
        .await
        .expect_err("old password's token");
    assert_eq!(e.code(), Code::Unauthenticated, "{e:?}");
    let new_token = auth
        .authenticate(authenticate(WORKER.0, "changed"))
        .await
        .expect("authenticate")
        .into_inner()
        .token;
    assert!(who_am_i(&new_token).await.is_ok());

    // A deleted user's token is refused.
    root.user_delete(WORKER.0).await.expect("delete");
    let e = who_am_i(&new_token).await.expect_err("deleted user");
    assert_eq!(e.code(), Code::Unauthenticated, "{e:?}");

    // A wrong password and an unknown user answer alike.
    let wrong = auth
        .authenticate(authenticate(ROOT.0, "wrong"))
        .await
        .expect_err("wrong password");
    let unknown = auth
        .authenticate(authenticate("mallory", "wrong"))
        .await
        .expect_err("unknown user");
    assert_eq!(
        (wrong.code(), wrong.message()),
        (unknown.code(), unknown.message())
    );
    assert_eq!(wrong.code(), Code::InvalidArgument);
}

/// Guessing one user's password is slowed down: failed attempts are
/// limited per user (10 at once, then 2 a second), with the time to wait.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_authentications_of_one_user_are_rate_limited() {
    let cluster = Cluster::start(CELL_BIN, 1, &[]).await;
    let ep = cluster.url(1);
    auth_matrix::configure(&ep).await;
    let mut auth = AuthClient::connect(ep.clone()).await.expect("connect");
    let attempt = |password: &str| AuthenticateRequest {
        name: WORKER.0.into(),
        password: password.into(),
    };
    let mut limited = None;
    for _ in 0..50 {
        match auth.authenticate(attempt("guess")).await {
            Err(e) if e.code() == Code::ResourceExhausted => {
                limited = Some(e);
                break;
            }
            Err(e) => assert_eq!(e.code(), Code::InvalidArgument, "{e:?}"),
            Ok(_) => panic!("a wrong password was accepted"),
        }
    }
    let limited = limited.expect("rate limited within 50 failed attempts");
    let error = latchkey_shared::ApiError::from_status(&limited);
    assert_eq!(error.code, latchkey_shared::ErrorCode::RateLimited);
    let wait = error.retry_after().expect("says how long to wait");
    assert!(wait <= Duration::from_secs(1), "{wait:?}");
    // Another user is not held up; the guessed one is again after the wait.
    let other = AuthenticateRequest {
        name: ROOT.0.into(),
        password: ROOT.1.into(),
    };
    assert!(auth.authenticate(other).await.is_ok());
    tokio::time::sleep(wait).await;
    assert!(auth.authenticate(attempt(WORKER.1)).await.is_ok());
}

/// The auth records (password hashes, token keys) under
/// `\0latchkey/auth/`: no client reads, watches or writes them, root
/// included, whether authentication is on or off.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_client_reaches_the_auth_records() {
    let cluster = Cluster::start(CELL_BIN, 1, &[]).await;
    let ep = cluster.url(1);
    let mut anonymous = connect_anonymous(&ep).await;
    anonymous
        .user_add("someone", "pw", None)
        .await
        .expect("user add");
    let records = b"\0latchkey/auth/".to_vec();
    let user_record = b"\0latchkey/auth/user/someone".to_vec();
    let check = async |c: &mut etcd_client::Client| {
        let e = c
            .get(records.clone(), Some(GetOptions::new().with_prefix()))
            .await
            .expect_err("range");
        assert_eq!(code(&e), Code::PermissionDenied, "{e}");
        let e = c
            .get(
                b"\0latchkey/".to_vec(),
                Some(GetOptions::new().with_from_key()),
            )
            .await
            .expect_err("a range that covers them");
        assert_eq!(code(&e), Code::PermissionDenied, "{e}");
        let e = c
            .put(user_record.clone(), "forged", None)
            .await
            .expect_err("put");
        assert_eq!(code(&e), Code::PermissionDenied, "{e}");
        let e = c
            .delete(user_record.clone(), None)
            .await
            .expect_err("delete");
        assert_eq!(code(&e), Code::PermissionDenied, "{e}");
        let mut events = c
            .watch(records.clone(), Some(WatchOptions::new().with_prefix()))
            .await
            .expect("watch stream");
        let refused = events.message().await.expect("answer").expect("message");
        assert!(refused.canceled(), "{refused:?}");
        // Everything else is still there: the whole keyspace as clients
        // see it does not include the reserved prefix.
        c.get("", Some(GetOptions::new().with_all_keys()))
            .await
            .expect("range all");
    };
    check(&mut anonymous).await;
    anonymous
        .user_add(ROOT.0, ROOT.1, None)
        .await
        .expect("root");
    anonymous.role_add("root").await.expect("root role");
    anonymous
        .user_grant_role(ROOT.0, "root")
        .await
        .expect("grant");
    anonymous.auth_enable().await.expect("enable");
    let mut root = connect_as(&ep, ROOT).await;
    check(&mut root).await;
    assert_eq!(
        root.user_get("someone")
            .await
            .expect("user get")
            .roles()
            .len(),
        0,
        "the forged put changed nothing"
    );
}

/// latchkey's own records under `\0latchkey/` (lock delays, audit,
/// idempotency) while authentication is off: a client at a member's port
/// cannot put, delete or txn them; a request with the proxies' key
/// (`--proxy-key-file`, which the test kit gives every member) can, and a
/// wrong key is a client like any other.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_the_proxies_key_writes_latchkeys_records_while_authentication_is_off() {
    use etcd_client::proto::{PbDeleteRequest, PbPutRequest, PbPutResponse};
    use etcd_client::{Compare, CompareOp, DeleteOptions, Txn, TxnOp};
    use latchkey_shared::auth::proxy_key::{self, PROXY_KEY_METADATA};
    use latchkey_shared::client::{call, endpoint};
    use latchkey_shared::etcd_methods::kv;

    let cluster = Cluster::start(CELL_BIN, 1, &[]).await;
    let ep = cluster.url(1);
    let mut client = connect_anonymous(&ep).await;
    let forged = b"\0latchkey/audit/forged".to_vec();
    let e = client
        .put(forged.clone(), "x", None)
        .await
        .expect_err("a client's put");
    assert_eq!(code(&e), Code::InvalidArgument, "{e}");
    assert!(e.to_string().contains("latchkey's own records"), "{e}");
    let e = client
        .delete(
            b"\0latchkey/idem/".to_vec(),
            Some(DeleteOptions::new().with_prefix()),
        )
        .await
        .expect_err("a client's delete");
    assert_eq!(code(&e), Code::InvalidArgument, "{e}");
    // One that covers the auth records too is refused for them.
    let e = client
        .delete(
            b"\0latchkey/".to_vec(),
            Some(DeleteOptions::new().with_prefix()),
        )
        .await
        .expect_err("a client's delete of everything reserved");
    assert_eq!(code(&e), Code::PermissionDenied, "{e}");
    let txn = Txn::new()
        .when([Compare::version("x", CompareOp::Greater, 0)])
        .or_else([TxnOp::put(b"\0latchkey/idem/forged".to_vec(), "x", None)]);
    let e = client.txn(txn).await.expect_err("a client's txn");
    assert_eq!(code(&e), Code::InvalidArgument, "{e}");

    // The same put with a key in the metadata.
    let channel = endpoint(&cluster.member(1).client)
        .expect("endpoint")
        .connect_lazy();
    let put_with = async |key: &str| {
        let mut request = tonic::Request::new(PbPutRequest {
            key: forged.clone(),
            value: b"by a proxy".to_vec(),
            ..Default::default()
        });
        request
            .metadata_mut()
            .insert(PROXY_KEY_METADATA, key.parse().expect("ascii"));
        call::unary::<_, PbPutResponse>(channel.clone(), kv::PUT, request).await
    };
    let e = put_with(&proxy_key::generate())
        .await
        .expect_err("a wrong key");
    assert_eq!(e.code.grpc_code(), Code::InvalidArgument, "{e:?}");
    let reserved = || GetOptions::new().with_prefix();
    let seen = client
        .get(b"\0latchkey/audit/".to_vec(), Some(reserved()))
        .await
        .expect("clients may read them");
    assert_eq!(seen.count(), 0, "nothing refused was written");
    let seen = client
        .get(b"\0latchkey/idem/".to_vec(), Some(reserved()))
        .await
        .expect("clients may read them");
    assert_eq!(seen.count(), 0, "nothing refused was written");

    let key = proxy_key::read_own(latchkey_testkit::proxy_key::key_file()).expect("the key");
    put_with(&key).await.expect("the proxies' key");
    let seen = client.get(forged.clone(), None).await.expect("read back");
    assert_eq!(seen.kvs()[0].value(), b"by a proxy");
    let mut request = tonic::Request::new(PbDeleteRequest {
        key: forged.clone(),
        ..Default::default()
    });
    request
        .metadata_mut()
        .insert(PROXY_KEY_METADATA, key.parse().expect("ascii"));
    call::unary::<_, etcd_client::proto::PbDeleteResponse>(
        channel.clone(),
        kv::DELETE_RANGE,
        request,
    )
    .await
    .expect("a delete with the key");
}

/// `ProxyAuth/CheckReads` tells a proxy whether its clients may still
/// read what they watch (by user name, or by a token the cell verifies and
/// names the user of); it would tell anyone else other users'
/// permissions, so only the proxies' user asks it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_a_proxy_asks_whether_others_may_still_read() {
    use latchkey_shared::proxy_auth_pb::proxy_auth_client::ProxyAuthClient;
    use latchkey_shared::proxy_auth_pb::{CheckReadsRequest, ReadCheck};
    use latchkey_testkit::auth_matrix::PROXY;

    let cluster = Cluster::start(CELL_BIN, 1, &[]).await;
    let ep = cluster.url(1);
    auth_matrix::configure(&ep).await;
    let mut auth = AuthClient::connect(ep.clone()).await.expect("connect");
    let mut token_of = async |(name, password): (&str, &str)| {
        let answer = auth.authenticate(AuthenticateRequest {
            name: name.into(),
            password: password.into(),
        });
        answer.await.expect("authenticate").into_inner().token
    };
    let (root_token, proxy_token) = (token_of(ROOT).await, token_of(PROXY).await);
    let worker_token = token_of(WORKER).await;
    let by_token = |token: &str| ReadCheck {
        key: b"jobs/".to_vec(),
        range_end: b"jobs0".to_vec(),
        token: token.to_string(),
        ..Default::default()
    };
    let checks = || CheckReadsRequest {
        checks: vec![
            by_token(&worker_token),
            by_token("forged.token"),
            ReadCheck {
                user: WORKER.0.into(),
                key: b"jobs/".to_vec(),
                range_end: b"jobs0".to_vec(),
                admin: false,
                ..Default::default()
            },
            ReadCheck {
                user: WORKER.0.into(),
                key: b"config/a".to_vec(),
                range_end: Vec::new(),
                admin: false,
                ..Default::default()
            },
            ReadCheck {
                user: WORKER.0.into(),
                key: Vec::new(),
                range_end: Vec::new(),
                admin: true,
                ..Default::default()
            },
            ReadCheck {
                user: "mallory".into(),
                key: b"jobs/".to_vec(),
                range_end: b"jobs0".to_vec(),
                admin: false,
                ..Default::default()
            },
        ],
    };
    let ask = async |token: Option<&str>| {
        let mut client = ProxyAuthClient::connect(ep.clone()).await.expect("connect");
        let mut request = tonic::Request::new(checks());
        if let Some(t) = token {
            request
                .metadata_mut()
                .insert("token", t.parse().expect("ascii token"));
        }
        client.check_reads(request).await.map(|r| r.into_inner())
    };
    // Root may do everything but this: it is not a proxy.
    for token in [None, Some(root_token.as_str())] {
        let e = ask(token).await.expect_err("not a proxy");
        assert!(
            matches!(e.code(), Code::PermissionDenied | Code::InvalidArgument),
            "{e:?}"
        );
    }
    let answer = ask(Some(&proxy_token)).await.expect("the proxy asks");
    let codes: Vec<&str> = answer.answers.iter().map(|a| a.code.as_str()).collect();
    assert_eq!(
        codes,
        [
            "",
            "invalid_auth_token",
            "",
            "permission_denied",
            "permission_denied",
            "invalid_auth_token"
        ]
    );
    // A token is verified by the cell, which names its user.
    assert_eq!(answer.answers[0].user, WORKER.0);
    assert_eq!(answer.answers[2].user, WORKER.0);
    assert!(answer.auth_revision > 0);
    assert!(answer.header.map(|h| h.revision).unwrap_or(0) >= answer.auth_revision as i64);
}
