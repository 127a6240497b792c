//! `move`: moves a key prefix from its cell to another and back
//! (`--moves` times, spread over the run) through a proxy's operators' API
//! (`POST /v1/admin/directory/moves`), while under the prefix writers put
//! new keys, sessions keep leases with keys alive and contenders take locks
//! with fencing tokens, all through the proxies; and writers under a prefix
//! that stays in the first cell go on beside them. Needs latchkey with two
//! cells or more behind the proxies (`cluster up --cell-groups 2`).
//!
//! Reported: each move's write pause (from the fence to the directory's
//! commit, as the proxy measured it) and length, and the longest any write
//! under the moving prefix, and under the prefix that stays, took while a
//! move ran. What must hold (safety counters: 0): every acknowledged write
//! is there after the moves, no session expired, and no lock was held twice
//! at once or granted with a token below one its resource accepted.

use super::load::{connect_all, within};
use super::locks::{grant, Contender, Referee};
use super::recorder::{Latency, Progress, Recorder};
use super::{drive, Common, Endpoints, Outcome, Target};
use crate::directory_api;
use etcd_client::{Client, GetOptions, PutOptions};
use std::collections::BTreeSet;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

#[derive(clap::Args, Debug)]
pub struct MoveArgs {
    #[command(flatten)]
    common: Common,
    /// Writers putting new keys under the moving prefix, each with its own
    /// connection.
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u64).range(1..=1_000))]
    writers: u64,
    /// Writers under a prefix that stays in the first cell, beside them.
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u64).range(0..=1_000))]
    others: u64,
    /// Sessions: leases with a key under the prefix, kept alive through
    /// the proxies.
    #[arg(long, default_value_t = 16, value_parser = clap::value_parser!(u64).range(0..=10_000))]
    sessions: u64,
    /// The sessions' TTL in seconds.
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(i64).range(2..=600))]
    session_ttl: i64,
    /// Lock contenders, each with its own connection and lease.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u64).range(0..=1_000))]
    contenders: u64,
    /// Locks under the prefix they contend for.
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u64).range(1..=1_000))]
    locks: u64,
    /// Moves, there and back in turn, spread evenly over the run.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u64).range(1..=100))]
    moves: u64,
    /// The cell to move the prefix to (default: the first cell the
    /// directory names besides the prefix's own).
    #[arg(long)]
    to: Option<String>,
}

pub async fn main(args: MoveArgs) -> ExitCode {
    let args = &args;
    drive("move", &args.common, |endpoints| async move {
        run(args, &endpoints).await
    })
    .await
}

/// One move as asked and answered.
struct Moved {
    started: Instant,
    ended: Instant,
    /// The write pause the proxy reported, or why the move failed (it was
    /// undone).
    outcome: Result<Duration, String>,
}

/// A write's span, and whether it was acknowledged.
#[derive(Clone, Copy)]
struct Span {
    started: Instant,
    ended: Instant,
}

/// Writers putting `<prefix><writer>/<n>` with n = 1, 2, ... until stopped:
/// the acknowledged n of each, and every acknowledged write's span.
struct KeyWriters {
    recorder: Arc<Recorder>,
    acked: Arc<Mutex<Vec<BTreeSet<u64>>>>,
    spans: Arc<Mutex<Vec<Span>>>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl KeyWriters {
    fn start(
        clients: Vec<Client>,
        prefix: &str,
        timeout: Duration,
        stop: &Arc<AtomicBool>,
    ) -> KeyWriters {
        let recorder = Arc::new(Recorder::new());
        let acked = Arc::new(Mutex::new(vec![BTreeSet::new(); clients.len()]));
        let spans = Arc::new(Mutex::new(Vec::new()));
        let tasks = clients
            .into_iter()
            .enumerate()
            .map(|(w, mut client)| {
                let (recorder, acked, spans, stop) =
                    (recorder.clone(), acked.clone(), spans.clone(), stop.clone());
                let prefix = format!("{prefix}{w}/");
                tokio::spawn(async move {
                    let mut n = 0u64;
                    while !stop.load(Ordering::Relaxed) {
                        n += 1;
                        let key = format!("{prefix}{n:08}");
                        let started = Instant::now();
                        match within(timeout, "write", client.put(key, "v", None)).await {
                            Ok(_) => {
                                let ended = Instant::now();
                                recorder.ok(ended - started);
                                acked.lock().unwrap_or_else(|p| p.into_inner())[w].insert(n);
                                spans
                                    .lock()
                                    .unwrap_or_else(|p| p.into_inner())
                                    .push(Span { started, ended });
                            }
                            Err(e) => {
                                recorder.error(e);
                                tokio::time::sleep(Duration::from_millis(10)).await;
                            }
                        }
                    }
                })
            })
            .collect();
        KeyWriters {
            recorder,
            acked,
            spans,
            tasks,
        }
    }

    async fn stop(self) -> (Arc<Recorder>, Vec<BTreeSet<u64>>, Vec<Span>) {
        self.recorder.end();
        for t in self.tasks {
            let _ = t.await;
        }
        let acked = self.acked.lock().unwrap_or_else(|p| p.into_inner()).clone();
        let spans = self.spans.lock().unwrap_or_else(|p| p.into_inner()).clone();
        (self.recorder, acked, spans)
    }
}

async fn run(args: &MoveArgs, endpoints: &Endpoints) -> Result<Outcome, String> {
    if endpoints.target == Target::Etcd {
        return Err("move moves a prefix between latchkey cells; etcd has none".into());
    }
    let front = endpoints.require_grpc()?;
    let http = endpoints.http.first().ok_or(
        "move needs a proxy's HTTP address for the operators' API (--http, or `cluster up`)",
    )?;
    let timeout = args.common.op_timeout;
    let run_id = format!("{}-{:06x}", std::process::id(), fastrand::u32(..1 << 24));
    let prefix = format!("loadtest/move/{run_id}/");
    let stays = format!("loadtest/cell-0/stays/{run_id}/");
    let (home, to) = cells_of(http, &prefix, args.to.as_deref()).await?;

    // The sessions: a lease each, with a key under the prefix.
    let session_clients = connect_all(front, args.sessions.clamp(1, 4), timeout, None).await?;
    let mut sessions = Vec::new();
    for s in 0..args.sessions {
        let mut client = session_clients[s as usize % session_clients.len()].clone();
        let lease = grant(&mut client, args.session_ttl, timeout).await?;
        let key = format!("{prefix}sessions/{s}");
        let bound = client.put(
            key.as_str(),
            "alive",
            Some(PutOptions::new().with_lease(lease)),
        );
        within(timeout, "a session's key", bound).await?;
        sessions.push((client, lease, key));
    }
    let stop = Arc::new(AtomicBool::new(false));
    let kept = Arc::new(Recorder::new());
    let keepers: Vec<_> = sessions
        .iter()
        .map(|(client, lease, _)| {
            tokio::spawn(keep_alive(
                client.clone(),
                *lease,
                Duration::from_secs(args.session_ttl as u64) / 3,
                timeout,
                kept.clone(),
                stop.clone(),
            ))
        })
        .collect();

    // The contenders: locks under the prefix.
    let referee = Arc::new(Referee::new());
    let acquired = Arc::new(Recorder::new());
    let lock_ttl = (args.common.duration.as_secs() + 60).max(60) as i64;
    let mut contenders = Vec::new();
    for (c, mut client) in connect_all(front, args.contenders, timeout, None)
        .await?
        .into_iter()
        .enumerate()
    {
        let lease = grant(&mut client, lock_ttl, timeout).await?;
        let contender = Contender {
            id: c as u64,
            client,
            lease,
            ttl: lock_ttl,
            locks: args.locks,
            hold: Duration::from_millis(5),
            timeout,
            referee: referee.clone(),
            acquired: acquired.clone(),
        };
        let (prefix, stop) = (prefix.clone(), stop.clone());
        contenders.push(tokio::spawn(contender.run(
            move |lock| format!("{prefix}locks/{lock}"),
            move || stop.load(Ordering::Relaxed),
        )));
    }

    // The writers, then the moves spread over the run.
    let moving = KeyWriters::start(
        connect_all(front, args.writers, timeout, None).await?,
        &format!("{prefix}writes/"),
        timeout,
        &stop,
    );
    let staying = KeyWriters::start(
        connect_all(front, args.others, timeout, None).await?,
        &stays,
        timeout,
        &stop,
    );
    let progress = Progress::show("move", moving.recorder.clone(), args.common.duration);
    let started = Instant::now();
    let mut moves = Vec::new();
    for i in 0..args.moves {
        let at = args
            .common
            .duration
            .mul_f64((i + 1) as f64 / (args.moves + 1) as f64);
        tokio::time::sleep_until((started + at).into()).await;
        let target = if i % 2 == 0 { &to } else { &home };
        let began = Instant::now();
        let outcome = directory_api::move_prefix(http, &prefix, target)
            .await
            .map_err(|e| format!("to {target}: {e}"));
        moves.push(Moved {
            started: began,
            ended: Instant::now(),
            outcome,
        });
    }
    tokio::time::sleep_until((started + args.common.duration).into()).await;
    stop.store(true, Ordering::Relaxed);
    let elapsed = started.elapsed().as_secs_f64();
    let (written, acked, spans) = moving.stop().await;
    let (others, _, other_spans) = staying.stop().await;
    for task in contenders {
        task.await.map_err(|e| format!("a contender failed: {e}"))?;
    }
    for task in keepers {
        let _ = task.await;
    }
    progress.finish();

    // After: every acknowledged write is there, every session alive.
    let mut reader = session_clients[0].clone();
    let mut lost = 0u64;
    let mut first_lost = None;
    for (w, acked) in acked.iter().enumerate() {
        let keys = keys_under(&mut reader, &format!("{prefix}writes/{w}/"), timeout).await?;
        for n in acked {
            if !keys.contains(&format!("{prefix}writes/{w}/{n:08}")) {
                lost += 1;
                first_lost.get_or_insert(format!("writer {w}'s write {n}"));
            }
        }
    }
    let mut expired = 0u64;
    let mut first_expired = None;
    for (client, lease, key) in &mut sessions {
        let ttl = within(
            timeout,
            "a session's TTL",
            client.lease_time_to_live(*lease, None),
        )
        .await
        .map_or(-1, |t| t.ttl());
        let present = within(timeout, "a session's key", client.get(key.as_str(), None))
            .await
            .is_ok_and(|g| g.kvs().first().is_some_and(|kv| kv.lease() == *lease));
        if ttl <= 0 || !present {
            expired += 1;
            first_expired.get_or_insert(format!(
                "session {lease:x}: TTL {ttl}, key present {present}"
            ));
        }
        let _ = tokio::time::timeout(timeout, client.lease_revoke(*lease)).await;
    }

    let mut o = Outcome::new("move", endpoints.target);
    o.field("endpoints", front.to_vec());
    o.figure(
        "load",
        args.writers,
        format!(
            "{} writers, {} sessions (TTL {} s), {} contenders on {} locks under {prefix}; {} \
             writers under {stays}",
            args.writers, args.sessions, args.session_ttl, args.contenders, args.locks, args.others
        ),
    );
    o.field("writers", args.writers);
    o.field("sessions", args.sessions);
    o.field("contenders", args.contenders);
    o.figure(
        "cells",
        format!("{home} <-> {to}"),
        format!("{home} <-> {to}"),
    );
    o.figure("duration_s", elapsed, format!("{elapsed:.1} s"));
    let through: Vec<&Moved> = moves.iter().filter(|m| m.outcome.is_ok()).collect();
    o.figure(
        "moves",
        through.len() as u64,
        format!("{} of {} went through", through.len(), moves.len()),
    );
    let pauses = Latency::of_micros(
        through
            .iter()
            .filter_map(|m| m.outcome.as_ref().ok())
            .map(|p| p.as_micros() as u64),
    );
    o.latency("move_pause", &pauses);
    let lengths = Latency::of_micros(
        moves
            .iter()
            .map(|m| (m.ended - m.started).as_micros() as u64),
    );
    o.latency("move_length", &lengths);
    let longest = |spans: &[Span]| -> f64 {
        spans
            .iter()
            .filter(|s| {
                moves
                    .iter()
                    .any(|m| s.started <= m.ended && m.started <= s.ended)
            })
            .map(|s| (s.ended - s.started).as_secs_f64() * 1000.0)
            .fold(0.0, f64::max)
    };
    let (during, beside) = (longest(&spans), longest(&other_spans));
    o.figure(
        "longest_write_during_a_move_ms",
        during,
        format!("{during:.1} ms under the moving prefix"),
    );
    o.figure(
        "longest_other_write_during_a_move_ms",
        beside,
        format!("{beside:.1} ms under the prefix that stays"),
    );
    let rate = written.done() as f64 / elapsed;
    o.figure(
        "writes_per_s",
        rate,
        format!("{rate:.0} under the moving prefix"),
    );
    o.latency("write", &written.latency());
    o.latency("other_write", &others.latency());
    o.figure("lock_grants", acquired.done(), acquired.done().to_string());
    o.figure("keep_alives", kept.done(), kept.done().to_string());
    o.safety("lost_writes", lost);
    o.field("first_lost", first_lost);
    o.safety("sessions_expired", expired);
    o.field("first_expired", first_expired);
    let (violations, first) = referee.found();
    o.safety("lock_violations", violations);
    o.field("first_violation", first);
    let failed = moves.iter().filter(|m| m.outcome.is_err()).count() as u64;
    let first_error = moves
        .iter()
        .find_map(|m| m.outcome.as_ref().err().map(|e| format!("move: {e}")))
        .or_else(|| written.first_error())
        .or_else(|| kept.first_error())
        .or_else(|| acquired.first_error());
    o.errors(
        failed + written.errors() + kept.errors() + acquired.errors(),
        first_error,
    );
    o.series(written.series());
    Ok(o)
}

/// Keeps `lease` alive every `every` until `stop`, recording each
/// confirmed keep-alive in `kept` (and a failure as an error).
async fn keep_alive(
    mut client: Client,
    lease: i64,
    every: Duration,
    timeout: Duration,
    kept: Arc<Recorder>,
    stop: Arc<AtomicBool>,
) {
    let mut stream = None;
    while !stop.load(Ordering::Relaxed) {
        let t = Instant::now();
        if stream.is_none() {
            stream = within(timeout, "keep-alive stream", client.lease_keep_alive(lease))
                .await
                .map_err(|e| kept.error(e))
                .ok();
        }
        if let Some((keeper, answers)) = &mut stream {
            let answered = within(timeout, "keep-alive", async {
                keeper.keep_alive().await?;
                answers.message().await
            })
            .await;
            match answered {
                Ok(Some(a)) if a.ttl() > 0 => kept.ok(t.elapsed()),
                Ok(_) => {
                    kept.error(format!("lease {lease:x} is gone"));
                    return;
                }
                Err(e) => {
                    kept.error(e);
                    stream = None;
                }
            }
        }
        tokio::time::sleep(every).await;
    }
}

/// Every key under `prefix`, read linearizably.
async fn keys_under(
    client: &mut Client,
    prefix: &str,
    timeout: Duration,
) -> Result<BTreeSet<String>, String> {
    let got = within(
        timeout,
        "reading the writes back",
        client.get(
            prefix,
            Some(GetOptions::new().with_prefix().with_keys_only()),
        ),
    )
    .await?;
    Ok(got
        .kvs()
        .iter()
        .map(|kv| String::from_utf8_lossy(kv.key()).into_owned())
        .collect())
}

/// The cell that owns `prefix` now and the one to move it to (`to`, or
/// the first other cell the directory names).
async fn cells_of(http: &str, prefix: &str, to: Option<&str>) -> Result<(String, String), String> {
    let directory = directory_api::directory(http).await?;
    let owner = directory_api::owner_of(&directory, prefix);
    let others: Vec<String> = directory["cells"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|c| c["name"].as_str().map(str::to_string))
        .chain(std::iter::once("home".to_string()))
        .filter(|c| *c != owner)
        .collect();
    let to = match to {
        Some(to) if others.iter().any(|c| c == to) => to.to_string(),
        Some(to) => {
            return Err(format!(
                "--to {to}: the directory names no such other cell ({others:?})"
            ))
        }
        None => others
            .first()
            .cloned()
            .ok_or("the directory names one cell: start two (`cluster up --cell-groups 2`)")?,
    };
    Ok((owner, to))
}
