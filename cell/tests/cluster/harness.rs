//! Real `latchkey-cell` processes on 127.0.0.1 for integration tests.
//!
//! A [`Cluster`] owns its processes and temporary data directories: dropping
//! it SIGKILLs every process and removes the directories, so a failing test
//! leaves nothing behind. Every wait is bounded.

use etcd_client::{Client, ConnectOptions};
use latchkey_shared::etcdpb::{PbLeaseKeepAliveRequest, PbLeaseKeepAliveResponse};
use std::collections::BTreeMap;
use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use tonic::codegen::http::uri::PathAndQuery;

pub const CELL_BIN: &str = env!("CARGO_BIN_EXE_latchkey-cell");

/// Ports handed out so far in this test process, so parallel tests never
/// pick the same free port twice.
static NEXT_PORT: std::sync::Mutex<u16> = std::sync::Mutex::new(0);

/// A free port on 127.0.0.1 (checked by binding it).
pub fn free_port() -> u16 {
    let mut next = NEXT_PORT.lock().unwrap_or_else(|e| e.into_inner());
    if *next == 0 {
        // Start from a spread based on the pid so concurrent test binaries
        // rarely collide; the bind check below settles the rest.
        *next = 20_000 + (std::process::id() % 20_000) as u16;
    }
    loop {
        *next = if *next >= 60_000 { 20_000 } else { *next + 1 };
        if TcpListener::bind(("127.0.0.1", *next)).is_ok() {
            return *next;
        }
    }
}

#[derive(Debug, Clone)]
pub struct MemberSpec {
    pub id: u64,
    pub client: String,
    pub peer: String,
    pub metrics: String,
    pub data_dir: PathBuf,
    /// Client URLs to `--join` (a member added to a running cell) instead
    /// of bootstrapping with `--initial-cluster`.
    pub join: Option<String>,
}

pub struct Cluster {
    pub members: Vec<MemberSpec>,
    procs: BTreeMap<u64, Child>,
    initial_cluster: String,
    extra_args: Vec<String>,
    _dir: tempfile::TempDir,
}

impl Cluster {
    /// Starts `n` members with extra flags for every member.
    pub async fn start(n: usize, extra_args: &[&str]) -> Cluster {
        let dir = tempfile::tempdir().expect("temp dir");
        let members: Vec<MemberSpec> = (1..=n as u64)
            .map(|id| MemberSpec {
                id,
                client: format!("127.0.0.1:{}", free_port()),
                peer: format!("127.0.0.1:{}", free_port()),
                metrics: format!("127.0.0.1:{}", free_port()),
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
            procs: BTreeMap::new(),
            initial_cluster,
            extra_args: extra_args.iter().map(|s| s.to_string()).collect(),
            _dir: dir,
        };
        for id in 1..=n as u64 {
            cluster.spawn(id);
        }
        cluster.wait_leader(Duration::from_secs(20)).await;
        cluster
    }

    /// Addresses for a new member that will join this running cell; the
    /// id is the one MemberAdd returned. Start it with [`Cluster::spawn`].
    pub fn new_joiner(&mut self, id: u64, peer: String) -> MemberSpec {
        let join = self
            .members
            .iter()
            .map(|m| format!("http://{}", m.client))
            .collect::<Vec<_>>()
            .join(",");
        let spec = MemberSpec {
            id,
            client: format!("127.0.0.1:{}", free_port()),
            peer,
            metrics: format!("127.0.0.1:{}", free_port()),
            data_dir: self._dir.path().join(format!("m{id}")),
            join: Some(join),
        };
        self.members.push(spec.clone());
        spec
    }

    pub fn member(&self, id: u64) -> &MemberSpec {
        self.members
            .iter()
            .find(|m| m.id == id)
            .expect("known member")
    }

    /// Starts (or restarts) member `id` with its data directory.
    pub fn spawn(&mut self, id: u64) {
        let m = self.member(id).clone();
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self._dir.path().join(format!("m{id}.log")))
            .or_else(|_| std::fs::File::create("/dev/null"))
            .expect("log file");
        let mut cmd = Command::new(CELL_BIN);
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
            .args(&self.extra_args)
            .stdin(Stdio::null())
            .stdout(log.try_clone().map_or_else(|_| Stdio::null(), Stdio::from))
            .stderr(log)
            .spawn()
            .expect("spawn latchkey-cell");
        self.procs.insert(id, child);
    }

    /// SIGKILLs member `id` (no chance to flush or say goodbye).
    pub fn kill(&mut self, id: u64) {
        if let Some(mut child) = self.procs.remove(&id) {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// SIGTERMs every member and waits for them to exit.
    pub fn stop_all(&mut self) {
        for (_, child) in self.procs.iter_mut() {
            let _ = Command::new("kill")
                .args(["-TERM", &child.id().to_string()])
                .status();
        }
        let deadline = Instant::now() + Duration::from_secs(10);
        for (_, mut child) in std::mem::take(&mut self.procs) {
            while Instant::now() < deadline {
                if let Ok(Some(_)) = child.try_wait() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Sends `signal` ("STOP", "CONT", ...) to every running member.
    pub fn signal_all(&self, signal: &str) {
        for child in self.procs.values() {
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

    pub fn running(&self) -> Vec<u64> {
        self.procs.keys().copied().collect()
    }

    /// An etcd client connected to member `id` only.
    pub async fn client(&self, id: u64) -> Client {
        let endpoint = format!("http://{}", self.member(id).client);
        let opts = ConnectOptions::new()
            .with_timeout(Duration::from_secs(10))
            .with_connect_timeout(Duration::from_secs(2));
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            match Client::connect([endpoint.as_str()], Some(opts.clone())).await {
                Ok(c) => return c,
                Err(e) if Instant::now() < deadline => {
                    let _ = e;
                    tokio::time::sleep(Duration::from_millis(100)).await
                }
                Err(e) => panic!("cannot connect to member {id}: {e}"),
            }
        }
    }

    /// The leader as seen by member `id`, if it knows one.
    pub async fn leader_seen_by(&self, id: u64) -> Option<u64> {
        let endpoint = format!("http://{}", self.member(id).client);
        let opts = ConnectOptions::new()
            .with_timeout(Duration::from_secs(1))
            .with_connect_timeout(Duration::from_millis(500));
        let mut c = Client::connect([endpoint.as_str()], Some(opts))
            .await
            .ok()?;
        let status = c.status().await.ok()?;
        (status.leader() != 0).then_some(status.leader())
    }

    /// Waits until every running member agrees on one leader that is running.
    pub async fn wait_leader(&self, timeout: Duration) -> u64 {
        let deadline = Instant::now() + timeout;
        loop {
            let mut seen = Vec::new();
            for id in self.running() {
                seen.push(self.leader_seen_by(id).await);
            }
            if let Some(Some(leader)) = seen.first() {
                if seen.iter().all(|s| s == &Some(*leader)) && self.procs.contains_key(leader) {
                    return *leader;
                }
            }
            assert!(
                Instant::now() < deadline,
                "no agreed leader within {timeout:?}: {seen:?}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Fetches `/metrics` of member `id`.
    pub async fn metrics(&self, id: u64) -> String {
        http_get(&self.member(id).metrics, "/metrics")
            .await
            .unwrap_or_default()
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        // Stopped members must run again to die cleanly.
        self.signal_all("CONT");
        // A failing test shows what the members logged last.
        if std::thread::panicking() {
            for m in &self.members {
                let path = self._dir.path().join(format!("m{}.log", m.id));
                let log = std::fs::read_to_string(&path).unwrap_or_default();
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

/// A minimal HTTP/1.1 GET on loopback, for /metrics and /healthz.
pub async fn http_get(addr: &str, path: &str) -> Option<String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::time::timeout(Duration::from_secs(2), tokio::net::TcpStream::connect(addr))
        .await
        .ok()?
        .ok()?;
    let req = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    s.write_all(req.as_bytes()).await.ok()?;
    let mut buf = Vec::new();
    tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut buf))
        .await
        .ok()?
        .ok()?;
    Some(String::from_utf8_lossy(&buf).into_owned())
}

/// An etcd-client error as "Code: message", the way tests compare them.
pub fn err_text(e: etcd_client::Error) -> String {
    match e {
        etcd_client::Error::GRpcStatus(s) => format!("{:?}: {}", s.code(), s.message()),
        other => other.to_string(),
    }
}

/// One `LeaseKeepAlive` stream that refreshes many leases, the way a proxy
/// does (etcd-client opens one stream per lease).
pub struct KeepAliveStream {
    tx: tokio::sync::mpsc::Sender<PbLeaseKeepAliveRequest>,
    rx: tonic::Streaming<PbLeaseKeepAliveResponse>,
}

impl KeepAliveStream {
    pub async fn open(addr: &str) -> Result<KeepAliveStream, String> {
        let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
            .map_err(|e| e.to_string())?
            .connect_timeout(Duration::from_secs(2))
            .connect()
            .await
            .map_err(|e| e.to_string())?;
        let mut grpc = tonic::client::Grpc::new(channel);
        grpc.ready().await.map_err(|e| e.to_string())?;
        let (tx, rx) = tokio::sync::mpsc::channel(16_384);
        let codec =
            tonic_prost::ProstCodec::<PbLeaseKeepAliveRequest, PbLeaseKeepAliveResponse>::default();
        let path = PathAndQuery::from_static("/etcdserverpb.Lease/LeaseKeepAlive");
        let resp = grpc
            .streaming(
                tonic::Request::new(tokio_stream::wrappers::ReceiverStream::new(rx)),
                path,
                codec,
            )
            .await
            .map_err(|e| e.to_string())?;
        Ok(KeepAliveStream {
            tx,
            rx: resp.into_inner(),
        })
    }

    /// Refreshes every lease in `ids`; returns the TTL reported for each.
    pub async fn refresh_all(
        &mut self,
        ids: &[i64],
        timeout: Duration,
    ) -> Result<BTreeMap<i64, i64>, String> {
        let deadline = tokio::time::Instant::now() + timeout;
        let sender = self.tx.clone();
        let to_send: Vec<i64> = ids.to_vec();
        let send = tokio::spawn(async move {
            for id in to_send {
                if sender.send(PbLeaseKeepAliveRequest { id }).await.is_err() {
                    break;
                }
            }
        });
        let mut out = BTreeMap::new();
        while out.len() < ids.len() {
            match tokio::time::timeout_at(deadline, self.rx.message()).await {
                Ok(Ok(Some(r))) => {
                    out.insert(r.id, r.ttl);
                }
                Ok(Ok(None)) => return Err("keep-alive stream ended".into()),
                Ok(Err(status)) => return Err(format!("keep-alive stream failed: {status}")),
                Err(_) => {
                    return Err(format!(
                        "only {} of {} keep-alives answered in time",
                        out.len(),
                        ids.len()
                    ))
                }
            }
        }
        let _ = send.await;
        Ok(out)
    }
}

/// A client of the cell's batched refresh extension: one stream, one
/// request per round naming every lease.
pub struct Refresher {
    tx: tokio::sync::mpsc::Sender<latchkey_shared::sessions_pb::RefreshRequest>,
    rx: tonic::Streaming<latchkey_shared::sessions_pb::RefreshResponse>,
    batch: u64,
}

impl Refresher {
    pub async fn open(addr: &str) -> Result<Refresher, String> {
        use latchkey_shared::sessions_pb::sessions_client::SessionsClient;
        let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
            .map_err(|e| e.to_string())?
            .connect_timeout(Duration::from_secs(2))
            .connect()
            .await
            .map_err(|e| e.to_string())?;
        let (tx, rx) = tokio::sync::mpsc::channel(4);
        let rx = SessionsClient::new(channel)
            .max_decoding_message_size(64 << 20)
            .max_encoding_message_size(64 << 20)
            .refresh(tokio_stream::wrappers::ReceiverStream::new(rx))
            .await
            .map_err(|e| e.to_string())?
            .into_inner();
        Ok(Refresher { tx, rx, batch: 0 })
    }

    /// Refreshes `ids` in one request: per id its TTL, or -1 if gone.
    pub async fn refresh(&mut self, ids: &[i64]) -> Result<Vec<i64>, String> {
        self.batch += 1;
        let req = latchkey_shared::sessions_pb::RefreshRequest {
            batch: self.batch,
            ids: ids.to_vec(),
        };
        self.tx.send(req).await.map_err(|e| e.to_string())?;
        let resp = tokio::time::timeout(Duration::from_secs(10), self.rx.message())
            .await
            .map_err(|_| "no answer in 10 s".to_string())?
            .map_err(|e| e.to_string())?
            .ok_or("the refresh stream ended")?;
        if resp.batch != self.batch {
            return Err(format!("answer to batch {} for {}", resp.batch, self.batch));
        }
        Ok(resp.ttls)
    }
}

/// Puts one key `prefix{lease:x}` per lease, 128 puts per txn.
pub async fn attach_keys(client: &Client, prefix: &str, leases: &[i64]) {
    use etcd_client::{PutOptions, Txn, TxnOp};
    use futures::StreamExt;
    let txns: Vec<Txn> = leases
        .chunks(128)
        .map(|chunk| {
            Txn::new().and_then(
                chunk
                    .iter()
                    .map(|id| {
                        TxnOp::put(
                            format!("{prefix}{id:x}"),
                            "x",
                            Some(PutOptions::new().with_lease(*id)),
                        )
                    })
                    .collect::<Vec<_>>(),
            )
        })
        .collect();
    let results: Vec<_> = futures::stream::iter(txns)
        .map(|t| {
            let mut c = client.clone();
            async move { c.txn(t).await }
        })
        .buffer_unordered(32)
        .collect()
        .await;
    if let Some(Err(e)) = results.iter().find(|r| r.is_err()) {
        panic!("attaching keys failed: {e}");
    }
}

/// Grants `n` leases with keys `prefix{id:x}` while refreshing, every
/// second through `refresher`, every lease granted so far, so none expires
/// before the caller takes over (granting 100 000 takes longer than a TTL).
pub async fn grant_kept_alive(
    client: &Client,
    refresher: &mut Refresher,
    n: usize,
    ttl: i64,
    prefix: &str,
) -> Vec<i64> {
    use futures::StreamExt;
    let granted = std::sync::Arc::new(std::sync::Mutex::new(Vec::with_capacity(n)));
    let grants = tokio::spawn({
        let client = client.clone();
        let granted = granted.clone();
        async move {
            futures::stream::iter(0..n)
                .map(|_| {
                    let mut c = client.clone();
                    let granted = granted.clone();
                    async move {
                        let id = c.lease_grant(ttl, None).await.expect("grant").id();
                        granted.lock().unwrap_or_else(|e| e.into_inner()).push(id);
                    }
                })
                .buffer_unordered(64)
                .collect::<Vec<()>>()
                .await;
        }
    });
    let granted_so_far = || granted.lock().unwrap_or_else(|e| e.into_inner()).clone();
    keep_alive_until_done(&grants, refresher, granted_so_far, "granting").await;
    grants.await.expect("granted");
    let leases = granted.lock().unwrap_or_else(|e| e.into_inner()).clone();
    let attach = tokio::spawn({
        let client = client.clone();
        let prefix = prefix.to_string();
        let leases = leases.clone();
        async move { attach_keys(&client, &prefix, &leases).await }
    });
    keep_alive_until_done(&attach, refresher, || leases.clone(), "attaching keys").await;
    attach.await.expect("keys attached");
    leases
}

/// Refreshes `ids()` every second until `task` finishes; every lease must
/// still be alive each time.
async fn keep_alive_until_done<T>(
    task: &tokio::task::JoinHandle<T>,
    refresher: &mut Refresher,
    ids: impl Fn() -> Vec<i64>,
    what: &str,
) {
    while !task.is_finished() {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let ttls = refresher
            .refresh(&ids())
            .await
            .unwrap_or_else(|e| panic!("refresh while {what}: {e}"));
        assert!(ttls.iter().all(|t| *t > 0), "a lease expired while {what}");
    }
}
