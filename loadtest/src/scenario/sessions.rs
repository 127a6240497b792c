//! `sessions`: many client sessions kept alive through the proxies, as
//! clients keep them: many sessions per connection, each refreshed every
//! third of its TTL, spread evenly over that period. Over gRPC a session is
//! an etcd lease on a LeaseKeepAlive stream (so this runs unchanged against
//! etcd); over HTTP it is the proxy's `/v1/sessions`.
//!
//! What must hold: no session expires (spurious expiries: 0), and the cell
//! sees at most one refresh batch per proxy per refresh tick however many
//! sessions there are. The sessions are revoked after the measured phase
//! (not timed), so that a run leaves nothing to expire under the next one.

use super::load::{connect_all, revoke, within};
use super::recorder::{counter, Progress, Recorder};
use super::{drive, max_rss_mib, url, Common, CpuMeter, Endpoints, Outcome, Target};
use etcd_client::TlsOptions;
use futures::StreamExt;
use latchkey_shared::client::{is_gone, KeepAliveStream};
use latchkey_shared::tls::ClientTls;
use std::collections::HashSet;
use std::process::ExitCode;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

#[derive(clap::Args, Debug)]
pub struct SessionsArgs {
    #[command(flatten)]
    common: Common,
    /// Sessions in all, spread evenly over the proxies.
    #[arg(long, default_value_t = 100_000, value_parser = clap::value_parser!(u64).range(1..=10_000_000))]
    sessions: u64,
    /// Their TTL in seconds; each is refreshed every third of it.
    #[arg(long, default_value_t = 30, value_parser = clap::value_parser!(i64).range(3..=3600))]
    ttl: i64,
    /// Which API carries them (`both`: half each; etcd: grpc only).
    #[arg(long, value_enum, default_value_t = Api::Both)]
    api: Api,
    /// gRPC keep-alive streams per endpoint, each carrying its share.
    #[arg(long, default_value_t = 8)]
    streams: usize,
    /// HTTP clients per proxy, each keeping its share alive one request at
    /// a time.
    #[arg(long, default_value_t = 32)]
    http_clients: usize,
    /// The proxies' --refresh-tick, to count refresh batches per tick.
    #[arg(long, default_value = "500ms", value_parser = humantime::parse_duration)]
    refresh_tick: Duration,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum Api {
    Grpc,
    Http,
    Both,
}

/// Each client's sessions are refreshed in this many slices per period,
/// so keep-alives arrive evenly rather than in one burst.
const SLICES: usize = 100;
/// Requests in flight while sessions are created.
const CREATING: usize = 128;

pub async fn main(args: SessionsArgs) -> ExitCode {
    let args = &args;
    drive("sessions", &args.common, |endpoints| async move {
        run(args, &endpoints).await
    })
    .await
}

/// The sessions of one endpoint, by API.
pub(super) struct Held {
    pub endpoint: String,
    pub ids: Vec<i64>,
}

/// How many sessions go over gRPC and how many over HTTP.
fn split(args: &SessionsArgs, endpoints: &Endpoints) -> Result<(usize, usize), String> {
    let n = args.sessions as usize;
    let no_grpc = endpoints.grpc_front().is_empty();
    match (args.api, no_grpc, endpoints.http.is_empty()) {
        (Api::Grpc, true, _) => return Err("gRPC sessions need --grpc or --cells".into()),
        (Api::Both, true, false) => return Ok((0, n)),
        _ => {}
    }
    match (endpoints.target, args.api, endpoints.http.is_empty()) {
        (Target::Etcd, Api::Grpc | Api::Both, _) => Ok((n, 0)),
        (Target::Etcd, Api::Http, _) => Err("etcd has no HTTP sessions: use --api grpc".into()),
        (_, Api::Grpc, _) => Ok((n, 0)),
        (_, Api::Http | Api::Both, true) => {
            Err("HTTP sessions need a proxy's HTTP address (--http), or --api grpc".into())
        }
        (_, Api::Http, false) => Ok((0, n)),
        (_, Api::Both, false) => Ok((n / 2, n - n / 2)),
    }
}

async fn run(args: &SessionsArgs, endpoints: &Endpoints) -> Result<Outcome, String> {
    if args.streams == 0 || args.http_clients == 0 {
        return Err("--streams and --http-clients must be at least 1".into());
    }
    let (grpc_n, http_n) = split(args, endpoints)?;
    let timeout = args.common.op_timeout;
    let created_at = Instant::now();
    let bar = counter("creating", (grpc_n + http_n) as u64);
    let (tls, client_tls) = (args.common.tls()?, args.common.client_tls()?);
    if client_tls.is_some() && http_n > 0 {
        return Err("--tls-cacert: the HTTP sessions have no TLS yet; use --api grpc".into());
    }
    let grpc = create_grpc(
        endpoints.grpc_front(),
        grpc_n,
        args.ttl,
        timeout,
        &bar,
        tls.clone(),
    )
    .await?;
    let http_client = reqwest::Client::builder()
        .timeout(timeout)
        .build()
        .map_err(|e| e.to_string())?;
    let http = create_http(&http_client, &endpoints.http, http_n, args.ttl, &bar).await?;
    bar.finish_and_clear();
    let create_s = created_at.elapsed().as_secs_f64();
    // The first sessions wait for their first keep-alive until creation is
    // done plus one refresh period: longer than their TTL, and they expire
    // with nothing wrong with the system.
    let period = Duration::from_secs(args.ttl as u64) / 3;
    if created_at.elapsed() + period >= Duration::from_secs(args.ttl as u64) {
        return Err(format!(
            "creating the sessions took {create_s:.1} s, so the first would expire before \
             their first keep-alive: use a larger --ttl or fewer --sessions"
        ));
    }

    let keepalives = Arc::new(Recorder::new());
    let expired = Arc::new(Expired::default());
    let cpu_cells = CpuMeter::start(&endpoints.cell_pids);
    let cpu_proxies = CpuMeter::start(&endpoints.proxy_pids);
    let cell_batches0 = endpoints
        .cell_metric("latchkey_refresh_batches_total")
        .await;
    let proxy_batches0 = endpoints
        .proxy_metric("latchkey_proxy_refresh_batches_total")
        .await;
    let progress = Progress::show("sessions", keepalives.clone(), args.common.duration);
    let started = Instant::now();
    let end = started + args.common.duration;
    let mut tasks = keep_alive_over_grpc(
        &grpc,
        args.streams,
        period,
        end,
        &keepalives,
        &expired,
        timeout,
        client_tls.clone(),
    );
    for held in &http {
        for share in chunks(&held.ids, args.http_clients) {
            let (base, recorder, expired, client) = (
                url(&held.endpoint),
                keepalives.clone(),
                expired.clone(),
                http_client.clone(),
            );
            tasks.push(tokio::spawn(async move {
                let mut slices = Slices::new(&share, period, end);
                while let Some(slice) = slices.next().await {
                    for id in slice {
                        let t = Instant::now();
                        let answer = client
                            .post(format!("{base}/v1/sessions/{id:016x}/keepalive"))
                            .send()
                            .await;
                        match answer {
                            Ok(r) if r.status() == 200 => recorder.ok(t.elapsed()),
                            Ok(r) if r.status() == 404 => {
                                expired.lock().unwrap_or_else(|p| p.into_inner()).insert(id);
                            }
                            Ok(r) => recorder.error(format!(
                                "keep-alive: {} {}",
                                r.status(),
                                r.text().await.unwrap_or_default()
                            )),
                            Err(e) => recorder.error(format!("keep-alive: {e}")),
                        }
                    }
                }
            }));
        }
    }
    for task in tasks {
        task.await.map_err(|e| format!("a client failed: {e}"))?;
    }
    let elapsed = started.elapsed().as_secs_f64();
    progress.finish();
    let cell_batches = endpoints
        .cell_metric("latchkey_refresh_batches_total")
        .await
        - cell_batches0;
    let proxy_batches = endpoints
        .proxy_metric("latchkey_proxy_refresh_batches_total")
        .await
        - proxy_batches0;
    let (cell_cpu, proxy_cpu) = (cpu_cells.percent(), cpu_proxies.percent());

    // Every session must still be alive at the cell itself.
    let all: Vec<i64> = grpc
        .iter()
        .chain(&http)
        .flat_map(|h| h.ids.clone())
        .collect();
    let gone_at_cell = gone_at(&endpoints.cells, &all, timeout, client_tls.as_deref()).await?;
    let (during, expired) = expired_count(&expired, &gone_at_cell);
    // Not timed: so that a run leaves nothing to expire under the next one
    // (`compare` runs its workloads back to back).
    let revoking = Instant::now();
    let front = endpoints.grpc_front();
    let not_revoked = match connect_all(front, 8, timeout, tls).await {
        Ok(clients) => revoke(&clients, &all, timeout).await,
        Err(e) => (all.len() as u64, Some(e)),
    };
    let revoke_s = revoking.elapsed().as_secs_f64();

    let mut o = Outcome::new("sessions", endpoints.target);
    o.field("ttl_s", args.ttl);
    o.field("grpc_sessions", grpc_n);
    o.field("http_sessions", http_n);
    o.field("endpoints", endpoints.grpc_front().to_vec());
    o.figure(
        "sessions",
        all.len(),
        format!(
            "{} ({grpc_n} gRPC, {http_n} HTTP), TTL {} s",
            all.len(),
            args.ttl
        ),
    );
    o.figure("create_s", create_s, format!("{create_s:.1} s"));
    o.figure(
        "revoked_after_s",
        revoke_s,
        format!("{} sessions in {revoke_s:.1} s (not timed)", all.len()),
    );
    o.field("not_revoked", not_revoked.0);
    o.field("first_not_revoked", not_revoked.1);
    o.figure("duration_s", elapsed, format!("{elapsed:.1} s"));
    o.safety("spurious_expiries", expired as u64);
    o.field("expired_during_run", during);
    o.field("gone_at_cell_after", gone_at_cell.len());
    let rate = keepalives.done() as f64 / elapsed;
    o.figure(
        "keepalives_per_s",
        rate,
        format!("{rate:.0} client keep-alives/s"),
    );
    o.latency("keepalive", &keepalives.latency());
    o.errors(keepalives.errors(), keepalives.first_error());
    if endpoints.target == Target::Latchkey && !endpoints.cell_metrics.is_empty() {
        let per_s = cell_batches / elapsed;
        let proxies = endpoints.proxy_metrics.len().max(1) as f64;
        let per_tick = per_s * args.refresh_tick.as_secs_f64() / proxies;
        o.figure(
            "cell_refresh_batches_per_s",
            per_s,
            format!("{per_s:.2} refresh batches/s at the cell"),
        );
        o.figure(
            "refresh_batches_per_tick_per_proxy",
            per_tick,
            format!("{per_tick:.2} (at most 1; tick {:?})", args.refresh_tick),
        );
        o.field("proxy_refresh_batches", proxy_batches);
    }
    o.maybe("cell_cpu_percent", cell_cpu, "% of a core (all members)");
    o.maybe(
        "cell_rss_mib",
        max_rss_mib(&endpoints.cell_pids),
        "MiB (largest member)",
    );
    o.maybe("proxy_cpu_percent", proxy_cpu, "% of a core (all proxies)");
    o.maybe(
        "proxy_rss_mib",
        max_rss_mib(&endpoints.proxy_pids),
        "MiB (largest proxy)",
    );
    o.series(keepalives.series());
    Ok(o)
}

/// Keeps every session of `held` alive on `streams` keep-alive streams per
/// endpoint until `end`: each answered keep-alive counts in `keepalives`,
/// each session answered gone in `expired`.
pub(super) fn keep_alive_over_grpc(
    held: &[Held],
    streams: usize,
    period: Duration,
    end: Instant,
    keepalives: &Arc<Recorder>,
    expired: &Arc<Expired>,
    timeout: Duration,
    tls: Option<Arc<ClientTls>>,
) -> Vec<tokio::task::JoinHandle<()>> {
    let mut tasks = Vec::new();
    for held in held {
        for share in chunks(&held.ids, streams) {
            let (endpoint, recorder, expired, tls) = (
                held.endpoint.clone(),
                keepalives.clone(),
                expired.clone(),
                tls.clone(),
            );
            tasks.push(tokio::spawn(async move {
                let mut stream: Option<KeepAliveStream> = None;
                let mut slices = Slices::new(&share, period, end);
                while let Some(slice) = slices.next().await {
                    let s = match stream.as_mut() {
                        Some(s) => s,
                        None => match KeepAliveStream::open_with(&endpoint, tls.as_deref()).await {
                            Ok(s) => stream.insert(s),
                            Err(e) => {
                                recorder.error(e);
                                continue;
                            }
                        },
                    };
                    let t = Instant::now();
                    match s.refresh(&slice, timeout).await {
                        Ok(ttls) => {
                            let gone: Vec<i64> = slice
                                .iter()
                                .filter(|id| ttls.get(id).is_none_or(|t| is_gone(*t)))
                                .copied()
                                .collect();
                            recorder.ok_many((slice.len() - gone.len()) as u64, t.elapsed());
                            expired
                                .lock()
                                .unwrap_or_else(|p| p.into_inner())
                                .extend(gone);
                        }
                        Err(e) => recorder.error(e),
                    }
                }
            }));
        }
    }
    tasks
}

/// `ids` dealt into `n` hands (fewer when there are fewer ids).
pub(super) fn chunks(ids: &[i64], n: usize) -> Vec<Vec<i64>> {
    let size = ids.len().div_ceil(n.max(1)).max(1);
    ids.chunks(size).map(<[i64]>::to_vec).collect()
}

/// `n` sessions dealt evenly over `endpoints` and opened concurrently;
/// `open(e)` opens one at endpoint `e`.
async fn open_spread<F, Fut>(
    endpoints: &[String],
    n: usize,
    bar: &indicatif::ProgressBar,
    open: F,
) -> Result<Vec<Held>, String>
where
    F: Fn(usize) -> Fut,
    Fut: std::future::Future<Output = Result<i64, String>>,
{
    let opened: Vec<(usize, Result<i64, String>)> = futures::stream::iter(0..n)
        .map(|k| {
            let e = k % endpoints.len();
            let one = open(e);
            async move {
                let id = one.await;
                bar.inc(1);
                (e, id)
            }
        })
        .buffer_unordered(CREATING)
        .collect()
        .await;
    let mut held: Vec<Held> = endpoints
        .iter()
        .map(|e| Held {
            endpoint: e.clone(),
            ids: Vec::new(),
        })
        .collect();
    for (e, id) in opened {
        held[e].ids.push(id?);
    }
    held.retain(|h| !h.ids.is_empty());
    Ok(held)
}

/// `n` leases granted over gRPC, spread over `front`.
pub(super) async fn create_grpc(
    front: &[String],
    n: usize,
    ttl: i64,
    timeout: Duration,
    bar: &indicatif::ProgressBar,
    tls: Option<TlsOptions>,
) -> Result<Vec<Held>, String> {
    let clients = connect_all(front, front.len() as u64, timeout, tls).await?;
    open_spread(front, n, bar, |e| {
        let (mut client, what) = (
            clients[e].clone(),
            format!("granting a lease at {}", front[e]),
        );
        async move {
            let granted = within(timeout, &what, client.lease_grant(ttl, None)).await?;
            Ok(granted.id())
        }
    })
    .await
}

/// `n` sessions opened over HTTP, spread over the proxies.
async fn create_http(
    http: &reqwest::Client,
    proxies: &[String],
    n: usize,
    ttl: i64,
    bar: &indicatif::ProgressBar,
) -> Result<Vec<Held>, String> {
    open_spread(proxies, n, bar, |e| {
        open_http_session(http.clone(), url(&proxies[e]), ttl)
    })
    .await
}

async fn open_http_session(http: reqwest::Client, base: String, ttl: i64) -> Result<i64, String> {
    let answer = http
        .post(format!("{base}/v1/sessions"))
        .body(format!("{{\"ttl\": {ttl}}}"))
        .send()
        .await
        .map_err(|e| format!("opening a session at {base}: {e}"))?;
    let status = answer.status();
    let body: serde_json::Value = answer
        .json()
        .await
        .map_err(|e| format!("opening a session at {base}: {status}: {e}"))?;
    body["id"]
        .as_str()
        .and_then(|id| i64::from_str_radix(id, 16).ok())
        .ok_or_else(|| format!("opening a session at {base}: {status}: {body}"))
}

/// One client's sessions in `SLICES` slices, handed out one every
/// period / SLICES until `end`: keep-alives spread evenly, not in bursts.
pub(super) struct Slices {
    slices: Vec<Vec<i64>>,
    tick: tokio::time::Interval,
    next: usize,
    end: Instant,
}

impl Slices {
    pub(super) fn new(ids: &[i64], period: Duration, end: Instant) -> Slices {
        let slices: Vec<Vec<i64>> = (0..SLICES)
            .map(|k| ids.iter().skip(k).step_by(SLICES).copied().collect())
            .filter(|s: &Vec<i64>| !s.is_empty())
            .collect();
        let mut tick = tokio::time::interval(period / slices.len().max(1) as u32);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        Slices {
            slices,
            tick,
            next: 0,
            end,
        }
    }

    /// The next slice when its turn comes; None once the time is up.
    pub(super) async fn next(&mut self) -> Option<Vec<i64>> {
        if self.slices.is_empty() || Instant::now() >= self.end {
            return None;
        }
        self.tick.tick().await;
        let slice = self.slices[self.next % self.slices.len()].clone();
        self.next += 1;
        Some(slice)
    }
}

/// The sessions found expired, each once however often it was seen.
pub(super) type Expired = Mutex<HashSet<i64>>;

/// Every session that expired during the run or is gone after it.
pub(super) fn expired_count(during: &Expired, gone_after: &[i64]) -> (usize, usize) {
    let mut all = during.lock().unwrap_or_else(|p| p.into_inner()).clone();
    let during = all.len();
    all.extend(gone_after);
    (during, all.len())
}

/// Which of `ids` the members no longer hold, asked with a
/// keep-alive on a member (which refreshes them: the check costs nothing
/// the sessions had not asked for).
pub(super) async fn gone_at(
    cells: &[String],
    ids: &[i64],
    timeout: Duration,
    tls: Option<&ClientTls>,
) -> Result<Vec<i64>, String> {
    let Some(member) = cells.first() else {
        return Ok(Vec::new());
    };
    let mut stream = KeepAliveStream::open_with(member, tls)
        .await
        .map_err(|e| format!("checking the sessions at {member}: {e}"))?;
    let mut gone = Vec::new();
    for chunk in ids.chunks(10_000) {
        let ttls = stream
            .refresh(chunk, timeout.max(Duration::from_secs(30)))
            .await
            .map_err(|e| format!("checking the sessions at {member}: {e}"))?;
        gone.extend(
            chunk
                .iter()
                .filter(|id| ttls.get(id).is_none_or(|t| is_gone(*t))),
        );
    }
    Ok(gone)
}
