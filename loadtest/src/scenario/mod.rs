//! The load scenarios: what every one shares. Where the system under test
//! is ([`Endpoints`]: named with `--http`, `--grpc`, `--cells`, or read from
//! the state file `cluster up` wrote), how long the load runs, and how a
//! result is given ([`Outcome`]: one JSON line on stdout, then a table;
//! exit status 1 when a safety counter is not zero).

pub mod cas;
pub mod failover;
pub mod kv;
pub mod lease_grants;
pub mod load;
pub mod locks;
pub mod mass_expiry;
pub mod moves;
pub mod recorder;
pub mod sessions;
pub mod slow_watcher;
pub mod watch_fanout;

use crate::cluster::{read_state, ClusterState};
use latchkey_shared::tls::{ClientFiles, ClientTls};
use latchkey_testkit::{http_get, metric_value};
use recorder::{Latency, Sample};
use serde_json::{json, Map, Value};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// What runs at the endpoints.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Target {
    /// A latchkey cell, with or without proxies in front.
    Latchkey,
    /// etcd (the reference): gRPC scenarios run unchanged against it.
    Etcd,
}

impl Target {
    pub fn name(self) -> &'static str {
        match self {
            Target::Latchkey => "latchkey",
            Target::Etcd => "etcd",
        }
    }
}

/// The flags every scenario takes.
#[derive(clap::Args, Debug, Clone)]
pub struct Common {
    /// What runs at the endpoints (default: what the state file records,
    /// else latchkey).
    #[arg(long, value_enum)]
    pub target: Option<Target>,
    /// Proxies' HTTP addresses, comma-separated (default: the state file's).
    #[arg(long, value_delimiter = ',')]
    pub http: Vec<String>,
    /// Proxies' gRPC addresses, comma-separated (default: the state
    /// file's). gRPC load goes here; with none, to the cells.
    #[arg(long, value_delimiter = ',')]
    pub grpc: Vec<String>,
    /// Cell members' (or etcd members') client addresses, comma-separated
    /// (default: the state file's).
    #[arg(long, value_delimiter = ',')]
    pub cells: Vec<String>,
    /// Cell members' metrics addresses, for the counters the cell keeps
    /// (default: the state file's).
    #[arg(long, value_delimiter = ',')]
    pub cell_metrics: Vec<String>,
    /// Proxies' metrics addresses (default: the state file's).
    #[arg(long, value_delimiter = ',')]
    pub proxy_metrics: Vec<String>,
    /// The state file of `cluster up`, read when no endpoint is named.
    #[arg(long, default_value_os_t = crate::cluster::default_state())]
    pub state: PathBuf,
    /// How long the load runs (its measured phase).
    #[arg(long, default_value = "30s", value_parser = humantime::parse_duration)]
    pub duration: Duration,
    /// Stop the measured phase after this many operations (0: no limit).
    #[arg(long, default_value_t = 0)]
    pub requests: u64,
    /// How long one operation may take before it counts as an error.
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    pub op_timeout: Duration,
    /// Append the JSON result line to this file too (for `report`).
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// The CA of the servers' certificates: gRPC load speaks TLS with it
    /// (the `kv` and `sessions` scenarios; `sessions` over gRPC only).
    #[arg(long = "tls-cacert")]
    pub cacert: Option<PathBuf>,
    /// The client certificate gRPC load presents over TLS (with
    /// --tls-key).
    #[arg(long = "tls-cert", requires_all = ["tls_key", "cacert"])]
    pub cert: Option<PathBuf>,
    /// The key of --tls-cert.
    #[arg(long = "tls-key", id = "tls_key", requires = "cert")]
    pub tls_key: Option<PathBuf>,
}

impl Common {
    /// etcd-client's TLS options from --tls-cacert, --tls-cert and --tls-key.
    pub fn tls(&self) -> Result<Option<etcd_client::TlsOptions>, String> {
        let Some(ca) = &self.cacert else {
            return Ok(None);
        };
        let read = |p: &PathBuf| std::fs::read(p).map_err(|e| format!("{}: {e}", p.display()));
        let mut tls = etcd_client::TlsOptions::new()
            .ca_certificate(etcd_client::Certificate::from_pem(read(ca)?));
        if let (Some(cert), Some(key)) = (&self.cert, &self.tls_key) {
            tls = tls.identity(etcd_client::Identity::from_pem(read(cert)?, read(key)?));
        }
        Ok(Some(tls))
    }

    /// The same flags as the TLS config of latchkey's own client (the
    /// keep-alive streams of `sessions`).
    pub fn client_tls(&self) -> Result<Option<Arc<ClientTls>>, String> {
        let Some(ca) = &self.cacert else {
            return Ok(None);
        };
        let files = ClientFiles {
            trusted_ca: ca.clone(),
            cert_and_key: self.cert.clone().zip(self.tls_key.clone()),
        };
        ClientTls::load("loadtest", &files)
            .map(|tls| Some(Arc::new(tls)))
            .map_err(|e| e.to_string())
    }
}

/// The system under test.
#[derive(Debug, Clone)]
pub struct Endpoints {
    pub target: Target,
    pub http: Vec<String>,
    pub grpc: Vec<String>,
    pub cells: Vec<String>,
    pub cell_metrics: Vec<String>,
    pub proxy_metrics: Vec<String>,
    /// Known only from a state file: for CPU and memory.
    pub cell_pids: Vec<u32>,
    pub proxy_pids: Vec<u32>,
}

impl Endpoints {
    /// From the named endpoints, or else from the state file.
    pub fn resolve(common: &Common) -> Result<Endpoints, String> {
        let named = !(common.http.is_empty() && common.grpc.is_empty() && common.cells.is_empty());
        let mut e = if named {
            Endpoints {
                target: common.target.unwrap_or(Target::Latchkey),
                http: common.http.clone(),
                grpc: common.grpc.clone(),
                cells: common.cells.clone(),
                cell_metrics: Vec::new(),
                proxy_metrics: Vec::new(),
                cell_pids: Vec::new(),
                proxy_pids: Vec::new(),
            }
        } else {
            Endpoints::from_state(&read_state(&common.state)?, common.target)?
        };
        if !common.cell_metrics.is_empty() {
            e.cell_metrics = common.cell_metrics.clone();
        }
        if !common.proxy_metrics.is_empty() {
            e.proxy_metrics = common.proxy_metrics.clone();
        }
        if e.cells.is_empty() && e.grpc.is_empty() && e.http.is_empty() {
            return Err("no endpoint: name --http, --grpc or --cells, or run `cluster up`".into());
        }
        if e.target == Target::Etcd && !e.http.is_empty() {
            return Err(
                "etcd has no HTTP API of latchkey's: drop --http with --target etcd".into(),
            );
        }
        Ok(e)
    }

    pub fn from_state(state: &ClusterState, wanted: Option<Target>) -> Result<Endpoints, String> {
        let of = |prefix: &str| -> Vec<&crate::cluster::Proc> {
            state
                .processes
                .iter()
                .filter(|p| p.name.starts_with(prefix))
                .collect()
        };
        let (members, found) = if of("etcd-").is_empty() {
            (of("cell-"), Target::Latchkey)
        } else {
            (of("etcd-"), Target::Etcd)
        };
        if let Some(wanted) = wanted.filter(|w| *w != found) {
            return Err(format!(
                "--target {} but the cluster that is up is {}",
                wanted.name(),
                found.name()
            ));
        }
        let proxies = of("proxy-");
        let addrs = |ps: &[&crate::cluster::Proc], role: &str| -> Vec<String> {
            ps.iter()
                .filter_map(|p| p.addrs.get(role).cloned())
                .collect()
        };
        Ok(Endpoints {
            target: found,
            http: addrs(&proxies, "http"),
            grpc: addrs(&proxies, "grpc"),
            cells: addrs(&members, "client"),
            cell_metrics: addrs(&members, "metrics"),
            proxy_metrics: addrs(&proxies, "metrics"),
            // Every cell's members (`cellgG-N` with `--cell-groups`); the
            // addresses above are the home cell's. etcd's are its members.
            cell_pids: match found {
                Target::Latchkey => of("cell").iter().map(|p| p.pid).collect(),
                Target::Etcd => members.iter().map(|p| p.pid).collect(),
            },
            proxy_pids: proxies.iter().map(|p| p.pid).collect(),
        })
    }

    /// Where gRPC load goes: the proxies, or the members when there is none.
    pub fn grpc_front(&self) -> &[String] {
        if self.grpc.is_empty() {
            &self.cells
        } else {
            &self.grpc
        }
    }

    /// [`grpc_front`](Self::grpc_front), which a gRPC scenario needs.
    pub fn require_grpc(&self) -> Result<&[String], String> {
        match self.grpc_front() {
            [] => Err("this scenario speaks gRPC: name --grpc or --cells".into()),
            front => Ok(front),
        }
    }

    /// The sum of one series over the cell's members (0 where unknown).
    pub async fn cell_metric(&self, series: &str) -> f64 {
        metric_sum(&self.cell_metrics, series).await
    }

    /// The sum of one series over the proxies.
    pub async fn proxy_metric(&self, series: &str) -> f64 {
        metric_sum(&self.proxy_metrics, series).await
    }
}

async fn metric_sum(addrs: &[String], series: &str) -> f64 {
    let mut sum = 0.0;
    for addr in addrs {
        if let Some(text) = http_get(addr, "/metrics").await {
            sum += metric_value(&text, series).unwrap_or(0.0);
        }
    }
    sum
}

/// `http://` in front of an address that has no scheme.
pub fn url(addr: &str) -> String {
    if addr.contains("://") {
        addr.to_string()
    } else {
        format!("http://{addr}")
    }
}

/// CPU time of a set of processes, to turn into a share of one core.
pub struct CpuMeter {
    pids: Vec<u32>,
    at: std::time::Instant,
    seconds: f64,
}

impl CpuMeter {
    pub fn start(pids: &[u32]) -> CpuMeter {
        CpuMeter {
            pids: pids.to_vec(),
            at: std::time::Instant::now(),
            seconds: latchkey_testkit::process::cpu_seconds(pids),
        }
    }

    /// Percent of one core since `start`, or None when no pid is known.
    pub fn percent(&self) -> Option<f64> {
        if self.pids.is_empty() {
            return None;
        }
        let used = latchkey_testkit::process::cpu_seconds(&self.pids) - self.seconds;
        Some(used / self.at.elapsed().as_secs_f64().max(1e-9) * 100.0)
    }
}

/// The largest resident set of `pids`, in MiB (None when none is known).
pub fn max_rss_mib(pids: &[u32]) -> Option<f64> {
    pids.iter()
        .filter_map(|p| latchkey_testkit::process::rss_bytes(*p))
        .max()
        .map(|b| b as f64 / (1 << 20) as f64)
}

/// A scenario's result: the JSON line and the table say the same things.
pub struct Outcome {
    fields: Map<String, Value>,
    rows: Vec<(String, String)>,
    safety: Vec<(String, u64)>,
}

impl Outcome {
    pub fn new(scenario: &str, target: Target) -> Outcome {
        let mut fields = Map::new();
        fields.insert("scenario".into(), json!(scenario));
        fields.insert("target".into(), json!(target.name()));
        let unix = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        fields.insert("unix_time".into(), json!(unix));
        Outcome {
            fields,
            rows: Vec::new(),
            safety: Vec::new(),
        }
    }

    /// A figure: a JSON field and a table row.
    pub fn figure(&mut self, name: &str, value: impl Into<Value>, shown: impl Into<String>) {
        self.fields.insert(name.into(), value.into());
        self.rows.push((name.replace('_', " "), shown.into()));
    }

    /// A field of the JSON line only (settings, series).
    pub fn field(&mut self, name: &str, value: impl Into<Value>) {
        self.fields.insert(name.into(), value.into());
    }

    /// A figure that may be unknown (CPU of processes not started here).
    pub fn maybe(&mut self, name: &str, value: Option<f64>, unit: &str) {
        match value {
            Some(v) => self.figure(name, v, format!("{v:.1} {unit}")),
            None => self.figure(
                name,
                Value::Null,
                "unknown (no pid: not started by `cluster up`)",
            ),
        }
    }

    /// A counter that must be zero; the run fails otherwise.
    pub fn safety(&mut self, name: &str, count: u64) {
        self.figure(name, count, format!("{count}  (must be 0)"));
        self.safety.push((name.to_string(), count));
    }

    /// A latency summary: `<name>_p50_ms`, `_p99_ms`, `_p999_ms`, `_max_ms`.
    pub fn latency(&mut self, name: &str, l: &Latency) {
        for (q, v) in [
            ("p50", l.p50_ms),
            ("p99", l.p99_ms),
            ("p999", l.p999_ms),
            ("max", l.max_ms),
        ] {
            self.fields.insert(format!("{name}_{q}_ms"), json!(v));
        }
        self.fields
            .insert(format!("{name}_histogram"), json!(l.buckets));
        self.rows.push((
            name.replace('_', " "),
            format!(
                "p50 {:.2} ms  p99 {:.2} ms  p999 {:.2} ms  max {:.2} ms  ({} samples)",
                l.p50_ms, l.p99_ms, l.p999_ms, l.max_ms, l.count
            ),
        ));
    }

    /// The per-second series of the run (latency over time).
    pub fn series(&mut self, series: Vec<Sample>) {
        self.field("series", json!(series));
    }

    /// Errors and the first one, as a figure.
    pub fn errors(&mut self, count: u64, first: Option<String>) {
        let shown = match &first {
            Some(e) => format!("{count}  (first: {e})"),
            None => count.to_string(),
        };
        self.figure("errors", count, shown);
        self.field("first_error", json!(first));
    }

    /// Prints the JSON line and the table, appends the line to `out`;
    /// success only when every safety counter is zero.
    pub fn emit(mut self, out: Option<&Path>) -> ExitCode {
        let names: Vec<&String> = self.safety.iter().map(|(n, _)| n).collect();
        self.fields.insert("safety_counters".into(), json!(names));
        let line = Value::Object(self.fields.clone()).to_string();
        println!("{line}");
        let width = self.rows.iter().map(|(n, _)| n.len()).max().unwrap_or(0);
        println!();
        for (name, shown) in &self.rows {
            println!("{name:<width$}  {shown}");
        }
        if let Some(path) = out {
            let appended = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(path)
                .and_then(|mut f| writeln!(f, "{line}"));
            if let Err(e) = appended {
                eprintln!("cannot append the result to {}: {e}", path.display());
                return ExitCode::from(1);
            }
        }
        let broken: Vec<String> = self
            .safety
            .iter()
            .filter(|(_, n)| *n > 0)
            .map(|(name, n)| format!("{name} = {n}"))
            .collect();
        if broken.is_empty() {
            ExitCode::SUCCESS
        } else {
            eprintln!("FAILED: {}", broken.join(", "));
            ExitCode::from(1)
        }
    }
}

/// Resolves the endpoints, runs `scenario` on them, and turns its outcome
/// (or why it could not run) into the exit status.
pub async fn drive<Fut>(
    name: &str,
    common: &Common,
    scenario: impl FnOnce(Endpoints) -> Fut,
) -> ExitCode
where
    Fut: std::future::Future<Output = Result<Outcome, String>>,
{
    let endpoints = match Endpoints::resolve(common) {
        Ok(e) => e,
        Err(e) => return failed(name, e),
    };
    match scenario(endpoints).await {
        Ok(outcome) => outcome.emit(common.out.as_deref()),
        Err(e) => failed(name, e),
    }
}

/// The end of a scenario that could not run: its reason, exit status 1.
pub fn failed(scenario: &str, why: impl std::fmt::Display) -> ExitCode {
    eprintln!("{scenario}: {why}");
    ExitCode::from(1)
}

/// Whether a measured phase that started at `started` is over: its time
/// is up, or `done` reached the request limit.
pub fn over(common: &Common, started: std::time::Instant, done: u64) -> bool {
    started.elapsed() >= common.duration || (common.requests > 0 && done >= common.requests)
}
