//! A chaos run over two cells (`--cells 2`): a second cell, the
//! directory that names it, and the mover, which moves the workload's
//! prefix back and forth between the cells through the proxy while the
//! faults hit either cell.
//!
//! The workload's keys, the lock holders' lock and the watch all live
//! under the moving prefix ([`workload::KEY_PREFIX`]); the second cell
//! also owns [`SECOND_PREFIX`], where its lease keepers bind their keys.

use super::workload::{self, Recorder};
use crate::directory_api::{self, call};
use latchkey_testkit::{Cluster, ProxyProcess};
use serde_json::json;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// The second cell's name in the directory.
pub const SECOND: &str = "b";
/// A prefix the second cell owns all run long.
pub const SECOND_PREFIX: &str = "b/";
/// The lock the holders take: under the moving prefix, so it moves too.
pub const LOCK: &str = "chaos%2Flock";
/// The second cell's members are on 127.0.0.{12,13,14}.
pub const SECOND_AFTER: u64 = 11;

/// Names the second cell in the directory through the proxy and gives it
/// [`SECOND_PREFIX`].
pub async fn set_up(proxy: &ProxyProcess, second: &Cluster) -> Result<(), String> {
    let endpoints: Vec<String> = second.members.iter().map(|m| m.client.clone()).collect();
    let (status, body) = call(
        &proxy.http,
        reqwest::Method::PUT,
        &format!("/v1/admin/directory/cells/{SECOND}"),
        Some(json!({ "endpoints": endpoints })),
    )
    .await?;
    if status != 200 {
        return Err(format!("adding cell {SECOND}: {status} {body}"));
    }
    let (status, body) = call(
        &proxy.http,
        reqwest::Method::PUT,
        "/v1/admin/directory/prefixes",
        Some(json!({ "prefix": SECOND_PREFIX, "cell": SECOND })),
    )
    .await?;
    if status != 200 {
        return Err(format!("assigning {SECOND_PREFIX}: {status} {body}"));
    }
    Ok(())
}

/// One move the mover asked for, on the recorder's clock.
#[derive(Debug, Clone)]
pub struct MoveDone {
    pub at_us: u64,
    pub ended_us: u64,
    /// The write pause it reported, or why it failed (it was undone).
    pub outcome: Result<Duration, String>,
}

/// Moves the workload's prefix to the other cell, waits, and again,
/// until stopped; a move in flight when told to stop ends first (each is
/// bounded by the proxy).
pub struct Mover {
    stop: Arc<AtomicBool>,
    done: Arc<Mutex<Vec<MoveDone>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Mover {
    pub fn start(proxy: &ProxyProcess, rec: Arc<Recorder>, every: Duration) -> Mover {
        let stop = Arc::new(AtomicBool::new(false));
        let done = Arc::new(Mutex::new(Vec::new()));
        let (http, stop2, done2) = (proxy.http.clone(), stop.clone(), done.clone());
        let task = tokio::spawn(async move {
            let mut owner = "home".to_string();
            loop {
                tokio::time::sleep(every).await;
                if stop2.load(Ordering::Relaxed) {
                    break;
                }
                let to = if owner == SECOND { "home" } else { SECOND };
                let at_us = rec.now_us();
                let outcome = directory_api::move_prefix(&http, workload::KEY_PREFIX, to).await;
                let ended_us = rec.now_us();
                match &outcome {
                    Ok(pause) => {
                        println!(
                            "chaos: {:>6.1}s moved {} to {to} in {} ms (writes paused {} ms)",
                            at_us as f64 / 1e6,
                            workload::KEY_PREFIX,
                            (ended_us - at_us) / 1000,
                            pause.as_millis()
                        );
                        owner = to.to_string();
                    }
                    Err(why) => {
                        println!(
                            "chaos: {:>6.1}s move of {} to {to} failed: {why}",
                            at_us as f64 / 1e6,
                            workload::KEY_PREFIX
                        );
                        if let Some(now) = owner_of_prefix(&http).await {
                            owner = now;
                        }
                    }
                }
                done2
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .push(MoveDone {
                        at_us,
                        ended_us,
                        outcome,
                    });
            }
        });
        Mover { stop, done, task }
    }

    /// Stops it (a move in flight ends first) and returns what it did.
    pub async fn stop(self) -> Vec<MoveDone> {
        self.stop.store(true, Ordering::Relaxed);
        if tokio::time::timeout(
            directory_api::CALL_TIMEOUT + Duration::from_secs(10),
            self.task,
        )
        .await
        .is_err()
        {
            println!("chaos: the mover did not end within its bound");
        }
        let done = self.done.lock().unwrap_or_else(|p| p.into_inner()).clone();
        done
    }
}

/// The cell the directory gives the workload's prefix now.
async fn owner_of_prefix(http: &str) -> Option<String> {
    let directory = directory_api::directory(http).await.ok()?;
    Some(directory_api::owner_of(&directory, workload::KEY_PREFIX))
}

/// The moves' write pauses, fastest first.
pub fn pauses(moves: &[MoveDone]) -> Vec<Duration> {
    let mut p: Vec<Duration> = moves
        .iter()
        .filter_map(|m| m.outcome.as_ref().ok().copied())
        .collect();
    p.sort_unstable();
    p
}

/// Whether a fault held from `at` to `healed` (µs) overlaps a move: writes
/// under the moving prefix may then wait out a move's pause as well as the
/// fault, so the outage bound of a single fault does not apply.
pub fn during_a_move(moves: &[MoveDone], at: u64, healed: u64) -> bool {
    moves.iter().any(|m| m.at_us <= healed && at <= m.ended_us)
}
