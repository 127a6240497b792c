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
    let timeout = args.common.op_timeout;
    let key = args
        .key
        .clone()
        .unwrap_or_else(|| format!("loadtest/watched/{}-{}", std::process::id(), rand_suffix()));
    let front = endpoints.require_grpc()?;
    let cell_watchers0 = endpoints.cell_metric("latchkey_watchers").await;

    // Streams: endpoint e gets every len-th stream; each stream its share.
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
    let setup = Instant::now();
    let bar = counter("watching", args.watchers);
    let opened: Vec<_> = futures::stream::iter(per_stream.iter().enumerate())
        .map(|(s, n)| {
            let on = &channels[s % channels.len()];
            let channel = on[(s / channels.len()) % on.len()].clone();
            let (key, bar) = (key.clone(), bar.clone());
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
    let opened: Vec<_> = opened.into_iter().collect::<Result<_, String>>()?;
    let setup_s = setup.elapsed().as_secs_f64();

    let received = Arc::new(AtomicU64::new(0));
    // Receipts per revision, so the wait below knows when every
    // acknowledged write has reached every watcher.
    let per_revision = Arc::new(Mutex::new(HashMap::<i64, u64>::new()));
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let collectors: Vec<tokio::task::JoinHandle<Receipts>> = opened
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
    let cell_watchers = endpoints.cell_metric("latchkey_watchers").await - cell_watchers0;
    let upstream = endpoints
        .proxy_metric("latchkey_proxy_upstream_watches")
        .await;

    let mut writer = etcd_client::Client::connect([url(&front[0])], None)
        .await
        .map_err(|e| format!("connecting the writer to {}: {e}", front[0]))?;
    let cpu_proxies = CpuMeter::start(&endpoints.proxy_pids);
    let cpu_cells = CpuMeter::start(&endpoints.cell_pids);
    let bar = counter("writing", args.writes);
    let started = Instant::now();
    let mut sent: Vec<(i64, Instant)> = Vec::new();
    let mut write_errors = 0u64;
    let mut first_error = None;
    for i in 0..args.writes {
        if started.elapsed() >= args.common.duration {
            break;
        }
        let at = Instant::now();
        match tokio::time::timeout(timeout, writer.put(key.as_str(), i.to_string(), None)).await {
            Ok(Ok(resp)) => sent.push((resp.header().map_or(0, |h| h.revision()), at)),
            Ok(Err(e)) => {
                write_errors += 1;
                first_error.get_or_insert(format!("write: {e}"));
            }
            Err(_) => {
                write_errors += 1;
                first_error.get_or_insert(format!("write: no answer within {timeout:?}"));
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
    let expected = args.watchers * sent.len() as u64;
    let deadline = Instant::now() + args.drain;
    let all_arrived = || {
        let counts = per_revision.lock().unwrap_or_else(|p| p.into_inner());
        sent.iter()
            .all(|(rev, _)| counts.get(rev).copied().unwrap_or(0) >= args.watchers)
    };
    while !all_arrived() && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let (proxy_cpu, cell_cpu) = (cpu_proxies.percent(), cpu_cells.percent());
    let proxy_rss = max_rss_mib(&endpoints.proxy_pids);
    let _ = stop.send(true);
    let sent_at: HashMap<i64, Instant> = sent.iter().copied().collect();
    let mut by_write: HashMap<i64, Vec<u64>> = HashMap::new();
    // Distinct watches each write reached: a watch that got one twice
    // cannot make up for one that did not get it.
    let mut reached: HashMap<i64, u64> = HashMap::new();
    let mut got = 0u64;
    for collector in collectors {
        let receipts = collector
            .await
            .map_err(|e| format!("a watch stream's reader failed: {e}"))?;
        let mut seen: HashSet<(i64, i64)> = HashSet::new();
        for (watch, revision, at) in receipts {
            if let Some(sent) = sent_at.get(&revision) {
                got += 1;
                if seen.insert((watch, revision)) {
                    *reached.entry(revision).or_default() += 1;
                }
                by_write
                    .entry(revision)
                    .or_default()
                    .push(at.saturating_duration_since(*sent).as_micros() as u64);
            }
        }
    }
    let distinct: u64 = reached.values().sum();
    let missed: u64 = sent
        .iter()
        .map(|(rev, _)| {
            args.watchers
                .saturating_sub(reached.get(rev).copied().unwrap_or(0))
        })
        .sum();
    let duplicated = got - distinct;
    let all = Latency::of_micros(by_write.values().flatten().copied());
    let series: Vec<Sample> = sent
        .iter()
        .map(|(rev, at)| {
            let l = Latency::of_micros(by_write.get(rev).into_iter().flatten().copied());
            Sample {
                t_s: at.duration_since(started).as_secs_f64(),
                ops_per_s: l.count as f64,
                errors: 0,
                p50_ms: l.p50_ms,
                p99_ms: l.p99_ms,
            }
        })
        .collect();

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
        sent.len(),
        format!("{} (one every {:?})", sent.len(), args.write_every),
    );
    o.figure("events_expected", expected, expected.to_string());
    o.safety("missed", missed);
    o.safety("duplicated", duplicated);
    o.field("events_received", got);
    o.latency("delivery", &all);
    o.errors(write_errors, first_error);
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
    o.series(series);
    Ok(o)
}

fn rand_suffix() -> String {
    format!("{:08x}", fastrand::u32(..))
}
