//! The recorded workload: clients doing linearizable reads, writes and
//! compare-and-sets on a few keys at a time, some straight to one member,
//! some through a proxy (whose clients also read serializably, from the
//! proxy's cache or any member), each operation recorded with its invocation and
//! completion time and its answer (or "unknown" when no answer came); and
//! a watcher through the proxy recording every event it is sent.
//!
//! Keys rotate every few seconds (`chaos/<epoch>/<slot>`): each key's
//! history stays short, so the checker's search, which may place every
//! unknown-outcome write anywhere after its invocation, stays small.

use etcd_client::{
    Client, Compare, CompareOp, ConnectOptions, GetOptions, Txn, TxnOp, WatchOptions,
};
use latchkey_testkit::linearizability::{Answer, Call, Operation};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

pub const KEY_PREFIX: &str = "chaos/";
const KEYS_PER_EPOCH: u64 = 3;
const EPOCH: Duration = Duration::from_secs(3);

/// One operation a client did, as recorded.
#[derive(Debug, Clone)]
pub struct Entry {
    pub client: usize,
    /// `member N` or `proxy`.
    pub via: String,
    pub op: Operation,
    /// The response header's revision, when there was an answer.
    pub revision: Option<i64>,
    /// A serializable read: not linearizable by design, so left out of the
    /// linearizability check; its revision still may not go backwards in
    /// its client's view, own writes included (read-your-writes).
    pub serializable: bool,
}

/// Every operation of the run, and the clock they are timed on.
pub struct Recorder {
    start: Instant,
    entries: Mutex<Vec<Entry>>,
    /// Operations a cell refused as not its own (`wrong_cell`).
    pub refused: std::sync::atomic::AtomicUsize,
}

impl Recorder {
    pub fn new() -> Recorder {
        Recorder {
            start: Instant::now(),
            entries: Mutex::new(Vec::new()),
            refused: Default::default(),
        }
    }

    /// Microseconds since the run began.
    pub fn now_us(&self) -> u64 {
        self.start.elapsed().as_micros() as u64
    }

    pub fn elapsed(&self) -> Duration {
        self.start.elapsed()
    }

    /// `at` in microseconds since the run began.
    pub fn us_of(&self, at: Instant) -> u64 {
        at.saturating_duration_since(self.start).as_micros() as u64
    }

    fn record(&self, entry: Entry) {
        self.entries
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(entry);
    }

    pub fn entries(&self) -> Vec<Entry> {
        self.entries
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Completion times of the writes that took effect for sure.
    pub fn write_completions(&self) -> Vec<u64> {
        let mut done: Vec<u64> = self
            .entries()
            .iter()
            .filter(|e| matches!(e.op.answer, Answer::Done | Answer::Cas(true)))
            .map(|e| e.op.complete)
            .collect();
        done.sort_unstable();
        done
    }
}

/// A client of one endpoint.
pub struct Worker {
    pub id: usize,
    pub via: String,
    pub endpoint: String,
    pub seed: u64,
    /// How long an operation waits for its answer (then it is unknown).
    pub op_timeout: Duration,
}

/// Options for a client of one member or proxy that waits `timeout` for
/// an answer (the lease keepers use them too).
pub fn client_options(timeout: Duration) -> ConnectOptions {
    ConnectOptions::new()
        .with_timeout(timeout)
        .with_connect_timeout(Duration::from_secs(1))
}

async fn connect(endpoint: &str, op_timeout: Duration, stop: &AtomicBool) -> Option<Client> {
    while !stop.load(Ordering::Relaxed) {
        if let Ok(c) = Client::connect([endpoint], Some(client_options(op_timeout))).await {
            return Some(c);
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    None
}

impl Worker {
    /// Runs operations back to back until `stop`.
    pub async fn run(self, rec: Arc<Recorder>, stop: Arc<AtomicBool>) {
        let mut rng = ChaCha8Rng::seed_from_u64(self.seed ^ (self.id as u64).wrapping_mul(0x9e37));
        let Some(mut client) = connect(&self.endpoint, self.op_timeout, &stop).await else {
            return;
        };
        let mut last_read: std::collections::HashMap<String, Option<String>> = Default::default();
        let mut n = 0u64;
        while !stop.load(Ordering::Relaxed) {
            n += 1;
            let epoch = rec.elapsed().as_millis() as u64 / EPOCH.as_millis() as u64;
            let key = format!(
                "{KEY_PREFIX}{epoch:04}/{}",
                rng.random_range(0..KEYS_PER_EPOCH)
            );
            let value = format!("c{}.{n}", self.id);
            let dice = rng.random_range(0..100);
            // Through a proxy, half the reads are serializable.
            let serializable = self.via == "proxy" && dice < 20;
            let invoke = rec.now_us();
            let (call, result) = if dice < 40 {
                let options = serializable.then(|| GetOptions::new().with_serializable());
                let r = client.get(key.as_str(), options).await;
                let answer = r.map(|g| {
                    let value = g
                        .kvs()
                        .first()
                        .map(|kv| String::from_utf8_lossy(kv.value()).into_owned());
                    if !serializable {
                        last_read.insert(key.clone(), value.clone());
                    }
                    (Answer::Read(value), g.header().map(|h| h.revision()))
                });
                (Call::Read, answer)
            } else if dice < 75 {
                let r = client.put(key.as_str(), value.as_str(), None).await;
                (
                    Call::Write(value.clone()),
                    r.map(|p| (Answer::Done, p.header().map(|h| h.revision()))),
                )
            } else {
                let from = last_read.get(&key).cloned().flatten();
                let compare = match &from {
                    Some(v) => Compare::value(key.as_str(), CompareOp::Equal, v.as_str()),
                    None => Compare::version(key.as_str(), CompareOp::Equal, 0),
                };
                let txn = Txn::new().when([compare]).and_then([TxnOp::put(
                    key.as_str(),
                    value.as_str(),
                    None,
                )]);
                let r = client.txn(txn).await;
                (
                    Call::Cas {
                        from,
                        to: value.clone(),
                    },
                    r.map(|t| (Answer::Cas(t.succeeded()), t.header().map(|h| h.revision()))),
                )
            };
            let complete = rec.now_us();
            if result.as_ref().is_err_and(wrong_cell) {
                // Refused whole by a cell that does not own the key (a
                // client straight to a member after a move): nothing was
                // applied, so it is no operation of the history.
                rec.refused.fetch_add(1, Ordering::Relaxed);
                tokio::time::sleep(Duration::from_millis(rng.random_range(50..150))).await;
                continue;
            }
            let failed = result.is_err();
            let (answer, revision) = result.unwrap_or((Answer::Unknown, None));
            rec.record(Entry {
                client: self.id,
                via: self.via.clone(),
                op: Operation {
                    key,
                    call,
                    answer,
                    invoke,
                    complete,
                },
                revision,
                serializable,
            });
            let pause = if failed {
                rng.random_range(50..150)
            } else {
                rng.random_range(0..4)
            };
            tokio::time::sleep(Duration::from_millis(pause)).await;
        }
    }
}

/// Whether a cell refused the request as not its own (`wrong_cell`: its
/// keys are another cell's, and nothing was applied).
pub fn wrong_cell(e: &etcd_client::Error) -> bool {
    match e {
        etcd_client::Error::GRpcStatus(s) => s
            .metadata()
            .get("latchkey-error")
            .is_some_and(|v| v.as_bytes() == b"wrong_cell"),
        _ => false,
    }
}

/// One watch event as a watcher saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Seen {
    pub key: String,
    pub value: String,
    pub revision: i64,
    pub delete: bool,
}

impl Seen {
    /// Where a watcher read the prefix again (see [`watch_all`]) and went
    /// on watching after `revision`: not an event.
    pub fn reread(revision: i64) -> Seen {
        Seen {
            key: String::new(),
            value: String::new(),
            revision,
            delete: false,
        }
    }

    pub fn is_reread(&self) -> bool {
        self.key.is_empty()
    }
}

/// How long the watcher's calls wait (the stream's messages have their
/// own wait).
const WATCH_CALL_TIMEOUT: Duration = Duration::from_secs(3);

/// Watches `chaos/` from `start` through `endpoint` until `stop`, and on
/// any break watches again from the revision after the last event seen.
///
/// A watch refused as compacted fails the watcher, unless `reread`: then
/// it does what a client of a prefix that moved between cells does (the
/// new cell refuses revisions from before the move as compacted), reads
/// the prefix again, notes where ([`Seen::reread`]) and watches from
/// after that read's revision.
pub async fn watch_all(
    endpoint: String,
    start: i64,
    seen: Arc<Mutex<Vec<Seen>>>,
    stop: Arc<AtomicBool>,
    reread: bool,
) -> Result<(), String> {
    let mut next = start;
    while !stop.load(Ordering::Relaxed) {
        let Some(mut client) = connect(&endpoint, WATCH_CALL_TIMEOUT, &stop).await else {
            break;
        };
        let opts = WatchOptions::new().with_prefix().with_start_revision(next);
        let Ok(mut stream) = client.watch(KEY_PREFIX, Some(opts)).await else {
            tokio::time::sleep(Duration::from_millis(200)).await;
            continue;
        };
        while !stop.load(Ordering::Relaxed) {
            let msg = tokio::time::timeout(Duration::from_millis(500), stream.message()).await;
            let resp = match msg {
                Err(_) => continue,
                Ok(Ok(Some(resp))) => resp,
                Ok(_) => break,
            };
            if resp.compact_revision() > 0 && reread {
                let read = client
                    .get(
                        KEY_PREFIX,
                        Some(GetOptions::new().with_prefix().with_keys_only()),
                    )
                    .await;
                if let Some(revision) = read.ok().and_then(|r| r.header().map(|h| h.revision())) {
                    seen.lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .push(Seen::reread(revision));
                    next = revision + 1;
                }
                break;
            }
            if resp.compact_revision() > 0 {
                return Err(format!(
                    "the watch from {next} was compacted at {}",
                    resp.compact_revision()
                ));
            }
            if resp.canceled() {
                break;
            }
            let mut got = seen.lock().unwrap_or_else(|p| p.into_inner());
            for e in resp.events() {
                let Some(kv) = e.kv() else { continue };
                got.push(Seen {
                    key: String::from_utf8_lossy(kv.key()).into_owned(),
                    value: String::from_utf8_lossy(kv.value()).into_owned(),
                    revision: kv.mod_revision(),
                    delete: e.event_type() == etcd_client::EventType::Delete,
                });
                next = kv.mod_revision() + 1;
            }
        }
    }
    Ok(())
}
