//! `locks`: contenders on L locks over etcd's lock API (`v3lockpb`
//! Lock/Unlock, so it runs unchanged against etcd). Each contender has its
//! own connection and lease and, until the time is up, takes a lock drawn
//! at random, writes to that lock's fenced resource with the lock's
//! fencing token (the revision the grant answered with), holds it for
//! `--hold`, and unlocks it.
//!
//! What must hold (violations: 0): no two contenders hold one lock at
//! once, no grant comes with a token below one the resource already
//! accepted, and no grant is answered at a revision before an unlock of
//! that lock that was already answered (its holder saw the lock free
//! before it was).

use super::load::{connect_all, within};
use super::recorder::{Progress, Recorder};
use super::{drive, over, Common, Endpoints, Outcome};
use etcd_client::{Client, LockOptions};
use latchkey_shared::lock::FencedResource;
use std::collections::HashMap;
use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

#[derive(clap::Args, Debug)]
pub struct LocksArgs {
    #[command(flatten)]
    common: Common,
    /// Contenders, each with its own connection and lease.
    #[arg(long, default_value_t = 16, value_parser = clap::value_parser!(u64).range(1..=10_000))]
    contenders: u64,
    /// Locks they contend for.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    locks: u64,
    /// How long each grant is held before the unlock (long enough that
    /// two holders at once would overlap in the referee's view).
    #[arg(long, default_value = "5ms", value_parser = humantime::parse_duration)]
    hold: Duration,
    /// Spread the locks over this many cells: lock i is named under
    /// `loadtest/cell-{i % N}/`, the prefixes `cluster up --cell-groups N`
    /// gives its cells.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..=8))]
    spread_cells: u64,
}

/// Who holds what, as the contenders themselves see it, and what they
/// saw go wrong (the `move` scenario's contenders use it too).
pub(super) struct Referee {
    holders: Mutex<HashMap<u64, u64>>,
    /// Per lock, the highest revision an unlock of it was answered at: a
    /// later grant saw the lock free at or after it.
    released: Mutex<HashMap<u64, i64>>,
    fenced: FencedResource,
    violations: AtomicU64,
    first: Mutex<Option<String>>,
}

impl Referee {
    pub(super) fn new() -> Referee {
        Referee {
            holders: Mutex::new(HashMap::new()),
            released: Mutex::new(HashMap::new()),
            fenced: FencedResource::new(),
            violations: AtomicU64::new(0),
            first: Mutex::new(None),
        }
    }

    /// How many violations, and the first.
    pub(super) fn found(&self) -> (u64, Option<String>) {
        let first = self.first.lock().unwrap_or_else(|p| p.into_inner()).clone();
        (self.violations.load(Ordering::Relaxed), first)
    }

    fn violation(&self, what: String) {
        self.violations.fetch_add(1, Ordering::Relaxed);
        let mut first = self.first.lock().unwrap_or_else(|p| p.into_inner());
        first.get_or_insert(what);
    }

    /// `contender` was granted `lock` with `token`.
    pub(super) fn granted(&self, lock: u64, contender: u64, token: i64) {
        let other = self
            .holders
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(lock, contender);
        if let Some(other) = other {
            self.violation(format!(
                "contenders {other} and {contender} held lock {lock} at once"
            ));
        }
        if let Err(stale) = self.fenced.accept(&lock.to_string(), token) {
            self.violation(format!("lock {lock}, contender {contender}: {stale}"));
        }
        let released = self.released.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(at) = released.get(&lock).filter(|at| token < **at) {
            self.violation(format!(
                "lock {lock}: contender {contender} was granted at revision {token}, before \
                 an unlock it waited for (revision {at})"
            ));
        }
    }

    /// An unlock of `lock` was answered at `revision`.
    pub(super) fn released(&self, lock: u64, revision: i64) {
        let mut released = self.released.lock().unwrap_or_else(|p| p.into_inner());
        let at = released.entry(lock).or_insert(revision);
        *at = (*at).max(revision);
    }

    /// `contender` is about to unlock `lock`.
    pub(super) fn releasing(&self, lock: u64, contender: u64) {
        let mut holders = self.holders.lock().unwrap_or_else(|p| p.into_inner());
        if holders.get(&lock) == Some(&contender) {
            holders.remove(&lock);
        }
    }
}

pub async fn main(args: LocksArgs) -> ExitCode {
    let args = &args;
    drive("locks", &args.common, |endpoints| async move {
        run(args, &endpoints).await
    })
    .await
}

async fn run(args: &LocksArgs, endpoints: &Endpoints) -> Result<Outcome, String> {
    let front = endpoints.require_grpc()?;
    let timeout = args.common.op_timeout;
    // Long enough to outlive the run: a lease is what a grant hangs on.
    let ttl = (args.common.duration.as_secs() + 60).max(60) as i64;
    let run_id = format!("{}-{:06x}", std::process::id(), fastrand::u32(..1 << 24));
    let mut contenders = Vec::new();
    for mut client in connect_all(front, args.contenders, timeout, None).await? {
        let lease = grant(&mut client, ttl, timeout).await?;
        contenders.push((client, lease));
    }
    let referee = Arc::new(Referee::new());
    let acquired = Arc::new(Recorder::new());
    let cpu = super::CpuMeter::start(&endpoints.cell_pids);
    let cpu_seconds = latchkey_testkit::process::cpu_seconds(&endpoints.cell_pids);
    let progress = Progress::show("locks", acquired.clone(), args.common.duration);
    let started = Instant::now();
    let tasks: Vec<_> = contenders
        .into_iter()
        .enumerate()
        .map(|(c, (client, lease))| {
            let (referee, acquired, common) =
                (referee.clone(), acquired.clone(), args.common.clone());
            let (spread, run_id) = (args.spread_cells, run_id.clone());
            let contender = Contender {
                id: c as u64,
                client,
                lease,
                ttl,
                locks: args.locks,
                hold: args.hold,
                timeout,
                referee,
                acquired: acquired.clone(),
            };
            tokio::spawn(contender.run(
                move |lock| {
                    let cell = lock % spread;
                    format!("loadtest/cell-{cell}/locks/{run_id}/{lock}")
                },
                move || over(&common, started, acquired.done()),
            ))
        })
        .collect();
    for task in tasks {
        task.await.map_err(|e| format!("a contender failed: {e}"))?;
    }
    let elapsed = started.elapsed().as_secs_f64();
    progress.finish();

    let mut o = Outcome::new("locks", endpoints.target);
    o.field("endpoints", front.to_vec());
    o.field("hold_ms", args.hold.as_secs_f64() * 1000.0);
    o.figure(
        "contenders",
        args.contenders,
        format!(
            "{} on {} lock(s), held {:?}",
            args.contenders, args.locks, args.hold
        ),
    );
    o.field("locks", args.locks);
    o.figure("duration_s", elapsed, format!("{elapsed:.1} s"));
    let rate = acquired.done() as f64 / elapsed;
    o.figure("acquisitions_per_s", rate, format!("{rate:.0}"));
    // A lock operation is an acquire or a release: two per acquisition.
    let ops = 2.0 * rate;
    o.figure(
        "lock_ops_per_s",
        ops,
        format!("{ops:.0} (acquire + release)"),
    );
    o.field("spread_cells", args.spread_cells);
    o.maybe(
        "cell_cpu_percent",
        cpu.percent(),
        "% of a core (every member)",
    );
    if !endpoints.cell_pids.is_empty() && acquired.done() > 0 {
        let used = latchkey_testkit::process::cpu_seconds(&endpoints.cell_pids) - cpu_seconds;
        // Each operation is served by one cell: per member of that cell
        // (the cluster's members over the cells the locks span).
        let members_per_cell =
            (endpoints.cell_pids.len() as f64 / args.spread_cells as f64).max(1.0);
        let per_thousand =
            used * 1000.0 * 1000.0 / (2.0 * acquired.done() as f64) / members_per_cell;
        o.figure(
            "cpu_ms_per_1000_ops_per_member",
            per_thousand,
            format!(
                "{per_thousand:.1} ms of CPU per 1 000 lock operations, per member of its cell"
            ),
        );
    }
    o.field("acquisitions", acquired.done());
    o.latency("acquire", &acquired.latency());
    let (violations, first) = referee.found();
    o.safety("violations", violations);
    o.field("first_violation", first);
    o.errors(acquired.errors(), acquired.first_error());
    o.series(acquired.series());
    Ok(o)
}

/// One contender with its connection and lease: takes a lock drawn at
/// random from `locks` (named by `name`), tells the referee, holds it,
/// unlocks it, until `done`; then revokes its lease.
pub(super) struct Contender {
    pub id: u64,
    pub client: Client,
    pub lease: i64,
    /// Of the leases it grants itself after a failure.
    pub ttl: i64,
    pub locks: u64,
    pub hold: Duration,
    pub timeout: Duration,
    pub referee: Arc<Referee>,
    pub acquired: Arc<Recorder>,
}

impl Contender {
    pub(super) async fn run(mut self, name: impl Fn(u64) -> String, done: impl Fn() -> bool) {
        let (c, timeout, acquired) = (self.id, self.timeout, self.acquired.clone());
        let mut rng = fastrand::Rng::with_seed(c + 1);
        while !done() {
            let lock = rng.u64(0..self.locks);
            let name = name(lock);
            let t = Instant::now();
            let asked = self.client.lock(
                name.as_str(),
                Some(LockOptions::new().with_lease(self.lease)),
            );
            let granted = match tokio::time::timeout(timeout, asked).await {
                Ok(Ok(resp)) => resp,
                failed => {
                    acquired.error(match failed {
                        Ok(Err(e)) => format!("lock: {e}"),
                        _ => format!("lock: no grant within {timeout:?}"),
                    });
                    // A queue place (or a grant) the failed call left
                    // behind would hold the lock with nobody to unlock it:
                    // give the lease up.
                    if let Err(e) = self.renew().await {
                        return acquired.error(e);
                    }
                    continue;
                }
            };
            acquired.ok(t.elapsed());
            let token = granted.header().map_or(0, |h| h.revision());
            self.referee.granted(lock, c, token);
            if !self.hold.is_zero() {
                tokio::time::sleep(self.hold).await;
            }
            self.referee.releasing(lock, c);
            let unlocked = tokio::time::timeout(timeout, self.client.unlock(granted.key())).await;
            if let Ok(Ok(answer)) = &unlocked {
                self.referee
                    .released(lock, answer.header().map_or(0, |h| h.revision()));
            } else {
                acquired.error("unlock failed or timed out: the lease goes instead");
                if let Err(e) = self.renew().await {
                    return acquired.error(e);
                }
            }
        }
        let _ = tokio::time::timeout(timeout, self.client.lease_revoke(self.lease)).await;
    }

    /// Revokes its lease (releasing whatever it holds or waits for) and
    /// grants a new one.
    async fn renew(&mut self) -> Result<(), String> {
        let _ = tokio::time::timeout(self.timeout, self.client.lease_revoke(self.lease)).await;
        self.lease = grant(&mut self.client, self.ttl, self.timeout).await?;
        Ok(())
    }
}

pub(super) async fn grant(client: &mut Client, ttl: i64, timeout: Duration) -> Result<i64, String> {
    let granted = within(timeout, "granting a lease", client.lease_grant(ttl, None)).await?;
    Ok(granted.id())
}
