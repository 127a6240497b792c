//! A writer that keeps writing while a test changes the cell under it.

use crate::eventually::eventually;
use etcd_client::{Client, ConnectOptions};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use tokio::task::JoinHandle;
use tokio::time::{sleep, Duration};

/// Writes `{prefix}{i:06}` = `v{i}` one after another until
/// [`BackgroundWriter::finish`], recording each acknowledged write.
/// Failures (elections, membership changes) are counted, not recorded: a
/// test then checks that every acknowledged write survived.
pub struct BackgroundWriter {
    /// A std mutex: held only to insert or copy, never across an await.
    acked: Arc<Mutex<BTreeMap<String, String>>>,
    stop: Arc<AtomicBool>,
    task: JoinHandle<usize>,
}

impl BackgroundWriter {
    /// Starts writing through a client balanced over `endpoints`.
    pub fn start(endpoints: Vec<String>, prefix: &str) -> BackgroundWriter {
        let acked = Arc::new(Mutex::new(BTreeMap::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let task = tokio::spawn({
            let acked = acked.clone();
            let stop = stop.clone();
            let prefix = prefix.to_string();
            async move {
                let opts = ConnectOptions::new()
                    .with_timeout(Duration::from_secs(5))
                    .with_connect_timeout(Duration::from_secs(1));
                let mut client = Client::connect(endpoints, Some(opts))
                    .await
                    .expect("the background writer connects");
                let mut failures = 0;
                let mut i = 0;
                while !stop.load(Ordering::Relaxed) {
                    let key = format!("{prefix}{i:06}");
                    let value = format!("v{i}");
                    match client.put(key.as_str(), value.as_str(), None).await {
                        Ok(_) => {
                            acked
                                .lock()
                                .unwrap_or_else(|e| e.into_inner())
                                .insert(key, value);
                        }
                        Err(e) => {
                            if failures < 5 {
                                println!("write {key} failed: {e}");
                            }
                            failures += 1;
                            sleep(Duration::from_millis(50)).await;
                        }
                    }
                    i += 1;
                }
                failures
            }
        });
        BackgroundWriter { acked, stop, task }
    }

    /// How many writes have been acknowledged so far.
    pub fn acked_count(&self) -> usize {
        self.acked.lock().unwrap_or_else(|e| e.into_inner()).len()
    }

    /// Waits (up to 60 s) until `n` more writes have been acknowledged:
    /// the cell takes writes again.
    pub async fn wait_for_more(&self, n: usize) {
        let target = self.acked_count() + n;
        eventually(Duration::from_secs(60), async || {
            let now = self.acked_count();
            if now >= target {
                Ok(())
            } else {
                Err(format!("writes stalled at {now} of {target} acknowledged"))
            }
        })
        .await
    }

    /// Stops writing; every acknowledged write with its value.
    pub async fn finish(self) -> BTreeMap<String, String> {
        self.stop.store(true, Ordering::Relaxed);
        let failures = self.task.await.expect("the background writer");
        let acked = self.acked.lock().unwrap_or_else(|e| e.into_inner()).clone();
        println!("writer: {} acknowledged, {failures} failed", acked.len());
        acked
    }
}
