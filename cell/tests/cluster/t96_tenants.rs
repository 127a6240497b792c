//! Tenants on a cell: prefixes with one owner, quotas enforced where writes
//! apply (a put or a txn through any member, refused whole), use counted
//! and rebuilt after every member restarts, changes written with an audit
//! record, and only by root once authentication is on.

use crate::CELL_BIN;
use etcd_client::{GetOptions, Txn, TxnOp};
use latchkey_shared::auth_pb::auth_client::AuthClient;
use latchkey_shared::auth_pb::AuthenticateRequest;
use latchkey_shared::tenants_pb::tenants_client::TenantsClient;
use latchkey_shared::tenants_pb::*;
use latchkey_testkit::auth_matrix::{self, code, connect_anonymous, ROOT, WORKER};
use latchkey_testkit::eventually::eventually;
use latchkey_testkit::Cluster;
use std::time::Duration;
use tonic::transport::Channel;
use tonic::Code;

fn tenant(name: &str, prefixes: &[&str], max_keys: u64, max_bytes: u64) -> TenantPutRequest {
    TenantPutRequest {
        tenant: Some(Tenant {
            name: name.into(),
            prefixes: prefixes.iter().map(|p| p.as_bytes().to_vec()).collect(),
            max_keys,
            max_bytes,
            ..Default::default()
        }),
    }
}

async fn usage(admin: &mut TenantsClient<Channel>, name: &str) -> (u64, u64) {
    let info = admin
        .get(TenantGetRequest { name: name.into() })
        .await
        .expect("tenant get")
        .into_inner()
        .info
        .expect("info");
    let u = info.usage.expect("usage");
    (u.keys, u.bytes)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quotas_hold_on_every_member_refuse_whole_writes_and_survive_a_restart() {
    let mut cluster = Cluster::start(CELL_BIN, 3, &[]).await;
    let leader = cluster.wait_leader(Duration::from_secs(10)).await;
    let follower = cluster.follower_of(leader);
    // Changed through a follower, which forwards its txn to the leader.
    let mut admin = TenantsClient::connect(cluster.url(follower))
        .await
        .expect("connect");
    admin
        .put(tenant("acme", &["acme/"], 3, 0))
        .await
        .expect("put acme");
    admin
        .put(tenant("globex", &["globex/"], 0, 100))
        .await
        .expect("put globex");
    for (bad, why) in [
        (tenant("evil", &["acme/x"], 1, 0), "overlaps"),
        (tenant("evil", &["\0latchkey/x"], 1, 0), "reserved"),
        (tenant("a/b", &["ab/"], 1, 0), "without '/'"),
    ] {
        let e = admin.put(bad).await.expect_err(why);
        assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
    }

    let mut kv = connect_anonymous(&cluster.url(follower)).await;
    kv.put("acme/0", "v", None).await.expect("first");
    kv.put("acme/1", "v", None).await.expect("second");
    kv.put("acme/2", "v", None).await.expect("third");
    let e = kv.put("acme/3", "v", None).await.expect_err("a fourth key");
    assert_eq!(code(&e), Code::ResourceExhausted, "{e}");
    // Refused whole: the txn's key outside any tenant is not written.
    let txn = Txn::new().and_then([
        TxnOp::put("free/1", "x", None),
        TxnOp::put("acme/3", "v", None),
    ]);
    let e = kv.txn(txn).await.expect_err("a txn adding a fourth key");
    assert_eq!(code(&e), Code::ResourceExhausted, "{e}");
    assert_eq!(kv.get("free/1", None).await.expect("get").count(), 0);
    // Replacing a key, keys of no tenant and another tenant's keys pass.
    kv.put("acme/0", "v2", None).await.expect("replace");
    kv.put("free/2", "x", None).await.expect("no one's key");
    kv.put("globex/a", "x".repeat(80), None)
        .await
        .expect("88 of 100 bytes");
    let e = kv
        .put("globex/b", "x".repeat(10), None)
        .await
        .expect_err("past 100 bytes");
    assert_eq!(code(&e), Code::ResourceExhausted, "{e}");
    assert_eq!(usage(&mut admin, "acme").await, (3, 22));
    assert_eq!(usage(&mut admin, "globex").await, (1, 88));

    // Every member counts alike, and counts again from its state after a
    // restart of all of them.
    cluster.stop_all().await;
    for id in 1..=3 {
        cluster.spawn(id);
    }
    cluster.wait_leader(Duration::from_secs(15)).await;
    for id in 1..=3 {
        let mut member = TenantsClient::connect(cluster.url(id))
            .await
            .expect("connect");
        eventually(Duration::from_secs(10), async || {
            match member
                .get(TenantGetRequest {
                    name: "acme".into(),
                })
                .await
            {
                Ok(r) => {
                    let u = r
                        .into_inner()
                        .info
                        .and_then(|i| i.usage)
                        .unwrap_or_default();
                    if (u.keys, u.bytes) == (3, 22) {
                        Ok(())
                    } else {
                        Err(format!("member {id}: {u:?}"))
                    }
                }
                Err(e) => Err(format!("member {id}: {e}")),
            }
        })
        .await;
    }
    let mut kv = connect_anonymous(&cluster.url(leader)).await;
    let e = kv
        .put("acme/3", "v", None)
        .await
        .expect_err("still a fourth key after the restart");
    assert_eq!(code(&e), Code::ResourceExhausted, "{e}");
    kv.delete("acme/1", None).await.expect("delete one");
    kv.put("acme/3", "v", None).await.expect("room again");

    // Each change left an audit record naming the actor.
    let audit = kv
        .get(
            b"\0latchkey/audit/tenant/".to_vec(),
            Some(GetOptions::new().with_prefix()),
        )
        .await
        .expect("audit records");
    assert_eq!(audit.count(), 2, "acme and globex");
    let record: serde_json::Value = serde_json::from_slice(audit.kvs()[0].value()).expect("json");
    assert_eq!(record["action"], "tenant_put");
    assert_eq!(record["actor"], "anonymous");

    // Without the tenant, its keys are no one's.
    let mut admin = TenantsClient::connect(cluster.url(leader))
        .await
        .expect("connect");
    admin
        .delete(TenantDeleteRequest {
            name: "acme".into(),
        })
        .await
        .expect("delete acme");
    let e = admin
        .get(TenantGetRequest {
            name: "acme".into(),
        })
        .await
        .expect_err("gone");
    assert_eq!(e.code(), Code::NotFound, "{e:?}");
    kv.put("acme/9", "v", None).await.expect("no quota now");
    // Each member's gauges: a deleted tenant's show 0.
    for (series, want) in [
        ("latchkey_tenant_keys{tenant=\"globex\"}", 1.0),
        ("latchkey_tenant_bytes{tenant=\"globex\"}", 88.0),
        ("latchkey_tenant_keys{tenant=\"acme\"}", 0.0),
    ] {
        eventually(Duration::from_secs(10), async || {
            match cluster.metric(leader, series).await {
                Some(got) if got == want => Ok(()),
                got => Err(format!("{series}: {got:?}, not {want}")),
            }
        })
        .await;
    }
    let listed = admin
        .list(TenantListRequest {})
        .await
        .expect("list")
        .into_inner()
        .tenants;
    assert_eq!(listed.len(), 1);
    assert_eq!(
        listed[0].tenant.as_ref().map(|t| t.name.as_str()),
        Some("globex")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_root_changes_or_reads_tenants_once_authentication_is_on() {
    let cluster = Cluster::start(CELL_BIN, 1, &[]).await;
    let ep = cluster.url(1);
    auth_matrix::configure(&ep).await;
    let auth = AuthClient::connect(ep.clone()).await.expect("connect");
    let token = async |(name, password): (&str, &str)| {
        auth.clone()
            .authenticate(AuthenticateRequest {
                name: name.into(),
                password: password.into(),
            })
            .await
            .expect("authenticate")
            .into_inner()
            .token
    };
    let (worker, root) = (token(WORKER).await, token(ROOT).await);
    let admin = TenantsClient::connect(ep).await.expect("connect");
    let put_as = async |token: &str| {
        let mut request = tonic::Request::new(tenant("jobs", &["jobs/"], 10, 0));
        request
            .metadata_mut()
            .insert("token", token.parse().expect("ascii"));
        admin.clone().put(request).await
    };
    let e = put_as(&worker).await.expect_err("a worker");
    assert_eq!(e.code(), Code::PermissionDenied, "{e:?}");
    let mut list = tonic::Request::new(TenantListRequest {});
    list.metadata_mut()
        .insert("token", worker.parse().expect("ascii"));
    let e = admin.clone().list(list).await.expect_err("a worker lists");
    assert_eq!(e.code(), Code::PermissionDenied, "{e:?}");
    put_as(&root).await.expect("root");
    let e = admin
        .clone()
        .list(TenantListRequest {})
        .await
        .expect_err("no token");
    assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
}
