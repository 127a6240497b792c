//! A cluster of real etcd processes (Debian's `etcd-server`) on 127.0.0.1:
//! the reference a latchkey cell is measured and compared against.
//!
//! Like [`crate::Cluster`], an [`EtcdCluster`] owns its processes and
//! temporary data directories: dropping it SIGKILLs them and removes the
//! directories.

use crate::eventually::eventually;
use crate::ports::free_port;
use etcd_client::{Client, ConnectOptions};
use std::process::{Child, Command, Stdio};
use tokio::time::Duration;

/// How long [`EtcdCluster::start`] waits until a write succeeds.
const READY_WITHIN: Duration = Duration::from_secs(30);

pub struct EtcdCluster {
    /// Each member's client address, `127.0.0.1:port`, in member order.
    pub clients: Vec<String>,
    procs: Vec<Child>,
    dir: tempfile::TempDir,
}

impl EtcdCluster {
    /// Starts `n` members of the `etcd` binary `bin` and waits until the
    /// cluster accepts a write.
    pub async fn start(bin: &str, n: usize) -> EtcdCluster {
        let dir = tempfile::tempdir().expect("temp dir");
        let ports: Vec<(u16, u16)> = (0..n).map(|_| (free_port(), free_port())).collect();
        let initial = ports
            .iter()
            .enumerate()
            .map(|(i, (_, peer))| format!("m{i}=http://127.0.0.1:{peer}"))
            .collect::<Vec<_>>()
            .join(",");
        let token = format!("latchkey-bench-{}", std::process::id());
        let mut procs = Vec::new();
        for (i, (client, peer)) in ports.iter().enumerate() {
            let log = std::fs::File::create(dir.path().join(format!("m{i}.log")))
                .or_else(|_| std::fs::File::create("/dev/null"))
                .expect("log file");
            let child = Command::new(bin)
                .args(member_args(
                    &format!("m{i}"),
                    &dir.path().join(format!("m{i}")),
                    &format!("127.0.0.1:{client}"),
                    &format!("127.0.0.1:{peer}"),
                    &initial,
                    &token,
                ))
                .args([
                    "--logger",
                    "zap",
                    "--log-outputs",
                    "stderr",
                    "--log-level",
                    "warn",
                ])
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(log)
                .spawn()
                .unwrap_or_else(|e| panic!("spawn {bin}: {e}"));
            procs.push(child);
        }
        let cluster = EtcdCluster {
            clients: ports
                .iter()
                .map(|(c, _)| format!("127.0.0.1:{c}"))
                .collect(),
            procs,
            dir,
        };
        let endpoints = cluster.clients.clone();
        eventually(READY_WITHIN, async || first_write(&endpoints).await).await;
        cluster
    }

    /// The process ids, in member order (to read their CPU time).
    pub fn pids(&self) -> Vec<u32> {
        self.procs.iter().map(Child::id).collect()
    }

    /// Where the members' data and logs are.
    pub fn dir(&self) -> &std::path::Path {
        self.dir.path()
    }
}

/// The arguments of etcd member `name` of a new cluster on loopback:
/// its data in `data_dir`, clients and peers at `client` and `peer`
/// (`ip:port`), the cluster's `--initial-cluster` and token.
pub fn member_args(
    name: &str,
    data_dir: &std::path::Path,
    client: &str,
    peer: &str,
    initial_cluster: &str,
    token: &str,
) -> Vec<String> {
    let client = format!("http://{client}");
    let peer = format!("http://{peer}");
    let data_dir = data_dir.to_string_lossy();
    [
        "--name",
        name,
        "--data-dir",
        &data_dir,
        "--listen-client-urls",
        &client,
        "--advertise-client-urls",
        &client,
        "--listen-peer-urls",
        &peer,
        "--initial-advertise-peer-urls",
        &peer,
        "--initial-cluster",
        initial_cluster,
        "--initial-cluster-state",
        "new",
        "--initial-cluster-token",
        token,
    ]
    .into_iter()
    .map(String::from)
    .collect()
}

/// The arguments of `etcd grpc-proxy start` in front of the members at
/// `endpoints`, serving gRPC at `listen`, its data (its lease and watch
/// state; nothing of the keyspace) under `data_dir`.
pub fn grpc_proxy_args(
    data_dir: &std::path::Path,
    listen: &str,
    endpoints: &[String],
) -> Vec<String> {
    vec![
        "grpc-proxy".into(),
        "start".into(),
        "--endpoints".into(),
        endpoints.join(","),
        "--listen-addr".into(),
        listen.into(),
        "--advertise-client-url".into(),
        listen.into(),
        "--data-dir".into(),
        data_dir.to_string_lossy().into_owned(),
    ]
}

/// One write to the etcd cluster at `endpoints`: `Ok` once it serves.
pub async fn first_write(endpoints: &[String]) -> Result<(), String> {
    let opts = ConnectOptions::new()
        .with_timeout(Duration::from_secs(2))
        .with_connect_timeout(Duration::from_millis(500));
    let mut c = Client::connect(endpoints, Some(opts))
        .await
        .map_err(|e| format!("connect: {e}"))?;
    c.put("etcd-cluster-ready", "", None)
        .await
        .map(|_| ())
        .map_err(|e| format!("a first write: {e}"))
}

impl Drop for EtcdCluster {
    fn drop(&mut self) {
        for child in &mut self.procs {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}
