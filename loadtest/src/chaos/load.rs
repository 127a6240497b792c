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
    pub(super) fn start(
        args: &ChaosArgs,
        cluster: &Cluster,
        proxy: &ProxyProcess,
        start_revision: i64,
    ) -> Load {
        let rec = Arc::new(Recorder::new());
        let stop = Arc::new(AtomicBool::new(false));
        let mut endpoints: Vec<(String, String)> = (0..args.member_clients)
            .map(|i| {
                let m = &cluster.members[i % cluster.members.len()];
                (format!("member {}", m.id), format!("http://{}", m.client))
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
        let n = cluster.members.len();
        // One keeper per member, and two through the proxy (its session
        // table answers their keep-alives), reading through members.
        let via_members = cluster.members.iter().enumerate().map(|(i, m)| {
            let next = &cluster.members[(i + 1) % n];
            let read = format!("http://{}", next.client);
            (format!("http://{}", m.client), read, false)
        });
        let via_proxy = (0..PROXY_KEEPERS).map(|i| {
            let read = format!("http://{}", cluster.members[i % n].client);
            (format!("http://{}", proxy.grpc), read, true)
        });
        let keepers = via_members
            .chain(via_proxy)
            .enumerate()
            .map(|(id, (keep, read, via_proxy))| {
                let k = leases::Keeper {
                    id,
                    keep,
                    read,
                    via_proxy,
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
        violations.extend(checks::watch_history(&watched, committed, entries));
        violations
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
