//! Elections (issue 13): etcd's `v3electionpb.Election` served by the
//! shared election recipe through a proxy and on a cell member, and the
//! HTTP elections with their Server-Sent Events observe stream.

use crate::t80_locks::{lease, Api};
use crate::{member_addrs, proxy_bin};
use etcd_client::Client;
use latchkey_testkit::{cell_binary, Cluster, ProxyProcess};
use std::time::Duration;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn elections_through_a_proxy_and_on_a_cell_member() {
    let cluster = Cluster::start(cell_binary(), 3, &[]).await;
    let proxy = ProxyProcess::start(proxy_bin(), &member_addrs(&cluster), &[]).await;
    election(&proxy.grpc, "through-proxy").await;
    let leader = cluster.wait_leader(Duration::from_secs(20)).await;
    election(
        &cluster.member(cluster.follower_of(leader)).client,
        "on-member",
    )
    .await;
}

/// The next value an Observe stream reports.
async fn observed(stream: &mut etcd_client::ObserveStream) -> String {
    let resp = tokio::time::timeout(Duration::from_secs(10), stream.message())
        .await
        .expect("an observation in time")
        .expect("observe")
        .expect("the stream is open");
    String::from_utf8_lossy(resp.kv().expect("a leader").value()).into_owned()
}

/// Campaign, Leader, Observe, Proclaim and Resign at `addr`.
async fn election(addr: &str, name: &str) {
    let endpoint = format!("http://{addr}");
    let mut client = Client::connect([endpoint.as_str()], None)
        .await
        .expect("connect");
    let first = lease(&mut client, 30).await;
    let won = client.campaign(name, "one", first).await.expect("campaign");
    let first_key = won.leader().expect("a leader key").clone();
    let leading = client.leader(name).await.expect("leader");
    assert_eq!(leading.kv().expect("a leader").value(), b"one");
    let mut observe = client.observe(name).await.expect("observe");
    assert_eq!(observed(&mut observe).await, "one");

    // A second campaign waits behind the leader.
    let second = lease(&mut client, 30).await;
    let mut other = client.clone();
    let name_owned = name.to_string();
    let waiting = tokio::spawn(async move {
        other
            .campaign(name_owned, "two", second)
            .await
            .expect("campaign")
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!waiting.is_finished(), "two leaders");

    // The leader proclaims; observers see it.
    client
        .proclaim(
            "uno",
            Some(etcd_client::ProclaimOptions::new().with_leader(first_key.clone())),
        )
        .await
        .expect("proclaim");
    assert_eq!(observed(&mut observe).await, "uno");

    // It resigns: the second leads, observers see it, and the old leader
    // key can no longer proclaim.
    client
        .resign(Some(
            etcd_client::ResignOptions::new().with_leader(first_key.clone()),
        ))
        .await
        .expect("resign");
    let second_won = tokio::time::timeout(Duration::from_secs(10), waiting)
        .await
        .expect("the second campaign wins once the leader resigns")
        .expect("campaign task");
    assert!(second_won.leader().expect("leader key").rev() > first_key.rev());
    assert_eq!(observed(&mut observe).await, "two");
    let stale = client
        .proclaim(
            "again",
            Some(etcd_client::ProclaimOptions::new().with_leader(first_key)),
        )
        .await;
    assert!(
        stale
            .as_ref()
            .is_err_and(|e| e.to_string().contains("election: not leader")),
        "a resigned leader proclaimed: {stale:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_elections_campaign_proclaim_resign_and_are_observed_in_order() {
    use serde_json::json;
    let proxy = ProxyProcess::dev(proxy_bin()).await;
    let api = Api::of(&proxy);
    let sessions = api.sessions(2).await;
    let resp = api
        .http
        .get(format!("{}/elections/primary/observe", api.base))
        .send()
        .await
        .expect("observe");
    assert_eq!(resp.status(), 200);
    let mut observed = Box::pin(resp.bytes_stream());

    let campaign = |session: &str, value: &str| {
        let (api, body) = (
            api.clone(),
            json!({"session_id": session, "value": value, "timeout_ms": 10000}),
        );
        async move { api.post("/elections/primary/campaign", body).await }
    };
    let (status, first) = campaign(&sessions[0], "a-1").await;
    assert_eq!(status, 200, "{first}");
    let second = tokio::spawn(campaign(&sessions[1], "b-1"));
    let leader = api.get("/elections/primary").await.expect("leader");
    assert_eq!(
        (&leader["session_id"], &leader["kv"]["value"]),
        (&json!(sessions[0]), &json!("a-1"))
    );
    let mut seen = leaders(&mut observed, 1).await;
    // Two values in quick succession: the observer sees both.
    for value in ["a-2", "a-3"] {
        let (status, body) = api
            .post(
                "/elections/primary/proclaim",
                json!({"session_id": sessions[0], "value": value}),
            )
            .await;
        assert_eq!(status, 200, "{body}");
    }
    // The leader resigns: the waiting candidate leads, with a higher token.
    let (status, body) = api
        .post(
            "/elections/primary/resign",
            json!({"session_id": sessions[0], "leader_revision": first["leader_revision"]}),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    let (status, next) = second.await.expect("second");
    assert_eq!(status, 200, "{next}");
    assert!(next["leader_revision"].as_i64() > first["leader_revision"].as_i64());
    // A resigned leader cannot proclaim.
    let (status, body) = api
        .post(
            "/elections/primary/proclaim",
            json!({"session_id": sessions[0], "leader_revision": first["leader_revision"], "value": "a-3"}),
        )
        .await;
    assert_eq!(
        (status, &body["error"]),
        (412, &json!("election_not_leader"))
    );

    // The observer saw each leader and value once, in order.
    seen.extend(leaders(&mut observed, 3).await);
    let expected = [
        (sessions[0].clone(), "a-1".to_string()),
        (sessions[0].clone(), "a-2".to_string()),
        (sessions[0].clone(), "a-3".to_string()),
        (sessions[1].clone(), "b-1".to_string()),
    ];
    assert_eq!(seen, expected);

    // Nobody leads after the last resigns.
    let (status, _) = api
        .post(
            "/elections/primary/resign",
            json!({"session_id": sessions[1]}),
        )
        .await;
    assert_eq!(status, 200);
    let resp = api
        .http
        .get(format!("{}/elections/primary", api.base))
        .send()
        .await
        .expect("leader");
    assert_eq!(resp.status(), 404);
}

/// The next `n` `leader` events of an election's SSE stream: (session,
/// value) each.
async fn leaders(
    observed: &mut (impl futures::Stream<Item = reqwest::Result<bytes::Bytes>> + Unpin),
    n: usize,
) -> Vec<(String, String)> {
    crate::t50_watch_sse::events(observed, n)
        .await
        .iter()
        .map(|block| {
            assert!(block.contains("event: leader"), "{block}");
            let data = block
                .lines()
                .find_map(|l| l.strip_prefix("data: "))
                .expect("data");
            let leader: serde_json::Value = serde_json::from_str(data).expect("JSON");
            (
                leader["session_id"].as_str().expect("session").to_string(),
                leader["kv"]["value"].as_str().expect("value").to_string(),
            )
        })
        .collect()
}
