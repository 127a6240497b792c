//! `latchkey-bench-watch`: many watchers of ONE key through ONE proxy in
//! front of a 3-member cell (DESIGN section 4), and the proxy's read cache
//! against a cell member.
//!
//! - Fan-out, once per `--jitters` value: `--watchers` gRPC watches of one
//!   key (many per stream, many streams per connection), then `--writes`
//!   writes of that key straight to the leader, one every `--write-every`.
//!   Prints write-to-client delivery p50/p99/max (from the moment the write
//!   was sent, so an upper bound of commit-to-client), events missed (must
//!   be 0), the watches the cell serves (must be 1), and the proxy's RSS
//!   and CPU.
//! - Reads: the same `--readers` etcd clients read one key serializably
//!   for `--read-seconds`, first through the proxy (answered from its
//!   cache), then straight from a follower: reads/s of each.
//!
//! `scripts/bench-watch.sh` builds it (release) and runs it. A benchmark,
//! not a test.

mod binaries;
#[allow(dead_code)] // the closed loop and the rest are latchkey-bench's
mod stats;

use binaries::binary;
use clap::Parser;
use futures::StreamExt;
use latchkey_shared::client::watches::open_watches;
use latchkey_testkit::process::rss_bytes;
use latchkey_testkit::{Cluster, ProxyProcess};
use stats::{cpu_seconds, percentile_ms};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

#[derive(Parser, Debug)]
#[command(about = "watch fan-out through one latchkey proxy, and its read cache vs a cell member")]
struct Args {
    /// Client watches of the one key.
    #[arg(long, default_value_t = 100_000)]
    watchers: usize,
    /// Watches per gRPC stream.
    #[arg(long, default_value_t = 500)]
    per_stream: usize,
    /// gRPC connections the streams share.
    #[arg(long, default_value_t = 10)]
    connections: usize,
    /// Writes of the watched key.
    #[arg(long, default_value_t = 40)]
    writes: usize,
    /// Time between writes (e.g. "500ms").
    #[arg(long, default_value = "500ms", value_parser = humantime::parse_duration)]
    write_every: Duration,
    /// The proxy's --fanout-jitter values, one run each.
    #[arg(long, value_delimiter = ',', default_value = "0s,100ms")]
    jitters: Vec<String>,
    /// Concurrent readers in the read comparison.
    #[arg(long, default_value_t = 32)]
    readers: usize,
    /// Seconds of reads on each target.
    #[arg(long, default_value_t = 10)]
    read_seconds: u64,
    /// The latchkey-cell binary (default: next to this one).
    #[arg(long)]
    cell_bin: Option<PathBuf>,
    /// The latchkey-proxy binary (default: next to this one).
    #[arg(long)]
    proxy_bin: Option<PathBuf>,
}

const KEY: &str = "bench/watched";
const READ_KEY: &str = "bench/read";

/// What one fan-out run measured.
struct FanOut {
    jitter: String,
    p50_ms: f64,
    p99_ms: f64,
    max_ms: f64,
    missed: u64,
    cell_watchers: f64,
    proxy_rss_mib: f64,
    proxy_cpu_percent: f64,
    setup_seconds: f64,
}

/// Each stream's deliveries: (revision, when received).
type Deliveries = Vec<(i64, Instant)>;

async fn fan_out(args: &Args, cluster: &Cluster, proxy_bin: &Path, jitter: &str) -> FanOut {
    let cells: Vec<String> = cluster.members.iter().map(|m| m.client.clone()).collect();
    let proxy = ProxyProcess::start(proxy_bin, &cells, &["--fanout-jitter", jitter]).await;
    let setup = Instant::now();
    let mut channels = Vec::new();
    for _ in 0..args.connections.max(1) {
        channels.push(
            latchkey_shared::client::connect(&proxy.grpc)
                .await
                .expect("connect to the proxy"),
        );
    }
    let streams = args.watchers.div_ceil(args.per_stream);
    let expected_per_stream: Vec<usize> = (0..streams)
        .map(|s| (args.watchers - s * args.per_stream).min(args.per_stream))
        .collect();
    let opened: Vec<_> = futures::stream::iter(expected_per_stream.iter().enumerate())
        .map(|(s, n)| {
            let channel = channels[s % channels.len()].clone();
            async move {
                open_watches(channel, KEY.as_bytes(), 0, *n)
                    .await
                    .expect("open watches")
            }
        })
        .buffer_unordered(8)
        .collect()
        .await;
    let setup_seconds = setup.elapsed().as_secs_f64();
    let received = Arc::new(AtomicU64::new(0));
    let collectors: Vec<tokio::task::JoinHandle<Deliveries>> = opened
        .into_iter()
        .map(|(requests, mut answers)| {
            let received = received.clone();
            tokio::spawn(async move {
                let _open = requests;
                let mut got = Deliveries::new();
                while let Some(Ok(resp)) = answers.next().await {
                    let now = Instant::now();
                    for event in &resp.events {
                        got.push((event.kv.as_ref().map_or(0, |kv| kv.mod_revision), now));
                    }
                    received.fetch_add(resp.events.len() as u64, Ordering::Relaxed);
                }
                got
            })
        })
        .collect();
    let cell_watchers = cluster.metric_sum("latchkey_watchers").await;
    let leader = cluster.wait_leader(Duration::from_secs(10)).await;
    let mut writer = cluster.client(leader).await;
    let cpu0 = cpu_seconds(&[proxy.pid()]);
    let started = Instant::now();
    let mut sent: Vec<(i64, Instant)> = Vec::new();
    for i in 0..args.writes {
        let at = Instant::now();
        let resp = writer.put(KEY, i.to_string(), None).await.expect("write");
        sent.push((resp.header().map_or(0, |h| h.revision()), at));
        tokio::time::sleep(args.write_every).await;
    }
    let expected = (args.watchers * args.writes) as u64;
    let deadline = Instant::now() + Duration::from_secs(30);
    while received.load(Ordering::Relaxed) < expected && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let proxy_cpu_percent =
        (cpu_seconds(&[proxy.pid()]) - cpu0) / started.elapsed().as_secs_f64() * 100.0;
    let proxy_rss_mib = rss_bytes(proxy.pid()).unwrap_or(0) as f64 / (1 << 20) as f64;
    drop(proxy);
    let sent_at: std::collections::HashMap<i64, Instant> = sent.into_iter().collect();
    let mut delays_us = Vec::new();
    let mut got = 0u64;
    for collector in collectors {
        for (revision, at) in collector.await.expect("collector") {
            if let Some(sent) = sent_at.get(&revision) {
                got += 1;
                delays_us.push(at.saturating_duration_since(*sent).as_micros() as u64);
            }
        }
    }
    delays_us.sort_unstable();
    FanOut {
        jitter: jitter.to_string(),
        p50_ms: percentile_ms(&delays_us, 0.50),
        p99_ms: percentile_ms(&delays_us, 0.99),
        max_ms: delays_us.last().copied().unwrap_or(0) as f64 / 1000.0,
        missed: expected.saturating_sub(got),
        cell_watchers,
        proxy_rss_mib,
        proxy_cpu_percent,
        setup_seconds,
    }
}

/// Serializable reads of one key by `readers` clients of `endpoint` for
/// `seconds`: reads/s and errors.
async fn reads(endpoint: &str, readers: usize, seconds: u64) -> (f64, u64) {
    let count = Arc::new(AtomicU64::new(0));
    let errors = Arc::new(AtomicU64::new(0));
    let end = Instant::now() + Duration::from_secs(seconds);
    let mut tasks = Vec::new();
    for _ in 0..readers {
        let mut client = etcd_client::Client::connect([endpoint], None)
            .await
            .expect("connect a reader");
        let (count, errors) = (count.clone(), errors.clone());
        tasks.push(tokio::spawn(async move {
            let options = etcd_client::GetOptions::new().with_serializable();
            while Instant::now() < end {
                match client.get(READ_KEY, Some(options.clone())).await {
                    Ok(_) => count.fetch_add(1, Ordering::Relaxed),
                    Err(_) => errors.fetch_add(1, Ordering::Relaxed),
                };
            }
        }));
    }
    for task in tasks {
        let _ = task.await;
    }
    (
        count.load(Ordering::Relaxed) as f64 / seconds as f64,
        errors.load(Ordering::Relaxed),
    )
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let cell_bin = binary(args.cell_bin.clone(), "latchkey-cell", "--cell-bin")?;
    let proxy_bin = binary(args.proxy_bin.clone(), "latchkey-proxy", "--proxy-bin")?;
    anyhow::ensure!(args.per_stream > 0, "--per-stream must be at least 1");
    let mut cluster = Cluster::start(cell_bin, 3, &[]).await;
    let mut runs = Vec::new();
    for jitter in &args.jitters {
        eprintln!(
            "fan-out to {} watchers with --fanout-jitter {jitter} ...",
            args.watchers
        );
        runs.push(fan_out(&args, &cluster, &proxy_bin, jitter).await);
    }

    eprintln!(
        "reads: {} readers, {} s per target ...",
        args.readers, args.read_seconds
    );
    let leader = cluster.wait_leader(Duration::from_secs(10)).await;
    cluster
        .client(leader)
        .await
        .put(READ_KEY, "v", None)
        .await
        .expect("write the read key");
    let cells: Vec<String> = cluster.members.iter().map(|m| m.client.clone()).collect();
    let proxy = ProxyProcess::start(&proxy_bin, &cells, &[]).await;
    let through_proxy = format!("http://{}", proxy.grpc);
    // Warm the cache: a range is cached after its second miss.
    reads(&through_proxy, 1, 1).await;
    let cell_pids = cluster.pids();
    let cpu0 = cpu_seconds(&cell_pids);
    let (proxy_rate, proxy_errors) = reads(&through_proxy, args.readers, args.read_seconds).await;
    let cell_cpu_via_proxy = (cpu_seconds(&cell_pids) - cpu0) / args.read_seconds as f64 * 100.0;
    let hits = proxy
        .metric("latchkey_proxy_cache_hits_total")
        .await
        .unwrap_or(0.0);
    let follower = format!(
        "http://{}",
        cluster.member(cluster.follower_of(leader)).client
    );
    let cpu0 = cpu_seconds(&cell_pids);
    let (cell_rate, cell_errors) = reads(&follower, args.readers, args.read_seconds).await;
    let cell_cpu_direct = (cpu_seconds(&cell_pids) - cpu0) / args.read_seconds as f64 * 100.0;
    drop(proxy);
    cluster.stop_all().await;

    let result = serde_json::json!({
        "watchers": args.watchers,
        "writes": args.writes,
        "fanout": runs.iter().map(|r| serde_json::json!({
            "jitter": r.jitter, "p50_ms": r.p50_ms, "p99_ms": r.p99_ms, "max_ms": r.max_ms,
            "missed": r.missed, "cell_watchers": r.cell_watchers,
            "proxy_rss_mib": r.proxy_rss_mib, "proxy_cpu_percent": r.proxy_cpu_percent,
            "setup_seconds": r.setup_seconds,
        })).collect::<Vec<_>>(),
        "serializable_reads_per_second": {
            "through_proxy_cache": proxy_rate, "straight_to_a_follower": cell_rate,
            "cache_hits": hits, "errors": proxy_errors + cell_errors,
            "cell_cpu_percent_through_proxy": cell_cpu_via_proxy,
            "cell_cpu_percent_direct": cell_cpu_direct,
        },
    });
    println!("{result}");
    println!(
        "\n{} watchers of one key through one proxy, {} writes every {:?}",
        args.watchers, args.writes, args.write_every
    );
    println!("jitter   write-to-client p50 / p99 / max      missed  cell watches  proxy RSS  proxy CPU  setup");
    for r in &runs {
        println!(
            "{:<8} {:>8.1} / {:>7.1} / {:>7.1} ms  {:>8}  {:>12}  {:>6.0} MiB  {:>7.0} %  {:>4.0} s",
            r.jitter,
            r.p50_ms,
            r.p99_ms,
            r.max_ms,
            r.missed,
            r.cell_watchers,
            r.proxy_rss_mib,
            r.proxy_cpu_percent,
            r.setup_seconds
        );
    }
    println!(
        "\nserializable reads, {} readers: through the proxy's cache {:.0}/s ({} hits, the cell's members at {:.0} % CPU), \
         straight to a follower {:.0}/s (the members at {:.0} % CPU): {:.2}x",
        args.readers,
        proxy_rate,
        hits,
        cell_cpu_via_proxy,
        cell_rate,
        cell_cpu_direct,
        if cell_rate > 0.0 { proxy_rate / cell_rate } else { 0.0 }
    );
    Ok(())
}
