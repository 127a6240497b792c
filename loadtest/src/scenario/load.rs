//! The pieces of load several scenarios run: connections spread over the
//! endpoints, one call bounded by a timeout, a closed loop of workers,
//! writers that put in a loop until told to stop, and revoking what a run
//! granted.

use super::recorder::{counter, Progress, Recorder};
use super::{over, url, Common};
use etcd_client::{Client, ConnectOptions, TlsOptions};
use futures::StreamExt;
use std::fmt::Display;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::watch;

/// `call`, bounded by `timeout`; a failure or no answer in time becomes
/// one message that says what was asked.
pub async fn within<T, E: Display>(
    timeout: Duration,
    what: &str,
    call: impl Future<Output = Result<T, E>>,
) -> Result<T, String> {
    match tokio::time::timeout(timeout, call).await {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => Err(format!("{what}: {e}")),
        Err(_) => Err(format!("{what}: no answer within {timeout:?}")),
    }
}

/// The flags of a closed-loop scenario: its workers and the connections
/// they share.
#[derive(clap::Args, Debug, Clone, Copy)]
pub struct Workers {
    /// Concurrent workers, each one request at a time.
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u64).range(1..=100_000))]
    pub clients: u64,
    /// Connections the workers share (spread over the endpoints).
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u64).range(1..=10_000))]
    pub connections: u64,
}

impl Workers {
    /// The connections, spread over `front`, over TLS with `tls` when given.
    pub async fn connect(
        &self,
        front: &[String],
        timeout: Duration,
        tls: Option<TlsOptions>,
    ) -> Result<Vec<Client>, String> {
        connect_all(front, self.connections, timeout, tls).await
    }

    /// Their settings, as fields of a result line.
    pub fn describe(&self, o: &mut super::Outcome) {
        o.field("clients", self.clients);
        o.field("connections", self.connections);
    }
}

/// `n` etcd clients, client i on endpoint i mod the number of endpoints.
pub async fn connect_all(
    front: &[String],
    n: u64,
    timeout: Duration,
    tls: Option<TlsOptions>,
) -> Result<Vec<Client>, String> {
    let mut clients = Vec::new();
    for i in 0..n {
        let addr = url(&front[i as usize % front.len()]);
        let (addr, options) = match &tls {
            None => (addr, None),
            Some(tls) => (
                addr.replacen("http://", "https://", 1),
                Some(ConnectOptions::new().with_tls(tls.clone())),
            ),
        };
        let what = format!("connecting to {addr}");
        clients.push(within(timeout, &what, Client::connect([&addr], options)).await?);
    }
    Ok(clients)
}

/// What one operation of a [`closed_loop`] came to.
pub enum Step {
    /// Done: its latency is recorded.
    Done,
    /// Answered, but not an operation to count (a compare-and-swap that
    /// lost its race and tries again).
    Again,
}

/// `workers` tasks, worker w on `clients[w % clients.len()]`, each one
/// operation at a time until the measured phase of `common` is over.
/// `op(client, state)` gives the worker's state back with what the
/// operation came to; an error is recorded and followed by a short pause
/// (a refusing target is not hammered). The workers' states at the end.
pub async fn closed_loop<S, Op, Fut>(
    clients: &[Client],
    workers: u64,
    common: &Common,
    recorder: &Arc<Recorder>,
    init: impl Fn(usize) -> S,
    op: Op,
) -> Result<Vec<S>, String>
where
    S: Send + 'static,
    Op: Fn(Client, S) -> Fut + Clone + Send + 'static,
    Fut: Future<Output = (S, Result<Step, String>)> + Send,
{
    if clients.is_empty() || workers == 0 {
        return Err("a closed loop needs a connection and a worker".into());
    }
    let started = Instant::now();
    let tasks: Vec<_> = (0..workers as usize)
        .map(|w| {
            let client = clients[w % clients.len()].clone();
            let (recorder, common, op) = (recorder.clone(), common.clone(), op.clone());
            let mut state = init(w);
            tokio::spawn(async move {
                while !over(&common, started, recorder.done() + recorder.errors()) {
                    let t = Instant::now();
                    let (next, step) = op(client.clone(), state).await;
                    state = next;
                    match step {
                        Ok(Step::Done) => recorder.ok(t.elapsed()),
                        Ok(Step::Again) => {}
                        Err(e) => {
                            recorder.error(e);
                            tokio::time::sleep(Duration::from_millis(10)).await;
                        }
                    }
                }
                state
            })
        })
        .collect();
    let mut states = Vec::with_capacity(tasks.len());
    for t in tasks {
        states.push(t.await.map_err(|e| format!("a worker failed: {e}"))?);
    }
    recorder.end();
    Ok(states)
}

/// When an acknowledged write was acknowledged, and how long it took.
pub type Ack = (Instant, Duration);

/// Writers putting a key in a loop, one per client, recording every
/// outcome; they run until [`Writers::stop`].
pub struct Writers {
    recorder: Arc<Recorder>,
    progress: Progress,
    acks: Arc<Mutex<Vec<Ack>>>,
    stop: watch::Sender<bool>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Writers {
    /// One writer per client; writer w puts `keys[w]` with `value`.
    /// `label` and `length` are for the progress line.
    pub fn start(
        clients: &[Client],
        keys: &[String],
        value: &[u8],
        timeout: Duration,
        label: &str,
        length: Duration,
    ) -> Writers {
        let recorder = Arc::new(Recorder::new());
        let acks = Arc::new(Mutex::new(Vec::new()));
        let (stop, stopped) = watch::channel(false);
        let tasks = clients
            .iter()
            .enumerate()
            .zip(keys)
            .map(|((_, client), key)| {
                let (mut client, recorder, acks) = (client.clone(), recorder.clone(), acks.clone());
                let (key, value, stopped) = (key.clone(), value.to_vec(), stopped.clone());
                tokio::spawn(async move {
                    while !*stopped.borrow() {
                        let t = Instant::now();
                        let put = client.put(key.as_str(), value.clone(), None);
                        match within(timeout, "write", put).await {
                            Ok(_) => {
                                recorder.ok(t.elapsed());
                                acks.lock()
                                    .unwrap_or_else(|p| p.into_inner())
                                    .push((Instant::now(), t.elapsed()));
                            }
                            Err(e) => {
                                recorder.error(e);
                                // A refusing target is not hammered.
                                tokio::time::sleep(Duration::from_millis(10)).await;
                            }
                        }
                    }
                })
            })
            .collect();
        let progress = Progress::show(label, recorder.clone(), length);
        Writers {
            recorder,
            progress,
            acks,
            stop,
            tasks,
        }
    }

    /// Runs them for `length`, then stops them.
    pub async fn run(
        clients: &[Client],
        keys: &[String],
        value: &[u8],
        timeout: Duration,
        label: &str,
        length: Duration,
    ) -> (Arc<Recorder>, Vec<Ack>) {
        let writers = Writers::start(clients, keys, value, timeout, label, length);
        tokio::time::sleep(length).await;
        writers.stop().await
    }

    /// Stops every writer once its write in flight is done; what they
    /// recorded, and every acknowledgement in order.
    pub async fn stop(self) -> (Arc<Recorder>, Vec<Ack>) {
        let _ = self.stop.send(true);
        // The phase ends now, not when the last write in flight returns.
        self.recorder.end();
        for t in self.tasks {
            let _ = t.await;
        }
        self.progress.finish();
        let mut acks = self.acks.lock().unwrap_or_else(|p| p.into_inner()).clone();
        acks.sort_unstable_by_key(|(at, _)| *at);
        (self.recorder, acks)
    }
}

/// A key of its own for each of `n` writers: `<prefix><w>`.
pub fn own_keys(prefix: &str, n: usize) -> Vec<String> {
    (0..n).map(|w| format!("{prefix}{w}")).collect()
}

/// The per-second series of phases run one after another, as one series.
pub fn joined_series(phases: &[&Recorder]) -> Vec<super::recorder::Sample> {
    let mut series = Vec::new();
    let mut offset = 0.0;
    for phase in phases {
        series.extend(phase.series().into_iter().map(|mut x| {
            x.t_s += offset;
            x
        }));
        offset += phase.elapsed().as_secs_f64();
    }
    series
}

/// Requests in flight while leases are revoked.
const REVOKING: usize = 128;

/// Revokes every lease; how many could not be (a lease already gone
/// counts as revoked), and the first reason.
pub async fn revoke(clients: &[Client], ids: &[i64], timeout: Duration) -> (u64, Option<String>) {
    let bar = counter("revoking", ids.len() as u64);
    let failures: Vec<String> = futures::stream::iter(ids.iter().enumerate())
        .map(|(n, id)| {
            let mut client = clients[n % clients.len()].clone();
            let bar = bar.clone();
            async move {
                let revoked = within(timeout, "lease revoke", client.lease_revoke(*id)).await;
                bar.inc(1);
                match revoked {
                    Err(e) if !e.contains("not found") => Some(format!("lease {id:x}: {e}")),
                    _ => None,
                }
            }
        })
        .buffer_unordered(REVOKING)
        .filter_map(|f| async move { f })
        .collect()
        .await;
    bar.finish_and_clear();
    (failures.len() as u64, failures.into_iter().next())
}
