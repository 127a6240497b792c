//! `latchkey-bench-locks`: lock throughput and latency, etcd's `v3lockpb`
//! Lock/Unlock with the same etcd client, on 1 lock and on 16 locks, on
//! three targets: through a latchkey proxy, straight to a latchkey cell
//! member (its leader), and a 3-member etcd 3.4 for reference.
//!
//! Each client has its own lease and connection and, until the time is
//! up, locks a lock and unlocks it at once: `bench/<i mod locks>` for
//! client i (`--pick own`: with as many locks as clients, nobody waits),
//! or a lock drawn at random each time (`--pick random`: clients collide
//! and hand locks over). An acquisition's latency runs from the Lock call
//! to its answer (queueing behind the other clients of the same lock
//! included).
//!
//! `scripts/bench-locks.sh` builds it (release) and runs it. A benchmark,
//! not a test.

mod binaries;
#[allow(dead_code, unused_imports)] // the rest is latchkey-bench's
mod stats;

use binaries::binary;
use clap::Parser;
use etcd_client::{Client, LockOptions};
use latchkey_testkit::etcd::EtcdCluster;
use latchkey_testkit::{Cluster, ProxyProcess};
use stats::percentile_ms;
use std::time::{Duration, Instant};

#[derive(Parser, Debug)]
#[command(about = "lock acquisitions/s and latency: latchkey proxy, latchkey cell, etcd")]
struct Args {
    /// Concurrent clients, each with its own lease and connection.
    #[arg(long, default_value_t = 16)]
    clients: usize,
    /// Seconds per run.
    #[arg(long, default_value_t = 10)]
    seconds: u64,
    /// Lock counts, one run each.
    #[arg(long, value_delimiter = ',', default_value = "1,16")]
    locks: Vec<usize>,
    /// Which lock each acquisition takes.
    #[arg(long, value_enum, default_value_t = Pick::Own)]
    pick: Pick,
    /// Skip etcd.
    #[arg(long)]
    latchkey_only: bool,
    /// The etcd binary.
    #[arg(long, default_value = "etcd")]
    etcd_bin: String,
    /// The latchkey-cell binary (default: next to this one).
    #[arg(long)]
    cell_bin: Option<std::path::PathBuf>,
    /// The latchkey-proxy binary (default: next to this one).
    #[arg(long)]
    proxy_bin: Option<std::path::PathBuf>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum Pick {
    /// Client i always takes lock i mod locks.
    Own,
    /// Each acquisition takes a lock drawn at random.
    Random,
}

/// A small xorshift generator: the draws need no quality, only spread.
struct Draw(u64);

impl Draw {
    fn next(&mut self, below: usize) -> usize {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 % below.max(1) as u64) as usize
    }
}

struct Run {
    target: String,
    locks: usize,
    rate: f64,
    p50_ms: f64,
    p90_ms: f64,
    p99_ms: f64,
    errors: u64,
    first_error: Option<String>,
}

/// `clients` clients of `endpoint` locking and unlocking for `seconds`.
async fn run(
    target: &str,
    endpoint: &str,
    clients: usize,
    locks: usize,
    pick: Pick,
    seconds: u64,
) -> Run {
    let deadline = Instant::now() + Duration::from_secs(seconds);
    let started = Instant::now();
    let mut tasks = Vec::new();
    for c in 0..clients {
        let mut client = Client::connect([endpoint], None)
            .await
            .expect("connect a client");
        let lease = client.lease_grant(60, None).await.expect("a lease").id();
        let mut draw =
            Draw(0x9e37_79b9_7f4a_7c15 ^ (c as u64 + 1).wrapping_mul(0xbf58_476d_1ce4_e5b9));
        tasks.push(tokio::spawn(async move {
            let (mut latencies, mut errors, mut first_error) = (Vec::new(), 0u64, None);
            while Instant::now() < deadline {
                let lock = match pick {
                    Pick::Own => c % locks.max(1),
                    Pick::Random => draw.next(locks),
                };
                let name = format!("bench/{lock}");
                let t = Instant::now();
                let locked = client
                    .lock(name.as_str(), Some(LockOptions::new().with_lease(lease)))
                    .await;
                match locked {
                    Ok(resp) => {
                        latencies.push(t.elapsed().as_micros() as u64);
                        if let Err(e) = client.unlock(resp.key()).await {
                            errors += 1;
                            first_error.get_or_insert(e.to_string());
                        }
                    }
                    Err(e) => {
                        errors += 1;
                        first_error.get_or_insert(e.to_string());
                    }
                }
            }
            let _ = client.lease_revoke(lease).await;
            (latencies, errors, first_error)
        }));
    }
    let (mut all, mut errors, mut first_error) = (Vec::new(), 0, None);
    for task in tasks {
        let (latencies, e, first) = task.await.expect("a client");
        all.extend(latencies);
        errors += e;
        if first_error.is_none() {
            first_error = first;
        }
    }
    let elapsed = started.elapsed().as_secs_f64();
    all.sort_unstable();
    Run {
        target: target.to_string(),
        locks,
        rate: all.len() as f64 / elapsed,
        p50_ms: percentile_ms(&all, 0.50),
        p90_ms: percentile_ms(&all, 0.90),
        p99_ms: percentile_ms(&all, 0.99),
        errors,
        first_error,
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let cell_bin = binary(args.cell_bin.clone(), "latchkey-cell", "--cell-bin")?;
    let proxy_bin = binary(args.proxy_bin.clone(), "latchkey-proxy", "--proxy-bin")?;
    let mut runs = Vec::new();
    {
        let mut cluster = Cluster::start(cell_bin, 3, &[]).await;
        let cells: Vec<String> = cluster.members.iter().map(|m| m.client.clone()).collect();
        let proxy = ProxyProcess::start(&proxy_bin, &cells, &[]).await;
        let leader = cluster.wait_leader(Duration::from_secs(10)).await;
        let targets = [
            ("latchkey proxy", format!("http://{}", proxy.grpc)),
            (
                "latchkey cell",
                format!("http://{}", cluster.member(leader).client),
            ),
        ];
        for (target, endpoint) in &targets {
            for &locks in &args.locks {
                eprintln!("{target}, {} clients on {locks} lock(s) ...", args.clients);
                runs.push(
                    run(
                        target,
                        endpoint,
                        args.clients,
                        locks,
                        args.pick,
                        args.seconds,
                    )
                    .await,
                );
            }
        }
        drop(proxy);
        cluster.stop_all().await;
    }
    if !args.latchkey_only {
        let etcd = EtcdCluster::start(&args.etcd_bin, 3).await;
        let endpoint = format!("http://{}", etcd.clients[0]);
        for &locks in &args.locks {
            eprintln!("etcd, {} clients on {locks} lock(s) ...", args.clients);
            runs.push(
                run(
                    "etcd 3.4",
                    &endpoint,
                    args.clients,
                    locks,
                    args.pick,
                    args.seconds,
                )
                .await,
            );
        }
    }
    let result: Vec<serde_json::Value> = runs
        .iter()
        .map(|r| {
            serde_json::json!({
                "target": r.target, "locks": r.locks, "clients": args.clients,
                "pick": format!("{:?}", args.pick).to_lowercase(),
                "acquisitions_per_second": r.rate, "p50_ms": r.p50_ms, "p90_ms": r.p90_ms,
                "p99_ms": r.p99_ms,
                "errors": r.errors,
            })
        })
        .collect();
    println!("{}", serde_json::Value::Array(result));
    println!(
        "\n{} clients, lock then unlock, {} s per run, locks picked: {:?}",
        args.clients, args.seconds, args.pick
    );
    println!("target            locks   acquisitions/s    p50 ms    p90 ms    p99 ms  errors");
    for r in &runs {
        println!(
            "{:<16} {:>6} {:>16.0} {:>9.1} {:>9.1} {:>9.1} {:>7}",
            r.target, r.locks, r.rate, r.p50_ms, r.p90_ms, r.p99_ms, r.errors
        );
        if let Some(e) = &r.first_error {
            println!("                 first error: {e}");
        }
    }
    Ok(())
}
