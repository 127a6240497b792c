//! The workloads, each run the same way against either target.

use crate::stats::{closed_loop, percentile_ms, Measured, Rng};
use crate::Settings;
use etcd_client::{
    Client, Compare, CompareOp, EventType, GetOptions, Txn, TxnOp, TxnOpResponse, WatchOptions,
};
use latchkey_shared::client::{is_gone, KeepAliveStream};
use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// Keys the put and range workloads use.
const KV_KEYS: u64 = 10_000;
const VALUE_BYTES: usize = 256;
const COUNTERS: u64 = 64;
/// Writes the watch workload makes, and the pause between them.
const WATCH_WRITES: usize = 20;
const WATCH_PAUSE: Duration = Duration::from_millis(250);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Workload {
    Put,
    LinearizableRange,
    SerializableRange,
    TxnCas,
    LeaseGrant,
    Watch,
    KeepAlive,
}

impl Workload {
    pub const ALL: [Workload; 7] = [
        Workload::Put,
        Workload::LinearizableRange,
        Workload::SerializableRange,
        Workload::TxnCas,
        Workload::LeaseGrant,
        Workload::Watch,
        Workload::KeepAlive,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Workload::Put => "put",
            Workload::LinearizableRange => "linearizable-range",
            Workload::SerializableRange => "serializable-range",
            Workload::TxnCas => "txn-cas",
            Workload::LeaseGrant => "lease-grant",
            Workload::Watch => "watch",
            Workload::KeepAlive => "keepalive",
        }
    }

    pub fn parse(name: &str) -> Option<Workload> {
        Workload::ALL.into_iter().find(|w| w.name() == name)
    }

    /// What the table shows for this workload's rate.
    pub fn describe(self, s: &Settings) -> String {
        match self {
            Workload::Put => format!("put, {VALUE_BYTES} B values, {KV_KEYS} keys"),
            Workload::LinearizableRange => "linearizable range, one key".into(),
            Workload::SerializableRange => "serializable range, one key".into(),
            Workload::TxnCas => format!("txn compare-and-swap, {COUNTERS} counters"),
            Workload::LeaseGrant => "lease grant".into(),
            Workload::Watch => format!("watch delivery, {} watchers", s.watchers),
            Workload::KeepAlive => format!("{} leases on keep-alive streams", s.leases),
        }
    }

    pub async fn run(self, clients: &[Client], endpoints: &[String], s: &Settings) -> Measured {
        match self {
            Workload::Put => put(clients, s).await,
            Workload::LinearizableRange => range(clients, s, false).await,
            Workload::SerializableRange => range(clients, s, true).await,
            Workload::TxnCas => txn_cas(clients, s).await,
            Workload::LeaseGrant => lease_grant(clients, s).await,
            Workload::Watch => watch(clients, s).await,
            Workload::KeepAlive => keep_alive(clients, endpoints, s).await,
        }
    }
}

fn kv_key(i: u64) -> String {
    format!("bench/kv/{i:05}")
}

/// Writes every key the range workloads read.
pub async fn load_keys(clients: &[Client], s: &Settings) -> Result<(), String> {
    let next = Arc::new(AtomicU64::new(0));
    let value = vec![b'v'; VALUE_BYTES];
    let tasks: Vec<_> = (0..s.clients)
        .map(|w| {
            let mut c = clients[w % clients.len()].clone();
            let (next, value) = (next.clone(), value.clone());
            tokio::spawn(async move {
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= KV_KEYS {
                        return Ok::<(), String>(());
                    }
                    c.put(kv_key(i), value.clone(), None)
                        .await
                        .map_err(|e| format!("load {}: {e}", kv_key(i)))?;
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.map_err(|e| e.to_string())??;
    }
    Ok(())
}

async fn put(clients: &[Client], s: &Settings) -> Measured {
    let value = Arc::new(vec![b'p'; VALUE_BYTES]);
    closed_loop(
        clients,
        s.clients,
        s.duration,
        |w| Rng::new(w as u64 + 1),
        move |mut c, mut rng: Rng| {
            let key = kv_key(rng.below(KV_KEYS));
            let value = value.clone();
            async move {
                let put = c.put(key, value.as_slice(), None).await;
                (rng, put.map(|_| true).map_err(|e| e.to_string()))
            }
        },
    )
    .await
    .measured()
}

async fn range(clients: &[Client], s: &Settings, serializable: bool) -> Measured {
    closed_loop(
        clients,
        s.clients,
        s.duration,
        |w| Rng::new(w as u64 + 100),
        move |mut c, mut rng: Rng| {
            let key = kv_key(rng.below(KV_KEYS));
            async move {
                let opts = serializable.then(|| GetOptions::new().with_serializable());
                let result = match c.get(key.as_str(), opts).await {
                    Ok(got) if got.kvs().is_empty() => Err(format!("{key} is missing")),
                    Ok(_) => Ok(true),
                    Err(e) => Err(e.to_string()),
                };
                (rng, result)
            }
        },
    )
    .await
    .measured()
}

fn counter_key(i: u64) -> String {
    format!("bench/cas/{i:02}")
}

/// Each worker increments random counters with compare-and-swap on the
/// counter's mod revision; a lost race answers the current value (the
/// txn's else branch) and the worker tries again from it. The rate counts
/// increments that committed, and the counters must add up to them.
async fn txn_cas(clients: &[Client], s: &Settings) -> Measured {
    let mut c = clients[0].clone();
    for i in 0..COUNTERS {
        if let Err(e) = c.put(counter_key(i), "0", None).await {
            return failed(format!("set up counters: {e}"));
        }
    }
    let sum_before = counter_sum(&mut c).await.unwrap_or(0);
    let attempts = Arc::new(AtomicU64::new(0));
    let counted = attempts.clone();
    let gathered = closed_loop(
        clients,
        s.clients,
        s.duration,
        |w| {
            (
                Rng::new(w as u64 + 1000),
                vec![None::<(u64, i64)>; COUNTERS as usize],
            )
        },
        move |mut c, mut state: (Rng, Vec<Option<(u64, i64)>>)| {
            let i = state.0.below(COUNTERS);
            let known = state.1[i as usize];
            counted.fetch_add(1, Ordering::Relaxed);
            let key = counter_key(i);
            let op = async move {
                let (value, rev) = match known {
                    Some(k) => k,
                    None => {
                        let got = c.get(key.as_str(), None).await.map_err(|e| e.to_string())?;
                        let kv = got.kvs().first().ok_or(format!("{key} is missing"))?;
                        (parse_counter(kv.value())?, kv.mod_revision())
                    }
                };
                let txn = Txn::new()
                    .when([Compare::mod_revision(key.as_str(), CompareOp::Equal, rev)])
                    .and_then([TxnOp::put(key.as_str(), (value + 1).to_string(), None)])
                    .or_else([TxnOp::get(key.as_str(), None)]);
                let resp = c.txn(txn).await.map_err(|e| e.to_string())?;
                if resp.succeeded() {
                    let rev = resp.header().map_or(0, |h| h.revision());
                    return Ok((true, Some((value + 1, rev))));
                }
                let current = resp.op_responses().into_iter().find_map(|r| match r {
                    TxnOpResponse::Get(g) => g
                        .kvs()
                        .first()
                        .map(|kv| parse_counter(kv.value()).map(|v| (v, kv.mod_revision()))),
                    _ => None,
                });
                Ok((false, current.transpose()?))
            };
            async move {
                let result = op.await;
                let (known, result) = match result {
                    Ok((done, now)) => (now, Ok(done)),
                    Err(e) => (None, Err(e)),
                };
                state.1[i as usize] = known;
                (state, result)
            }
        },
    )
    .await;
    let committed = gathered.ok;
    let mut m = gathered.measured();
    let sum_after = counter_sum(&mut c).await.unwrap_or(-1);
    let lost = sum_before + committed as i64 - sum_after;
    m.notes.push((
        "attempts/s".into(),
        attempts.load(Ordering::Relaxed) as f64 / s.duration.as_secs_f64(),
    ));
    // Every acknowledged increment is in the counters and nothing else is.
    m.notes.push(("lost".into(), lost as f64));
    m
}

fn parse_counter(value: &[u8]) -> Result<u64, String> {
    std::str::from_utf8(value)
        .ok()
        .and_then(|v| v.parse().ok())
        .ok_or_else(|| format!("a counter holds {value:?}"))
}

async fn counter_sum(c: &mut Client) -> Result<i64, String> {
    let got = c
        .get("bench/cas/", Some(GetOptions::new().with_prefix()))
        .await
        .map_err(|e| e.to_string())?;
    got.kvs()
        .iter()
        .map(|kv| parse_counter(kv.value()).map(|v| v as i64))
        .sum()
}

async fn lease_grant(clients: &[Client], s: &Settings) -> Measured {
    closed_loop(
        clients,
        s.clients,
        s.duration,
        |_| (),
        move |mut c, (): ()| async move {
            let granted = c.lease_grant(600, None).await;
            ((), granted.map(|_| true).map_err(|e| e.to_string()))
        },
    )
    .await
    .measured()
}

fn micros_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64)
}

/// `watchers` watches on one key, spread over one watch stream per
/// connection; each write carries its send time, each event is timed on
/// arrival. The rate is events delivered per second of the write phase.
async fn watch(clients: &[Client], s: &Settings) -> Measured {
    let key = "bench/watch";
    let per_stream = s.watchers.div_ceil(clients.len());
    let mut streams = Vec::new();
    let mut total = 0;
    for c in clients {
        let n = per_stream.min(s.watchers - total);
        if n == 0 {
            break;
        }
        let mut c = c.clone();
        let mut stream = match c.watch(key, None).await {
            Ok(stream) => stream,
            Err(e) => return failed(format!("open a watch stream: {e}")),
        };
        for _ in 1..n {
            if let Err(e) = stream.watch(key, Some(WatchOptions::new())).await {
                return failed(format!("add a watch: {e}"));
            }
        }
        streams.push((stream, n));
        total += n;
    }
    // Every watch created before the first write.
    let mut ready = Vec::new();
    for (mut stream, n) in streams {
        let mut created = 0;
        let deadline = Instant::now() + Duration::from_secs(60);
        while created < n {
            let left = deadline.saturating_duration_since(Instant::now());
            match tokio::time::timeout(left, stream.message()).await {
                Ok(Ok(Some(resp))) => created += usize::from(resp.created()),
                other => return failed(format!("watches not created: {other:?}")),
            }
        }
        ready.push(stream);
    }
    let receivers: Vec<_> = ready
        .into_iter()
        .map(|mut stream| {
            tokio::spawn(async move {
                let mut latencies = Vec::new();
                let quiet = Duration::from_secs(5);
                while let Ok(Ok(Some(resp))) = tokio::time::timeout(quiet, stream.message()).await {
                    for ev in resp.events() {
                        if ev.event_type() != EventType::Put {
                            continue;
                        }
                        let sent = ev
                            .kv()
                            .and_then(|kv| std::str::from_utf8(kv.value()).ok()?.parse().ok());
                        if let Some(sent) = sent {
                            latencies.push(micros_now().saturating_sub(sent));
                        }
                    }
                }
                latencies
            })
        })
        .collect();
    let mut writer = clients[0].clone();
    let started = Instant::now();
    let mut errors = 0;
    for _ in 0..WATCH_WRITES {
        if writer
            .put(key, micros_now().to_string(), None)
            .await
            .is_err()
        {
            errors += 1;
        }
        tokio::time::sleep(WATCH_PAUSE).await;
    }
    let mut latencies = Vec::new();
    for r in receivers {
        latencies.extend(r.await.unwrap_or_default());
    }
    let elapsed = started.elapsed().as_secs_f64();
    latencies.sort_unstable();
    let expected = (WATCH_WRITES - errors) * total;
    Measured {
        rate: latencies.len() as f64 / elapsed,
        p50_ms: percentile_ms(&latencies, 0.50),
        p99_ms: percentile_ms(&latencies, 0.99),
        errors: errors as u64,
        notes: vec![
            (
                "missed".into(),
                expected.saturating_sub(latencies.len()) as f64,
            ),
            ("max_ms".into(), percentile_ms(&latencies, 1.0)),
        ],
        ..Default::default()
    }
}

/// `leases` leases of `lease_ttl`, kept alive over one etcd keep-alive
/// stream per connection (many leases per stream), each lease refreshed
/// every third of its TTL as etcd's clients do. Refreshing starts while the
/// leases are still being granted (granting 50 000 takes longer than a
/// short TTL), and runs `lease_duration` after the last grant; rate and
/// round latency count only rounds that began once all were granted.
/// Counts the leases that expired anyway.
async fn keep_alive(clients: &[Client], endpoints: &[String], s: &Settings) -> Measured {
    let streams = clients.len();
    let granted: Vec<Arc<Mutex<Vec<i64>>>> = (0..streams).map(|_| Arc::default()).collect();
    let (all_granted_tx, all_granted) = tokio::sync::watch::channel(None::<Instant>);
    let grants = grant_many(clients, s, granted.clone());
    let interval = Duration::from_secs(s.lease_ttl as u64) / 3;
    let round_timeout = Duration::from_secs(s.lease_ttl as u64);
    let duration = s.lease_duration;
    let tasks: Vec<_> = granted
        .iter()
        .enumerate()
        .map(|(i, ids)| {
            let ids = ids.clone();
            let addr = endpoints[i % endpoints.len()].clone();
            let all_granted = all_granted.clone();
            tokio::spawn(async move {
                let mut r = Refreshed::default();
                let mut stream = match KeepAliveStream::open(&addr).await {
                    Ok(s) => s,
                    Err(e) => {
                        r.errors += 1;
                        r.first_error = Some(e.to_string());
                        return r;
                    }
                };
                let mut next = tokio::time::Instant::now();
                // One round after the end, to count what expired.
                let mut last = false;
                loop {
                    tokio::time::sleep_until(next).await;
                    next += interval;
                    let done_at = *all_granted.borrow();
                    let round: Vec<i64> = ids.lock().unwrap_or_else(|e| e.into_inner()).clone();
                    let t = Instant::now();
                    match stream.refresh(&round, round_timeout).await {
                        Ok(ttls) => {
                            if done_at.is_some() {
                                r.rounds.push(t.elapsed().as_micros() as u64);
                                r.answered += ttls.len() as u64;
                            }
                            r.gone.extend(
                                ttls.iter().filter(|(_, t)| is_gone(**t)).map(|(id, _)| *id),
                            );
                        }
                        Err(e) => {
                            r.errors += 1;
                            r.first_error.get_or_insert(e.to_string());
                        }
                    }
                    if last {
                        return r;
                    }
                    last = done_at.is_some_and(|at| at.elapsed() >= duration);
                }
            })
        })
        .collect();
    let grant_error = grants.await.err();
    let done_at = Instant::now();
    all_granted_tx.send_replace(Some(done_at));
    let mut all = Refreshed::default();
    for t in tasks {
        if let Ok(r) = t.await {
            all.rounds.extend(r.rounds);
            all.answered += r.answered;
            all.errors += r.errors;
            all.gone.extend(r.gone);
            if all.first_error.is_none() {
                all.first_error = r.first_error;
            }
        }
    }
    all.rounds.sort_unstable();
    Measured {
        rate: all.answered as f64 / done_at.elapsed().as_secs_f64(),
        p50_ms: percentile_ms(&all.rounds, 0.50),
        p99_ms: percentile_ms(&all.rounds, 0.99),
        errors: all.errors + u64::from(grant_error.is_some()),
        notes: vec![("expired".into(), all.gone.len() as f64)],
        first_error: grant_error.or(all.first_error),
        ..Default::default()
    }
}

/// What one keep-alive stream saw.
#[derive(Default)]
struct Refreshed {
    rounds: Vec<u64>,
    answered: u64,
    errors: u64,
    gone: HashSet<i64>,
    first_error: Option<String>,
}

/// Grants `leases` leases with `s.clients` workers; worker `w` hands its
/// leases to stream `w % streams` as soon as each is granted.
async fn grant_many(
    clients: &[Client],
    s: &Settings,
    streams: Vec<Arc<Mutex<Vec<i64>>>>,
) -> Result<(), String> {
    let left = Arc::new(AtomicU64::new(s.leases as u64));
    let ttl = s.lease_ttl;
    let tasks: Vec<_> = (0..s.clients)
        .map(|w| {
            let mut c = clients[w % clients.len()].clone();
            let left = left.clone();
            let ids = streams[w % streams.len()].clone();
            tokio::spawn(async move {
                while left
                    .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1))
                    .is_ok()
                {
                    let granted = c
                        .lease_grant(ttl, None)
                        .await
                        .map_err(|e| format!("grant: {e}"))?;
                    ids.lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .push(granted.id());
                }
                Ok::<_, String>(())
            })
        })
        .collect();
    for t in tasks {
        t.await.map_err(|e| e.to_string())??;
    }
    Ok(())
}

fn failed(why: String) -> Measured {
    Measured {
        errors: 1,
        first_error: Some(why),
        ..Default::default()
    }
}
