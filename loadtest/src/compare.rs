//! `compare`: the same workloads against latchkey and against etcd,
//! interleaved (latchkey, etcd, latchkey, etcd, ...) so that both see the
//! same machine, then one table of latchkey/etcd ratios.
//!
//! Each run is this binary's own scenario command against a cluster's
//! state file, so a comparison is exactly what an operator can rerun by
//! hand. Without `--latchkey-state` and `--etcd-state`, `compare` brings up
//! a 3-member cell behind 2 latchkey-proxies and a 3-member etcd behind 2
//! of etcd's own grpc-proxies itself (`--proxies 0`: both straight to
//! their members) and takes them down at the end.

use crate::report::{better_when_higher, comparisons, Ratio};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};

#[derive(clap::Args, Debug)]
pub struct CompareArgs {
    /// State file of a running latchkey cluster (`cluster up`).
    #[arg(long, requires = "etcd_state")]
    latchkey_state: Option<PathBuf>,
    /// State file of a running etcd cluster (`cluster up --etcd`).
    #[arg(long, requires = "latchkey_state")]
    etcd_state: Option<PathBuf>,
    /// Workloads, comma-separated (see [`WORKLOADS`]; `--help` lists them).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "put,linearizable-range,serializable-range,cas,lease-grants,watch-fanout,sessions,locks",
        value_parser = clap::builder::PossibleValuesParser::new(WORKLOADS)
    )]
    workloads: Vec<String>,
    /// Rounds: each workload runs this many times on each system.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=20))]
    rounds: u32,
    /// How long each timed workload runs.
    #[arg(long, default_value = "10s")]
    duration: String,
    /// Distinct keys for `put` and `serializable-range` (read at random).
    #[arg(long, default_value_t = 10_000, value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    keys: u64,
    /// Sessions for `sessions`: leases on etcd's keep-alive streams, many
    /// per stream, on both systems (through the proxies on latchkey).
    #[arg(long, default_value_t = 50_000)]
    sessions: u64,
    /// Their TTL in seconds; each is refreshed every third of it.
    #[arg(long, default_value_t = 30)]
    session_ttl: u64,
    /// Watchers for `watch-fanout`.
    #[arg(long, default_value_t = 10_000)]
    watchers: u64,
    /// Proxies in front of each system `compare` brings up: latchkey-proxy
    /// before the cell, `etcd grpc-proxy` before etcd (0: the load goes
    /// straight to the members of both).
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u8).range(0..=16))]
    proxies: u8,
    /// Every result line goes here too (for `report`).
    #[arg(long)]
    out: Option<PathBuf>,
    /// A Markdown file whose block between `<!-- NAME:begin -->` and
    /// `<!-- NAME:end -->` is replaced with the table and the command that
    /// measured it (docs/capacity.md, README.md).
    #[arg(long)]
    write_into: Option<PathBuf>,
    /// NAME of that block (a file can hold several).
    #[arg(long, default_value = "compare", requires = "write_into", value_parser = block_name)]
    block: String,
    #[command(flatten)]
    bins: crate::binaries::Binaries,
}

/// What `compare` can run. Each is one scenario with its arguments; the
/// result line carries the workload's name (`workload`), by which the
/// ratios are taken.
pub const WORKLOADS: [&str; 11] = [
    "kv",
    "put",
    "linearizable-range",
    "serializable-range",
    "cas",
    "lease-grants",
    "sessions",
    "locks",
    "watch-fanout",
    "mass-expiry",
    "slow-watcher",
];

/// A workload's scenario arguments, the same for both systems.
fn scenario_args(workload: &str, args: &CompareArgs) -> Result<Vec<String>, String> {
    let d = args.duration.as_str();
    let sessions = args.sessions.to_string();
    let ttl = args.session_ttl.to_string();
    let watchers = args.watchers.to_string();
    let keys = args.keys.to_string();
    let v: &[&str] = match workload {
        "kv" => &["kv", "--duration", d],
        "put" => &["kv", "--duration", d, "--writes", "1", "--keys", &keys],
        "linearizable-range" => &["kv", "--duration", d, "--writes", "0", "--keys", "1"],
        "serializable-range" => &[
            "kv",
            "--duration",
            d,
            "--writes",
            "0",
            "--keys",
            &keys,
            "--reads",
            "serializable",
        ],
        "cas" => &["cas", "--duration", d],
        "lease-grants" => &["lease-grants", "--duration", d],
        "sessions" => &[
            "sessions",
            "--sessions",
            &sessions,
            "--api",
            "grpc",
            "--ttl",
            &ttl,
            "--duration",
            d,
        ],
        "locks" => &["locks", "--duration", d, "--locks", "16"],
        "watch-fanout" => &[
            "watch-fanout",
            "--watchers",
            &watchers,
            "--writes",
            "20",
            "--write-every",
            "250ms",
        ],
        "mass-expiry" => &["mass-expiry", "--duration", d],
        "slow-watcher" => &["slow-watcher", "--duration", d],
        other => return Err(format!("no workload {other:?} to compare")),
    };
    Ok(v.iter().map(|s| s.to_string()).collect())
}

fn this_binary() -> Result<PathBuf, String> {
    std::env::current_exe().map_err(|e| format!("where this binary is: {e}"))
}

/// Runs this binary with `args`; its stdout, or why it failed.
fn run_self(args: &[String]) -> Result<String, String> {
    let (stdout, ok) = run_self_status(args)?;
    if ok {
        Ok(stdout)
    } else {
        Err(failed(args, &stdout))
    }
}

/// Runs this binary with `args`: its stdout and whether it succeeded.
fn run_self_status(args: &[String]) -> Result<(String, bool), String> {
    let out = Command::new(this_binary()?)
        .args(args)
        .stderr(std::process::Stdio::inherit())
        .output()
        .map_err(|e| format!("running {}: {e}", args.join(" ")))?;
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    Ok((stdout, out.status.success()))
}

fn failed(args: &[String], stdout: &str) -> String {
    format!("`latchkey-loadtest {}` failed:\n{stdout}", args.join(" "))
}

/// The safety counters of a result line that are not 0, as `name = n`.
fn broken_counters(line: &serde_json::Map<String, serde_json::Value>) -> Vec<String> {
    let names = line
        .get("safety_counters")
        .and_then(|v| v.as_array())
        .cloned()
        .unwrap_or_default();
    names
        .iter()
        .filter_map(|n| n.as_str())
        .filter_map(|n| {
            let value = line.get(n).and_then(|v| v.as_u64()).unwrap_or(0);
            (value > 0).then(|| format!("{n} = {value}"))
        })
        .collect()
}

fn path(p: &Path) -> String {
    p.to_string_lossy().to_string()
}

/// Clusters `compare` brought up itself, taken down when it ends.
struct OwnClusters {
    states: Vec<PathBuf>,
    _dir: tempfile::TempDir,
}

impl Drop for OwnClusters {
    fn drop(&mut self) {
        for state in &self.states {
            if let Err(e) = run_self(&[
                "cluster".into(),
                "down".into(),
                "--state".into(),
                path(state),
            ]) {
                eprintln!("compare: {e}");
            }
        }
    }
}

fn bring_up(args: &CompareArgs) -> Result<(OwnClusters, PathBuf, PathBuf), String> {
    let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
    let (l, e) = (
        dir.path().join("latchkey.json"),
        dir.path().join("etcd.json"),
    );
    let mut own = OwnClusters {
        states: Vec::new(),
        _dir: dir,
    };
    let mut up: Vec<String> = vec!["cluster".into(), "up".into(), "--state".into(), path(&l)];
    up.extend(["--proxies".into(), args.proxies.to_string()]);
    for (flag, value) in [
        ("--cell-bin", &args.bins.cell_bin),
        ("--proxy-bin", &args.bins.proxy_bin),
    ] {
        if let Some(v) = value {
            up.extend([flag.to_string(), path(v)]);
        }
    }
    for (flag, values) in [
        ("--cell-arg", &args.bins.cell_arg),
        ("--proxy-arg", &args.bins.proxy_arg),
    ] {
        for v in values {
            up.push(format!("{flag}={v}"));
        }
    }
    run_self(&up)?;
    own.states.push(l.clone());
    run_self(&[
        "cluster".into(),
        "up".into(),
        "--etcd".into(),
        "--proxies".into(),
        args.proxies.to_string(),
        "--state".into(),
        path(&e),
    ])?;
    own.states.push(e.clone());
    Ok((own, l, e))
}

pub fn main(args: CompareArgs) -> ExitCode {
    match compare(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("compare: {e}");
            ExitCode::from(1)
        }
    }
}

fn compare(args: &CompareArgs) -> Result<(), String> {
    let plans: Vec<Vec<String>> = args
        .workloads
        .iter()
        .map(|w| scenario_args(w, args))
        .collect::<Result<_, _>>()?;
    let (_own, latchkey, etcd) = match (&args.latchkey_state, &args.etcd_state) {
        (Some(l), Some(e)) => (None, l.clone(), e.clone()),
        _ => {
            let (own, l, e) = bring_up(args)?;
            (Some(own), l, e)
        }
    };
    let mut lines: Vec<serde_json::Map<String, serde_json::Value>> = Vec::new();
    let mut all_text = String::new();
    let mut etcd_broke: Vec<String> = Vec::new();
    for round in 1..=args.rounds {
        for (workload, plan) in args.workloads.iter().zip(&plans) {
            for state in [&latchkey, &etcd] {
                eprintln!("compare: round {round}: {workload} on {}", path(state));
                let mut a = plan.clone();
                a.extend(["--state".into(), path(state)]);
                let (stdout, ok) = run_self_status(&a)?;
                let line = stdout.lines().next().unwrap_or_default();
                let Ok(serde_json::Value::Object(mut m)) = serde_json::from_str(line) else {
                    return Err(failed(&a, &stdout));
                };
                // A guarantee latchkey broke ends the comparison; one etcd
                // broke is a finding about etcd, said under the table.
                let broken = broken_counters(&m);
                if !ok && (state == &latchkey || broken.is_empty()) {
                    return Err(failed(&a, &stdout));
                }
                if !broken.is_empty() {
                    etcd_broke.push(format!(
                        "- etcd, round {round}, {workload}: {}",
                        broken.join(", ")
                    ));
                }
                m.insert("workload".into(), workload.as_str().into());
                all_text.push_str(&serde_json::Value::Object(m.clone()).to_string());
                all_text.push('\n');
                lines.push(m);
            }
        }
    }
    if let Some(out) = &args.out {
        use std::io::Write;
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(out)
            .and_then(|mut f| f.write_all(all_text.as_bytes()))
            .map_err(|e| format!("appending to {}: {e}", out.display()))?;
    }
    let mut ratios = averaged(&lines, args.rounds);
    ratios.push(Ratio::of(
        "after the suite",
        "largest_member_rss_mib",
        false,
        largest_member_rss_mib(&latchkey)?,
        largest_member_rss_mib(&etcd)?,
    ));
    let mut table = table(&ratios);
    if !etcd_broke.is_empty() {
        table.push_str("\nGuarantees etcd broke in these runs:\n");
        for line in &etcd_broke {
            table.push_str(line);
            table.push('\n');
        }
    }
    print!("{table}");
    if let Some(doc) = &args.write_into {
        let command: Vec<String> = std::env::args().skip(1).collect();
        let block = format!(
            "Measured by `latchkey-loadtest {}` ({} round(s), {}):\n\n{table}",
            command.join(" "),
            args.rounds,
            machine()
        );
        write_into(doc, &args.block, &block)?;
        eprintln!("compare: the table is in {}", doc.display());
    }
    Ok(())
}

/// The resident set of the largest member of the cluster `state` names,
/// in MiB: what the suite left the members holding.
fn largest_member_rss_mib(file: &Path) -> Result<f64, String> {
    let state = crate::cluster::read_state(file)?;
    let members = crate::scenario::Endpoints::from_state(&state, None)?;
    crate::scenario::max_rss_mib(&members.cell_pids)
        .ok_or_else(|| format!("no member of {} is running to measure", path(file)))
}

/// The machine the figures come from: CPUs and memory, as Linux says.
fn machine() -> String {
    let cpus = std::thread::available_parallelism().map_or(0, |n| n.get());
    let model = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|c| {
            c.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|m| m.trim().to_string())
        })
        .unwrap_or_else(|| "unknown CPU".into());
    let mem_gib = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| {
            m.lines()
                .find(|l| l.starts_with("MemTotal:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|kib| kib.parse::<f64>().ok())
        })
        .map_or(0.0, |kib| kib / (1 << 20) as f64);
    format!("{cpus} CPUs ({model}), {mem_gib:.0} GiB")
}

/// A block name: letters, digits and `-`, so that it cannot end a comment.
fn block_name(s: &str) -> Result<String, String> {
    let fine = !s.is_empty() && s.chars().all(|c| c.is_ascii_alphanumeric() || c == '-');
    if fine {
        Ok(s.to_string())
    } else {
        Err(format!("{s:?}: letters, digits and '-' only"))
    }
}

/// The markers around block `name`.
fn markers(name: &str) -> (String, String) {
    (
        format!("<!-- {name}:begin -->"),
        format!("<!-- {name}:end -->"),
    )
}

/// Replaces block `name` of `doc` with `block`.
fn write_into(doc: &Path, name: &str, block: &str) -> Result<(), String> {
    let text = std::fs::read_to_string(doc).map_err(|e| format!("{}: {e}", doc.display()))?;
    let replaced = replace_block(&text, name, block).ok_or_else(|| {
        let (begin, end) = markers(name);
        format!("{} has no {begin} ... {end} block", doc.display())
    })?;
    std::fs::write(doc, replaced).map_err(|e| format!("{}: {e}", doc.display()))
}

fn replace_block(text: &str, name: &str, block: &str) -> Option<String> {
    let (begin, end) = markers(name);
    let start = text.find(&begin)? + begin.len();
    let stop = start + text[start..].find(&end)?;
    Some(format!("{}\n{block}{}", &text[..start], &text[stop..]))
}

/// Each figure averaged over the rounds that measured it on both systems,
/// and the ratio of those means.
fn averaged(lines: &[serde_json::Map<String, serde_json::Value>], rounds: u32) -> Vec<Ratio> {
    let per_round = lines.len() / rounds.max(1) as usize;
    let mut sums: Vec<(Ratio, u32)> = Vec::new();
    for chunk in lines.chunks(per_round.max(1)) {
        for r in comparisons(chunk) {
            match sums
                .iter_mut()
                .find(|(s, _)| s.scenario == r.scenario && s.figure == r.figure)
            {
                Some((s, n)) => {
                    s.latchkey += r.latchkey;
                    s.etcd += r.etcd;
                    *n += 1;
                }
                None => sums.push((r, 1)),
            }
        }
    }
    sums.into_iter()
        .map(|(s, n)| {
            let higher = better_when_higher(&s.figure).unwrap_or(true);
            let (latchkey, etcd) = (s.latchkey / n as f64, s.etcd / n as f64);
            Ratio::of(&s.scenario, &s.figure, higher, latchkey, etcd)
        })
        .collect()
}

/// The ratio table, as Markdown (it goes into docs/capacity.md as is).
fn table(ratios: &[Ratio]) -> String {
    let mut t = String::from(
        "| workload | figure | latchkey | etcd | latchkey/etcd |\n|---|---|---|---|---|\n",
    );
    for r in ratios {
        let mark = if r.latchkey_ahead { "" } else { " (behind)" };
        t.push_str(&format!(
            "| {} | {} | {:.1} | {:.1} | {:.2}{mark} |\n",
            r.scenario, r.figure, r.latchkey, r.etcd, r.ratio
        ));
    }
    t
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_replaces_only_the_marked_block() {
        let doc =
            "# Capacity\nbefore\n<!-- compare:begin -->\nold table\n<!-- compare:end -->\nafter\n";
        let new = replace_block(doc, "compare", "new table\n").expect("a block");
        assert_eq!(
            new,
            "# Capacity\nbefore\n<!-- compare:begin -->\nnew table\n<!-- compare:end -->\nafter\n"
        );
        // Again: the block is replaced, not appended to.
        assert_eq!(
            replace_block(&new, "compare", "new table\n").as_deref(),
            Some(new.as_str())
        );
        assert_eq!(replace_block("no markers", "compare", "x"), None);
        // Another block of the same file is another name.
        let two = format!("{doc}<!-- direct:begin -->\n<!-- direct:end -->\n");
        let direct = replace_block(&two, "direct", "t2\n").expect("the second block");
        assert!(direct.starts_with(doc), "{direct}");
        assert!(direct.ends_with("<!-- direct:begin -->\nt2\n<!-- direct:end -->\n"));
        assert!(block_name("a-b2").is_ok() && block_name("x -->").is_err());
    }

    #[test]
    fn only_the_safety_counters_above_zero_are_reported_broken() {
        let line = serde_json::json!({
            "safety_counters": ["spurious_expiries", "stale_reads"],
            "spurious_expiries": 20608,
            "stale_reads": 0,
            "errors": 3,
        });
        let m = line.as_object().expect("a JSON object").clone();
        assert_eq!(broken_counters(&m), vec!["spurious_expiries = 20608"]);
        let mut clean = m.clone();
        clean.insert("spurious_expiries".into(), 0.into());
        assert!(broken_counters(&clean).is_empty());
    }
}
