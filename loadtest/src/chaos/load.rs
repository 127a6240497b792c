//! The load a chaos run puts under its faults: the recorded workers
//! (straight to each member and through the proxy), the lease keepers,
//! and the watch through the proxy, started together and stopped within a
//! bound.

use super::workload::{self, Entry, Recorder, Seen, Worker};
use super::{checks, leases, ChaosArgs};
use latchkey_testkit::{Cluster, ProxyProcess};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Lease keepers whose keep-alives go through the proxy.
const PROXY_KEEPERS: usize = 2;

/// What runs under the faults: the recorded workers, the lease keepers
/// and the watcher through the proxy.
pub(super) struct Load {
    pub(super) rec: Arc<Recorder>,
    stop: Arc<AtomicBool>,
    workers: Vec<tokio::task::JoinHandle<()>>,
    keepers: Vec<tokio::task::JoinHandle<()>>,
    leases_seen: Arc<Mutex<Vec<leases::Seen>>>,
    watch: Watch,
}

impl Load {
    /// The load on `cells` (the first is home, the proxy's) and `proxy`:
    /// workers straight to members spread over every cell's, lease keepers
    /// on each member with their key under the cell's `key_prefixes` entry
    /// (a prefix that cell owns), and the watch from `start_revision`.
    pub(super) fn start(
        args: &ChaosArgs,
        cells: &[&Cluster],
        key_prefixes: &[&str],
        proxy: &ProxyProcess,
        start_revision: i64,
    ) -> Load {
        let rec = Arc::new(Recorder::new());
        let stop = Arc::new(AtomicBool::new(false));
        let members: Vec<&latchkey_testkit::MemberSpec> =
            cells.iter().flat_map(|c| c.members.iter()).collect();
        let mut endpoints: Vec<(String, String)> = (0..args.member_clients)
            .map(|i| {
                let m = members[i % members.len()];
                (
                    format!("member {}", m.client),
                    format!("http://{}", m.client),
                )
            })
            .collect();
        for _ in 0..args.proxy_clients {
            endpoints.push(("proxy".into(), format!("http://{}", proxy.grpc)));
        }
        let workers = endpoints
            .into_iter()
            .enumerate()
            .map(|(id, (via, endpoint))| {
                let w = Worker {
                    id,
                    via,
                    endpoint,
                    seed: args.seed,
                    op_timeout: args.op_timeout,
                };
                tokio::spawn(w.run(rec.clone(), stop.clone()))
            })
            .collect();
        let leases_seen = Arc::new(Mutex::new(Vec::new()));
        let started = std::time::Instant::now();
        // One keeper per member, reading through the next member of its
        // cell; and two through the proxy (its session table answers
        // their keep-alives), reading through home's members.
        let mut keepers: Vec<(String, String, bool, &str)> = Vec::new();
        for (cell, prefix) in cells.iter().zip(key_prefixes) {
            let n = cell.members.len();
            for (i, m) in cell.members.iter().enumerate() {
                let next = &cell.members[(i + 1) % n];
                keepers.push((
                    format!("http://{}", m.client),
                    format!("http://{}", next.client),
                    false,
                    prefix,
                ));
            }
        }
        let home = cells[0];
        for i in 0..PROXY_KEEPERS {
            let read = format!("http://{}", home.members[i % home.members.len()].client);
            keepers.push((
                format!("http://{}", proxy.grpc),
                read,
                true,
                key_prefixes[0],
            ));
        }
        let keepers = keepers
            .into_iter()
            .enumerate()
            .map(|(id, (keep, read, via_proxy, prefix))| {
                let k = leases::Keeper {
                    keep,
                    read,
                    via_proxy,
                    key: format!("{prefix}leases/{id}"),
                };
                tokio::spawn(k.run(started, leases_seen.clone(), stop.clone()))
            })
            .collect();
        let watched = Arc::new(Mutex::new(Vec::new()));
        let watch_stop = Arc::new(AtomicBool::new(false));
        let watcher = tokio::spawn(workload::watch_all(
            format!("http://{}", proxy.grpc),
            start_revision,
            watched.clone(),
            watch_stop.clone(),
            cells.len() > 1,
        ));
        Load {
            rec,
            stop,
            workers,
            keepers,
            leases_seen,
            watch: Watch {
                watched,
                stop: watch_stop,
                watcher,
            },
        }
    }

    /// Stops the workers and keepers (the watcher goes on until it has
    /// seen the end of the history); what the keepers saw, and which of
    /// them did not end their step within [`STOP_WITHIN`] (aborted: an
    /// operation of the load with no bound is a finding, not a run that
    /// never ends).
    pub(super) async fn stop(self) -> (Watch, Vec<leases::Seen>, Vec<String>) {
        self.stop.store(true, Ordering::Relaxed);
        let mut stuck = Vec::new();
        let tasks = (self.workers.into_iter().map(|w| ("worker", w)))
            .chain(self.keepers.into_iter().map(|k| ("lease keeper", k)));
        for (i, (what, mut task)) in tasks.enumerate() {
            if tokio::time::timeout(STOP_WITHIN, &mut task).await.is_err() {
                task.abort();
                stuck.push(format!(
                    "{what} {i} did not stop within {STOP_WITHIN:?} of the end of the run"
                ));
            }
        }
        let seen = self
            .leases_seen
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        (self.watch, seen, stuck)
    }
}

/// How long a worker or keeper has to end its step once told to stop:
/// longer than any step's own timeouts.
const STOP_WITHIN: Duration = Duration::from_secs(30);

/// The watch through the proxy, from the run's first revision.
pub(super) struct Watch {
    watched: Arc<Mutex<Vec<Seen>>>,
    stop: Arc<AtomicBool>,
    watcher: tokio::task::JoinHandle<Result<(), String>>,
}

impl Watch {
    /// Waits for it to reach the committed history's end, stops it, and
    /// checks what it saw against that history.
    pub(super) async fn check(self, committed: &[Seen], entries: &[Entry]) -> Vec<String> {
        let mut violations = Vec::new();
        let last = committed.last().map_or(0, |s| s.revision);
        let watched = self.finish(last, &mut violations).await;
        violations.extend(checks::watch_history(&watched, committed, entries));
        violations
    }

    /// [`check`](Self::check) for a prefix that moved between cells (see
    /// [`checks::watch_across_moves`]): waits for the watch to pass the
    /// last acknowledged write, stops it and checks what it saw; and that
    /// no write took effect twice among what it saw.
    pub(super) async fn check_across_moves(self, start: i64, entries: &[Entry]) -> Vec<String> {
        let mut violations = Vec::new();
        let last = entries
            .iter()
            .filter(|e| checks::written_value(e).is_some())
            .filter_map(|e| e.revision)
            .max()
            .unwrap_or(0);
        let watched = self.finish(last, &mut violations).await;
        violations.extend(checks::watch_across_moves(&watched, start, entries));
        let events: Vec<Seen> = watched.into_iter().filter(|s| !s.is_reread()).collect();
        violations.extend(checks::writes_at_most_once(&events));
        violations
    }

    /// Waits for the watch to reach `last`, stops it; what it saw.
    async fn finish(self, last: i64, violations: &mut Vec<String>) -> Vec<Seen> {
        if !wait_watched(&self.watched, last).await {
            violations.push(format!(
                "the watch through the proxy did not reach revision {last} within 10 s of heal"
            ));
        }
        self.stop.store(true, Ordering::Relaxed);
        match self.watcher.await {
            Ok(Err(e)) => violations.push(e),
            Err(e) => violations.push(format!("the watcher failed: {e}")),
            Ok(Ok(())) => {}
        }
        let watched = self
            .watched
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        watched
    }
}

/// Waits (up to 10 s) until the events in `seen` reach `revision`.
pub(super) async fn wait_watched(seen: &Mutex<Vec<Seen>>, revision: i64) -> bool {
    for _ in 0..100 {
        let last = seen
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .last()
            .map_or(0, |s| s.revision);
        if last >= revision {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    false
}
