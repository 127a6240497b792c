//! A cell of real `latchkey-cell` processes on 127.0.0.1.
//!
//! A [`Cluster`] owns its processes and temporary data directories:
//! dropping it SIGKILLs every process and removes the directories, so a
//! failing test leaves nothing behind, and a panicking test prints what
//! each member logged last.

use crate::certs::ClientIdentity;
use crate::eventually::eventually;
use crate::metrics::{http_get, metric_value};
use crate::ports::free_port;
use etcd_client::{Client, ConnectOptions, GetOptions};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use tokio::time::{sleep, Duration, Instant};

/// How long [`Cluster::start`] waits for the first leader. Three members
/// elect one in about a second; a starved 2-core machine needs more.
const FIRST_LEADER_WITHIN: Duration = Duration::from_secs(20);

/// The environment variable that names the `latchkey-cell` binary for
/// tests outside the cell crate.
pub const CELL_BIN_ENV: &str = "LATCHKEY_CELL_BIN";

/// The `latchkey-cell` binary for tests outside the cell crate, which
/// cargo gives no `CARGO_BIN_EXE_latchkey-cell`: `$LATCHKEY_CELL_BIN` if
/// set, else `latchkey-cell` in the target directory the running test
/// binary lives in (`target/debug/deps/..`), which `cargo build -p
/// latchkey-cell` fills. The cell's own tests pass
/// `env!("CARGO_BIN_EXE_latchkey-cell")` instead.
pub fn cell_binary() -> PathBuf {
    if let Some(path) = std::env::var_os(CELL_BIN_ENV) {
        return PathBuf::from(path);
    }
    let exe = std::env::current_exe().expect("the test binary's path");
    let profile_dir = exe
        .parent()
        .and_then(|deps| deps.parent())
        .expect("the test binary runs from target/<profile>/deps");
    let bin = profile_dir.join("latchkey-cell");
    assert!(
        bin.exists(),
        "{} is missing: run `cargo build -p latchkey-cell` or set {CELL_BIN_ENV}",
        bin.display()
    );
    bin
}

/// Where one member listens and keeps its data.
#[derive(Debug, Clone)]
pub struct MemberSpec {
    pub id: u64,
    /// The etcd API address, `127.0.0.1:port` (or another loopback address,
    /// see [`Cluster::start_apart`]).
    pub client: String,
    pub peer: String,
    /// `/metrics`, `/healthz` and `/readyz`.
    pub metrics: String,
    pub data_dir: PathBuf,
    /// Client URLs to `--join` (a member added to a running cell) instead
    /// of bootstrapping with `--initial-cluster`.
    pub join: Option<String>,
}

pub struct Cluster {
    /// Every member ever started, in id order of creation (joiners last).
    pub members: Vec<MemberSpec>,
    bin: PathBuf,
    procs: BTreeMap<u64, Child>,
    initial_cluster: String,
    extra_args: Vec<String>,
    leader_at_start: u64,
    dir: tempfile::TempDir,
    /// Members serve their client port over TLS and this is how the
    /// cluster's own clients dial them.
    client_tls: Option<ClientIdentity>,
}

impl Cluster {
    /// Starts `n` members (ids 1..=n) of the `latchkey-cell` binary `bin`,
    /// each with `extra_args`, and waits until they agree on a leader
    /// ([`Cluster::leader_at_start`]).
    pub async fn start(bin: impl Into<PathBuf>, n: usize, extra_args: &[&str]) -> Cluster {
        Cluster::start_on(bin, n, extra_args, |_| "127.0.0.1".to_string(), None).await
    }

    /// Like [`Cluster::start`], for members whose `extra_args` put their
    /// client port on TLS: the cluster's clients dial with `tls`.
    pub async fn start_tls(
        bin: impl Into<PathBuf>,
        n: usize,
        extra_args: &[&str],
        tls: ClientIdentity,
    ) -> Cluster {
        Cluster::start_on(bin, n, extra_args, |_| "127.0.0.1".to_string(), Some(tls)).await
    }

    /// Like [`Cluster::start`], but member `id` listens on (and dials its
    /// peers from) its own loopback address `127.0.0.{id + 1}`, so a
    /// firewall rule can tell members apart ([`crate::PeerBlackhole`]).
    pub async fn start_apart(bin: impl Into<PathBuf>, n: usize, extra_args: &[&str]) -> Cluster {
        Cluster::start_apart_after(bin, n, extra_args, 1).await
    }

    /// [`start_apart`](Self::start_apart) with member `id` on
    /// `127.0.0.{after + id}`: a second cell apart from the first (`after`
    /// past the first's addresses), so a rule between one cell's members
    /// touches no other cell's.
    pub async fn start_apart_after(
        bin: impl Into<PathBuf>,
        n: usize,
        extra_args: &[&str],
        after: u64,
    ) -> Cluster {
        Cluster::start_on(
            bin,
            n,
            extra_args,
            move |id| format!("127.0.0.{}", id + after),
            None,
        )
        .await
    }

    async fn start_on(
        bin: impl Into<PathBuf>,
        n: usize,
        extra_args: &[&str],
        ip_of: impl Fn(u64) -> String,
        client_tls: Option<ClientIdentity>,
    ) -> Cluster {
        let dir = tempfile::tempdir().expect("temp dir");
        let members: Vec<MemberSpec> = (1..=n as u64)
            .map(|id| MemberSpec {
                id,
                client: format!("{}:{}", ip_of(id), free_port()),
                peer: format!("{}:{}", ip_of(id), free_port()),
                metrics: format!("{}:{}", ip_of(id), free_port()),
                data_dir: dir.path().join(format!("m{id}")),
                join: None,
            })
            .collect();
        let initial_cluster = members
            .iter()
            .map(|m| format!("{}={}", m.id, m.peer))
            .collect::<Vec<_>>()
            .join(",");
        let mut cluster = Cluster {
            members,
            bin: bin.into(),
            procs: BTreeMap::new(),
            initial_cluster,
            extra_args: extra_args.iter().map(|s| s.to_string()).collect(),
            leader_at_start: 0,
            dir,
            client_tls,
        };
        for id in 1..=n as u64 {
            cluster.spawn(id);
        }
        cluster.leader_at_start = cluster.wait_leader(FIRST_LEADER_WITHIN).await;
        cluster
    }

    /// The leader every member agreed on when [`Cluster::start`] returned.
    /// Leadership may have moved since; [`Cluster::wait_leader`] tells the
    /// current one.
    pub fn leader_at_start(&self) -> u64 {
        self.leader_at_start
    }

    /// A follower of [`Cluster::leader_at_start`] (see
    /// [`Cluster::follower_of`]).
    pub fn follower(&self) -> u64 {
        self.follower_of(self.leader_at_start)
    }

    /// The running member with the lowest id other than `leader`.
    pub fn follower_of(&self, leader: u64) -> u64 {
        self.running()
            .into_iter()
            .find(|id| *id != leader)
            .unwrap_or_else(|| panic!("no running member other than {leader}"))
    }

    /// Addresses for a new member that will join this running cell; the
    /// id is the one MemberAdd returned. Start it with [`Cluster::spawn`].
    pub fn new_joiner(&mut self, id: u64, peer: String) -> MemberSpec {
        let spec = MemberSpec {
            id,
            client: format!("127.0.0.1:{}", free_port()),
            peer,
            metrics: format!("127.0.0.1:{}", free_port()),
            data_dir: self.dir.path().join(format!("m{id}")),
            join: Some(
                self.members
                    .iter()
                    .map(|m| self.url(m.id))
                    .collect::<Vec<_>>()
                    .join(","),
            ),
        };
        self.members.push(spec.clone());
        spec
    }

    pub fn member(&self, id: u64) -> &MemberSpec {
        self.members
            .iter()
            .find(|m| m.id == id)
            .unwrap_or_else(|| panic!("no member {id}"))
    }

    /// Every member's client URL (`http://127.0.0.1:port`), for clients
    /// that balance over the cell.
    pub fn endpoints(&self) -> Vec<String> {
        self.members
            .iter()
            .map(|m| format!("http://{}", m.client))
            .collect()
    }

    /// Every member's client address, comma-separated, as etcdctl's
    /// `--endpoints` takes them.
    pub fn client_addrs(&self) -> String {
        self.members
            .iter()
            .map(|m| m.client.as_str())
            .collect::<Vec<_>>()
            .join(",")
    }

    /// Starts (or restarts) member `id` with its data directory; its
    /// output is appended to a log that [`Drop`] prints if the test fails.
    pub fn spawn(&mut self, id: u64) {
        let m = self.member(id).clone();
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.log_path(id))
            .or_else(|_| std::fs::File::create("/dev/null"))
            .expect("log file");
        let mut cmd = Command::new(&self.bin);
        match &m.join {
            Some(join) => cmd.args(["--join", join]),
            None => cmd
                .args(["--id", &id.to_string()])
                .args(["--initial-cluster", &self.initial_cluster]),
        };
        let child = cmd
            .args(["--data-dir", m.data_dir.to_str().expect("utf-8 path")])
            .args([
                "--client-addr",
                &m.client,
                "--peer-addr",
                &m.peer,
                "--metrics-addr",
                &m.metrics,
            ])
            .args(self.args_for(&m))
            .args(crate::proxy_key::flag_unless_given(
                self.extra_args.iter().map(String::as_str),
            ))
            .stdin(Stdio::null())
            .stdout(log.try_clone().map_or_else(|_| Stdio::null(), Stdio::from))
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("spawn {}: {e}", self.bin.display()));
        self.procs.insert(id, child);
    }

    /// Replaces the extra arguments members are started with from now on.
    pub fn set_extra_args(&mut self, args: &[&str]) {
        self.extra_args = args.iter().map(|s| s.to_string()).collect();
    }

    /// The cluster's extra arguments for member `m`: a joiner takes its
    /// state from the cell, so it is never given `--restore FILE`.
    fn args_for(&self, m: &MemberSpec) -> Vec<String> {
        let mut args = Vec::new();
        let mut given = self.extra_args.iter();
        while let Some(arg) = given.next() {
            if m.join.is_some() && arg == "--restore" {
                given.next();
            } else {
                args.push(arg.clone());
            }
        }
        args
    }

    /// Where member `id`'s output goes (deleted with the cluster).
    pub fn log_path(&self, id: u64) -> PathBuf {
        self.dir.path().join(format!("m{id}.log"))
    }

    /// SIGKILLs member `id` (no chance to flush or say goodbye).
    pub fn kill(&mut self, id: u64) {
        if let Some(mut child) = self.procs.remove(&id) {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// SIGTERMs every member and waits (up to 10 s in all) for them to
    /// exit; a member still running then is SIGKILLed.
    pub async fn stop_all(&mut self) {
        self.signal_all("TERM");
        let deadline = Instant::now() + Duration::from_secs(10);
        for (_, mut child) in std::mem::take(&mut self.procs) {
            while !matches!(child.try_wait(), Ok(Some(_))) && Instant::now() < deadline {
                sleep(Duration::from_millis(20)).await;
            }
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Sends `signal` ("STOP", "CONT", "TERM", ...) to every running member.
    pub fn signal_all(&self, signal: &str) {
        for child in self.procs.values() {
            let _ = Command::new("kill")
                .args([format!("-{signal}"), child.id().to_string()])
                .status();
        }
    }

    /// Sends `signal` (a name such as `STOP` or `CONT`) to member `id`.
    pub fn signal(&self, id: u64, signal: &str) {
        if let Some(child) = self.procs.get(&id) {
            let _ = Command::new("kill")
                .args([format!("-{signal}"), child.id().to_string()])
                .status();
        }
    }

    /// Whether member `id`'s process has exited on its own.
    pub fn exited(&mut self, id: u64) -> bool {
        self.procs
            .get_mut(&id)
            .is_some_and(|c| matches!(c.try_wait(), Ok(Some(_))))
    }

    /// The process ids of the running members, in member order.
    pub fn pids(&self) -> Vec<u32> {
        self.procs.values().map(Child::id).collect()
    }

    /// The process id of member `id`, if it runs.
    pub fn pid(&self, id: u64) -> Option<u32> {
        self.procs.get(&id).map(Child::id)
    }

    /// The ids of the members this cluster runs, in order.
    pub fn running(&self) -> Vec<u64> {
        self.procs.keys().copied().collect()
    }

    /// Member `id`'s client URL (`https://` when the cluster is on TLS).
    pub fn url(&self, id: u64) -> String {
        let scheme = if self.client_tls.is_some() {
            "https"
        } else {
            "http"
        };
        format!("{scheme}://{}", self.member(id).client)
    }

    fn options(&self, opts: ConnectOptions) -> ConnectOptions {
        match &self.client_tls {
            Some(tls) => opts.with_tls(tls.options()),
            None => opts,
        }
    }

    /// An etcd client connected to member `id` only (retrying the connect
    /// for up to 15 s while the member starts listening).
    pub async fn client(&self, id: u64) -> Client {
        let endpoint = self.url(id);
        let opts = self.options(
            ConnectOptions::new()
                .with_timeout(Duration::from_secs(10))
                .with_connect_timeout(Duration::from_secs(2)),
        );
        eventually(Duration::from_secs(15), async || {
            Client::connect([endpoint.as_str()], Some(opts.clone()))
                .await
                .map_err(|e| format!("cannot connect to member {id}: {e}"))
        })
        .await
    }

    /// The leader as seen by member `id`, if it answers and knows one.
    pub async fn leader_seen_by(&self, id: u64) -> Option<u64> {
        let endpoint = self.url(id);
        let opts = self.options(
            ConnectOptions::new()
                .with_timeout(Duration::from_secs(1))
                .with_connect_timeout(Duration::from_millis(500)),
        );
        let mut c = Client::connect([endpoint.as_str()], Some(opts))
            .await
            .ok()?;
        let status = c.status().await.ok()?;
        (status.leader() != 0).then_some(status.leader())
    }

    /// Waits until every running member agrees on one leader that is
    /// running, and returns it.
    pub async fn wait_leader(&self, timeout: Duration) -> u64 {
        eventually(timeout, async || {
            let mut seen = Vec::new();
            for id in self.running() {
                seen.push((id, self.leader_seen_by(id).await));
            }
            match seen.first() {
                Some((_, Some(leader)))
                    if seen.iter().all(|(_, s)| *s == Some(*leader))
                        && self.procs.contains_key(leader) =>
                {
                    Ok(*leader)
                }
                _ => Err(format!("no agreed leader; (member, its leader): {seen:?}")),
            }
        })
        .await
    }

    /// Waits (up to 30 s) until member `id` holds every key of `expected`
    /// with its value in its own state (serializable reads), e.g. every
    /// acknowledged write after a restart.
    pub async fn wait_member_holds(
        &self,
        id: u64,
        prefix: &str,
        expected: &BTreeMap<String, String>,
    ) {
        let c = self.client(id).await;
        eventually(Duration::from_secs(30), async || {
            // A member just restarted may not answer yet: that is a retry.
            let got = c
                .clone()
                .get(
                    prefix,
                    Some(GetOptions::new().with_prefix().with_serializable()),
                )
                .await
                .map_err(|e| format!("member {id} does not answer: {e}"))?;
            let held: BTreeMap<&[u8], &[u8]> =
                got.kvs().iter().map(|kv| (kv.key(), kv.value())).collect();
            let missing: Vec<&String> = expected
                .iter()
                .filter(|(k, v)| held.get(k.as_bytes()) != Some(&v.as_bytes()))
                .map(|(k, _)| k)
                .collect();
            match missing.first() {
                None => Ok(()),
                Some(first) => Err(format!(
                    "member {id} lacks {} of {} expected keys under {prefix:?} (first {first:?})",
                    missing.len(),
                    expected.len()
                )),
            }
        })
        .await
    }

    /// The `/metrics` text of member `id` (empty if it does not answer).
    pub async fn metrics(&self, id: u64) -> String {
        http_get(&self.member(id).metrics, "/metrics")
            .await
            .unwrap_or_default()
    }

    /// One series of member `id`'s `/metrics` (see [`metric_value`]).
    pub async fn metric(&self, id: u64, series: &str) -> Option<f64> {
        metric_value(&self.metrics(id).await, series)
    }

    /// One series summed over the members that run (a member without it
    /// counts 0): what the cell as a whole has counted.
    pub async fn metric_sum(&self, series: &str) -> f64 {
        let mut sum = 0.0;
        for id in self.running() {
            sum += self.metric(id, series).await.unwrap_or(0.0);
        }
        sum
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        // Stopped members must run again to die cleanly.
        self.signal_all("CONT");
        // A failing test shows what the members logged last.
        if std::thread::panicking() {
            for m in &self.members {
                let log = std::fs::read_to_string(self.log_path(m.id)).unwrap_or_default();
                let tail: Vec<&str> = log.lines().rev().take(40).collect();
                eprintln!("---- member {} log (last {} lines) ----", m.id, tail.len());
                for line in tail.iter().rev() {
                    eprintln!("{line}");
                }
            }
        }
        for (_, mut child) in std::mem::take(&mut self.procs) {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}
