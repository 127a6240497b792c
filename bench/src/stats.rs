//! What one workload measured on one target, and the closed loop most
//! workloads run.

use etcd_client::Client;
pub use latchkey_testkit::process::cpu_seconds;
use std::future::Future;
use std::time::{Duration, Instant};

/// One workload's result on one target.
#[derive(Debug, Clone, Default)]
pub struct Measured {
    /// Operations completed (successfully) per second.
    pub rate: f64,
    /// Latency of one operation, in milliseconds.
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub errors: u64,
    /// Server CPU over the run, in percent of one core (all members).
    pub cpu_percent: f64,
    /// Anything the workload counts besides rate and latency (expired
    /// leases, missed events), as `name=value`.
    pub notes: Vec<(String, f64)>,
    /// The first error seen, if any.
    pub first_error: Option<String>,
}

/// Latencies in microseconds, summarised.
pub fn percentile_ms(sorted_us: &[u64], p: f64) -> f64 {
    if sorted_us.is_empty() {
        return 0.0;
    }
    let i = ((sorted_us.len() as f64 * p).ceil() as usize).clamp(1, sorted_us.len()) - 1;
    sorted_us[i] as f64 / 1000.0
}

/// A small deterministic generator (xorshift64*), so workers pick keys
/// without a dependency and runs are alike.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    pub fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D) % n
    }
}

/// What a closed loop gathered.
pub struct Gathered {
    pub ok: u64,
    pub errors: u64,
    pub latencies_us: Vec<u64>,
    pub elapsed: Duration,
    pub first_error: Option<String>,
}

impl Gathered {
    pub fn measured(mut self) -> Measured {
        self.latencies_us.sort_unstable();
        Measured {
            rate: self.ok as f64 / self.elapsed.as_secs_f64(),
            p50_ms: percentile_ms(&self.latencies_us, 0.50),
            p99_ms: percentile_ms(&self.latencies_us, 0.99),
            errors: self.errors,
            first_error: self.first_error,
            ..Default::default()
        }
    }
}

/// `workers` concurrent workers, worker `w` on connection `w % clients`,
/// each running `op` back to back until `duration` is over. `op` is given
/// the worker's state and hands it back with whether the operation counts
/// as done (a CAS that lost its race completed but does not count).
pub async fn closed_loop<S, F, Fut>(
    clients: &[Client],
    workers: usize,
    duration: Duration,
    state: impl Fn(usize) -> S,
    op: F,
) -> Gathered
where
    S: Send + 'static,
    F: Fn(Client, S) -> Fut + Clone + Send + Sync + 'static,
    Fut: Future<Output = (S, Result<bool, String>)> + Send,
{
    let started = Instant::now();
    let deadline = started + duration;
    let tasks: Vec<_> = (0..workers)
        .map(|w| {
            let client = clients[w % clients.len()].clone();
            let op = op.clone();
            let mut state = Some(state(w));
            tokio::spawn(async move {
                let mut g = Gathered {
                    ok: 0,
                    errors: 0,
                    latencies_us: Vec::new(),
                    elapsed: Duration::ZERO,
                    first_error: None,
                };
                while Instant::now() < deadline {
                    let t = Instant::now();
                    let Some(given) = state.take() else { break };
                    let (back, result) = op(client.clone(), given).await;
                    state = Some(back);
                    match result {
                        Ok(counted) => {
                            g.latencies_us.push(t.elapsed().as_micros() as u64);
                            g.ok += u64::from(counted);
                        }
                        Err(e) => {
                            g.errors += 1;
                            g.first_error.get_or_insert(e);
                        }
                    }
                }
                g
            })
        })
        .collect();
    let mut all = Gathered {
        ok: 0,
        errors: 0,
        latencies_us: Vec::new(),
        elapsed: Duration::ZERO,
        first_error: None,
    };
    for task in tasks {
        match task.await {
            Ok(g) => {
                all.ok += g.ok;
                all.errors += g.errors;
                all.latencies_us.extend(g.latencies_us);
                if all.first_error.is_none() {
                    all.first_error = g.first_error;
                }
            }
            Err(e) => {
                all.errors += 1;
                all.first_error.get_or_insert(format!("worker failed: {e}"));
            }
        }
    }
    all.elapsed = started.elapsed();
    all
}
