//! `latchkey-bench`: latchkey next to etcd on the same machine. Starts a
//! 3-member etcd (Debian's `etcd-server`) and a 3-member latchkey cell on
//! 127.0.0.1, runs each workload against one and then the other with the
//! same Rust client (`etcd-client`, and the shared crate's keep-alive
//! stream), and prints one table with the latchkey/etcd ratios.
//!
//! `scripts/bench-vs-etcd.sh` builds it (release) and runs it; the load
//! test will take it over as `latchkey-loadtest compare`.

mod stats;
mod workloads;

use clap::Parser;
use etcd_client::{Client, ConnectOptions};
use latchkey_testkit::{Cluster, EtcdCluster};
use stats::{cpu_seconds, Measured};
use std::path::PathBuf;
use std::time::Duration;
use workloads::Workload;

#[derive(Parser, Debug)]
#[command(about = "latchkey next to etcd: the same workloads against both, one table of ratios")]
struct Args {
    /// The latchkey-cell binary (default: next to this one).
    #[arg(long)]
    cell_bin: Option<PathBuf>,
    /// The etcd binary.
    #[arg(long, default_value = "etcd")]
    etcd_bin: String,
    /// Seconds each closed-loop workload runs on each target.
    #[arg(long, default_value_t = 10)]
    duration: u64,
    /// Concurrent clients (workers).
    #[arg(long, default_value_t = 64)]
    clients: usize,
    /// Connections the clients share, spread over the members.
    #[arg(long, default_value_t = 8)]
    connections: usize,
    /// Leases for the keep-alive workload.
    #[arg(long, default_value_t = 50_000)]
    leases: usize,
    /// Their TTL in seconds; each is refreshed every third of it.
    #[arg(long, default_value_t = 10)]
    lease_ttl: i64,
    /// Seconds the leases are kept alive after the last is granted.
    #[arg(long, default_value_t = 30)]
    lease_duration: u64,
    /// Watchers for the watch workload.
    #[arg(long, default_value_t = 10_000)]
    watchers: usize,
    /// Workloads to run, comma-separated (default: all): put,
    /// linearizable-range, serializable-range, txn-cas, lease-grant, watch,
    /// keepalive.
    #[arg(long, value_delimiter = ',')]
    workloads: Vec<String>,
    /// Run only against latchkey (no etcd, no ratios): for profiling.
    #[arg(long)]
    latchkey_only: bool,
}

/// What every workload is given.
pub struct Settings {
    pub duration: Duration,
    pub clients: usize,
    pub leases: usize,
    pub lease_ttl: i64,
    pub lease_duration: Duration,
    pub watchers: usize,
}

/// One system under test: its connections and its processes.
struct Target {
    name: &'static str,
    clients: Vec<Client>,
    endpoints: Vec<String>,
    pids: Vec<u32>,
}

impl Target {
    async fn connect(
        name: &'static str,
        endpoints: Vec<String>,
        pids: Vec<u32>,
        connections: usize,
    ) -> anyhow::Result<Target> {
        let opts = ConnectOptions::new()
            .with_timeout(Duration::from_secs(10))
            .with_connect_timeout(Duration::from_secs(2));
        let mut clients = Vec::new();
        for i in 0..connections {
            let endpoint = format!("http://{}", endpoints[i % endpoints.len()]);
            clients.push(Client::connect([endpoint], Some(opts.clone())).await?);
        }
        Ok(Target {
            name,
            clients,
            endpoints,
            pids,
        })
    }

    async fn run(&self, w: Workload, s: &Settings) -> Measured {
        let cpu_before = cpu_seconds(&self.pids);
        let started = std::time::Instant::now();
        let mut m = w.run(&self.clients, &self.endpoints, s).await;
        let secs = started.elapsed().as_secs_f64();
        m.cpu_percent = 100.0 * (cpu_seconds(&self.pids) - cpu_before) / secs;
        m
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let workloads: Vec<Workload> = if args.workloads.is_empty() {
        Workload::ALL.to_vec()
    } else {
        args.workloads
            .iter()
            .map(|n| Workload::parse(n).ok_or_else(|| anyhow::anyhow!("no workload {n:?}")))
            .collect::<anyhow::Result<_>>()?
    };
    let cell_bin = match args.cell_bin {
        Some(bin) => bin,
        None => std::env::current_exe()?.with_file_name("latchkey-cell"),
    };
    anyhow::ensure!(
        cell_bin.is_file(),
        "no latchkey-cell at {}",
        cell_bin.display()
    );
    let settings = Settings {
        duration: Duration::from_secs(args.duration),
        clients: args.clients,
        leases: args.leases,
        lease_ttl: args.lease_ttl,
        lease_duration: Duration::from_secs(args.lease_duration),
        watchers: args.watchers,
    };

    eprintln!(
        "starting 3 etcd members ({}) and 3 latchkey members ({})",
        args.etcd_bin,
        cell_bin.display()
    );
    let cell = Cluster::start(&cell_bin, 3, &[]).await;
    let cell_endpoints: Vec<String> = cell.members.iter().map(|m| m.client.clone()).collect();
    let mut targets = Vec::new();
    let mut _etcd = None;
    if !args.latchkey_only {
        let etcd = EtcdCluster::start(&args.etcd_bin, 3).await;
        targets.push(
            Target::connect("etcd", etcd.clients.clone(), etcd.pids(), args.connections).await?,
        );
        _etcd = Some(etcd);
    }
    targets.push(Target::connect("latchkey", cell_endpoints, cell.pids(), args.connections).await?);
    eprintln!(
        "latchkey pids {:?}, metrics {:?} (leader member {})",
        cell.pids(),
        cell.members
            .iter()
            .map(|m| m.metrics.as_str())
            .collect::<Vec<_>>(),
        cell.leader_at_start()
    );
    for t in &targets {
        workloads::load_keys(&t.clients, &settings)
            .await
            .map_err(|e| anyhow::anyhow!("{}: {e}", t.name))?;
    }

    let mut rows = Vec::new();
    for w in workloads {
        let mut results = Vec::new();
        for t in &targets {
            eprintln!("{:<20} on {:<8} ...", w.name(), t.name);
            let m = t.run(w, &settings).await;
            eprintln!("{:<20} on {:<8} {}", w.name(), t.name, one_line(&m));
            println!("{}", json_line(w, t.name, &m));
            results.push(m);
        }
        rows.push((w, results));
    }
    print_table(&rows, &settings, &args.connections);
    Ok(())
}

fn one_line(m: &Measured) -> String {
    let mut line = format!(
        "{:.0}/s p50 {:.2} ms p99 {:.2} ms cpu {:.0}% errors {}",
        m.rate, m.p50_ms, m.p99_ms, m.cpu_percent, m.errors
    );
    for (name, value) in &m.notes {
        line.push_str(&format!(" {name} {value:.0}"));
    }
    if let Some(e) = &m.first_error {
        line.push_str(&format!(" (first error: {e})"));
    }
    line
}

fn json_line(w: Workload, target: &str, m: &Measured) -> serde_json::Value {
    let notes: serde_json::Map<String, serde_json::Value> = m
        .notes
        .iter()
        .map(|(n, v)| (n.clone(), serde_json::json!(v)))
        .collect();
    serde_json::json!({
        "workload": w.name(),
        "target": target,
        "rate": m.rate,
        "p50_ms": m.p50_ms,
        "p99_ms": m.p99_ms,
        "cpu_percent": m.cpu_percent,
        "errors": m.errors,
        "notes": notes,
    })
}

/// The comparison: for the watch workload the ratio is of delivery p50
/// (etcd's over latchkey's: above 1 means latchkey delivers sooner); for
/// keep-alives there is none (compare round p99 and expired leases); for
/// the others, of rates.
fn print_table(rows: &[(Workload, Vec<Measured>)], s: &Settings, connections: &usize) {
    println!();
    println!(
        "{} clients on {connections} connections, {} s per workload and target",
        s.clients,
        s.duration.as_secs()
    );
    println!("| workload | etcd | latchkey | latchkey/etcd |");
    println!("|---|---|---|---|");
    for (w, results) in rows {
        let [etcd, latchkey] = &results[..] else {
            continue;
        };
        let ratio = match w {
            // Its rate is set by the refresh interval; what tells the two
            // apart is the round latency and the leases that expired.
            Workload::KeepAlive => "—".to_string(),
            Workload::Watch if latchkey.p50_ms > 0.0 => {
                format!("{:.2}", etcd.p50_ms / latchkey.p50_ms)
            }
            _ if etcd.rate > 0.0 => format!("{:.2}", latchkey.rate / etcd.rate),
            _ => "—".to_string(),
        };
        println!(
            "| {} | {} | {} | {ratio} |",
            w.describe(s),
            cell(*w, etcd),
            cell(*w, latchkey)
        );
    }
}

fn cell(w: Workload, m: &Measured) -> String {
    let mut text = match w {
        Workload::Watch => format!("p50 {:.1} ms, p99 {:.1} ms", m.p50_ms, m.p99_ms),
        Workload::KeepAlive => format!(
            "{:.1}k keep-alives/s, round p99 {:.0} ms",
            m.rate / 1000.0,
            m.p99_ms
        ),
        _ => format!("{:.1}k/s, p99 {:.1} ms", m.rate / 1000.0, m.p99_ms),
    };
    for (name, value) in &m.notes {
        if name != "attempts/s" && name != "max_ms" {
            text.push_str(&format!(", {value:.0} {name}"));
        }
    }
    text.push_str(&format!(", cpu {:.0}%", m.cpu_percent));
    if m.errors > 0 {
        text.push_str(&format!(", {} errors", m.errors));
    }
    text
}
