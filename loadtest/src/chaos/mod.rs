//! `latchkey-loadtest chaos`: the fault-injection safety suite.
//!
//! One run starts a three-member cell (each member on its own loopback
//! address, so iptables rules can tell them apart) and a proxy in front of
//! it, then runs at once:
//!
//! - the recorded workload ([`workload`]): clients straight to each member
//!   and through the proxy doing linearizable reads, writes and
//!   compare-and-sets, and a watcher through the proxy;
//! - lock holders (separate `sh`+`curl` processes through the proxy, 1 s
//!   sessions) writing to a fenced resource with their tokens;
//! - the nemesis ([`nemesis`]) doing the seeded plan ([`schedule`]) of
//!   faults, each healed before the next.
//!
//! With `--cells 2` ([`cells`]) a second cell of three joins the first
//! behind the proxy, the workload's prefix (with the lock) moves between
//! them every `--move-every`, and the faults hit either cell.
//!
//! What runs under the faults, started and stopped together, is the
//! [`load`]. After the last heal it checks ([`checks`], and the linearizability
//! checker of the test kit) and prints a verdict; on a violation it writes
//! the history and a picture of it ([`report`]).

mod cells;
mod checks;
mod leases;
mod load;
mod nemesis;
mod report;
mod schedule;
mod workload;

use etcd_client::{Client, GetOptions, SortOrder, SortTarget};
use latchkey_testkit::linearizability::{self, Answer, Call, Operation, Verdict};
use latchkey_testkit::{outlier_bound, Cluster, FencedLog, Holders, ProxyProcess};
use load::{wait_watched, Load};
use nemesis::Nemesis;
use schedule::FaultKind;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use workload::{Entry, Recorder, Seen, KEY_PREFIX};

#[derive(clap::Args, Debug)]
pub struct ChaosArgs {
    /// How long the faults go on (30-60 s is a CI run).
    #[arg(long, default_value = "45s", value_parser = humantime::parse_duration)]
    duration: Duration,
    /// Draws the faults, their order, timing and targets: the same seed
    /// gives the same plan.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// The fault kinds to draw from, comma separated (default: all).
    #[arg(long, value_enum, value_delimiter = ',')]
    faults: Vec<FaultKind>,
    #[command(flatten)]
    bins: crate::binaries::Binaries,
    /// Workload clients straight to a member (spread over the members in
    /// turn).
    #[arg(long, default_value_t = 3)]
    member_clients: usize,
    /// Workload clients through the proxy.
    #[arg(long, default_value_t = 2)]
    proxy_clients: usize,
    /// How long a workload operation waits for its answer before its
    /// outcome is unknown and the client goes on.
    #[arg(long, default_value = "3s", value_parser = humantime::parse_duration)]
    op_timeout: Duration,
    /// Fewer checked operations than this fails the run: nothing happened.
    #[arg(long, default_value_t = 1000)]
    min_ops: usize,
    /// Fewer injected faults than this fails the run.
    #[arg(long, default_value_t = 4)]
    min_faults: usize,
    /// The longest write outage allowed after a single-member fault, or
    /// twice the median outage of this run's faults that depose the leader
    /// when that is longer: a loaded machine stretches every outage, and
    /// one far longer than the rest of its run is still a violation.
    #[arg(long, default_value = "3s", value_parser = humantime::parse_duration)]
    max_outage: Duration,
    /// Cells: 1, or 2 with the workload's prefix moving between them
    /// (`--move-every`) and faults in both.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u8).range(1..=2))]
    cells: u8,
    /// With two cells: the wait between one move's end and the next.
    #[arg(long, default_value = "4s", value_parser = humantime::parse_duration)]
    move_every: Duration,
    /// With two cells: fewer moves that went through than this fails the
    /// run (the moves were not checked).
    #[arg(long, default_value_t = 2)]
    min_moves: usize,
    /// Where a failing run writes its history and report.
    #[arg(long, default_value = "chaos-report")]
    out: PathBuf,
    /// Write the history and report even when every check passes.
    #[arg(long)]
    keep_history: bool,
}

/// A fault as the run did it, on the recorder's clock.
#[derive(Debug, Clone)]
pub struct Done {
    pub kind: FaultKind,
    pub detail: String,
    pub at_us: u64,
    pub healed_us: u64,
}

/// What a run found.
pub struct Findings {
    pub seed: u64,
    pub operations: usize,
    pub faults: Vec<Done>,
    pub skipped: usize,
    pub violations: Vec<String>,
    /// Per fault kind: how many, and the longest write outage after one.
    pub outages: Vec<(FaultKind, usize, Duration)>,
    pub lock_grants: usize,
    pub stale_refused: usize,
    pub linearizable: Option<bool>,
    /// The key whose history has no legal order.
    pub bad_key: Option<String>,
    /// How much the proxy invariants had to look at.
    pub coverage: Coverage,
    /// With two cells: the moves of the workload's prefix.
    pub moves: Vec<cells::MoveDone>,
    /// Workload operations a cell refused as not its own (nothing applied).
    pub refused: usize,
}

/// What the invariants about the proxy were checked on: a run where one
/// of these is 0 checked nothing of it.
#[derive(Debug, Default)]
pub struct Coverage {
    /// Serializable reads answered through the proxy.
    pub serializable_reads: usize,
    /// Keep-alives the proxy's session table confirmed.
    pub proxy_keep_alives: usize,
    /// Lock handoffs that began while a follower was cut off, and the
    /// slowest of them.
    pub partition_handoffs: usize,
    pub slowest_partition_handoff: Duration,
}

pub async fn main(args: ChaosArgs) -> ExitCode {
    let (cell_bin, proxy_bin) = match (args.bins.cell(), args.bins.proxy()) {
        (Ok(cell), Ok(proxy)) => (cell, proxy),
        (Err(e), _) | (_, Err(e)) => {
            eprintln!("chaos: {e}");
            return ExitCode::from(2);
        }
    };
    let kinds = if args.faults.is_empty() {
        FaultKind::ALL.to_vec()
    } else {
        args.faults.clone()
    };
    match run(&args, &cell_bin, &proxy_bin, &kinds).await {
        Ok((findings, entries)) => {
            report::finish(&args.out, args.keep_history, &findings, &entries)
        }
        Err(e) => {
            eprintln!("chaos: {e}");
            ExitCode::from(2)
        }
    }
}

async fn run(
    args: &ChaosArgs,
    cell_bin: &std::path::Path,
    proxy_bin: &std::path::Path,
    kinds: &[FaultKind],
) -> Result<(Findings, Vec<Entry>), String> {
    let two = args.cells == 2;
    let mut clusters = vec![start_cell(args, cell_bin, kinds, 1).await?];
    if two {
        clusters.push(start_cell(args, cell_bin, kinds, cells::SECOND_AFTER).await?);
    }
    let members: Vec<String> = clusters[0]
        .members
        .iter()
        .map(|m| m.client.clone())
        .collect();
    let mut proxy_args: Vec<&str> = vec!["--refresh-tick", "100ms"];
    proxy_args.extend(args.bins.proxy_arg.iter().map(String::as_str));
    let proxy = ProxyProcess::start(proxy_bin, &members, &proxy_args).await;
    if two {
        cells::set_up(&proxy, &clusters[1]).await?;
    }

    let (fenced, fenced_addr) = FencedLog::serve().await;
    let lock = if two { cells::LOCK } else { "fenced" };
    let holders = Holders::start(3, &proxy.http, lock, fenced_addr);
    let start_revision = {
        let home = &clusters[0];
        let mut c = home.client(home.leader_at_start()).await;
        c.status()
            .await
            .map_err(|e| format!("status: {e}"))?
            .header()
            .map_or(1, |h| h.revision())
            + 1
    };
    let cell_refs: Vec<&Cluster> = clusters.iter().collect();
    let load = Load::start(
        args,
        &cell_refs,
        &["", cells::SECOND_PREFIX],
        &proxy,
        start_revision,
    );
    let mover = two.then(|| cells::Mover::start(&proxy, load.rec.clone(), args.move_every));
    let plan = schedule::plan(args.seed, args.duration, kinds);
    let (done, skipped) = inject(args, &plan, &mut clusters, &holders, &load.rec).await;
    let moves = match mover {
        Some(m) => m.stop().await,
        None => Vec::new(),
    };
    let rec = load.rec.clone();
    let (watch, leases_seen, stuck) = load.stop().await;
    drop(holders);
    let end_us = rec.now_us();

    // After heal: one leader in each cell, then the checks.
    for c in &clusters {
        c.wait_leader(Duration::from_secs(20)).await;
    }
    let mut entries = rec.entries();
    let mut violations = stuck;
    if two {
        // The prefix's history is spread over both cells: the final reads
        // go through the proxy to its owner, and the watch is checked
        // stretch by stretch.
        let final_reads = final_reads(&format!("http://{}", proxy.grpc), &entries, &rec).await?;
        entries.extend(final_reads);
        violations.extend(watch.check_across_moves(start_revision, &entries).await);
    } else {
        let home = &clusters[0];
        let endpoint = format!("http://{}", home.member(home.running()[0]).client);
        let final_reads = final_reads(&endpoint, &entries, &rec).await?;
        entries.extend(final_reads);
        let committed = committed_history(home, start_revision).await?;
        violations.extend(watch.check(&committed, &entries).await);
        violations.extend(checks::writes_at_most_once(&committed));
    }
    violations.extend(leases::expired_while_confirmed(&leases_seen));
    violations.extend(checks::revisions_per_client(&entries));
    for c in &clusters {
        violations.extend(hashes_agree(c).await);
    }
    let (lock_grants, stale_refused) = match fenced.check() {
        Ok(s) => (s.grants, s.stale_refused),
        Err(e) => {
            violations.push(format!("fencing: {e}"));
            (0, 0)
        }
    };
    // Bounds on availability hold for a fault alone, not for one that
    // overlaps a move (whose pause is bounded on its own).
    let alone: Vec<Done> = done
        .iter()
        .filter(|d| !cells::during_a_move(&moves, d.at_us, d.healed_us))
        .cloned()
        .collect();
    let (slow, partition_handoffs) = handoffs_while_a_follower_is_cut_off(&fenced, &alone, &rec);
    violations.extend(slow);
    let coverage = Coverage {
        serializable_reads: entries
            .iter()
            .filter(|e| e.serializable && e.revision.is_some())
            .count(),
        proxy_keep_alives: leases_seen
            .iter()
            .filter(|s| {
                matches!(
                    s,
                    leases::Seen::Confirmed {
                        via_proxy: true,
                        ..
                    }
                )
            })
            .count(),
        partition_handoffs: partition_handoffs.len(),
        slowest_partition_handoff: partition_handoffs.iter().copied().max().unwrap_or_default(),
    };
    let (linearizable, operations, bad_key) = verdict(&entries, &mut violations).await?;
    let during_a_move = |d: &Done| cells::during_a_move(&moves, d.at_us, d.healed_us);
    let outages = outages(args, &done, &rec, end_us, during_a_move, &mut violations);
    if operations < args.min_ops {
        violations.push(format!(
            "only {operations} operations checked (at least {})",
            args.min_ops
        ));
    }
    if done.len() < args.min_faults {
        violations.push(format!(
            "only {} faults injected (at least {})",
            done.len(),
            args.min_faults
        ));
    }
    let moved = cells::pauses(&moves).len();
    if two && moved < args.min_moves {
        violations.push(format!(
            "only {moved} moves went through of {} asked for (at least {})",
            moves.len(),
            args.min_moves
        ));
    }
    if !violations.is_empty() || args.keep_history {
        for (i, c) in clusters.iter().enumerate() {
            keep_member_logs(c, &args.out, if i == 0 { "" } else { cells::SECOND });
        }
    }
    print_upstream_errors(&proxy).await;
    drop(proxy);
    Ok((
        Findings {
            seed: args.seed,
            operations,
            faults: done,
            skipped,
            violations,
            outages,
            lock_grants,
            stale_refused,
            linearizable,
            bad_key,
            coverage,
            moves,
            refused: rec.refused.load(Ordering::Relaxed),
        },
        entries,
    ))
}

/// A three-member cell with short lease timings and, when the plan has
/// crash faults, fail points.
async fn start_cell(
    args: &ChaosArgs,
    cell_bin: &std::path::Path,
    kinds: &[FaultKind],
    after: u64,
) -> Result<Cluster, String> {
    // A short grace on leader change (default 5 s) lets leases expire
    // within a fault's hold, where the lease invariant can see it; it
    // must exceed the checkpoint interval (the cell refuses otherwise).
    let mut cell_args: Vec<&str> = vec![
        "--min-ttl",
        "1",
        "--lease-grace-ms",
        "1000",
        "--lease-checkpoint-interval-ms",
        "250",
    ];
    // The crash faults arm fail points, which only a debug build has and
    // serves only with this flag.
    let needs_fail_points = kinds
        .iter()
        .any(|k| matches!(k, FaultKind::LogAppendCrash | FaultKind::CommitCrash));
    if needs_fail_points {
        cell_args.push("--unsafe-fail-points");
    }
    cell_args.extend(args.bins.cell_arg.iter().map(String::as_str));
    let cluster = Cluster::start_apart_after(cell_bin, 3, &cell_args, after).await;
    if needs_fail_points && !nemesis::has_fail_points(&cluster, 1).await {
        return Err(format!(
            "{} serves no fail points: pass a debug build with --cell-bin, or leave out \
             --faults log-append-crash,commit-crash",
            cell_bin.display()
        ));
    }
    Ok(cluster)
}

/// Does the plan: each fault injected into one of the cells (the step's
/// pick chooses), held (noting a new leader) and healed, then the rest of
/// `--duration`. The faults done, and how many were skipped.
async fn inject(
    args: &ChaosArgs,
    plan: &[schedule::Step],
    clusters: &mut [Cluster],
    holders: &Holders,
    rec: &Recorder,
) -> (Vec<Done>, usize) {
    let mut done = Vec::new();
    let mut skipped = 0;
    let names: Vec<&str> = ["", cells::SECOND]
        .into_iter()
        .take(clusters.len())
        .collect();
    let mut nemeses: Vec<Nemesis> = clusters
        .iter_mut()
        .map(|c| Nemesis::new(c, holders))
        .collect();
    for step in plan {
        tokio::time::sleep(step.at.saturating_sub(rec.elapsed())).await;
        let at_us = rec.now_us();
        let which = (step.pick >> 32) as usize % nemeses.len();
        let cell = if names[which].is_empty() {
            String::new()
        } else {
            format!("cell {}: ", names[which])
        };
        let nemesis = &mut nemeses[which];
        match nemesis.inject(step).await {
            Ok(injected) => {
                println!(
                    "chaos: {:>6.1}s {} ({cell}{}) at {}",
                    at_us as f64 / 1e6,
                    injected.kind.name(),
                    injected.detail,
                    humantime::format_rfc3339_millis(std::time::SystemTime::now())
                );
                let before = nemesis.leader_before;
                let healing = tokio::time::Instant::now() + step.hold;
                while tokio::time::Instant::now() < healing {
                    if let Some(l) = nemesis.leader().await.filter(|l| Some(*l) != before) {
                        println!(
                            "chaos: {:>6.1}s {cell}new leader {l}",
                            rec.now_us() as f64 / 1e6
                        );
                        break;
                    }
                    // Each look asks every member over a new connection:
                    // not so often that it loads the cell under test.
                    tokio::time::sleep(Duration::from_millis(250)).await;
                }
                tokio::time::sleep_until(healing).await;
                nemesis.heal().await;
                done.push(Done {
                    kind: injected.kind,
                    detail: format!("{cell}{}", injected.detail),
                    at_us,
                    healed_us: rec.now_us(),
                });
            }
            Err(why) => {
                println!(
                    "chaos: {:>6.1}s {} skipped: {cell}{why}",
                    at_us as f64 / 1e6,
                    step.kind.name()
                );
                nemesis.heal().await;
                skipped += 1;
            }
        }
    }
    tokio::time::sleep(args.duration.saturating_sub(rec.elapsed())).await;
    for nemesis in &mut nemeses {
        nemesis.heal().await;
    }
    (done, skipped)
}

/// How long a lock handoff may take while one follower is cut off from
/// its peers (issue 28): the proxy moves a waiter's watch off that member
/// within two election timeouts, then the waiter is granted.
const HANDOFF_BOUND: Duration = Duration::from_secs(2);

/// The lock holders' handoffs that began during a minority partition and
/// took longer than [`HANDOFF_BOUND`]; and how long each such handoff took.
fn handoffs_while_a_follower_is_cut_off(
    fenced: &FencedLog,
    done: &[Done],
    rec: &Recorder,
) -> (Vec<String>, Vec<Duration>) {
    let writes: Vec<(u64, i64)> = fenced
        .writes()
        .iter()
        .filter(|w| w.accepted)
        .map(|w| (rec.us_of(w.at), w.token))
        .collect();
    let windows: Vec<(u64, u64)> = done
        .iter()
        .filter(|d| d.kind == FaultKind::MinorityPartition)
        .map(|d| (d.at_us, d.healed_us))
        .collect();
    let took = checks::handoffs_within(&writes, &windows)
        .map(|(from, to)| Duration::from_micros(to - from))
        .collect();
    let slow = checks::slow_handoffs(&writes, &windows, HANDOFF_BOUND.as_micros() as u64);
    (slow, took)
}

/// The linearizability checker's verdict on the history (at most 120 s):
/// linearizable or not (None: no answer in time), the operations checked,
/// and the key without a legal order.
async fn verdict(
    entries: &[Entry],
    violations: &mut Vec<String>,
) -> Result<(Option<bool>, usize, Option<String>), String> {
    let history: Vec<Operation> = entries
        .iter()
        .filter(|e| !e.serializable)
        .map(|e| e.op.clone())
        .collect();
    let verdict = tokio::time::timeout(
        Duration::from_secs(120),
        tokio::task::spawn_blocking(move || linearizability::check(&history)),
    )
    .await;
    match verdict {
        Ok(Ok(Verdict::Linearizable { operations })) => Ok((Some(true), operations, None)),
        Ok(Ok(Verdict::NotLinearizable { key })) => {
            violations.push(format!("not linearizable: key {key}"));
            Ok((Some(false), entries.len(), Some(key)))
        }
        Ok(Err(e)) => Err(format!("the checker failed: {e}")),
        Err(_) => {
            violations.push("the checker found no answer within 120 s".into());
            Ok((None, entries.len(), None))
        }
    }
}

/// Per fault kind: how many, and the longest write outage after one; a
/// single-member fault's outage past the bound is a violation, unless
/// `exempt` (a fault that overlapped a move, whose pause has its own
/// bound).
fn outages(
    args: &ChaosArgs,
    done: &[Done],
    rec: &Recorder,
    end_us: u64,
    exempt: impl Fn(&Done) -> bool,
    violations: &mut Vec<String>,
) -> Vec<(FaultKind, usize, Duration)> {
    let gaps = write_gaps(done, rec, end_us);
    let election_gaps: Vec<Duration> = done
        .iter()
        .zip(&gaps)
        .filter(|(d, _)| d.kind.deposes_leader() && !exempt(d))
        .map(|(_, gap)| *gap)
        .collect();
    let max_outage = outlier_bound(args.max_outage, &election_gaps);
    for (d, &gap) in done.iter().zip(&gaps) {
        if d.kind.single_member() && !exempt(d) && gap > max_outage {
            violations.push(format!(
                "{} at {:.1}s: no write succeeded for {} ms (at most {} ms)",
                d.kind.name(),
                d.at_us as f64 / 1e6,
                gap.as_millis(),
                max_outage.as_millis()
            ));
        }
    }
    per_kind(done, &gaps)
}

/// The longest write outage after each fault.
fn write_gaps(done: &[Done], rec: &Recorder, end_us: u64) -> Vec<Duration> {
    let writes = rec.write_completions();
    done.iter()
        .map(|d| {
            Duration::from_micros(checks::longest_outage(
                &writes,
                d.at_us,
                d.healed_us,
                end_us,
            ))
        })
        .collect()
}

/// Per fault kind: how many, and the longest of their `gaps`.
fn per_kind(done: &[Done], gaps: &[Duration]) -> Vec<(FaultKind, usize, Duration)> {
    let mut outages: Vec<(FaultKind, usize, Duration)> = Vec::new();
    for (d, &gap) in done.iter().zip(gaps) {
        match outages.iter_mut().find(|o| o.0 == d.kind) {
            Some(o) => {
                o.1 += 1;
                o.2 = o.2.max(gap);
            }
            None => outages.push((d.kind, 1, gap)),
        }
    }
    outages.sort_by_key(|o| o.0);
    outages
}

/// The members' own account of the run, beside the history (a second
/// cell's named after it).
fn keep_member_logs(cluster: &Cluster, out: &std::path::Path, cell: &str) {
    let _ = std::fs::create_dir_all(out);
    for m in &cluster.members {
        let _ = std::fs::copy(
            cluster.log_path(m.id),
            out.join(format!("member-{cell}{}.log", m.id)),
        );
    }
}

async fn print_upstream_errors(proxy: &ProxyProcess) {
    let upstream_errors: Vec<String> = proxy
        .metrics()
        .await
        .lines()
        .filter(|l| l.starts_with("latchkey_proxy_upstream_errors_total"))
        .map(|l| {
            l.trim_start_matches("latchkey_proxy_upstream_errors_total")
                .to_string()
        })
        .collect();
    println!(
        "chaos: proxy upstream errors: {}",
        upstream_errors.join(", ")
    );
}

/// A linearizable read of every key the workload touched through
/// `endpoint`, after heal: what every acknowledged write must have left
/// behind.
async fn final_reads(
    endpoint: &str,
    entries: &[Entry],
    rec: &Recorder,
) -> Result<Vec<Entry>, String> {
    let mut keys: Vec<&str> = entries.iter().map(|e| e.op.key.as_str()).collect();
    keys.sort_unstable();
    keys.dedup();
    let mut client = Client::connect(
        [endpoint],
        Some(workload::client_options(Duration::from_secs(10))),
    )
    .await
    .map_err(|e| format!("final reads through {endpoint}: {e}"))?;
    let mut reads = Vec::new();
    for key in keys {
        let invoke = rec.now_us();
        let got = client
            .get(key, None)
            .await
            .map_err(|e| format!("final read of {key}: {e}"))?;
        reads.push(Entry {
            client: usize::MAX,
            via: "final read".into(),
            op: Operation {
                key: key.to_string(),
                call: Call::Read,
                answer: Answer::Read(
                    got.kvs()
                        .first()
                        .map(|kv| String::from_utf8_lossy(kv.value()).into_owned()),
                ),
                invoke,
                complete: rec.now_us(),
            },
            revision: got.header().map(|h| h.revision()),
            serializable: false,
        });
    }
    Ok(reads)
}

/// Every event under `chaos/` from `start`, read after heal by a fresh
/// watch on a member, up to the newest write there is.
async fn committed_history(cluster: &Cluster, start: i64) -> Result<Vec<Seen>, String> {
    let mut client: Client = cluster.client(cluster.running()[0]).await;
    let newest = client
        .get(
            KEY_PREFIX,
            Some(
                GetOptions::new()
                    .with_prefix()
                    .with_sort(SortTarget::Mod, SortOrder::Descend)
                    .with_limit(1),
            ),
        )
        .await
        .map_err(|e| format!("newest write: {e}"))?
        .kvs()
        .first()
        .map_or(0, |kv| kv.mod_revision());
    let seen = Arc::new(Mutex::new(Vec::new()));
    let stop = Arc::new(AtomicBool::new(false));
    let endpoint = format!("http://{}", cluster.member(cluster.running()[0]).client);
    let task = tokio::spawn(workload::watch_all(
        endpoint,
        start,
        seen.clone(),
        stop.clone(),
        false,
    ));
    let reached = wait_watched(&seen, newest).await;
    stop.store(true, Ordering::Relaxed);
    task.await
        .map_err(|e| format!("history watch: {e}"))?
        .map_err(|e| format!("history watch: {e}"))?;
    if !reached {
        return Err(format!(
            "a fresh watch did not reach revision {newest} in 10 s"
        ));
    }
    let got = seen.lock().unwrap_or_else(|p| p.into_inner()).clone();
    Ok(got)
}

/// Every member's hash of the keyspace history (HashKV, etcd's
/// corruption check) at the lowest revision all of them have applied.
async fn hashes_agree(cluster: &Cluster) -> Vec<String> {
    let mut clients = Vec::new();
    let mut lowest = i64::MAX;
    for id in cluster.running() {
        let mut c = cluster.client(id).await;
        match c.status().await {
            Ok(s) => lowest = lowest.min(s.header().map_or(0, |h| h.revision())),
            Err(e) => return vec![format!("member {id} gives no status after heal: {e}")],
        }
        clients.push((id, c));
    }
    let mut hashes = Vec::new();
    for (id, c) in &mut clients {
        match c.hash_kv(lowest).await {
            Ok(h) => hashes.push((*id, h.hash())),
            Err(e) => return vec![format!("member {id} HashKV({lowest}): {e}")],
        }
    }
    if hashes.windows(2).all(|w| w[0].1 == w[1].1) {
        Vec::new()
    } else {
        vec![format!(
            "members' state hashes differ at revision {lowest}: {hashes:?}"
        )]
    }
}
