//! `watch-fanout`: many watchers of ONE key across the proxies (many
//! watches per gRPC stream, many streams per connection), then writes of
//! that key, one every `--write-every`. For each write: the time from
//! sending it to each watcher's receipt (an upper bound of commit to
//! client), and whether every watcher got it. What must hold: no event
//! missed; and the cell serves one upstream watch per proxy for the key,
//! not one per client.

use super::recorder::{counter, Latency, Sample};
use super::{drive, max_rss_mib, url, Common, CpuMeter, Endpoints, Outcome, Target};
use futures::StreamExt;
use latchkey_shared::client::watches::open_watches;
use latchkey_shared::etcdpb::{PbWatchRequest, PbWatchResponse};
use std::collections::{HashMap, HashSet};
use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

#[derive(clap::Args, Debug)]
pub struct WatchFanoutArgs {
    #[command(flatten)]
    common: Common,
    /// Client watches of the key, spread evenly over the endpoints.
    #[arg(long, default_value_t = 100_000, value_parser = clap::value_parser!(u64).range(1..=10_000_000))]
    watchers: u64,
    /// Watches per gRPC stream.
    #[arg(long, default_value_t = 500, value_parser = clap::value_parser!(u64).range(1..=100_000))]
    per_stream: u64,
    /// gRPC connections per endpoint that the streams share.
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u64).range(1..=1000))]
    connections: u64,
    /// Writes of the key (the measured phase also ends at --duration).
    #[arg(long, default_value_t = 40, value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    writes: u64,
    /// Time between writes.
    #[arg(long, default_value = "500ms", value_parser = humantime::parse_duration)]
    write_every: Duration,
    /// How long to wait after the last write for every event to arrive.
    #[arg(long, default_value = "30s", value_parser = humantime::parse_duration)]
    drain: Duration,
    /// The watched key (default: one of its own per run).
    #[arg(long)]
    key: Option<String>,
}

/// Each stream's receipts: (watch id, revision, when).
type Receipts = Vec<(i64, i64, Instant)>;

pub async fn main(args: WatchFanoutArgs) -> ExitCode {
    let args = &args;
    drive("watch-fanout", &args.common, |endpoints| async move {
        run(args, &endpoints).await
    })
    .await
}

async fn run(args: &WatchFanoutArgs, endpoints: &Endpoints) -> Result<Outcome, String> {
    let key = args
        .key
        .clone()
        .unwrap_or_else(|| format!("loadtest/watched/{}-{}", std::process::id(), rand_suffix()));
    let front = endpoints.require_grpc()?;
    let cell_watchers0 = endpoints.cell_metric("latchkey_watchers").await;
    let setup = Instant::now();
    let (streams, opened) = open_all(args, front, &key).await?;
    let setup_s = setup.elapsed().as_secs_f64();
    let collecting = Collecting::start(opened);
    let cell_watchers = endpoints.cell_metric("latchkey_watchers").await - cell_watchers0;
    let upstream = endpoints
        .proxy_metric("latchkey_proxy_upstream_watches")
        .await;

    let cpu_proxies = CpuMeter::start(&endpoints.proxy_pids);
    let cpu_cells = CpuMeter::start(&endpoints.cell_pids);
    let writes = write(args, &front[0], &key, &collecting.received).await?;
    collecting
        .drain(&writes.sent, args.watchers, args.drain)
        .await;
    let (proxy_cpu, cell_cpu) = (cpu_proxies.percent(), cpu_cells.percent());
    let proxy_rss = max_rss_mib(&endpoints.proxy_pids);
    let tally = collecting.stop(&writes.sent, args.watchers).await?;

    let mut o = Outcome::new("watch-fanout", endpoints.target);
    o.field("key", key);
    o.field("endpoints", front.to_vec());
    o.field("per_stream", args.per_stream);
    o.figure(
        "watchers",
        args.watchers,
        format!(
            "{} on {} streams over {} endpoint(s)",
            args.watchers,
            streams,
            front.len()
        ),
    );
    o.figure(
        "setup_s",
        setup_s,
        format!("{setup_s:.1} s to open every watch"),
    );
    o.figure(
        "writes",
        writes.sent.len(),
        format!("{} (one every {:?})", writes.sent.len(), args.write_every),
    );
    let expected = args.watchers * writes.sent.len() as u64;
    o.figure("events_expected", expected, expected.to_string());
    o.safety("missed", tally.missed);
    o.safety("duplicated", tally.duplicated);
    o.field("events_received", tally.got);
    o.latency("delivery", &tally.delivery());
    o.errors(writes.errors, writes.first_error.clone());
    if endpoints.target == Target::Latchkey {
        o.figure(
            "proxy_upstream_watches",
            upstream,
            format!("{upstream} (the proxies' watches at the cell)"),
        );
        if !endpoints.cell_metrics.is_empty() {
            o.figure(
                "cell_watchers_added",
                cell_watchers,
                format!(
                    "{cell_watchers} (watches the cell gained for {} clients)",
                    args.watchers
                ),
            );
        }
    }
    o.maybe("proxy_cpu_percent", proxy_cpu, "% of a core (all proxies)");
    o.maybe("proxy_rss_mib", proxy_rss, "MiB (largest proxy)");
    o.maybe("cell_cpu_percent", cell_cpu, "% of a core (all members)");
    o.series(tally.series(&writes));
    Ok(o)
}

/// One watch stream: what keeps its requests open, and its answers.
type Opened = (
    tokio::sync::mpsc::UnboundedSender<PbWatchRequest>,
    tonic::Streaming<PbWatchResponse>,
);

/// Every watch, `--per-stream` to a stream; stream s on endpoint s mod
/// the endpoints, over that endpoint's `--connections` connections. The
/// number of streams, and the streams.
async fn open_all(
    args: &WatchFanoutArgs,
    front: &[String],
    key: &str,
) -> Result<(usize, Vec<Opened>), String> {
    let timeout = args.common.op_timeout;
    let streams = args.watchers.div_ceil(args.per_stream) as usize;
    let per_stream: Vec<usize> = (0..streams)
        .map(|s| {
            (args.watchers as usize - s * args.per_stream as usize).min(args.per_stream as usize)
        })
        .collect();
    let mut channels = Vec::new();
    for endpoint in front {
        let mut of_endpoint = Vec::new();
        for _ in 0..args.connections {
            let channel = tokio::time::timeout(timeout, latchkey_shared::client::connect(endpoint))
                .await
                .map_err(|_| format!("connecting to {endpoint}: no answer within {timeout:?}"))?
                .map_err(|e| format!("connecting to {endpoint}: {e}"))?;
            of_endpoint.push(channel);
        }
        channels.push(of_endpoint);
    }
    let bar = counter("watching", args.watchers);
    let opened: Vec<_> = futures::stream::iter(per_stream.iter().enumerate())
        .map(|(s, n)| {
            let on = &channels[s % channels.len()];
            let channel = on[(s / channels.len()) % on.len()].clone();
            let bar = bar.clone();
            async move {
                let opened = tokio::time::timeout(
                    timeout.max(Duration::from_secs(30)),
                    open_watches(channel, key.as_bytes(), 0, *n),
                )
                .await;
                bar.inc(*n as u64);
                match opened {
                    Ok(Ok(stream)) => Ok(stream),
                    Ok(Err(e)) => Err(format!("opening {n} watches: {e}")),
                    Err(_) => Err(format!("opening {n} watches: not all created in time")),
                }
            }
        })
        .buffer_unordered(8)
        .collect()
        .await;
    bar.finish_and_clear();
    let opened = opened.into_iter().collect::<Result<_, String>>()?;
    Ok((streams, opened))
}

/// A reader per stream, noting every event it receives.
struct Collecting {
    received: Arc<AtomicU64>,
    /// Receipts per revision, so the drain knows when every acknowledged
    /// write has reached every watcher.
    per_revision: Arc<Mutex<HashMap<i64, u64>>>,
    stop: tokio::sync::watch::Sender<bool>,
    readers: Vec<tokio::task::JoinHandle<Receipts>>,
}

impl Collecting {
    fn start(opened: Vec<Opened>) -> Collecting {
        let received = Arc::new(AtomicU64::new(0));
        let per_revision = Arc::new(Mutex::new(HashMap::<i64, u64>::new()));
        let (stop, stopped) = tokio::sync::watch::channel(false);
        let readers = opened
            .into_iter()
            .map(|(requests, mut answers)| {
                let (received, mut stopped) = (received.clone(), stopped.clone());
                let per_revision = per_revision.clone();
                tokio::spawn(async move {
                    let _open = requests;
                    let mut got = Receipts::new();
                    loop {
                        let resp = tokio::select! {
                            _ = stopped.changed() => break,
                            next = answers.next() => match next {
                                Some(Ok(resp)) => resp,
                                _ => break,
                            },
                        };
                        let now = Instant::now();
                        let mut counts = per_revision.lock().unwrap_or_else(|p| p.into_inner());
                        for event in &resp.events {
                            let revision = event.kv.as_ref().map_or(0, |kv| kv.mod_revision);
                            got.push((resp.watch_id, revision, now));
                            *counts.entry(revision).or_default() += 1;
                        }
                        drop(counts);
                        received.fetch_add(resp.events.len() as u64, Ordering::Relaxed);
                    }
                    got
                })
            })
            .collect();
        Collecting {
            received,
            per_revision,
            stop,
            readers,
        }
    }

    /// Waits until every write in `sent` reached `watchers` receipts, or
    /// `drain` is over.
    async fn drain(&self, sent: &[(i64, Instant)], watchers: u64, drain: Duration) {
        let deadline = Instant::now() + drain;
        let all_arrived = || {
            let counts = self.per_revision.lock().unwrap_or_else(|p| p.into_inner());
            sent.iter()
                .all(|(rev, _)| counts.get(rev).copied().unwrap_or(0) >= watchers)
        };
        while !all_arrived() && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Stops the readers and tallies what they received against `sent`.
    async fn stop(self, sent: &[(i64, Instant)], watchers: u64) -> Result<Tally, String> {
        let _ = self.stop.send(true);
        let sent_at: HashMap<i64, Instant> = sent.iter().copied().collect();
        let mut t = Tally::default();
        // Distinct watches each write reached: a watch that got one twice
        // cannot make up for one that did not get it.
        let mut reached: HashMap<i64, u64> = HashMap::new();
        for reader in self.readers {
            let receipts = reader
                .await
                .map_err(|e| format!("a watch stream's reader failed: {e}"))?;
            let mut seen: HashSet<(i64, i64)> = HashSet::new();
            for (watch, revision, at) in receipts {
                if let Some(sent) = sent_at.get(&revision) {
                    t.got += 1;
                    if seen.insert((watch, revision)) {
                        *reached.entry(revision).or_default() += 1;
                    }
                    t.by_write
                        .entry(revision)
                        .or_default()
                        .push(at.saturating_duration_since(*sent).as_micros() as u64);
                }
            }
        }
        let distinct: u64 = reached.values().sum();
        t.missed = sent
            .iter()
            .map(|(rev, _)| watchers.saturating_sub(reached.get(rev).copied().unwrap_or(0)))
            .sum();
        t.duplicated = t.got - distinct;
        Ok(t)
    }
}

/// The writes of the key, one every `--write-every`.
struct Writes {
    /// Each acknowledged write's revision and when it was sent.
    sent: Vec<(i64, Instant)>,
    started: Instant,
    errors: u64,
    first_error: Option<String>,
}

async fn write(
    args: &WatchFanoutArgs,
    endpoint: &str,
    key: &str,
    received: &AtomicU64,
) -> Result<Writes, String> {
    let timeout = args.common.op_timeout;
    let mut writer = etcd_client::Client::connect([url(endpoint)], None)
        .await
        .map_err(|e| format!("connecting the writer to {endpoint}: {e}"))?;
    let bar = counter("writing", args.writes);
    let mut w = Writes {
        sent: Vec::new(),
        started: Instant::now(),
        errors: 0,
        first_error: None,
    };
    for i in 0..args.writes {
        if w.started.elapsed() >= args.common.duration {
            break;
        }
        let at = Instant::now();
        match tokio::time::timeout(timeout, writer.put(key, i.to_string(), None)).await {
            Ok(Ok(resp)) => w.sent.push((resp.header().map_or(0, |h| h.revision()), at)),
            Ok(Err(e)) => {
                w.errors += 1;
                w.first_error.get_or_insert(format!("write: {e}"));
            }
            Err(_) => {
                w.errors += 1;
                w.first_error
                    .get_or_insert(format!("write: no answer within {timeout:?}"));
            }
        }
        bar.inc(1);
        bar.set_message(format!(
            "events received {}",
            received.load(Ordering::Relaxed)
        ));
        tokio::time::sleep(args.write_every).await;
    }
    bar.finish_and_clear();
    Ok(w)
}

/// What the watchers received of the acknowledged writes.
#[derive(Default)]
struct Tally {
    /// Events of acknowledged writes received, duplicates included.
    got: u64,
    missed: u64,
    duplicated: u64,
    /// Per write (by revision), each receipt's delay from the send, in µs.
    by_write: HashMap<i64, Vec<u64>>,
}

impl Tally {
    fn delivery(&self) -> Latency {
        Latency::of_micros(self.by_write.values().flatten().copied())
    }

    /// Per write: when it was sent, and its receipts' delays.
    fn series(&self, writes: &Writes) -> Vec<Sample> {
        writes
            .sent
            .iter()
            .map(|(rev, at)| {
                let l = Latency::of_micros(self.by_write.get(rev).into_iter().flatten().copied());
                Sample {
                    t_s: at.duration_since(writes.started).as_secs_f64(),
                    ops_per_s: l.count as f64,
                    errors: 0,
                    p50_ms: l.p50_ms,
                    p99_ms: l.p99_ms,
                }
            })
            .collect()
    }
}

fn rand_suffix() -> String {
    format!("{:08x}", fastrand::u32(..))
}
