//! `latchkey-loadtest cluster up | down`: a local cluster of real processes
//! on loopback that outlives the command, for scenarios (or curl, etcdctl)
//! to point at.
//!
//! `up` starts `--cells` members of a latchkey cell and `--proxies` proxies
//! in front of it (or, with `--etcd`, members of Debian's etcd as the
//! reference and etcd's own grpc-proxies), each in its own process group so the terminal's Ctrl-C does
//! not reach them, waits until every one is ready, and writes a state file:
//! With `--cell-groups G`, it starts G cells of `--cells` members each (the
//! first is home, `cell-N`; the others `cellgG-N`), adds the others to the
//! directory of cells through the first proxy and gives cell g the prefix
//! `loadtest/cell-{g-1}/` (the `locks` scenario's `--spread-cells G` names
//! its locks across them); `--cpu-quota C` puts each cell's members in a
//! cgroup of their own limited to C cores (cgroup v1's `cpu` controller, or
//! v2's `cpu.max`; root only), so cells on one machine do not share CPU as
//! they please.
//! what runs, its pid, its addresses, its log, and the one directory that
//! holds every data directory and log. `down` reads that file, stops each
//! process that is still the one it started (SIGTERM, then SIGKILL after a
//! while), and removes the directory and the file.

use latchkey_testkit::{etcd, free_port, http_get, poll_until};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};
use std::time::Duration;

#[derive(clap::Args, Debug)]
pub struct ClusterArgs {
    #[command(subcommand)]
    action: Action,
}

#[derive(clap::Subcommand, Debug)]
enum Action {
    /// Starts a cell and proxies (or etcd) and returns once they are ready.
    Up(UpArgs),
    /// Stops what `up` started and removes its data.
    Down(DownArgs),
}

#[derive(clap::Args, Debug)]
struct UpArgs {
    /// Voting members of the cell (or of etcd): 1, 3, 5 or 7.
    #[arg(long, default_value_t = 3, value_parser = voters)]
    cells: usize,
    /// Proxies in front (0-16): latchkey-proxy processes (default 2) or,
    /// with --etcd, etcd's own `etcd grpc-proxy` (default none).
    #[arg(long, value_parser = clap::value_parser!(u8).range(0..=16))]
    proxies: Option<u8>,
    /// Start members of etcd (the reference) instead of latchkey.
    #[arg(long)]
    etcd: bool,
    /// Cells of `--cells` members each (latchkey only): the first is home,
    /// the others are added to the directory, cell g owning the prefix
    /// `loadtest/cell-{g-1}/`.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u8).range(1..=8))]
    cell_groups: u8,
    /// Cores each cell's members may use together (a cgroup per cell; root
    /// only), e.g. 0.5.
    #[arg(long)]
    cpu_quota: Option<f64>,
    /// The `etcd` binary (Debian's etcd-server installs /usr/bin/etcd).
    #[arg(long, default_value = "etcd")]
    etcd_bin: PathBuf,
    #[command(flatten)]
    bins: crate::binaries::Binaries,
    /// The state file `down` reads.
    #[arg(long, default_value_os_t = default_state())]
    state: PathBuf,
    /// How long to wait for every process to be ready.
    #[arg(long, default_value = "60s", value_parser = humantime::parse_duration)]
    ready_timeout: Duration,
}

#[derive(clap::Args, Debug)]
struct DownArgs {
    /// The state file `up` wrote.
    #[arg(long, default_value_os_t = default_state())]
    state: PathBuf,
}

fn voters(s: &str) -> Result<usize, String> {
    match s.parse::<usize>() {
        Ok(n @ (1 | 3 | 5 | 7)) => Ok(n),
        _ => Err(
            "a cell has 1, 3, 5 or 7 voters (an even count tolerates no more failures than \
             the odd count below it)"
                .to_string(),
        ),
    }
}

pub fn default_state() -> PathBuf {
    std::env::temp_dir().join("latchkey-loadtest-cluster.json")
}

/// What `up` started, as the state file records it.
#[derive(Debug, Serialize, Deserialize)]
pub struct ClusterState {
    /// Holds every data directory and log; `down` removes it.
    pub dir: PathBuf,
    pub processes: Vec<Proc>,
    /// The cgroups `--cpu-quota` made; `down` removes them.
    #[serde(default)]
    pub cgroups: Vec<PathBuf>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Proc {
    /// `cell-1`, `proxy-2`, `etcd-1`.
    pub name: String,
    pub pid: u32,
    /// The binary's path, to tell it from another process that got the pid.
    pub bin: PathBuf,
    /// Its listening addresses by role (`client`, `peer`, `metrics`,
    /// `http`, `grpc`).
    pub addrs: BTreeMap<String, String>,
    pub log: PathBuf,
    /// Its arguments, to start it again (`failover` restarts what it
    /// killed).
    #[serde(default)]
    pub argv: Vec<String>,
}

impl ClusterState {
    /// Every address of one role, in process order.
    pub fn addrs(&self, role: &str) -> Vec<String> {
        self.processes
            .iter()
            .filter_map(|p| p.addrs.get(role).cloned())
            .collect()
    }
}

pub async fn main(args: ClusterArgs) -> ExitCode {
    let result = match args.action {
        Action::Up(up) => self::up(up).await,
        Action::Down(down) => self::down(&down.state).await,
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("cluster: {e}");
            ExitCode::from(1)
        }
    }
}

async fn up(args: UpArgs) -> Result<(), String> {
    if let Ok(old) = read_state(&args.state) {
        let alive: Vec<String> = old
            .processes
            .iter()
            .filter(|p| is_ours(p))
            .map(|p| format!("{} (pid {})", p.name, p.pid))
            .collect();
        if !alive.is_empty() {
            return Err(format!(
                "a cluster is up ({}; state {}): run `latchkey-loadtest cluster down` first",
                alive.join(", "),
                args.state.display()
            ));
        }
    }
    let dir = tempfile::Builder::new()
        .prefix("latchkey-cluster-")
        .tempdir()
        .map_err(|e| format!("a directory for the cluster's data: {e}"))?
        .keep();
    let mut state = ClusterState {
        dir: dir.clone(),
        processes: Vec::new(),
        cgroups: Vec::new(),
    };
    let started = if args.etcd {
        start_etcd(&args, &mut state).await
    } else {
        start_latchkey(&args, &mut state).await
    };
    if let Err(e) = started {
        stop(&state.processes).await;
        remove_cgroups(&state.cgroups);
        let _ = std::fs::remove_dir_all(&dir);
        return Err(e);
    }
    write_state(&args.state, &state)?;
    print_state(&state, &args.state);
    Ok(())
}

/// Spawns `bin` in its own process group with its output in `log`.
fn spawn(bin: &Path, args: &[String], log: &Path) -> Result<u32, String> {
    // Appended to: a restarted process continues its log.
    let file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .map_err(|e| format!("{}: {e}", log.display()))?;
    let out = file
        .try_clone()
        .map_err(|e| format!("{}: {e}", log.display()))?;
    let child = Command::new(bin)
        .args(args)
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(file)
        .process_group(0)
        .spawn()
        .map_err(|e| format!("starting {}: {e}", bin.display()))?;
    Ok(child.id())
}

fn loopback() -> String {
    format!("127.0.0.1:{}", free_port())
}

/// A free loopback address for each of `roles`.
fn listen_on(roles: &[&str]) -> BTreeMap<String, String> {
    roles
        .iter()
        .map(|role| (role.to_string(), loopback()))
        .collect()
}

/// `--<role>-addr <addr>` for each address: how the cell and the proxy
/// take them.
fn addr_flags(addrs: &BTreeMap<String, String>) -> Vec<String> {
    addrs
        .iter()
        .flat_map(|(role, addr)| [format!("--{role}-addr"), addr.clone()])
        .collect()
}

async fn start_latchkey(args: &UpArgs, state: &mut ClusterState) -> Result<(), String> {
    let cell_bin = args.bins.cell()?;
    let proxy_bin = args.bins.proxy()?;
    if args.cpu_quota.is_some_and(|c| !(c > 0.0 && c <= 64.0)) {
        return Err("--cpu-quota is in cores, above 0 and at most 64".into());
    }
    // The members admit, and the proxies present, one key for latchkey's
    // own records.
    let key_file = state.dir.join("proxy.key");
    latchkey_shared::auth::proxy_key::create_or_read(&key_file).map_err(|e| e.to_string())?;
    let key_file = path_arg(&key_file)?;
    let mut groups: Vec<Vec<String>> = Vec::new();
    for g in 1..=args.cell_groups {
        let name = |id: usize| match g {
            1 => format!("cell-{id}"),
            _ => format!("cellg{g}-{id}"),
        };
        let members: Vec<BTreeMap<String, String>> = (0..args.cells)
            .map(|_| listen_on(&["client", "peer", "metrics"]))
            .collect();
        let initial_cluster = members
            .iter()
            .enumerate()
            .map(|(i, m)| format!("{}={}", i + 1, m["peer"]))
            .collect::<Vec<_>>()
            .join(",");
        let mut started = Vec::new();
        for (i, addrs) in members.iter().enumerate() {
            let id = i + 1;
            let mut argv: Vec<String> = vec![
                "--proxy-key-file".into(),
                key_file.clone(),
                "--id".into(),
                id.to_string(),
                "--initial-cluster".into(),
                initial_cluster.clone(),
                "--data-dir".into(),
                path_arg(&state.dir.join(name(id)))?,
            ];
            argv.extend(addr_flags(addrs));
            argv.extend(args.bins.cell_arg.iter().cloned());
            started.push(launch(state, &cell_bin, name(id), argv, addrs.clone())?);
        }
        if let Some(cores) = args.cpu_quota {
            let pids: Vec<u32> = started.iter().map(|p| p.pid).collect();
            let group = cpu_cgroup(
                &format!("latchkey-loadtest-{}-g{g}", std::process::id()),
                cores,
                &pids,
            )?;
            state.cgroups.push(group);
        }
        for p in &started {
            wait_ready(p, &p.addrs["metrics"], args.ready_timeout).await?;
        }
        groups.push(members.iter().map(|m| m["client"].clone()).collect());
    }
    let cells = groups[0].join(",");
    let mut first_http = None;
    for n in 1..=args.proxies.unwrap_or(2) {
        let addrs = listen_on(&["http", "grpc", "metrics"]);
        let mut argv: Vec<String> = vec![
            "--proxy-key-file".into(),
            key_file.clone(),
            "--cells".into(),
            cells.clone(),
            "--data-dir".into(),
            path_arg(&state.dir.join(format!("proxy-{n}")))?,
        ];
        argv.extend(addr_flags(&addrs));
        argv.extend(args.bins.proxy_arg.iter().cloned());
        let p = launch(state, &proxy_bin, format!("proxy-{n}"), argv, addrs)?;
        wait_ready(&p, &p.addrs["http"], args.ready_timeout).await?;
        first_http.get_or_insert(p.addrs["http"].clone());
    }
    if groups.len() > 1 {
        let http = first_http.ok_or("--cell-groups needs a proxy to change the directory")?;
        for (i, members) in groups.iter().enumerate().skip(1) {
            let cell = format!("cell{}", i + 1);
            let body = serde_json::json!({ "endpoints": members }).to_string();
            directory_change(&http, &format!("/v1/admin/directory/cells/{cell}"), &body).await?;
            let body = serde_json::json!({ "prefix": format!("loadtest/cell-{i}/"), "cell": cell })
                .to_string();
            directory_change(&http, "/v1/admin/directory/prefixes", &body).await?;
        }
    }
    Ok(())
}

/// A `PUT` of the directory through the proxy at `http`.
async fn directory_change(http: &str, path: &str, body: &str) -> Result<(), String> {
    let resp = reqwest::Client::new()
        .put(format!("http://{http}{path}"))
        .header("content-type", "application/json")
        .body(body.to_string())
        .timeout(Duration::from_secs(30))
        .send()
        .await
        .map_err(|e| format!("PUT {path}: {e}"))?;
    if resp.status().is_success() {
        return Ok(());
    }
    let status = resp.status();
    Err(format!(
        "PUT {path}: {status} {}",
        resp.text().await.unwrap_or_default()
    ))
}

/// A cgroup named `name` holding `pids`, limited to `cores` of CPU: v1's
/// `cpu` controller where it is mounted, else v2's `cpu.max`.
fn cpu_cgroup(name: &str, cores: f64, pids: &[u32]) -> Result<PathBuf, String> {
    let period = 100_000u64;
    let quota = ((cores * period as f64) as u64).max(1_000);
    let v1 = Path::new("/sys/fs/cgroup/cpu");
    let (dir, files): (PathBuf, Vec<(&str, String)>) = if v1.join("cpu.cfs_quota_us").exists() {
        (
            v1.join(name),
            vec![
                ("cpu.cfs_period_us", period.to_string()),
                ("cpu.cfs_quota_us", quota.to_string()),
            ],
        )
    } else {
        (
            Path::new("/sys/fs/cgroup").join(name),
            vec![("cpu.max", format!("{quota} {period}"))],
        )
    };
    let fail = |what: &str, e: std::io::Error| {
        format!(
            "--cpu-quota: {what} {}: {e} (root and a cgroup cpu controller are needed)",
            dir.display()
        )
    };
    std::fs::create_dir_all(&dir).map_err(|e| fail("making", e))?;
    for (file, value) in files {
        std::fs::write(dir.join(file), value).map_err(|e| fail(file, e))?;
    }
    for pid in pids {
        std::fs::write(dir.join("cgroup.procs"), pid.to_string())
            .map_err(|e| fail("cgroup.procs of", e))?;
    }
    Ok(dir)
}

/// Removes the cgroups `up` made (their processes have stopped).
fn remove_cgroups(groups: &[PathBuf]) {
    for group in groups {
        if let Err(e) = std::fs::remove_dir(group) {
            eprintln!("cluster: removing {}: {e}", group.display());
        }
    }
}

async fn start_etcd(args: &UpArgs, state: &mut ClusterState) -> Result<(), String> {
    let members: Vec<BTreeMap<String, String>> = (0..args.cells)
        .map(|_| listen_on(&["client", "peer"]))
        .collect();
    let initial = members
        .iter()
        .enumerate()
        .map(|(i, m)| format!("etcd-{}=http://{}", i + 1, m["peer"]))
        .collect::<Vec<_>>()
        .join(",");
    let token = format!("latchkey-loadtest-{}", std::process::id());
    for (i, addrs) in members.iter().enumerate() {
        let name = format!("etcd-{}", i + 1);
        let argv = etcd::member_args(
            &name,
            &state.dir.join(&name),
            &addrs["client"],
            &addrs["peer"],
            &initial,
            &token,
        );
        launch(state, &args.etcd_bin, name, argv, addrs.clone())?;
    }
    let endpoints = state.addrs("client");
    let first = state.processes[0].clone();
    eventually_or(args.ready_timeout, &first, async || {
        etcd::first_write(&endpoints).await
    })
    .await?;
    for n in 1..=args.proxies.unwrap_or(0) {
        let addrs = listen_on(&["grpc"]);
        let argv = etcd::grpc_proxy_args(
            &state.dir.join(format!("proxy-{n}")),
            &addrs["grpc"],
            &endpoints,
        );
        let p = launch(state, &args.etcd_bin, format!("proxy-{n}"), argv, addrs)?;
        let through = vec![p.addrs["grpc"].clone()];
        eventually_or(args.ready_timeout, &p, async || {
            etcd::first_write(&through).await
        })
        .await?;
    }
    Ok(())
}

fn path_arg(p: &Path) -> Result<String, String> {
    p.to_str()
        .map(String::from)
        .ok_or_else(|| format!("{} is not UTF-8", p.display()))
}

/// Spawns one process of the cluster and records it.
fn launch(
    state: &mut ClusterState,
    bin: &Path,
    name: String,
    argv: Vec<String>,
    addrs: BTreeMap<String, String>,
) -> Result<Proc, String> {
    let log = state.dir.join(format!("{name}.log"));
    let pid = spawn(bin, &argv, &log)?;
    let p = Proc {
        name,
        pid,
        bin: bin.to_path_buf(),
        addrs,
        log,
        argv,
    };
    state.processes.push(p.clone());
    Ok(p)
}

/// Waits until `GET /readyz` at `addr` answers 200.
pub async fn wait_ready(p: &Proc, addr: &str, within: Duration) -> Result<(), String> {
    eventually_or(within, p, async || match http_get(addr, "/readyz").await {
        Some(r) if r.starts_with("HTTP/1.1 200") => Ok(()),
        Some(r) => Err(r.lines().next().unwrap_or_default().to_string()),
        None => Err("no answer".to_string()),
    })
    .await
}

/// Calls `probe` until it succeeds, for at most `within`; the error names
/// `p` and its log's last lines, and comes at once if `p` has exited.
async fn eventually_or(
    within: Duration,
    p: &Proc,
    mut probe: impl AsyncFnMut() -> Result<(), String>,
) -> Result<(), String> {
    let outcome = poll_until(within, async || {
        if !is_ours(p) {
            return Ok(Err(format!("{} exited", p.name)));
        }
        probe().await.map(Ok)
    })
    .await;
    let why = match outcome {
        Ok(Ok(())) => return Ok(()),
        Ok(Err(exited)) => exited,
        Err(not_yet) => not_yet,
    };
    let log = std::fs::read_to_string(&p.log).unwrap_or_default();
    let lines: Vec<&str> = log.lines().collect();
    let tail = lines[lines.len().saturating_sub(10)..].join("\n");
    // The log goes with the cluster's directory when `up` gives up.
    Err(format!(
        "{} not ready ({why}); the end of its log:\n{tail}",
        p.name
    ))
}

fn print_state(state: &ClusterState, file: &Path) {
    for p in &state.processes {
        let addrs: Vec<String> = p.addrs.iter().map(|(r, a)| format!("{r} {a}")).collect();
        println!("{:<8} pid {:<7} {}", p.name, p.pid, addrs.join("  "));
    }
    println!("data and logs: {}", state.dir.display());
    println!(
        "state: {} (`latchkey-loadtest cluster down` stops it)",
        file.display()
    );
    let summary = serde_json::json!({
        "cells": state.addrs("client"),
        "http": state.addrs("http"),
        "grpc": state.addrs("grpc"),
        "dir": state.dir,
        "state": file,
    });
    println!("{summary}");
}

fn write_state(file: &Path, state: &ClusterState) -> Result<(), String> {
    let text = serde_json::to_string_pretty(state).map_err(|e| e.to_string())?;
    std::fs::write(file, text).map_err(|e| format!("writing {}: {e}", file.display()))
}

pub fn read_state(file: &Path) -> Result<ClusterState, String> {
    let text = std::fs::read_to_string(file).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => format!(
            "no cluster is up: there is no state file at {} (`cluster up` writes it)",
            file.display()
        ),
        _ => format!("reading {}: {e}", file.display()),
    })?;
    serde_json::from_str(&text)
        .map_err(|e| format!("{} is not a cluster state: {e}", file.display()))
}

/// Whether `p` still runs: its pid is alive and runs `p.bin` (a pid the
/// system gave to another program since is not ours to stop).
fn is_ours(p: &Proc) -> bool {
    let Ok(exe) = std::fs::read_link(format!("/proc/{}/exe", p.pid)) else {
        return false;
    };
    let zombie = std::fs::read_to_string(format!("/proc/{}/stat", p.pid))
        .ok()
        .and_then(|s| {
            s.rsplit_once(')')
                .map(|(_, rest)| rest.trim_start().starts_with('Z'))
        })
        .unwrap_or(false);
    // A binary rebuilt since it started reads "<path> (deleted)".
    let exe = exe.to_string_lossy();
    let exe = exe.trim_end_matches(" (deleted)");
    let same = Path::new(exe).file_name() == p.bin.file_name();
    same && !zombie
}

pub fn signal(pid: u32, signal: &str) {
    let _ = Command::new("kill")
        .args([format!("-{signal}"), pid.to_string()])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
}

/// How long stopped processes get to exit after SIGTERM before SIGKILL.
const STOP_GRACE: Duration = Duration::from_secs(10);

/// Stops every process of `procs` that is still ours; returns how many
/// were running.
async fn stop(procs: &[Proc]) -> usize {
    let running: Vec<&Proc> = procs.iter().filter(|p| is_ours(p)).collect();
    for p in &running {
        signal(p.pid, "TERM");
    }
    let deadline = tokio::time::Instant::now() + STOP_GRACE;
    while running.iter().any(|p| is_ours(p)) && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    for p in running.iter().filter(|p| is_ours(p)) {
        signal(p.pid, "KILL");
    }
    let deadline = tokio::time::Instant::now() + Duration::from_secs(2);
    while running.iter().any(|p| is_ours(p)) && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    running.len()
}

/// Starts the process `name` of the cluster in `file` again as it was
/// started (binary, arguments, log) and records its new pid.
pub fn restart(file: &Path, name: &str) -> Result<u32, String> {
    let mut state = read_state(file)?;
    let p = state
        .processes
        .iter_mut()
        .find(|p| p.name == name)
        .ok_or_else(|| format!("{name} is not in {}", file.display()))?;
    if is_ours(p) {
        return Err(format!("{name} still runs (pid {})", p.pid));
    }
    if p.argv.is_empty() {
        return Err(format!(
            "{name} was started by an older `cluster up` that did not record its arguments"
        ));
    }
    p.pid = spawn(&p.bin, &p.argv, &p.log)?;
    let pid = p.pid;
    write_state(file, &state)?;
    Ok(pid)
}

async fn down(file: &Path) -> Result<(), String> {
    let state = read_state(file)?;
    let stopped = stop(&state.processes).await;
    let left: Vec<String> = state
        .processes
        .iter()
        .filter(|p| is_ours(p))
        .map(|p| format!("{} (pid {})", p.name, p.pid))
        .collect();
    if !left.is_empty() {
        return Err(format!(
            "still running after SIGKILL: {}; state kept in {}",
            left.join(", "),
            file.display()
        ));
    }
    remove_cgroups(&state.cgroups);
    std::fs::remove_dir_all(&state.dir)
        .or_else(|e| match e.kind() {
            std::io::ErrorKind::NotFound => Ok(()),
            _ => Err(e),
        })
        .map_err(|e| format!("removing {}: {e}", state.dir.display()))?;
    std::fs::remove_file(file).map_err(|e| format!("removing {}: {e}", file.display()))?;
    println!(
        "stopped {stopped} of {} processes; removed {}",
        state.processes.len(),
        state.dir.display()
    );
    Ok(())
}
