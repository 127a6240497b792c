//! 20 000 sessions kept alive through proxies, half over HTTP and half
//! over gRPC (etcd's keep-alive stream, many leases on it), with the cell
//! seeing one refresh batch per tick per proxy; sessions whose clients
//! stop expire within TTL + 2 ticks; none of the others expire, also when
//! the cell's leader is SIGKILLed and when half the clients move to a
//! second proxy.

use crate::{member_addrs, proxy_bin};
use futures::StreamExt;
use latchkey_shared::client::{KeepAliveStream, RefreshStream};
use latchkey_testkit::{cell_binary, grant_leases, Cluster, ProxyProcess};
use std::collections::BTreeSet;
use tokio::time::{sleep, Duration, Instant};

const SESSIONS_PER_API: usize = 10_000;
/// Sessions per API whose clients stop after the first round.
const STOPPERS_PER_API: usize = 250;
const TTL: i64 = 10;
/// Sessions granted per API before everything granted so far is refreshed:
/// granting all 20 000 and only then refreshing took longer than the TTL
/// on a loaded CI run (a debug build beside another test), and the first
/// 1 086 leases expired before round 1, as they should.
const GRANT_CHUNK: usize = 2_500;
const TICK: Duration = Duration::from_millis(500);
/// Clients refresh every TTL/3, as etcd's clients do.
const PERIOD: Duration = Duration::from_millis(3_333);
/// HTTP keep-alives in flight per round. Each session stands for one
/// client, and clients do not wait for each other: a proxy answers a
/// session it does not know yet (a client that moved to it) only with the
/// next tick's batch, so a handful of connections taking turns would make
/// the last of 5 000 moved sessions wait 150 ticks, past its TTL.
const HTTP_IN_FLIGHT: usize = 1024;
/// Allowance for the expiry to be proposed, committed, applied and read
/// on a loaded 2-core machine (the lessor ticks, a Raft round, a read).
const EXPIRY_SLACK: Duration = Duration::from_secs(2);

/// The cell's refresh batches and single keep-alives, summed over the
/// members that run.
async fn cell_counters(cluster: &Cluster) -> (f64, f64) {
    (
        cluster.metric_sum("latchkey_refresh_batches_total").await,
        cluster.metric_sum("latchkey_lease_keepalives_total").await,
    )
}

async fn http_grant(http: &reqwest::Client, proxy: &str, n: usize) -> Vec<i64> {
    futures::stream::iter(0..n)
        .map(|_| async move {
            let resp: serde_json::Value = http
                .post(format!("http://{proxy}/v1/sessions"))
                .body(format!("{{\"ttl\": {TTL}}}"))
                .send()
                .await
                .expect("create a session")
                .json()
                .await
                .expect("JSON");
            let id = resp["id"].as_str().unwrap_or_else(|| panic!("{resp}"));
            i64::from_str_radix(id, 16).expect("hex id")
        })
        .buffer_unordered(HTTP_IN_FLIGHT)
        .collect()
        .await
}

/// One HTTP keep-alive round through `proxy`: every answer must be 200
/// with a TTL.
async fn http_round(http: &reqwest::Client, proxy: &str, ids: &[i64]) {
    let failures: Vec<String> = futures::stream::iter(ids.iter().copied())
        .map(|id| async move {
            let url = format!("http://{proxy}/v1/sessions/{id:016x}/keepalive");
            match http.post(url).send().await {
                Ok(r) if r.status() == 200 => {
                    let body: serde_json::Value = r.json().await.unwrap_or_default();
                    match body["ttl"].as_i64() {
                        Some(ttl) if ttl > 0 => None,
                        _ => Some(format!("{id:016x}: {body}")),
                    }
                }
                Ok(r) => Some(format!(
                    "{id:016x}: {} {}",
                    r.status(),
                    r.text().await.unwrap_or_default()
                )),
                Err(e) => Some(format!("{id:016x}: {e}")),
            }
        })
        .buffer_unordered(HTTP_IN_FLIGHT)
        .filter_map(futures::future::ready)
        .collect()
        .await;
    assert!(
        failures.is_empty(),
        "{} HTTP keep-alives failed: {:?}",
        failures.len(),
        &failures[..failures.len().min(5)]
    );
}

/// One gRPC keep-alive round on `stream`: every lease answered alive.
async fn grpc_round(stream: &mut KeepAliveStream, ids: &[i64]) {
    let ttls = stream
        .refresh(ids, Duration::from_secs(20))
        .await
        .unwrap_or_else(|e| panic!("gRPC keep-alive round at {}: {e}", stream.endpoint()));
    let dead: Vec<String> = ids
        .iter()
        .filter(|id| ttls.get(id).is_none_or(|ttl| *ttl <= 0))
        .map(|id| format!("{id:016x}"))
        .collect();
    assert!(
        dead.is_empty(),
        "{} gRPC sessions answered expired: {:?}",
        dead.len(),
        &dead[..dead.len().min(5)]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn twenty_thousand_sessions_survive_a_leader_kill_and_a_move_to_another_proxy() {
    let mut cluster = Cluster::start(cell_binary(), 3, &[]).await;
    let cells = member_addrs(&cluster);
    let tick = format!("{}ms", TICK.as_millis());
    let proxy_a = ProxyProcess::start(proxy_bin(), &cells, &["--refresh-tick", &tick]).await;
    let http = reqwest::Client::new();
    let grpc_client = etcd_client::Client::connect([format!("http://{}", proxy_a.grpc)], None)
        .await
        .expect("connect to the proxy");

    let mut grpc_a = KeepAliveStream::open(&proxy_a.grpc)
        .await
        .expect("keep-alive stream");
    // Granted a chunk at a time, what was granted kept alive meanwhile.
    let mut grpc_ids = Vec::with_capacity(SESSIONS_PER_API);
    let mut http_ids = Vec::with_capacity(SESSIONS_PER_API);
    while grpc_ids.len() < SESSIONS_PER_API {
        if !grpc_ids.is_empty() {
            grpc_round(&mut grpc_a, &grpc_ids).await;
            http_round(&http, &proxy_a.http, &http_ids).await;
        }
        grpc_ids.extend(grant_leases(&grpc_client, GRANT_CHUNK, TTL).await);
        http_ids.extend(http_grant(&http, &proxy_a.http, GRANT_CHUNK).await);
    }
    let (grpc_stop, grpc_live) = grpc_ids.split_at(STOPPERS_PER_API);
    let (http_stop, http_live) = http_ids.split_at(STOPPERS_PER_API);

    // Round 1 refreshes everyone; the stoppers never again.
    let (batches_before, single_before) = cell_counters(&cluster).await;
    let window = Instant::now();
    let stop_started = Instant::now();
    grpc_round(&mut grpc_a, &grpc_ids).await;
    http_round(&http, &proxy_a.http, &http_ids).await;
    let stop_ended = Instant::now();

    let mut proxy_b: Option<ProxyProcess> = None;
    let mut grpc_b: Option<KeepAliveStream> = None;
    let mut stoppers_checked = false;
    let mut killed = None;
    // ~50 s: the stoppers expire by round 5, the leader dies at round 6,
    // proxy B takes half the clients at round 9; three TTLs after the kill.
    let rounds = 16;
    for round in 2..=rounds {
        let next = stop_started + PERIOD * (round - 1);
        sleep(next.saturating_duration_since(Instant::now())).await;
        if round == 3 {
            // One proxy so far: at most one batch per tick since round 1.
            let (batches, single) = cell_counters(&cluster).await;
            let ticks = window.elapsed().as_secs_f64() / TICK.as_secs_f64();
            assert!(
                batches - batches_before <= ticks + 1.0,
                "{} refresh batches in {ticks:.1} ticks",
                batches - batches_before
            );
            assert!(
                batches - batches_before >= 1.0,
                "no refresh batch reached the cell"
            );
            assert_eq!(single, single_before, "the proxy sent single keep-alives");
        }
        if round == 6 {
            // After the stoppers expired: a new leader gives every lease a
            // grace period, which would stretch their TTL + 2 ticks.
            assert!(
                stoppers_checked,
                "the stoppers were not checked before the kill"
            );
            let leader = cluster.wait_leader(Duration::from_secs(10)).await;
            cluster.kill(leader);
            killed = Some(leader);
        }
        if round == 9 {
            let b = ProxyProcess::start(proxy_bin(), &cells, &["--refresh-tick", &tick]).await;
            grpc_b = Some(
                KeepAliveStream::open(&b.grpc)
                    .await
                    .expect("keep-alive stream"),
            );
            proxy_b = Some(b);
        }
        // From round 9 on, the second half of each API's clients refresh
        // through proxy B (which adopts their sessions).
        let (grpc_here, grpc_there) = match &grpc_b {
            Some(_) => grpc_live.split_at(grpc_live.len() / 2),
            None => (grpc_live, &[][..]),
        };
        let (http_here, http_there) = match &proxy_b {
            Some(_) => http_live.split_at(http_live.len() / 2),
            None => (http_live, &[][..]),
        };
        grpc_round(&mut grpc_a, grpc_here).await;
        http_round(&http, &proxy_a.http, http_here).await;
        if let (Some(b), Some(stream)) = (&proxy_b, &mut grpc_b) {
            grpc_round(stream, grpc_there).await;
            http_round(&http, &b.http, http_there).await;
        }
        if !stoppers_checked
            && stop_ended.elapsed() > Duration::from_secs(TTL as u64) + TICK * 2 + EXPIRY_SLACK
        {
            check_stoppers_gone(&cluster, grpc_stop, http_stop, killed).await;
            stoppers_checked = true;
        }
    }
    assert!(stoppers_checked);
    // Two proxies now: at most one batch per tick each, over the last
    // rounds (the leader kill is long past).
    let (b0, _) = cell_counters(&cluster).await;
    let t0 = Instant::now();
    sleep(PERIOD).await;
    let (b1, single) = cell_counters(&cluster).await;
    let ticks = t0.elapsed().as_secs_f64() / TICK.as_secs_f64();
    assert!(
        b1 - b0 <= 2.0 * (ticks + 1.0),
        "{} batches in {ticks:.1} ticks from two proxies",
        b1 - b0
    );
    let _ = single;

    // Every live session is alive on the cell itself.
    let live: Vec<i64> = grpc_live.iter().chain(http_live).copied().collect();
    let mut direct = RefreshStream::new(
        cluster
            .running()
            .iter()
            .map(|id| cluster.member(*id).client.clone()),
    )
    .expect("refresh stream");
    let reply = direct
        .refresh(&live, Duration::from_secs(20))
        .await
        .expect("a direct refresh");
    let dead = reply.ttls.iter().filter(|t| **t <= 0).count();
    assert_eq!(dead, 0, "{dead} of {} live sessions expired", live.len());
}

/// The stoppers' sessions are gone from the cell (checked on a member
/// that runs, through etcd's LeaseTimeToLive, which refreshes nothing).
async fn check_stoppers_gone(cluster: &Cluster, grpc: &[i64], http: &[i64], killed: Option<u64>) {
    let member = cluster
        .running()
        .into_iter()
        .find(|id| Some(*id) != killed)
        .expect("a running member");
    let client = cluster.client(member).await;
    let ids: BTreeSet<i64> = grpc.iter().chain(http).copied().collect();
    let alive: Vec<String> = futures::stream::iter(ids)
        .map(|id| {
            let mut c = client.clone();
            async move {
                let ttl = c
                    .lease_time_to_live(id, None)
                    .await
                    .map(|r| r.ttl())
                    .unwrap_or(-1);
                (ttl > 0).then(|| format!("{id:016x} ({ttl} s left)"))
            }
        })
        .buffer_unordered(64)
        .filter_map(futures::future::ready)
        .collect()
        .await;
    assert!(
        alive.is_empty(),
        "{} stopped sessions outlived TTL + 2 ticks: {:?}",
        alive.len(),
        &alive[..alive.len().min(5)]
    );
}
