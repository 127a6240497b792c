//! A member as a library: [`Cell::start`] opens storage, starts Raft, the
//! servers and every background task, and returns a [`CellHandle`] that owns
//! them all; [`CellHandle::shutdown`] stops them and closes the database.
//! This file settles the member's identity (data directory, flags,
//! `--join`, `--restore`) and owns start and shutdown; `cell/assembly.rs`
//! holds the steps `start` takes.
//!
//! Nothing here is process-wide: tracing, the metrics recorder and signal
//! handling belong to whoever embeds the cell (`main.rs`, a proxy started
//! with `--dev`, a test), so several cells can live in one process.

mod assembly;
mod tls;

use crate::config::Resolved;
use crate::membership::discover_identity;
use crate::node::CellNode;
use crate::raft::log_store::{self, LogStore};
use crate::raft::{LogId, NodeId, Raft, StoredMembership};
use crate::state_machine::backup::{decode_state_file, state_file_digest};
use crate::state_machine::snapshot_file::has_snapshot;
use crate::state_machine::store::write_restored_state;
use anyhow::{bail, Context};
use latchkey_shared::lifecycle::Lifecycle;
use metrics_exporter_prometheus::PrometheusHandle;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::task::JoinHandle;
use tokio::time::Instant;

pub use assembly::Stopped;
use assembly::{
    bootstrap_if_new, initial_members, serve_admin, serve_api, serve_peers, spawn_jobs, start_raft,
    Listeners,
};

/// How long a server may take to finish in-flight requests at shutdown
/// before it is aborted: long enough for an answer already computed, short
/// enough that a stuck client cannot hold a restart.
const SERVER_GRACE: Duration = Duration::from_secs(3);
/// How long background tasks may take to notice shutdown.
const TASK_GRACE: Duration = Duration::from_secs(3);
/// How long to wait for Raft's tasks and the log flusher to let go of the
/// database once Raft has shut down.
const DB_RELEASE: Duration = Duration::from_secs(5);
/// How long a `--join`ing member keeps asking the cell for its identity
/// (MemberAdd may come just after the process starts).
const JOIN_TIMEOUT: Duration = Duration::from_secs(60);

/// How `--join` reaches the cell's client ports: plain text for `http://`
/// URLs; for `https://` ones, TLS trusting `--trusted-ca-file` and
/// presenting `--cert-file` (members of one cell share the client CA).
fn join_tls(cfg: &Resolved) -> anyhow::Result<Option<etcd_client::TlsOptions>> {
    let tls = cfg.join.iter().any(|url| url.starts_with("https://"));
    if !tls {
        return Ok(None);
    }
    if cfg.join.iter().any(|url| !url.starts_with("https://")) {
        bail!("--join: give every URL as https:// or none");
    }
    let flags = &cfg.cfg.tls;
    let read = |path: &std::path::Path| {
        std::fs::read(path).with_context(|| format!("--join over TLS: reading {}", path.display()))
    };
    let Some(ca) = &flags.trusted_ca_file else {
        bail!("--join https://...: --trusted-ca-file names the CA of the members' client ports");
    };
    let mut options = etcd_client::TlsOptions::new()
        .ca_certificate(etcd_client::Certificate::from_pem(read(ca)?));
    if let (Some(cert), Some(key)) = (&flags.cert_file, &flags.key_file) {
        options = options.identity(etcd_client::Identity::from_pem(read(cert)?, read(key)?));
    }
    Ok(Some(options))
}

/// Settles which member of which cell this is: what the data directory
/// records, else the flags, else (with `--join`) what the running cell says;
/// and applies `--restore` to a fresh directory.
async fn settle_identity(cfg: &mut Resolved, db: &rocksdb::DB) -> anyhow::Result<()> {
    let stored = log_store::stored_node_id(db)?;
    if let Some(file) = &cfg.cfg.restore {
        if stored.is_some() || has_snapshot(&cfg.data_dir) {
            bail!(
                "--restore needs an empty data directory, but {} already holds a member's data \
                 (to restart that member, leave out --restore)",
                cfg.data_dir.display()
            );
        }
        let bytes =
            std::fs::read(file).with_context(|| format!("reading --restore {}", file.display()))?;
        let mut state =
            decode_state_file(&bytes).with_context(|| format!("--restore {}", file.display()))?;
        let bump = cfg.cfg.restore_bump_revision;
        state.keys.bump_revision(bump as i64);
        tracing::info!(
            revision = state.keys.revision(),
            bumped_by = bump,
            keys = state.keys.live_keys(),
            leases = state.leases.len(),
            "restoring a new cell from a state file"
        );
        // The image sits where `initialize` would have put the first
        // membership, and the log starts after it.
        let at = LogId::default();
        let members = initial_members(cfg);
        let voters = members.keys().copied().collect();
        let membership = openraft::Membership::new(vec![voters], members);
        let stored = StoredMembership::new(Some(at), membership);
        write_restored_state(&cfg.data_dir, state, at, stored)?;
        log_store::mark_purged_through(db, at)?;
        // The bump is part of what the cell starts from: members given
        // different ones belong to different cells.
        let mut started_from = state_file_digest(&bytes).to_vec();
        if bump > 0 {
            started_from.extend_from_slice(&bump.to_le_bytes());
        }
        cfg.cluster_id = crate::ids::restored_cluster_id(cfg.cluster_id, &started_from);
    }
    let (id, cluster_id) = match stored {
        Some(stored) => {
            if cfg.id != 0 && stored != cfg.id {
                bail!(
                    "{} belongs to member {stored}, not {}",
                    cfg.data_dir.display(),
                    cfg.id
                );
            }
            let cluster_id = log_store::stored_cluster_id(db)?.unwrap_or(cfg.cluster_id);
            (stored, cluster_id)
        }
        None if !cfg.join.is_empty() => {
            let (id, cluster_id) = discover_identity(
                &cfg.join,
                cfg.cfg.advertised_peer_addr(),
                join_tls(&cfg)?,
                JOIN_TIMEOUT,
            )
            .await?;
            if cfg.id != 0 && cfg.id != id {
                bail!(
                    "--id {} but the cell added this peer address as member {id}",
                    cfg.id
                );
            }
            tracing::info!(id, cluster_id = %format!("{cluster_id:x}"), "joining a running cell");
            (id, cluster_id)
        }
        None => (cfg.id, cfg.cluster_id),
    };
    log_store::store_identity(db, id, cluster_id)?;
    cfg.id = id;
    cfg.cluster_id = cluster_id;
    if cfg.cfg.name.is_none() {
        cfg.name = format!("cell-{id}");
    }
    Ok(())
}

pub struct Cell;

/// A running member. Dropping it without [`CellHandle::shutdown`] leaves
/// its tasks running until the runtime ends.
pub struct CellHandle {
    pub id: NodeId,
    pub client_addr: SocketAddr,
    pub peer_addr: SocketAddr,
    pub metrics_addr: SocketAddr,
    node: Arc<CellNode>,
    raft: Raft,
    log: LogStore,
    lifecycle: Lifecycle,
    servers: Vec<JoinHandle<Result<(), String>>>,
    stopped: tokio::sync::watch::Receiver<Option<Stopped>>,
    db: std::sync::Weak<rocksdb::DB>,
}

impl Cell {
    /// Starts a member. `prometheus` renders `/metrics` when the embedding
    /// process installed a recorder.
    pub async fn start(
        mut cfg: Resolved,
        prometheus: Option<PrometheusHandle>,
    ) -> anyhow::Result<CellHandle> {
        // HELP text and units for `/metrics` (a no-op without a recorder).
        crate::metrics_catalog::describe();
        let addrs = Listeners::parse(&cfg)?;
        std::fs::create_dir_all(&cfg.data_dir)
            .with_context(|| format!("creating {}", cfg.data_dir.display()))?;
        let db = crate::storage::open(&cfg.data_dir)
            .with_context(|| format!("opening the log in {}", cfg.data_dir.display()))?;
        settle_identity(&mut cfg, &db).await?;
        let tls = tls::MemberTls::load(&cfg.cfg)?;
        let listeners = Listeners::bind(addrs, &tls).await?;
        let (client_addr, peer_addr, metrics_addr) = (
            listeners.client_addr,
            listeners.peer_addr,
            listeners.metrics_addr,
        );
        let started = start_raft(&cfg, &db, peer_addr, tls.peer_client).await?;
        let (node, raft, log) = (
            started.node.clone(),
            started.raft.clone(),
            started.log.clone(),
        );
        let (stopped_tx, stopped) = tokio::sync::watch::channel(None);
        // Peers first: the others may already be electing and need our vote.
        let mut servers = vec![serve_peers(&cfg, &started, listeners.peer, &stopped_tx)];
        bootstrap_if_new(&cfg, &raft).await;
        spawn_jobs(&cfg, started, &stopped_tx);
        servers.push(serve_admin(&node, prometheus, listeners.admin, &stopped_tx));
        servers.push(serve_api(&cfg, &node, listeners.api, &stopped_tx));
        tracing::info!(id = cfg.id, %client_addr, %peer_addr, %metrics_addr, data_dir = %cfg.data_dir.display(), "latchkey-cell started");
        Ok(CellHandle {
            id: cfg.id,
            client_addr,
            peer_addr,
            metrics_addr,
            lifecycle: node.lifecycle.clone(),
            node,
            raft,
            log,
            servers,
            stopped,
            db: Arc::downgrade(&db),
        })
    }
}

impl CellHandle {
    /// The member, for in-process callers.
    pub fn node(&self) -> &Arc<CellNode> {
        &self.node
    }

    /// Resolves when the member stops on its own: removed from the cell,
    /// or a server failed. Pending for as long as it runs normally.
    pub async fn stopped(&self) -> Stopped {
        let mut rx = self.stopped.clone();
        let reason = rx.wait_for(Option::is_some).await.map(|r| r.clone());
        match reason {
            Ok(reason) => reason.unwrap_or(Stopped::Removed),
            Err(_) => std::future::pending().await,
        }
    }

    /// Stops the servers, every background task and Raft, and waits until
    /// the database is closed, so the same data directory can be opened
    /// again at once.
    pub async fn shutdown(self) -> anyhow::Result<()> {
        let CellHandle {
            node,
            raft,
            log,
            lifecycle,
            servers,
            db,
            ..
        } = self;
        let left = lifecycle.shutdown(TASK_GRACE).await;
        if left > 0 {
            tracing::warn!(
                tasks = left,
                "background tasks still running after shutdown"
            );
        }
        for mut server in servers {
            if tokio::time::timeout(SERVER_GRACE, &mut server)
                .await
                .is_err()
            {
                server.abort();
                let _ = server.await;
            }
        }
        if let Err(e) = raft.shutdown().await {
            tracing::warn!(error = %e, "raft shutdown");
        }
        log.stop_flusher();
        drop(log);
        drop(node);
        drop(raft);
        let deadline = Instant::now() + DB_RELEASE;
        while db.strong_count() > 0 {
            if Instant::now() >= deadline {
                bail!(
                    "the database is still open {DB_RELEASE:?} after shutdown ({} holders)",
                    db.strong_count()
                );
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        tracing::info!("stopped");
        Ok(())
    }

    /// Tasks of this member still running (0 after shutdown).
    pub fn live_tasks(&self) -> usize {
        self.lifecycle.live_tasks()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;
    use clap::Parser;
    use latchkey_testkit::free_port;

    fn one_member(dir: &std::path::Path, ports: [u16; 3]) -> Resolved {
        let [client, peer, metrics] = ports.map(|p| format!("127.0.0.1:{p}"));
        Config::parse_from([
            "latchkey-cell",
            "--dev",
            "--data-dir",
            &dir.display().to_string(),
            "--client-addr",
            &client,
            "--peer-addr",
            &peer,
            "--metrics-addr",
            &metrics,
        ])
        .resolve()
        .expect("config")
    }

    /// Tasks alive on this runtime, polled until it is `want` or 10 s pass
    /// (an aborted task is reaped a moment after it is aborted).
    async fn alive_tasks_settle_at(want: usize) -> usize {
        let metrics = tokio::runtime::Handle::current().metrics();
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let alive = metrics.num_alive_tasks();
            if alive <= want || Instant::now() >= deadline {
                return alive;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    async fn client(cell: &CellHandle) -> etcd_client::Client {
        etcd_client::Client::connect([cell.client_addr.to_string()], None)
            .await
            .expect("connect")
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_cell_starts_in_process_stops_through_its_handle_and_restarts_on_its_data() {
        let dir = tempfile::tempdir().expect("temp dir");
        let ports = [free_port(), free_port(), free_port()];
        let baseline = tokio::runtime::Handle::current()
            .metrics()
            .num_alive_tasks();

        let cell = Cell::start(one_member(dir.path(), ports), None)
            .await
            .expect("start");
        let mut c = client(&cell).await;
        // The first write waits for the one-member cell to elect itself.
        c.put("greeting", "hello", None).await.expect("put");
        drop(c);
        assert!(cell.live_tasks() > 0, "the cell runs background tasks");
        cell.shutdown().await.expect("shutdown");
        let alive = alive_tasks_settle_at(baseline).await;
        assert_eq!(alive, baseline, "tasks outlived the cell's handle");

        // Same data directory, same ports: the database was released.
        let cell = Cell::start(one_member(dir.path(), ports), None)
            .await
            .expect("restart on the same data");
        let mut c = client(&cell).await;
        let got = c.get("greeting", None).await.expect("get");
        let values: Vec<&[u8]> = got.kvs().iter().map(|kv| kv.value()).collect();
        assert_eq!(
            values,
            [b"hello".as_slice()],
            "the write survived the restart"
        );
        drop(c);
        cell.shutdown().await.expect("second shutdown");
        let alive = alive_tasks_settle_at(baseline).await;
        assert_eq!(
            alive, baseline,
            "tasks outlived the restarted cell's handle"
        );
    }
}
