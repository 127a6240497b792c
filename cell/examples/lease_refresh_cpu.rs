//! Measures the CPU a server spends keeping many leases alive.
//!
//! Grants `--leases` leases on the server at `--endpoint`, then refreshes
//! every one of them each `--interval-secs` for `--duration-secs`, and
//! reports the CPU time the server process `--pid` used meanwhile (from
//! /proc/PID/stat, after one warm-up interval).
//!
//! - `--mode latchkey`: one batched request per interval on latchkey's
//!   session extension (how latchkey-proxy refreshes), with
//!   [`RefreshStream`].
//! - `--mode etcd`: etcd's own protocol: one LeaseKeepAlive stream, one
//!   request per lease per interval, with [`KeepAliveStream`].
//!
//! scripts/lease-cpu.sh runs both against a latchkey cell and an etcd
//! server on this machine.

use clap::Parser;
use futures::StreamExt;
use latchkey_shared::client::{is_gone, KeepAliveStream, RefreshStream};
use std::time::Duration;
use tokio::time::Instant;

/// How long one round of refreshes may take. 100 000 leases are answered
/// within seconds even by a debug build; a round that takes a minute
/// means the server is broken, not slow, and the measurement is void.
const ROUND_TIMEOUT: Duration = Duration::from_secs(60);

#[derive(Parser)]
struct Args {
    #[arg(long)]
    endpoint: String,
    #[arg(long)]
    mode: String,
    #[arg(long, default_value_t = 100_000)]
    leases: usize,
    #[arg(long, default_value_t = 10)]
    interval_secs: u64,
    #[arg(long, default_value_t = 60)]
    duration_secs: u64,
    /// The server process to measure.
    #[arg(long)]
    pid: u32,
}

/// utime + stime of `pid`, in clock ticks.
fn cpu_ticks(pid: u32) -> anyhow::Result<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    // The command name is parenthesised and may hold spaces: count fields
    // after its closing parenthesis. utime and stime are the 14th and 15th
    // fields of the whole line, so the 12th and 13th after the name.
    let rest = stat
        .rsplit_once(')')
        .map(|(_, r)| r)
        .ok_or_else(|| anyhow::anyhow!("/proc/{pid}/stat has no command name"))?;
    let mut fields = rest.split_whitespace().skip(11);
    let mut ticks = |name: &str| -> anyhow::Result<u64> {
        let field = fields
            .next()
            .ok_or_else(|| anyhow::anyhow!("/proc/{pid}/stat ends before {name}"))?;
        Ok(field.parse::<u64>()?)
    };
    Ok(ticks("utime")? + ticks("stime")?)
}

/// The stream a round of refreshes goes on.
enum Refresher {
    /// Boxed: the batched stream is several times larger than the other.
    Latchkey(Box<RefreshStream>),
    Etcd(KeepAliveStream),
}

impl Refresher {
    /// Refreshes every lease once; returns how many are alive.
    async fn round(&mut self, leases: &[i64]) -> anyhow::Result<usize> {
        let ttls: Vec<i64> = match self {
            Refresher::Latchkey(stream) => stream.refresh(leases, ROUND_TIMEOUT).await?.ttls,
            Refresher::Etcd(stream) => stream
                .refresh(leases, ROUND_TIMEOUT)
                .await?
                .into_values()
                .collect(),
        };
        Ok(ttls.into_iter().filter(|t| !is_gone(*t)).count())
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let mut refresher = match args.mode.as_str() {
        "latchkey" => Refresher::Latchkey(Box::new(RefreshStream::new([args.endpoint.clone()])?)),
        "etcd" => Refresher::Etcd(KeepAliveStream::open(&args.endpoint).await?),
        other => anyhow::bail!("--mode {other}: use latchkey or etcd"),
    };
    let url = format!("http://{}", args.endpoint);
    let client = etcd_client::Client::connect([url.as_str()], None).await?;
    let started = Instant::now();
    // Long enough to outlast granting them all (tens of seconds for
    // 100 000 on a debug build); the refresh cost does not depend on it.
    let ttl = 300;
    let leases: Vec<i64> = futures::stream::iter(0..args.leases)
        .map(|_| {
            let mut c = client.clone();
            async move { c.lease_grant(ttl, None).await.map(|r| r.id()) }
        })
        .buffer_unordered(256)
        .collect::<Vec<_>>()
        .await
        .into_iter()
        .collect::<Result<_, _>>()?;
    println!(
        "granted {} leases (TTL {ttl} s) in {:?}",
        leases.len(),
        started.elapsed()
    );

    let interval = Duration::from_secs(args.interval_secs);
    let end = Instant::now() + Duration::from_secs(args.duration_secs);
    let mut measuring_from: Option<(Instant, u64)> = None;
    let mut rounds = 0u64;
    // At least two rounds: the first one warms up, the CPU is measured from
    // its end.
    while rounds < 2 || Instant::now() < end {
        let t = Instant::now();
        rounds += 1;
        let alive = refresher.round(&leases).await?;
        anyhow::ensure!(alive == leases.len(), "only {alive} leases alive");
        if measuring_from.is_none() {
            measuring_from = Some((Instant::now(), cpu_ticks(args.pid)?));
        }
        tokio::time::sleep(interval.saturating_sub(t.elapsed())).await;
    }
    let (from, ticks) = measuring_from.ok_or_else(|| anyhow::anyhow!("no round completed"))?;
    let cpu = cpu_ticks(args.pid)?.saturating_sub(ticks) as f64 / 100.0;
    let wall = from.elapsed().as_secs_f64();
    println!(
        "{} leases every {} s, {rounds} rounds: server CPU {cpu:.2} s in {wall:.1} s = {:.1}% of one core",
        leases.len(),
        args.interval_secs,
        100.0 * cpu / wall
    );
    Ok(())
}
