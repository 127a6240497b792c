//! `failover`: sessions kept alive and writes running through the proxies
//! while the cell loses its leader (SIGKILL) and, once a new leader
//! serves, while a follower is paused (SIGSTOP, then SIGCONT). Measures the
//! time to a new leader and the write unavailability windows; what must
//! hold: no session expires. The killed member is started again once a
//! new leader serves, before the follower pauses (so the cell keeps a
//! quorum through the pause) and so the cluster is whole afterwards.
//!
//! Needs a cluster `cluster up` started (its state file names the pids).

use super::load::{connect_all, own_keys, Writers};
use super::recorder::{counter, Recorder};
use super::sessions::{create_grpc, expired_count, gone_at, keep_alive_over_grpc, Expired};
use super::{drive, Common, Endpoints, Outcome, Target};
use crate::cluster::{read_state, restart, signal, wait_ready, Proc};
use latchkey_testkit::{http_get, metric_value};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

#[derive(clap::Args, Debug)]
pub struct FailoverArgs {
    #[command(flatten)]
    common: Common,
    /// Sessions kept alive over gRPC through the proxies.
    #[arg(long, default_value_t = 10_000, value_parser = clap::value_parser!(u64).range(1..=10_000_000))]
    sessions: u64,
    /// Their TTL in seconds (each refreshed every third of it).
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(i64).range(3..=3600))]
    ttl: i64,
    /// Concurrent writers.
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u64).range(1..=10_000))]
    writers: u64,
    /// When the leader is killed, from the start of the load.
    #[arg(long, default_value = "5s", value_parser = humantime::parse_duration)]
    kill_after: Duration,
    /// How long after a new leader serves a follower is paused.
    #[arg(long, default_value = "5s", value_parser = humantime::parse_duration)]
    pause_after: Duration,
    /// How long the follower stays paused.
    #[arg(long, default_value = "5s", value_parser = humantime::parse_duration)]
    pause_for: Duration,
    /// How long the load runs after the follower resumes.
    #[arg(long, default_value = "5s", value_parser = humantime::parse_duration)]
    tail: Duration,
    /// The longest a new leader may take to appear before the run fails.
    #[arg(long, default_value = "30s", value_parser = humantime::parse_duration)]
    leader_timeout: Duration,
}

pub async fn main(args: FailoverArgs) -> ExitCode {
    let args = &args;
    drive("failover", &args.common, |endpoints| async move {
        run(args, &endpoints).await
    })
    .await
}

/// The member whose metrics say it leads, among `members`.
async fn leader(members: &[Proc]) -> Option<Proc> {
    for m in members {
        let Some(addr) = m.addrs.get("metrics") else {
            continue;
        };
        let Some(text) = http_get(addr, "/metrics").await else {
            continue;
        };
        if metric_value(&text, "latchkey_is_leader") == Some(1.0) {
            return Some(m.clone());
        }
    }
    None
}

/// Waits until one of `members` leads; returns it and how long that took.
async fn new_leader(members: &[Proc], within: Duration) -> Result<(Proc, Duration), String> {
    let t = Instant::now();
    while t.elapsed() < within {
        if let Some(l) = leader(members).await {
            return Ok((l, t.elapsed()));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Err(format!("no new leader within {within:?}"))
}

/// Waits until `member` answers ready (it knows a leader and has applied
/// what it knows committed); returns how long that took.
async fn ready(member: &Proc, within: Duration) -> Result<Duration, String> {
    let addr = member.addrs.get("metrics").ok_or("no metrics address")?;
    let t = Instant::now();
    wait_ready(member, addr, within).await?;
    Ok(t.elapsed())
}

/// The longest time between two successful writes inside `[from, to]`
/// (the edges count as writes), in milliseconds.
fn longest_gap(acks: &[Instant], from: Instant, to: Instant) -> f64 {
    let mut last = from;
    let mut gap = Duration::ZERO;
    for &at in acks.iter().filter(|&&at| at > from && at <= to) {
        gap = gap.max(at - last);
        last = at;
    }
    gap = gap.max(to.saturating_duration_since(last));
    gap.as_secs_f64() * 1000.0
}

async fn run(args: &FailoverArgs, endpoints: &Endpoints) -> Result<Outcome, String> {
    if endpoints.target != Target::Latchkey || endpoints.cell_pids.len() < 3 {
        return Err(
            "needs a latchkey cell of 3 or more members started by `cluster up` \
                    (its state file names the processes to kill and pause)"
                .into(),
        );
    }
    let timeout = args.common.op_timeout;
    let state = read_state(&args.common.state)?;
    let members: Vec<Proc> = state
        .processes
        .iter()
        .filter(|p| p.name.starts_with("cell-"))
        .cloned()
        .collect();
    let front = endpoints.require_grpc()?.to_vec();

    let bar = counter("creating", args.sessions);
    let held = create_grpc(
        &front,
        args.sessions as usize,
        args.ttl,
        timeout,
        &bar,
        None,
    )
    .await?;
    bar.finish_and_clear();

    // Load: keep-alives and writers until every phase is over.
    let keepalives = Arc::new(Recorder::new());
    let expired = Arc::new(Expired::default());
    let far = Instant::now() + Duration::from_secs(24 * 3600);
    let period = Duration::from_secs(args.ttl as u64) / 3;
    let keepers = keep_alive_over_grpc(&held, 8, period, far, &keepalives, &expired, timeout, None);
    let clients = connect_all(&front, args.writers, timeout, None).await?;
    let keys = own_keys("loadtest/failover/", clients.len());
    let total =
        args.kill_after + args.pause_after + args.pause_for + args.tail + Duration::from_secs(2);
    let writers = Writers::start(&clients, &keys, b"v", timeout, "failover", total);

    tokio::time::sleep(args.kill_after).await;
    let kill = kill_the_leader(args, &members).await?;
    let rejoined = rejoin(args, &kill.old).await;
    if let Err(e) = &rejoined {
        // Pausing a follower now would take the quorum away: the figure
        // would be an outage, not a follower's pause.
        let _ = writers.stop().await;
        keepers.iter().for_each(|k| k.abort());
        return Err(format!(
            "{} did not come back after the kill: {e}",
            kill.old.name
        ));
    }
    tokio::time::sleep(args.pause_after).await;
    let pause = pause_a_follower(args, &members, &kill.survivors).await?;
    tokio::time::sleep(args.tail).await;
    let (writes, acks) = writers.stop().await;
    for k in &keepers {
        k.abort();
    }

    // The sessions must all be there.
    let survivor_addrs: Vec<String> = kill
        .survivors
        .iter()
        .filter_map(|m| m.addrs.get("client").cloned())
        .collect();
    let all: Vec<i64> = held.iter().flat_map(|h| h.ids.clone()).collect();
    let gone = gone_at(&survivor_addrs, &all, timeout, None).await?;
    let (during, expired) = expired_count(&expired, &gone);

    let acks: Vec<Instant> = acks.into_iter().map(|(at, _)| at).collect();
    let kill_window = longest_gap(&acks, kill.at, pause.at);
    let pause_window = longest_gap(&acks, pause.at, pause.resumed_at);
    let before = longest_gap(
        &acks,
        kill.at - args.kill_after.min(Duration::from_secs(3)),
        kill.at,
    );

    let mut o = Outcome::new("failover", endpoints.target);
    o.field("endpoints", front);
    o.figure(
        "sessions",
        all.len(),
        format!("{} over gRPC, TTL {} s", all.len(), args.ttl),
    );
    o.figure(
        "killed",
        kill.old.name.clone(),
        format!("{} (the leader), SIGKILL", kill.old.name),
    );
    let ms = kill.to_new_leader.as_secs_f64() * 1000.0;
    o.figure(
        "time_to_new_leader_ms",
        ms,
        format!("{ms:.0} ms ({} leads)", kill.new_leader.name),
    );
    o.figure(
        "write_unavailable_ms",
        kill_window,
        format!("{kill_window:.0} ms (longest time without a write acknowledged after the kill)"),
    );
    o.figure(
        "paused",
        pause.paused.name.clone(),
        format!(
            "{} (a follower), SIGSTOP for {:?}",
            pause.paused.name, args.pause_for
        ),
    );
    o.figure(
        "write_gap_during_pause_ms",
        pause_window,
        format!("{pause_window:.0} ms (longest gap while the follower was paused)"),
    );
    o.figure(
        "write_gap_before_ms",
        before,
        format!("{before:.0} ms (longest gap before the kill, for comparison)"),
    );
    o.safety("expired_sessions", expired as u64);
    o.field("expired_during_run", during);
    o.field("gone_at_cell_after", gone);
    let rate = writes.rate();
    o.figure("writes_per_s", rate, format!("{rate:.0}"));
    o.latency("write", &writes.latency());
    o.errors(writes.errors(), writes.first_error());
    o.field("keepalive_errors", keepalives.errors());
    match rejoined {
        Ok((pid, took)) => o.figure(
            "restarted",
            true,
            format!(
                "{} again as pid {pid}, ready after {:.1} s",
                kill.old.name,
                took.as_secs_f64()
            ),
        ),
        Err(e) => o.figure("restarted", false, format!("no: {e}")),
    }
    o.series(writes.series());
    Ok(o)
}

/// The leader's SIGKILL and who leads after it.
struct Kill {
    old: Proc,
    at: Instant,
    survivors: Vec<Proc>,
    new_leader: Proc,
    to_new_leader: Duration,
}

async fn kill_the_leader(args: &FailoverArgs, members: &[Proc]) -> Result<Kill, String> {
    let old = new_leader(members, args.leader_timeout).await?.0;
    let at = Instant::now();
    signal(old.pid, "KILL");
    let survivors: Vec<Proc> = members
        .iter()
        .filter(|m| m.name != old.name)
        .cloned()
        .collect();
    match new_leader(&survivors, args.leader_timeout).await {
        Ok((new_leader, to_new_leader)) => Ok(Kill {
            old,
            at,
            survivors,
            new_leader,
            to_new_leader,
        }),
        Err(e) => {
            // Leave the cluster as it was found, as far as that goes.
            let _ = restart(&args.common.state, &old.name);
            Err(e)
        }
    }
}

/// The killed member started again: its new pid and how long it took to
/// be ready.
async fn rejoin(args: &FailoverArgs, old: &Proc) -> Result<(u32, Duration), String> {
    let pid = restart(&args.common.state, &old.name)?;
    // The same member under its new pid.
    let back = Proc { pid, ..old.clone() };
    let took = ready(&back, args.leader_timeout).await?;
    Ok((pid, took))
}

/// A follower's SIGSTOP for `--pause-for`, then SIGCONT.
struct Pause {
    paused: Proc,
    at: Instant,
    resumed_at: Instant,
}

/// Pauses a follower that was never down (the cell keeps a quorum: the
/// leader and the restarted member).
async fn pause_a_follower(
    args: &FailoverArgs,
    members: &[Proc],
    survivors: &[Proc],
) -> Result<Pause, String> {
    // Whoever leads now.
    let leading = new_leader(members, args.leader_timeout).await?.0;
    let paused = survivors
        .iter()
        .find(|m| m.name != leading.name)
        .cloned()
        .ok_or("no follower left to pause")?;
    let at = Instant::now();
    signal(paused.pid, "STOP");
    tokio::time::sleep(args.pause_for).await;
    signal(paused.pid, "CONT");
    Ok(Pause {
        paused,
        at,
        resumed_at: Instant::now(),
    })
}
