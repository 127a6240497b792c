//! `latchkey-bench-sessions`: many client sessions kept alive through ONE
//! proxy in front of a 3-member cell, half over HTTP and half over gRPC
//! (etcd's keep-alive stream), each refreshed every third of its TTL as
//! etcd's clients do. Prints what the proxy's design is for: spurious
//! expiries (must be 0), client keep-alives/s and their latency, the
//! refresh batches the cell sees per second, the proxy's CPU and memory and
//! the cell leader's CPU.
//!
//! `scripts/bench-sessions.sh` builds it (release) and runs it. A
//! benchmark, not a test.

mod binaries;
#[allow(dead_code)] // the closed loop and the rest are latchkey-bench's
mod stats;

use binaries::binary;
use clap::Parser;
use futures::StreamExt;
use latchkey_shared::client::{KeepAliveStream, RefreshStream};
use latchkey_testkit::{grant_leases, Cluster, ProxyProcess};
use stats::{cpu_seconds, percentile_ms};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

#[derive(Parser, Debug)]
#[command(
    about = "sessions kept alive through one latchkey proxy: expiries, keep-alive rate and latency, cost"
)]
struct Args {
    /// Sessions in all; half over HTTP, half over gRPC.
    #[arg(long, default_value_t = 100_000)]
    sessions: usize,
    /// Their TTL in seconds; each is refreshed every third of it.
    #[arg(long, default_value_t = 30)]
    ttl: u64,
    /// Seconds of keep-alives after the last session is created.
    #[arg(long, default_value_t = 60)]
    duration: u64,
    /// The proxy's --refresh-tick.
    #[arg(long, default_value = "500ms")]
    refresh_tick: String,
    /// HTTP clients (each with its share of the sessions, one request at a
    /// time).
    #[arg(long, default_value_t = 64)]
    http_clients: usize,
    /// gRPC keep-alive streams (each carrying its share of the sessions).
    #[arg(long, default_value_t = 8)]
    grpc_streams: usize,
    /// The latchkey-cell binary (default: next to this one).
    #[arg(long)]
    cell_bin: Option<PathBuf>,
    /// The latchkey-proxy binary (default: next to this one).
    #[arg(long)]
    proxy_bin: Option<PathBuf>,
}

/// Each client's sessions are spread over its refresh period in this many
/// slices, so keep-alives arrive evenly rather than in one burst.
const SLICES: usize = 100;

#[derive(Default)]
struct Tally {
    keepalives: AtomicU64,
    expired: AtomicU64,
    errors: AtomicU64,
    /// HTTP: one keep-alive's latency. gRPC: one slice's round (every
    /// keep-alive of the slice answered), an upper bound for each.
    http_us: Mutex<Vec<u64>>,
    grpc_us: Mutex<Vec<u64>>,
    first_error: Mutex<Option<String>>,
}

impl Tally {
    fn error(&self, e: String) {
        self.errors.fetch_add(1, Ordering::Relaxed);
        if let Ok(mut first) = self.first_error.lock() {
            first.get_or_insert(e);
        }
    }
}

fn rss_mib(pid: u32) -> f64 {
    latchkey_testkit::process::rss_bytes(pid).map_or(0.0, |b| b as f64 / (1 << 20) as f64)
}

async fn http_create(http: &reqwest::Client, base: &str, n: usize, ttl: u64) -> Vec<i64> {
    futures::stream::iter(0..n)
        .map(|_| async move {
            let body: serde_json::Value = http
                .post(format!("http://{base}/v1/sessions"))
                .body(format!("{{\"ttl\": {ttl}}}"))
                .send()
                .await
                .map_err(|e| e.to_string())?
                .json()
                .await
                .map_err(|e| e.to_string())?;
            let id = body["id"].as_str().ok_or_else(|| body.to_string())?;
            i64::from_str_radix(id, 16).map_err(|e| e.to_string())
        })
        .buffer_unordered(64)
        .map(|r: Result<i64, String>| r.unwrap_or_else(|e| panic!("create a session: {e}")))
        .collect()
        .await
}

/// One client's loop: its sessions in `SLICES` slices, one slice every
/// period / SLICES, until `end`.
async fn every_slice<F, Fut>(ids: Vec<i64>, period: Duration, end: Instant, mut refresh: F)
where
    F: FnMut(Vec<i64>) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let slices: Vec<Vec<i64>> = (0..SLICES)
        .map(|k| ids.iter().skip(k).step_by(SLICES).copied().collect())
        .collect();
    let mut tick = tokio::time::interval(period / SLICES as u32);
    let mut k = 0;
    while Instant::now() < end {
        tick.tick().await;
        refresh(slices[k % SLICES].clone()).await;
        k += 1;
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let cell_bin = binary(args.cell_bin.clone(), "latchkey-cell", "--cell-bin")?;
    let proxy_bin = binary(args.proxy_bin.clone(), "latchkey-proxy", "--proxy-bin")?;
    let mut cluster = Cluster::start(cell_bin, 3, &[]).await;
    let cells: Vec<String> = cluster.members.iter().map(|m| m.client.clone()).collect();
    let proxy =
        ProxyProcess::start(&proxy_bin, &cells, &["--refresh-tick", &args.refresh_tick]).await;
    let leader = cluster.wait_leader(Duration::from_secs(10)).await;
    let leader_pid = cluster.pid(leader).unwrap_or_default();
    let period = Duration::from_secs(args.ttl) / 3;

    let created = Instant::now();
    let grpc_client =
        etcd_client::Client::connect([format!("http://{}", proxy.grpc)], None).await?;
    let http = reqwest::Client::new();
    let half = args.sessions / 2;
    let grpc_ids = grant_leases(&grpc_client, half, args.ttl as i64).await;
    let http_ids = http_create(&http, &proxy.http, args.sessions - half, args.ttl).await;
    eprintln!(
        "{} sessions created in {:.1} s",
        args.sessions,
        created.elapsed().as_secs_f64()
    );

    let tally = Arc::new(Tally::default());
    let (cpu_proxy0, cpu_leader0) = (cpu_seconds(&[proxy.pid()]), cpu_seconds(&[leader_pid]));
    let batches0 = cluster.metric_sum("latchkey_refresh_batches_total").await;
    let started = Instant::now();
    let end = started + Duration::from_secs(args.duration);
    let mut tasks = Vec::new();
    for share in grpc_ids.chunks(grpc_ids.len().div_ceil(args.grpc_streams).max(1)) {
        let (ids, tally, addr) = (share.to_vec(), tally.clone(), proxy.grpc.clone());
        tasks.push(tokio::spawn(async move {
            let stream = Arc::new(tokio::sync::Mutex::new(
                KeepAliveStream::open(&addr)
                    .await
                    .expect("a keep-alive stream"),
            ));
            every_slice(ids, period, end, |slice| {
                let (stream, tally) = (stream.clone(), tally.clone());
                async move {
                    let t = Instant::now();
                    match stream
                        .lock()
                        .await
                        .refresh(&slice, Duration::from_secs(10))
                        .await
                    {
                        Ok(ttls) => {
                            let gone = slice
                                .iter()
                                .filter(|id| ttls.get(id).is_none_or(|t| *t <= 0))
                                .count();
                            tally.expired.fetch_add(gone as u64, Ordering::Relaxed);
                            tally
                                .keepalives
                                .fetch_add(slice.len() as u64, Ordering::Relaxed);
                            if let Ok(mut v) = tally.grpc_us.lock() {
                                v.push(t.elapsed().as_micros() as u64);
                            }
                        }
                        Err(e) => tally.error(e.to_string()),
                    }
                }
            })
            .await;
        }));
    }
    for share in http_ids.chunks(http_ids.len().div_ceil(args.http_clients).max(1)) {
        let (ids, tally, http, base) = (
            share.to_vec(),
            tally.clone(),
            http.clone(),
            proxy.http.clone(),
        );
        tasks.push(tokio::spawn(async move {
            every_slice(ids, period, end, |slice| {
                let (tally, http, base) = (tally.clone(), http.clone(), base.clone());
                async move {
                    for id in slice {
                        let t = Instant::now();
                        let url = format!("http://{base}/v1/sessions/{id:016x}/keepalive");
                        match http.post(url).send().await {
                            Ok(r) if r.status() == 200 => {
                                tally.keepalives.fetch_add(1, Ordering::Relaxed);
                                if let Ok(mut v) = tally.http_us.lock() {
                                    v.push(t.elapsed().as_micros() as u64);
                                }
                            }
                            Ok(r) if r.status() == 404 => {
                                tally.expired.fetch_add(1, Ordering::Relaxed);
                            }
                            Ok(r) => tally.error(format!(
                                "{}: {}",
                                r.status(),
                                r.text().await.unwrap_or_default()
                            )),
                            Err(e) => tally.error(e.to_string()),
                        }
                    }
                }
            })
            .await;
        }));
    }
    for task in tasks {
        task.await?;
    }
    let elapsed = started.elapsed().as_secs_f64();
    let proxy_cpu = (cpu_seconds(&[proxy.pid()]) - cpu_proxy0) / elapsed * 100.0;
    let leader_cpu = (cpu_seconds(&[leader_pid]) - cpu_leader0) / elapsed * 100.0;
    let batches = (cluster.metric_sum("latchkey_refresh_batches_total").await - batches0) / elapsed;
    let proxy_rss = rss_mib(proxy.pid());

    // Every session must still be alive on the cell itself.
    let all: Vec<i64> = grpc_ids.iter().chain(&http_ids).copied().collect();
    let mut direct = RefreshStream::new(cells.iter().cloned())?;
    let reply = direct.refresh(&all, Duration::from_secs(30)).await?;
    let gone_on_cell = reply.ttls.iter().filter(|t| **t <= 0).count();

    let mut http_us = tally.http_us.lock().map(|v| v.clone()).unwrap_or_default();
    let mut grpc_us = tally.grpc_us.lock().map(|v| v.clone()).unwrap_or_default();
    http_us.sort_unstable();
    grpc_us.sort_unstable();
    let keepalives = tally.keepalives.load(Ordering::Relaxed);
    let expired = tally.expired.load(Ordering::Relaxed) + gone_on_cell as u64;
    let errors = tally.errors.load(Ordering::Relaxed);
    let result = serde_json::json!({
        "sessions": args.sessions,
        "ttl_s": args.ttl,
        "duration_s": elapsed,
        "spurious_expiries": expired,
        "keepalive_errors": errors,
        "client_keepalives_per_s": keepalives as f64 / elapsed,
        "http_keepalive_p50_ms": percentile_ms(&http_us, 0.50),
        "http_keepalive_p99_ms": percentile_ms(&http_us, 0.99),
        "grpc_slice_p50_ms": percentile_ms(&grpc_us, 0.50),
        "grpc_slice_p99_ms": percentile_ms(&grpc_us, 0.99),
        "upstream_batches_per_s": batches,
        "proxy_cpu_percent": proxy_cpu,
        "proxy_rss_mib": proxy_rss,
        "cell_leader_cpu_percent": leader_cpu,
    });
    println!("{result}");
    println!(
        "\n{} sessions (TTL {} s, half HTTP, half gRPC) through one proxy for {:.0} s\n\
         spurious expiries        {expired}  (keep-alive errors: {errors})\n\
         client keep-alives/s     {:.0}\n\
         HTTP keep-alive          p50 {:.2} ms  p99 {:.2} ms\n\
         gRPC keep-alive (slice)  p50 {:.2} ms  p99 {:.2} ms\n\
         upstream batches/s       {batches:.2}  (the cell's refresh batches)\n\
         proxy                    CPU {proxy_cpu:.0} %  RSS {proxy_rss:.0} MiB\n\
         cell leader              CPU {leader_cpu:.0} %",
        args.sessions,
        args.ttl,
        elapsed,
        keepalives as f64 / elapsed,
        percentile_ms(&http_us, 0.50),
        percentile_ms(&http_us, 0.99),
        percentile_ms(&grpc_us, 0.50),
        percentile_ms(&grpc_us, 0.99),
    );
    if let Some(e) = tally.first_error.lock().ok().and_then(|e| e.clone()) {
        println!("first error: {e}");
    }
    drop(proxy);
    cluster.stop_all().await;
    Ok(())
}
