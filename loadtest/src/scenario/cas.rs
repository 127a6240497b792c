//! `cas`: counters incremented with compare-and-swap, as clients build
//! optimistic transactions on etcd's API: each worker reads a counter,
//! then commits `value + 1` in a txn only if the counter's mod revision is
//! still the one it read; a lost race answers the current value (the txn's
//! else branch) and the worker tries again from it.
//!
//! What must hold: every acknowledged increment is in the counters (lost:
//! 0), and the counters hold no increment that was not tried (phantom: 0;
//! an increment whose answer timed out may or may not have committed, so
//! the counters may exceed the acknowledged increments by at most the
//! errors).

use super::load::{closed_loop, within, Step, Workers};
use super::recorder::{Progress, Recorder};
use super::{drive, Common, CpuMeter, Endpoints, Outcome};
use etcd_client::{Client, Compare, CompareOp, GetOptions, Txn, TxnOp, TxnOpResponse};
use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

#[derive(clap::Args, Debug)]
pub struct CasArgs {
    #[command(flatten)]
    common: Common,
    #[command(flatten)]
    workers: Workers,
    /// Counters they increment (fewer: more lost races).
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u64).range(1..=100_000))]
    counters: u64,
}

pub async fn main(args: CasArgs) -> ExitCode {
    let args = &args;
    drive("cas", &args.common, |endpoints| async move {
        run(args, &endpoints).await
    })
    .await
}

/// The counters of one run, under a prefix of their own so that runs
/// against one cluster do not add up.
struct Counters {
    prefix: String,
    n: u64,
}

impl Counters {
    fn new(n: u64) -> Counters {
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        Counters {
            prefix: format!("loadtest/cas/{nanos}/"),
            n,
        }
    }

    fn key(&self, i: u64) -> String {
        format!("{}{i:06}", self.prefix)
    }

    /// Their sum, read in one range.
    async fn sum(&self, client: &mut Client) -> Result<u64, String> {
        let options = GetOptions::new().with_prefix();
        let got = client
            .get(self.prefix.as_str(), Some(options))
            .await
            .map_err(|e| format!("reading the counters: {e}"))?;
        if got.kvs().len() as u64 != self.n {
            return Err(format!(
                "{} counters under {}, {} expected",
                got.kvs().len(),
                self.prefix,
                self.n
            ));
        }
        got.kvs().iter().map(|kv| parse(kv.value())).sum()
    }
}

fn parse(value: &[u8]) -> Result<u64, String> {
    std::str::from_utf8(value)
        .ok()
        .and_then(|v| v.parse().ok())
        .ok_or_else(|| format!("a counter holds {value:?}"))
}

/// A worker's view: its random source and, per counter, the value and mod
/// revision it last saw (none: read it first).
type Known = (fastrand::Rng, Vec<Option<(u64, i64)>>);

/// One increment of counter `key` from what the worker knows: committed
/// (`Done`) or lost to another worker (`Again`, with the current value).
async fn increment(
    mut client: Client,
    key: String,
    known: Option<(u64, i64)>,
) -> Result<(Step, Option<(u64, i64)>), String> {
    let (value, revision) = match known {
        Some(k) => k,
        None => {
            let got = client
                .get(key.as_str(), None)
                .await
                .map_err(|e| format!("get {key}: {e}"))?;
            let kv = got.kvs().first().ok_or(format!("{key} is missing"))?;
            (parse(kv.value())?, kv.mod_revision())
        }
    };
    let txn = Txn::new()
        .when([Compare::mod_revision(
            key.as_str(),
            CompareOp::Equal,
            revision,
        )])
        .and_then([TxnOp::put(key.as_str(), (value + 1).to_string(), None)])
        .or_else([TxnOp::get(key.as_str(), None)]);
    let answer = client
        .txn(txn)
        .await
        .map_err(|e| format!("txn on {key}: {e}"))?;
    if answer.succeeded() {
        let revision = answer.header().map_or(0, |h| h.revision());
        return Ok((Step::Done, Some((value + 1, revision))));
    }
    let current = answer.op_responses().into_iter().find_map(|r| match r {
        TxnOpResponse::Get(g) => g
            .kvs()
            .first()
            .map(|kv| parse(kv.value()).map(|v| (v, kv.mod_revision()))),
        _ => None,
    });
    Ok((Step::Again, current.transpose()?))
}

async fn run(args: &CasArgs, endpoints: &Endpoints) -> Result<Outcome, String> {
    let timeout = args.common.op_timeout;
    let front = endpoints.require_grpc()?;
    let clients = args.workers.connect(front, timeout, None).await?;
    let counters = Arc::new(Counters::new(args.counters));
    let mut first = clients[0].clone();
    for i in 0..counters.n {
        let key = counters.key(i);
        within(
            timeout,
            "setting up the counters",
            first.put(key, "0", None),
        )
        .await?;
    }

    let increments = Arc::new(Recorder::new());
    let lost_races = Arc::new(AtomicU64::new(0));
    let cpu_cells = CpuMeter::start(&endpoints.cell_pids);
    let cpu_proxies = CpuMeter::start(&endpoints.proxy_pids);
    let progress = Progress::show("cas", increments.clone(), args.common.duration);
    let (counted, races) = (counters.clone(), lost_races.clone());
    let op = move |client: Client, (mut rng, mut known): Known| {
        let (counters, races) = (counted.clone(), races.clone());
        async move {
            let i = rng.u64(0..counters.n);
            let slot = i as usize;
            let tried = within(
                timeout,
                "increment",
                increment(client, counters.key(i), known[slot]),
            )
            .await;
            let step = match tried {
                Ok((step, now)) => {
                    if matches!(step, Step::Again) {
                        races.fetch_add(1, Ordering::Relaxed);
                    }
                    known[slot] = now;
                    Ok(step)
                }
                Err(e) => {
                    known[slot] = None;
                    Err(e)
                }
            };
            ((rng, known), step)
        }
    };
    let init = |w: usize| -> Known {
        (
            fastrand::Rng::with_seed(w as u64 + 1),
            vec![None; args.counters as usize],
        )
    };
    closed_loop(
        &clients,
        args.workers.clients,
        &args.common,
        &increments,
        init,
        op,
    )
    .await?;
    progress.finish();

    let sum = within(timeout, "summing", counters.sum(&mut first)).await?;
    let acknowledged = increments.done();
    let unknown = increments.errors();
    let lost = acknowledged.saturating_sub(sum);
    let phantom = sum.saturating_sub(acknowledged + unknown);
    let elapsed = increments.elapsed().as_secs_f64();

    let mut o = Outcome::new("cas", endpoints.target);
    args.workers.describe(&mut o);
    o.field("counters", args.counters);
    o.field("endpoints", front.to_vec());
    o.figure("duration_s", elapsed, format!("{elapsed:.1} s"));
    let rate = increments.rate();
    o.figure("increments_per_s", rate, format!("{rate:.0} committed"));
    let races = lost_races.load(Ordering::Relaxed);
    o.figure("lost_races", races, format!("{races} (tried again)"));
    o.latency("increment", &increments.latency());
    o.safety("lost", lost);
    o.safety("phantom", phantom);
    o.errors(unknown, increments.first_error());
    o.maybe("cell_cpu_percent", cpu_cells.percent(), "% of a core");
    o.maybe("proxy_cpu_percent", cpu_proxies.percent(), "% of a core");
    o.series(increments.series());
    Ok(o)
}
