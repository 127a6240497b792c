//! The permission matrix: four users (root; `reader` with read on
//! `config/`; `worker` with readwrite on `jobs/`; `nobody` without roles),
//! every kind of operation, and whether each user may do it, checked
//! against any endpoint that speaks etcd's gRPC API (a member, a proxy).
//! A refused write must change nothing: the keys it named are read back
//! as root afterwards.

use crate::etcdctl::{etcdctl, try_etcdctl};
use crate::eventually::eventually;
use etcd_client::{
    Client, Compare, CompareOp, ConnectOptions, GetOptions, LockOptions, Permission, PutOptions,
    Txn, TxnOp, WatchOptions,
};
use std::time::Duration;
use tonic::Code;

pub const ROOT: (&str, &str) = ("root", "root-secret");
pub const READER: (&str, &str) = ("reader", "reader-secret");
pub const WORKER: (&str, &str) = ("worker", "worker-secret");
pub const NOBODY: (&str, &str) = ("nobody", "nobody-secret");
/// The proxies' own user: root and the proxy role (it writes latchkey's
/// records, which root alone may not).
pub const PROXY: (&str, &str) = ("latchkey-proxy", "proxy-secret");

/// Users, roles and permissions of the matrix, then authentication on,
/// through `endpoint` (authentication must be off).
pub async fn configure(endpoint: &str) {
    let client = &mut connect_anonymous(endpoint).await;
    for (name, password) in [ROOT, READER, WORKER, NOBODY, PROXY] {
        client
            .user_add(name, password, None)
            .await
            .unwrap_or_else(|e| panic!("user add {name}: {e}"));
    }
    for role in ["root", "config-read", "jobs-rw", "latchkey-proxy"] {
        client.role_add(role).await.expect("role add");
    }
    client
        .role_grant_permission("config-read", Permission::read("config/").with_prefix())
        .await
        .expect("grant read config/");
    client
        .role_grant_permission("jobs-rw", Permission::read_write("jobs/").with_prefix())
        .await
        .expect("grant readwrite jobs/");
    for (user, role) in [
        ("root", "root"),
        ("reader", "config-read"),
        ("worker", "jobs-rw"),
        (PROXY.0, "root"),
        (PROXY.0, "latchkey-proxy"),
    ] {
        client
            .user_grant_role(user, role)
            .await
            .expect("grant role");
    }
    client.auth_enable().await.expect("auth enable");
    // Keys the reads find, written as root.
    let mut root = connect_as(endpoint, ROOT).await;
    root.put("config/a", "root-config", None)
        .await
        .expect("put");
    root.put("jobs/a", "root-job", None).await.expect("put");
}

/// An etcd client at `endpoint` (`http://host:port`) as `user`
/// (authenticating on connect; retried for up to 15 s).
pub async fn connect_as(endpoint: &str, (user, password): (&str, &str)) -> Client {
    let opts = ConnectOptions::new()
        .with_user(user, password)
        .with_timeout(Duration::from_secs(10))
        .with_connect_timeout(Duration::from_secs(2));
    eventually(Duration::from_secs(15), async || {
        Client::connect([endpoint], Some(opts.clone()))
            .await
            .map_err(|e| format!("cannot connect to {endpoint} as {user}: {e}"))
    })
    .await
}

/// An anonymous etcd client at `endpoint`.
pub async fn connect_anonymous(endpoint: &str) -> Client {
    let opts = ConnectOptions::new()
        .with_timeout(Duration::from_secs(10))
        .with_connect_timeout(Duration::from_secs(2));
    eventually(Duration::from_secs(15), async || {
        Client::connect([endpoint], Some(opts.clone()))
            .await
            .map_err(|e| format!("cannot connect to {endpoint}: {e}"))
    })
    .await
}

/// Whether `client` may watch `prefix`: its first answer is a created
/// watch, not a cancelled one.
async fn may_watch(client: &mut Client, prefix: &str) -> Result<bool, String> {
    let mut stream = client
        .watch(prefix, Some(WatchOptions::new().with_prefix()))
        .await
        .map_err(|e| e.to_string())?;
    match tokio::time::timeout(Duration::from_secs(5), stream.message()).await {
        Ok(Ok(Some(resp))) => Ok(!resp.canceled()),
        other => Err(format!("no watch answer: {other:?}")),
    }
}

/// Waits (up to 15 s) until the proxy at `endpoint` acts on the cell's
/// authentication being on, as it learns within a second: it refuses a
/// shared watch to `nobody` and serves one to root (so its own identity
/// works too).
pub async fn wait_until_proxy_enforces(endpoint: &str) {
    let mut nobody = connect_as(endpoint, NOBODY).await;
    let mut root = connect_as(endpoint, ROOT).await;
    eventually(Duration::from_secs(15), async || {
        let refused = !may_watch(&mut nobody, "config/").await?;
        let served = may_watch(&mut root, "config/").await?;
        if refused && served {
            Ok(())
        } else {
            Err(format!("nobody refused: {refused}, root served: {served}"))
        }
    })
    .await
}

/// The gRPC code of an etcd-client error (Unknown for one that is not a
/// status).
pub fn code(e: &etcd_client::Error) -> Code {
    match e {
        etcd_client::Error::GRpcStatus(s) => s.code(),
        _ => Code::Unknown,
    }
}

/// What one operation did: allowed, or refused with a code.
type Outcome = Result<(), (Code, String)>;

fn outcome<T>(r: Result<T, etcd_client::Error>) -> Outcome {
    r.map(|_| ()).map_err(|e| (code(&e), e.to_string()))
}

/// The operations of the matrix, in order.
pub const OPERATIONS: [&str; 17] = [
    "range config/",
    "range jobs/",
    "put config/",
    "put jobs/",
    "delete jobs/",
    "txn on jobs/",
    "txn writing config/",
    "watch config/",
    "lease grant, keep-alive, time-to-live",
    "lease revoke with a jobs/ key",
    "lock jobs/",
    "election jobs/",
    "member list",
    "member add",
    "snapshot",
    "auth change (user add)",
    "compaction",
];

/// Who may do what: one row per operation, columns root, reader, worker,
/// nobody.
pub const ALLOWED: [[bool; 4]; 17] = [
    [true, true, false, false],  // range config/
    [true, false, true, false],  // range jobs/
    [true, false, false, false], // put config/
    [true, false, true, false],  // put jobs/
    [true, false, true, false],  // delete jobs/
    [true, false, true, false],  // txn on jobs/
    [true, false, false, false], // txn writing config/
    [true, true, false, false],  // watch config/
    [true, true, true, true],    // lease grant, keep-alive, time-to-live
    [true, false, true, false],  // lease revoke with a jobs/ key
    [true, false, true, false],  // lock jobs/
    [true, false, true, false],  // election jobs/
    [true, true, true, true],    // member list
    [true, false, false, false], // member add
    [true, false, false, false], // snapshot
    [true, false, false, false], // auth change (user add)
    [true, false, false, false], // compaction
];

/// Runs operation `op` as `user` (whose client is `c`); `root` sets up
/// what an operation needs that the user may not create.
async fn run(op: usize, user: &str, c: &mut Client, root: &mut Client) -> Outcome {
    match op {
        0 => outcome(c.get("config/a", None).await),
        1 => outcome(c.get("jobs/", Some(GetOptions::new().with_prefix())).await),
        2 => outcome(c.put("config/a", format!("by {user}"), None).await),
        3 => outcome(c.put(format!("jobs/{user}"), "v", None).await),
        4 => outcome(c.delete(format!("jobs/gone-{user}"), None).await),
        5 => {
            let txn = Txn::new()
                .when([Compare::version("jobs/a", CompareOp::Greater, 0)])
                .and_then([TxnOp::put(format!("jobs/txn-{user}"), "v", None)]);
            outcome(c.txn(txn).await)
        }
        6 => {
            let txn = Txn::new()
                .when([Compare::version("jobs/a", CompareOp::Equal, 0)])
                .or_else([TxnOp::put("config/a", format!("txn by {user}"), None)]);
            outcome(c.txn(txn).await)
        }
        7 => {
            let mut stream = match c
                .watch("config/", Some(WatchOptions::new().with_prefix()))
                .await
            {
                Ok(w) => w,
                Err(e) => return outcome::<()>(Err(e)),
            };
            match tokio::time::timeout(Duration::from_secs(10), stream.message()).await {
                Ok(Ok(Some(resp))) if resp.canceled() => Err((
                    Code::PermissionDenied,
                    format!("watch cancelled: {}", resp.cancel_reason()),
                )),
                Ok(Ok(Some(_))) => Ok(()),
                Ok(Ok(None)) => Err((Code::Unknown, "watch stream ended".into())),
                Ok(Err(e)) => outcome::<()>(Err(e)),
                Err(_) => Err((Code::DeadlineExceeded, "no watch answer in 10 s".into())),
            }
        }
        8 => {
            let lease = match c.lease_grant(30, None).await {
                Ok(l) => l.id(),
                Err(e) => return outcome::<()>(Err(e)),
            };
            let (mut keeper, mut replies) = match c.lease_keep_alive(lease).await {
                Ok(k) => k,
                Err(e) => return outcome::<()>(Err(e)),
            };
            if let Err(e) = keeper.keep_alive().await {
                return outcome::<()>(Err(e));
            }
            if let Err(e) = replies.message().await {
                return outcome::<()>(Err(e));
            }
            outcome(c.lease_time_to_live(lease, None).await)
        }
        9 => {
            let lease = root.lease_grant(30, None).await.expect("root grants").id();
            root.put(
                format!("jobs/leased-{user}"),
                "v",
                Some(PutOptions::new().with_lease(lease)),
            )
            .await
            .expect("root puts");
            let refused = outcome(c.lease_revoke(lease).await);
            if refused.is_err() {
                root.lease_revoke(lease).await.expect("root revokes");
            }
            refused
        }
        10 => {
            let lease = c.lease_grant(30, None).await.expect("grant").id();
            let held = c
                .lock("jobs/lock", Some(LockOptions::new().with_lease(lease)))
                .await;
            let out = match held {
                Ok(held) => outcome(c.unlock(held.key()).await),
                Err(e) => outcome::<()>(Err(e)),
            };
            let _ = c.lease_revoke(lease).await;
            out
        }
        11 => {
            let lease = c.lease_grant(30, None).await.expect("grant").id();
            let out = match c.campaign("jobs/election", user, lease).await {
                Ok(resp) => match resp.leader() {
                    Some(leader) => outcome(
                        c.resign(Some(
                            etcd_client::ResignOptions::new().with_leader(leader.clone()),
                        ))
                        .await,
                    ),
                    None => Err((Code::Unknown, "campaign gave no leader key".into())),
                },
                Err(e) => outcome::<()>(Err(e)),
            };
            let _ = c.lease_revoke(lease).await;
            out
        }
        12 => outcome(c.member_list().await),
        13 => match c.member_add(["not a url"], None).await {
            // Past the permission check, the URL is refused: nothing added.
            Err(e) if code(&e) != Code::PermissionDenied => Ok(()),
            other => outcome(other),
        },
        14 => match c.snapshot().await {
            Ok(mut stream) => outcome(stream.message().await),
            Err(e) => outcome::<()>(Err(e)),
        },
        15 => outcome(c.user_add(format!("made-by-{user}"), "pw", None).await),
        16 => outcome(c.compact(1, None).await),
        _ => unreachable!("no operation {op}"),
    }
}

/// Runs every operation as every user at `endpoint` and checks each
/// against [`ALLOWED`]: allowed ones succeed, refused ones fail with
/// PermissionDenied. Then checks that no refused write changed anything,
/// and that an anonymous request is refused as etcd refuses it.
pub async fn check(endpoint: &str) {
    let mut root = connect_as(endpoint, ROOT).await;
    let mut failures = Vec::new();
    for (column, who) in [ROOT, READER, WORKER, NOBODY].into_iter().enumerate() {
        let mut client = connect_as(endpoint, who).await;
        for (op, name) in OPERATIONS.iter().enumerate() {
            let got = run(op, who.0, &mut client, &mut root).await;
            let allowed = ALLOWED[op][column];
            match (&got, allowed) {
                (Ok(()), true) => {}
                (Err((Code::PermissionDenied, _)), false) => {}
                _ => failures.push(format!(
                    "{name} as {}: expected {}, got {got:?}",
                    who.0,
                    if allowed {
                        "allowed"
                    } else {
                        "PermissionDenied"
                    }
                )),
            }
        }
    }
    assert!(
        failures.is_empty(),
        "permission matrix:\n{}",
        failures.join("\n")
    );
    nothing_refused_was_written(&mut root).await;

    // Root may not forge latchkey's own records (only the proxy role
    // writes them), directly or through a proxy.
    let e = root
        .put(b"\0latchkey/audit/forged".to_vec(), "x", None)
        .await
        .expect_err("root forging an audit record");
    assert_eq!(code(&e), Code::InvalidArgument, "{e}");

    // No token at all: etcd's "user name is empty".
    let mut anonymous = connect_anonymous(endpoint).await;
    let e = anonymous
        .get("config/a", None)
        .await
        .expect_err("anonymous read");
    assert_eq!(code(&e), Code::InvalidArgument, "{e}");
    assert!(e.to_string().contains("user name is empty"), "{e}");
}

/// After the matrix's operations (over gRPC or HTTP), read as root: the
/// writes of users who may not write left nothing. `config/a` was last
/// written by root's txn; `jobs/` holds what root and the worker wrote;
/// only root added users.
pub async fn nothing_refused_was_written(root: &mut Client) {
    let config = root.get("config/a", None).await.expect("get");
    // Root's own put and txn are the last that may have written it.
    assert_eq!(
        config.kvs()[0].value_str().expect("utf8"),
        "txn by root",
        "only root wrote config/a"
    );
    let jobs = root
        .get(
            "jobs/",
            Some(GetOptions::new().with_prefix().with_keys_only()),
        )
        .await
        .expect("get");
    let mut keys: Vec<&str> = jobs
        .kvs()
        .iter()
        .map(|kv| kv.key_str().expect("utf8"))
        .collect();
    keys.sort();
    assert_eq!(
        keys,
        [
            "jobs/a",
            "jobs/root",
            "jobs/txn-root",
            "jobs/txn-worker",
            "jobs/worker"
        ],
        "jobs/ holds what root and worker wrote, nothing from reader or nobody"
    );
    let users = root.user_list().await.expect("user list");
    assert!(
        users
            .users()
            .iter()
            .all(|u| !u.starts_with("made-by-") || u == "made-by-root"),
        "only root added users: {:?}",
        users.users()
    );
}

/// etcdctl's auth commands and `--user` at `ep` (`host:port`, a member
/// or a proxy; authentication off): users, a role with a prefix, auth on,
/// allowed and refused requests, wrong credentials, a revoked permission,
/// auth off again.
pub async fn etcdctl_session(ep: &str) {
    let ep = ep.to_string();
    let run = |args: &'static [&'static str]| {
        let ep = ep.clone();
        async move { etcdctl(&ep, args, None).await }
    };
    assert_eq!(
        run(&["--interactive=false", "user", "add", "root:rootpw"]).await,
        "User root created\n"
    );
    assert_eq!(
        run(&["--interactive=false", "user", "add", "alice:alicepw"]).await,
        "User alice created\n"
    );
    assert_eq!(run(&["role", "add", "jobs"]).await, "Role jobs created\n");
    assert_eq!(
        run(&[
            "role",
            "grant-permission",
            "jobs",
            "--prefix",
            "readwrite",
            "jobs/"
        ])
        .await,
        "Role jobs updated\n"
    );
    assert_eq!(
        run(&["user", "grant-role", "alice", "jobs"]).await,
        "Role jobs is granted to user alice\n"
    );
    // etcdctl adds the root role and grants it to root when the cell
    // answers that root lacks it, as etcd does.
    assert_eq!(run(&["auth", "enable"]).await, "Authentication Enabled\n");

    let e = try_etcdctl(&ep, &["put", "jobs/1", "x"], None)
        .await
        .expect_err("anonymous");
    assert!(e.contains("user name is empty"), "{e}");
    assert_eq!(
        run(&["--user", "alice:alicepw", "put", "jobs/1", "x"]).await,
        "OK\n"
    );
    assert_eq!(
        run(&["--user", "alice:alicepw", "get", "jobs/1"]).await,
        "jobs/1\nx\n"
    );
    let e = try_etcdctl(&ep, &["--user", "alice:alicepw", "put", "other", "x"], None)
        .await
        .expect_err("no permission on other");
    assert!(e.contains("permission denied"), "{e}");
    for wrong in ["alice:nope", "mallory:alicepw"] {
        let e = try_etcdctl(&ep, &["--user", wrong, "get", "jobs/1"], None)
            .await
            .expect_err("wrong credentials");
        assert!(
            e.contains("authentication failed, invalid user ID or password"),
            "{e}"
        );
    }
    assert_eq!(
        run(&["--user", "root:rootpw", "role", "get", "jobs"]).await,
        "Role jobs\nKV Read:\n\t[jobs/, jobs0) (prefix jobs/)\nKV Write:\n\t[jobs/, jobs0) (prefix jobs/)\n"
    );
    assert_eq!(
        run(&["--user", "root:rootpw", "user", "list"]).await,
        "alice\nroot\n"
    );
    assert_eq!(
        run(&["--user", "root:rootpw", "user", "get", "alice"]).await,
        "User: alice\nRoles: jobs\n"
    );
    let e = try_etcdctl(
        &ep,
        &["--user", "root:rootpw", "user", "delete", "root"],
        None,
    )
    .await
    .expect_err("root stays while auth is on");
    assert!(e.contains("invalid auth management"), "{e}");
    let e = try_etcdctl(&ep, &["--user", "alice:alicepw", "auth", "disable"], None)
        .await
        .expect_err("alice is no admin");
    assert!(e.contains("permission denied"), "{e}");
    assert_eq!(
        run(&[
            "--user",
            "root:rootpw",
            "role",
            "revoke-permission",
            "jobs",
            "jobs/",
            "--prefix"
        ])
        .await,
        "Permission of range [jobs/, jobs0) is revoked from role jobs\n"
    );
    let e = try_etcdctl(&ep, &["--user", "alice:alicepw", "get", "jobs/1"], None)
        .await
        .expect_err("revoked");
    assert!(e.contains("permission denied"), "{e}");
    assert_eq!(
        run(&["--user", "root:rootpw", "auth", "disable"]).await,
        "Authentication Disabled\n"
    );
    assert_eq!(run(&["get", "jobs/1"]).await, "jobs/1\nx\n");
}
