//! `kv`: a closed loop of puts and gets over etcd's gRPC API, through the
//! proxies (or straight to the members, or to etcd): ops/s and
//! p50/p99/p999 of each kind. What must hold with linearizable reads
//! (stale reads: 0): a get that begins after a put was acknowledged
//! answers at that put's revision or later, whichever proxy or
//! connection each went through.

use super::load::{within, Workers};
use super::recorder::{Progress, Recorder};
use super::{drive, over, Common, CpuMeter, Endpoints, Outcome};
use etcd_client::{Client, GetOptions};
use std::process::ExitCode;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

#[derive(clap::Args, Debug)]
pub struct KvArgs {
    #[command(flatten)]
    common: Common,
    #[command(flatten)]
    workers: Workers,
    /// The share of operations that are puts (0 to 1); the rest are gets.
    #[arg(long, default_value_t = 0.5, value_parser = share)]
    writes: f64,
    /// Bytes per value.
    #[arg(long, default_value_t = 256, value_parser = clap::value_parser!(u32).range(0..=1_048_576))]
    value_size: u32,
    /// Distinct keys (each written once before the run).
    #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    keys: u64,
    /// How gets read.
    #[arg(long, value_enum, default_value_t = Reads::Linearizable)]
    reads: Reads,
    /// The same load first for this long, not measured: what a long-running
    /// system answers from (a proxy's cache filled, connections warm).
    #[arg(long, default_value = "0s", value_parser = humantime::parse_duration)]
    warmup: Duration,
}

/// What one phase of the loop records.
#[derive(Clone)]
struct Tally {
    all: Arc<Recorder>,
    puts: Arc<Recorder>,
    gets: Arc<Recorder>,
    /// The highest revision a put was acknowledged at, and the gets that
    /// answered from before it though they began after its acknowledgement.
    acked: Arc<AtomicI64>,
    behind: Arc<AtomicU64>,
}

impl Tally {
    fn new() -> Tally {
        Tally {
            all: Arc::new(Recorder::new()),
            puts: Arc::new(Recorder::new()),
            gets: Arc::new(Recorder::new()),
            acked: Arc::new(AtomicI64::new(0)),
            behind: Arc::new(AtomicU64::new(0)),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum Reads {
    /// Confirmed with a quorum: never stale.
    Linearizable,
    /// Answered by whoever is asked (a proxy's cache, a member).
    Serializable,
}

fn share(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if (0.0..=1.0).contains(&v) => Ok(v),
        _ => Err(format!("{s:?} is not a share between 0 and 1")),
    }
}

/// A key of the run's key space.
fn key(i: u64) -> String {
    format!("loadtest/kv/{i:08}")
}

pub async fn main(args: KvArgs) -> ExitCode {
    let args = &args;
    drive("kv", &args.common, |endpoints| async move {
        run(args, &endpoints).await
    })
    .await
}

async fn run(args: &KvArgs, endpoints: &Endpoints) -> Result<Outcome, String> {
    let front = endpoints.require_grpc()?;
    let clients = args
        .workers
        .connect(front, args.common.op_timeout, args.common.tls()?)
        .await?;
    let value = vec![b'v'; args.value_size as usize];
    preload(&clients, args.keys, &value, args.common.op_timeout).await?;

    if !args.warmup.is_zero() {
        let warmup = Common {
            duration: args.warmup,
            requests: 0,
            ..args.common.clone()
        };
        closed_loop(args, &warmup, &clients, &value, &Tally::new()).await?;
    }
    let tally = Tally::new();
    let Tally {
        all,
        puts,
        gets,
        behind,
        ..
    } = tally.clone();
    let cpu_cells = CpuMeter::start(&endpoints.cell_pids);
    let cpu_proxies = CpuMeter::start(&endpoints.proxy_pids);
    let progress = Progress::show("kv", all.clone(), args.common.duration);
    let started = Instant::now();
    closed_loop(args, &args.common, &clients, &value, &tally).await?;
    let elapsed = started.elapsed().as_secs_f64();
    progress.finish();

    let mut o = Outcome::new("kv", endpoints.target);
    args.workers.describe(&mut o);
    o.field("write_share", args.writes);
    o.field("value_size", args.value_size);
    o.field("keys", args.keys);
    o.field("reads", format!("{:?}", args.reads).to_lowercase());
    o.field("endpoints", front.to_vec());
    o.figure("duration_s", elapsed, format!("{elapsed:.1} s"));
    let rate = all.done() as f64 / elapsed;
    o.figure("ops_per_s", rate, format!("{rate:.0}"));
    o.figure(
        "puts_per_s",
        puts.done() as f64 / elapsed,
        format!("{:.0}", puts.done() as f64 / elapsed),
    );
    o.figure(
        "gets_per_s",
        gets.done() as f64 / elapsed,
        format!("{:.0}", gets.done() as f64 / elapsed),
    );
    o.latency("latency", &all.latency());
    o.latency("put", &puts.latency());
    o.latency("get", &gets.latency());
    let behind = behind.load(Ordering::Relaxed);
    match args.reads {
        // A linearizable read that misses an acknowledged write is stale.
        Reads::Linearizable => o.safety("stale_reads", behind),
        // Serializable reads may lag (a member, a cache): shown, allowed.
        Reads::Serializable => o.figure(
            "reads_behind_acknowledged_writes",
            behind,
            format!("{behind} (serializable reads may lag)"),
        ),
    }
    o.errors(all.errors(), all.first_error());
    o.maybe("cell_cpu_percent", cpu_cells.percent(), "% of a core");
    o.maybe("proxy_cpu_percent", cpu_proxies.percent(), "% of a core");
    o.series(all.series());
    Ok(o)
}

/// The workers' closed loop until `common` says it is over, into `tally`.
async fn closed_loop(
    args: &KvArgs,
    common: &Common,
    clients: &[Client],
    value: &[u8],
    tally: &Tally,
) -> Result<(), String> {
    let started = Instant::now();
    let workers: Vec<_> = (0..args.workers.clients as usize)
        .map(|w| {
            let mut client = clients[w % clients.len()].clone();
            let Tally {
                all,
                puts,
                gets,
                acked,
                behind,
            } = tally.clone();
            let (common, value) = (common.clone(), value.to_vec());
            let (writes, keys, reads) = (args.writes, args.keys, args.reads);
            tokio::spawn(async move {
                let mut rng = fastrand::Rng::with_seed(w as u64 + 1);
                while !over(&common, started, all.done() + all.errors()) {
                    let k = key(rng.u64(0..keys));
                    let put = rng.f64() < writes;
                    // Acknowledged before this get began: it must see it.
                    let floor = acked.load(Ordering::Relaxed);
                    let t = Instant::now();
                    let timeout = common.op_timeout;
                    let result = if put {
                        let put = client.put(k, value.clone(), None);
                        within(timeout, "put", put)
                            .await
                            .map(|r| r.header().map_or(0, |h| h.revision()))
                    } else {
                        let options = match reads {
                            Reads::Linearizable => None,
                            Reads::Serializable => Some(GetOptions::new().with_serializable()),
                        };
                        let get = client.get(k, options);
                        within(timeout, "get", get)
                            .await
                            .map(|r| r.header().map_or(0, |h| h.revision()))
                    };
                    let kind = if put { &puts } else { &gets };
                    match result {
                        Ok(revision) => {
                            if put {
                                acked.fetch_max(revision, Ordering::Relaxed);
                            } else if revision < floor {
                                behind.fetch_add(1, Ordering::Relaxed);
                            }
                            let took = t.elapsed();
                            all.ok(took);
                            kind.ok(took);
                        }
                        Err(e) => {
                            all.error(&e);
                            kind.error(e);
                            // A refusing target is not hammered.
                            tokio::time::sleep(Duration::from_millis(10)).await;
                        }
                    }
                }
            })
        })
        .collect();
    for w in workers {
        w.await.map_err(|e| format!("a worker failed: {e}"))?;
    }
    Ok(())
}

/// Writes every key once, so gets find values.
async fn preload(
    clients: &[Client],
    keys: u64,
    value: &[u8],
    timeout: Duration,
) -> Result<(), String> {
    use futures::StreamExt;
    let bar = super::recorder::counter("preload", keys);
    let results: Vec<Result<(), String>> = futures::stream::iter(0..keys)
        .map(|i| {
            let mut client = clients[i as usize % clients.len()].clone();
            let (value, bar) = (value.to_vec(), bar.clone());
            async move {
                let what = format!("preloading {}", key(i));
                let put = within(timeout, &what, client.put(key(i), value, None)).await;
                bar.inc(1);
                put.map(drop)
            }
        })
        .buffer_unordered(64)
        .collect()
        .await;
    bar.finish_and_clear();
    results.into_iter().collect()
}
