//! `compare`: the same workloads against latchkey and against etcd,
//! interleaved (latchkey, etcd, latchkey, etcd, ...) so that both see the
//! same machine, then one table of latchkey/etcd ratios.
//!
//! Each run is this binary's own scenario command against a cluster's
//! state file, so a comparison is exactly what an operator can rerun by
//! hand. Without `--latchkey-state` and `--etcd-state`, `compare` brings up
//! a 3-member cell behind 2 proxies and a 3-member etcd itself and takes
//! them down at the end.

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
    /// Workloads, comma-separated: kv, sessions, locks, watch-fanout,
    /// mass-expiry, slow-watcher.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "kv,sessions,locks,watch-fanout"
    )]
    workloads: Vec<String>,
    /// Rounds: each workload runs this many times on each system.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=20))]
    rounds: u32,
    /// How long each timed workload runs.
    #[arg(long, default_value = "10s")]
    duration: String,
    /// Sessions for `sessions` (etcd must hold them too).
    #[arg(long, default_value_t = 20_000)]
    sessions: u64,
    /// Watchers for `watch-fanout`.
    #[arg(long, default_value_t = 10_000)]
    watchers: u64,
    /// Every result line goes here too (for `report`).
    #[arg(long)]
    out: Option<PathBuf>,
    /// A Markdown file whose block between `<!-- compare:begin -->` and
    /// `<!-- compare:end -->` is replaced with the table (docs/capacity.md).
    #[arg(long)]
    write_into: Option<PathBuf>,
    #[command(flatten)]
    bins: crate::binaries::Binaries,
}

/// A workload's scenario arguments, the same for both systems.
fn scenario_args(workload: &str, args: &CompareArgs) -> Result<Vec<String>, String> {
    let d = args.duration.clone();
    let v: Vec<String> = match workload {
        "kv" => vec!["kv".into(), "--duration".into(), d],
        "sessions" => vec![
            "sessions".into(),
            "--sessions".into(),
            args.sessions.to_string(),
            "--api".into(),
            "grpc".into(),
            "--ttl".into(),
            "15".into(),
            "--duration".into(),
            d,
        ],
        "locks" => vec![
            "locks".into(),
            "--duration".into(),
            d,
            "--locks".into(),
            "4".into(),
        ],
        "watch-fanout" => vec![
            "watch-fanout".into(),
            "--watchers".into(),
            args.watchers.to_string(),
            "--writes".into(),
            "20".into(),
            "--write-every".into(),
            "250ms".into(),
        ],
        "mass-expiry" => vec!["mass-expiry".into(), "--duration".into(), d],
        "slow-watcher" => vec!["slow-watcher".into(), "--duration".into(), d],
        other => return Err(format!("no workload {other:?} to compare")),
    };
    Ok(v)
}

fn this_binary() -> Result<PathBuf, String> {
    std::env::current_exe().map_err(|e| format!("where this binary is: {e}"))
}

/// Runs this binary with `args`; its stdout, or why it failed.
fn run_self(args: &[String]) -> Result<String, String> {
    let out = Command::new(this_binary()?)
        .args(args)
        .stderr(std::process::Stdio::inherit())
        .output()
        .map_err(|e| format!("running {}: {e}", args.join(" ")))?;
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    if out.status.success() {
        Ok(stdout)
    } else {
        Err(format!(
            "`latchkey-loadtest {}` failed ({}):\n{stdout}",
            args.join(" "),
            out.status
        ))
    }
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
    for round in 1..=args.rounds {
        for plan in &plans {
            for state in [&latchkey, &etcd] {
                eprintln!("compare: round {round}: {} on {}", plan[0], path(state));
                let mut a = plan.clone();
                a.extend(["--state".into(), path(state)]);
                let stdout = run_self(&a)?;
                let line = stdout.lines().next().unwrap_or_default();
                match serde_json::from_str(line) {
                    Ok(serde_json::Value::Object(m)) => lines.push(m),
                    _ => return Err(format!("`{}` gave no result line:\n{stdout}", a.join(" "))),
                }
                all_text.push_str(line);
                all_text.push('\n');
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
    let ratios = averaged(&lines, args.rounds);
    let table = table(&ratios);
    print!("{table}");
    if let Some(doc) = &args.write_into {
        let command: Vec<String> = std::env::args().skip(1).collect();
        let block = format!(
            "Measured by `latchkey-loadtest {}` ({} round(s), {}):\n\n{table}",
            command.join(" "),
            args.rounds,
            machine()
        );
        write_into(doc, &block)?;
        eprintln!("compare: the table is in {}", doc.display());
    }
    Ok(())
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

const BEGIN: &str = "<!-- compare:begin -->";
const END: &str = "<!-- compare:end -->";

/// Replaces the block between the markers in `doc` with `block`.
fn write_into(doc: &Path, block: &str) -> Result<(), String> {
    let text = std::fs::read_to_string(doc).map_err(|e| format!("{}: {e}", doc.display()))?;
    let replaced = replace_block(&text, block)
        .ok_or_else(|| format!("{} has no {BEGIN} ... {END} block", doc.display()))?;
    std::fs::write(doc, replaced).map_err(|e| format!("{}: {e}", doc.display()))
}

fn replace_block(text: &str, block: &str) -> Option<String> {
    let start = text.find(BEGIN)? + BEGIN.len();
    let end = start + text[start..].find(END)?;
    Some(format!("{}\n{block}{}", &text[..start], &text[end..]))
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
        let new = replace_block(doc, "new table\n").expect("a block");
        assert_eq!(
            new,
            "# Capacity\nbefore\n<!-- compare:begin -->\nnew table\n<!-- compare:end -->\nafter\n"
        );
        // Again: the block is replaced, not appended to.
        assert_eq!(
            replace_block(&new, "new table\n").as_deref(),
            Some(new.as_str())
        );
        assert_eq!(replace_block("no markers", "x"), None);
    }
}
