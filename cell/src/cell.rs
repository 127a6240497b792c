//! A member as a library: [`Cell::start`] opens storage, starts Raft, the
//! servers and every background task, and returns a [`CellHandle`] that owns
//! them all; [`CellHandle::shutdown`] stops them and closes the database.
//!
//! Nothing here is process-wide: tracing, the metrics recorder and signal
//! handling belong to whoever embeds the cell (`main.rs`, a proxy started
//! with `--dev`, a test), so several cells can live in one process.

use crate::config::Resolved;
use crate::jobs::auto_compaction::AutoCompaction;
use crate::jobs::publish_member::PublishMember;
use crate::jobs::snapshot_trigger::SnapshotTrigger;
use crate::lease::lessor::Lessor;
use crate::lease::lessor_loop::LessorLoop;
use crate::membership::discover_identity;
use crate::node::CellNode;
use crate::peer::client::PeerClients;
use crate::peer::server::{PeerService, AFTER_SNAPSHOT_CHUNK};
use crate::raft::election_nudge::ElectionNudge;
use crate::raft::log_purger::LogPurger;
use crate::raft::log_store::{self, LogStore};
use crate::raft::network::{
    NetworkFactory, PeerChannels, MAX_PEER_MESSAGE_BYTES, PEER_CONNECTION_WINDOW,
    PEER_STREAM_WINDOW, SNAPSHOT_CHUNK_BYTES,
};
use crate::raft::snapshot_receipt::SnapshotReceipt;
use crate::raft::{LogId, Member, NodeId, Raft, StoredMembership};
use crate::state_machine::backup::{decode_state_file, state_file_digest};
use crate::state_machine::snapshot_file::has_snapshot;
use crate::state_machine::store::{write_restored_state, StateMachineStore};
use crate::state_machine::watch_hub::WatchHub;
use crate::watch::stream::WatchOptions;
use anyhow::{bail, Context};
use latchkey_shared::lifecycle::Lifecycle;
use latchkey_shared::peer::peer_server::PeerServer;
use metrics_exporter_prometheus::PrometheusHandle;
use openraft::SnapshotPolicy;
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::task::JoinHandle;
use tokio::time::Instant;

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
/// How many streams a peer may reset before the peer server has accepted
/// them (h2's guard against the rapid-reset attack; its default is 20).
const PEER_PENDING_RESETS: usize = 10_000;
/// How long a removed member goes on answering (the MemberRemove that
/// removed a leader must reach its client) before it stops.
const REMOVED_LINGER: Duration = Duration::from_secs(2);

fn raft_config(cfg: &Resolved) -> anyhow::Result<openraft::Config> {
    let c = &cfg.cfg;
    let config = openraft::Config {
        cluster_name: format!("latchkey-{:x}", cfg.cluster_id),
        heartbeat_interval: c.heartbeat_ms,
        election_timeout_min: c.election_timeout_ms,
        // openraft 0.9 derives two delays from the maximum: the leader
        // lease (followers refuse votes for that long after hearing from
        // a leader, and wait it out before their own timeout) and, twice
        // the maximum, the wait added to the next election of a member
        // that once saw a longer log than its own, a flag it keeps until
        // that election, however long ago it was seen. With the maximum
        // at twice the minimum a follower so flagged called its election
        // 800 + 400..800 + 1600 ms after the leader went quiet: the safety
        // suite measured 3.1 s without writes after a leader partition.
        // A narrower range keeps each member's (fixed, random) timeout
        // apart and bounds that worst case at 2 s.
        election_timeout_max: c.election_timeout_ms * 5 / 4,
        // Per snapshot chunk. openraft's default (200 ms) made a large
        // snapshot time out and be resent forever; the last chunk's answer
        // waits for the follower to decode and store the whole image.
        install_snapshot_timeout: 60_000,
        snapshot_max_chunk_size: SNAPSHOT_CHUNK_BYTES,
        snapshot_policy: SnapshotPolicy::LogsSinceLast(c.snapshot_entries),
        max_in_snapshot_log_to_keep: c.snapshot_keep_entries,
        // openraft 0.9 gives every AppendEntries the heartbeat interval as
        // its whole timeout. A follower that fell behind is sent batches of
        // this many entries; at openraft's default (300 entries of up to
        // 128 puts each) one batch could take longer than the interval on a
        // loaded machine, time out, and be resent forever: the follower
        // never caught up (seen with 100 000 leases on 2 cores). Smaller
        // batches always make progress; the log store also bounds each
        // batch in bytes (`log_store::MAX_APPEND_BYTES`), since one entry
        // that group commit filled can be 1.5 MiB.
        max_payload_entries: 32,
        ..Default::default()
    };
    Ok(config.validate()?)
}

fn parse_addr(flag: &str, addr: &str) -> anyhow::Result<SocketAddr> {
    addr.parse()
        .with_context(|| format!("{flag} '{addr}' is not ip:port"))
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
        let state =
            decode_state_file(&bytes).with_context(|| format!("--restore {}", file.display()))?;
        tracing::info!(
            revision = state.keys.revision(),
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
        cfg.cluster_id = crate::ids::restored_cluster_id(cfg.cluster_id, state_file_digest(&bytes));
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
            let (id, cluster_id) =
                discover_identity(&cfg.join, cfg.cfg.advertised_peer_addr(), JOIN_TIMEOUT).await?;
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

/// The members a new cell starts with (`--initial-cluster`).
fn initial_members(cfg: &Resolved) -> BTreeMap<u64, Member> {
    cfg.initial_cluster
        .iter()
        .map(|(id, addr)| {
            (
                *id,
                Member {
                    peer_addr: addr.clone(),
                },
            )
        })
        .collect()
}

/// Resolves when this member must stop: it has been removed from the
/// cell's membership (after having been in it), as in etcd, whether it
/// applied its removal or a peer says so, or Raft on it has stopped (a
/// storage error, a failed apply).
async fn member_ends(node: &CellNode) -> Stopped {
    let membership = node.membership();
    tokio::select! {
        why = removed_here(node.raft.clone(), node.id) => why,
        _ = membership.removed_elsewhere() => Stopped::Removed,
    }
}

async fn removed_here(raft: Raft, id: u64) -> Stopped {
    let mut rx = raft.metrics();
    let mut was_member = false;
    loop {
        {
            let m = rx.borrow_and_update();
            if let Err(fatal) = &m.running_state {
                return Stopped::RaftFailed(fatal.to_string());
            }
            let membership = m.membership_config.membership();
            let is_member = membership.get_node(&id).is_some();
            // Only a configuration this member has applied (so committed)
            // counts: an appended one may still be replaced.
            let applied =
                m.membership_config.log_id().map(|l| l.index) <= m.last_applied.map(|l| l.index);
            if is_member {
                was_member = true;
            } else if was_member && applied && membership.nodes().next().is_some() {
                return Stopped::Removed;
            }
        }
        if rx.changed().await.is_err() {
            std::future::pending::<()>().await;
        }
    }
}

/// Why a running member stopped on its own.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Stopped {
    /// It was removed from the cell's membership.
    Removed,
    /// A server failed (its error).
    ServerFailed(String),
    /// Raft on this member stopped (its error).
    RaftFailed(String),
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

/// Spawns a server; its result is reported once, as a `Stopped` reason
/// when it ends before shutdown.
fn spawn_server<F, E>(
    lifecycle: &Lifecycle,
    stopped: &tokio::sync::watch::Sender<Option<Stopped>>,
    what: &'static str,
    serve: F,
) -> JoinHandle<Result<(), String>>
where
    F: std::future::Future<Output = Result<(), E>> + Send + 'static,
    E: std::fmt::Display,
{
    let stopped = stopped.clone();
    let lifecycle = lifecycle.clone();
    tokio::spawn(async move {
        let result = serve.await.map_err(|e| format!("{what}: {e}"));
        if !lifecycle.is_stopping() {
            let why = result
                .clone()
                .err()
                .unwrap_or_else(|| format!("{what} ended"));
            stopped.send_replace(Some(Stopped::ServerFailed(why)));
        }
        result
    })
}

/// The member's three listeners, bound before Raft starts: once Raft
/// runs, a failure to start must stop it.
struct Listeners {
    peer: tokio::net::TcpListener,
    peer_addr: SocketAddr,
    admin: tokio::net::TcpListener,
    metrics_addr: SocketAddr,
    api: tokio::net::TcpListener,
    client_addr: SocketAddr,
}

impl Listeners {
    /// The addresses as the flags give them, refused before anything is
    /// opened if one is not `ip:port`.
    fn parse(cfg: &Resolved) -> anyhow::Result<[SocketAddr; 3]> {
        Ok([
            parse_addr("--client-addr", &cfg.cfg.client_addr)?,
            parse_addr("--peer-addr", &cfg.cfg.peer_addr)?,
            parse_addr("--metrics-addr", &cfg.cfg.metrics_addr)?,
        ])
    }

    async fn bind(
        [client_addr, peer_addr, metrics_addr]: [SocketAddr; 3],
    ) -> anyhow::Result<Listeners> {
        let peer = tokio::net::TcpListener::bind(peer_addr)
            .await
            .with_context(|| format!("binding --peer-addr {peer_addr}"))?;
        let admin = tokio::net::TcpListener::bind(metrics_addr)
            .await
            .with_context(|| format!("binding --metrics-addr {metrics_addr}"))?;
        let api = tokio::net::TcpListener::bind(client_addr)
            .await
            .with_context(|| format!("binding --client-addr {client_addr}"))?;
        Ok(Listeners {
            peer_addr: peer.local_addr()?,
            metrics_addr: admin.local_addr()?,
            client_addr: api.local_addr()?,
            peer,
            admin,
            api,
        })
    }
}

/// Raft started on the member's storage, and the member around it.
struct Started {
    raft: Raft,
    node: Arc<CellNode>,
    log: LogStore,
    lessor: Arc<Lessor>,
    state: crate::state_machine::store::SharedState,
}

/// Loads the state machine from its snapshot, starts Raft on the log and
/// builds the member around it.
async fn start_raft(
    cfg: &Resolved,
    db: &Arc<rocksdb::DB>,
    peer_addr: SocketAddr,
) -> anyhow::Result<Started> {
    let lessor = Arc::new(Lessor::new());
    let hub = Arc::new(WatchHub::new());
    let purger = LogPurger::gated(db.clone()).context("reading the log's purge point")?;
    let sm = StateMachineStore::open(
        &cfg.data_dir,
        Some(lessor.clone()),
        hub.clone(),
        Some(purger.clone()),
    )
    .await
    .with_context(|| format!("loading the snapshot in {}", cfg.data_dir.display()))?;
    let config = Arc::new(raft_config(cfg)?);
    let log = LogStore::new(db.clone(), purger).context("starting the log store")?;
    let state = sm.shared();
    let channels = PeerChannels::new(cfg.cluster_id, peer_addr);
    let nudge = ElectionNudge::default();
    let raft = Raft::new(
        cfg.id,
        config,
        NetworkFactory {
            channels: channels.clone(),
            nudge: nudge.clone(),
        },
        log.clone(),
        sm,
    )
    .await;
    let raft = match raft {
        Ok(raft) => {
            nudge.attach(raft.clone());
            raft
        }
        Err(e) => {
            log.stop_flusher();
            return Err(e).context("starting raft");
        }
    };
    let node = Arc::new(CellNode::new(
        cfg,
        raft.clone(),
        state.clone(),
        lessor.clone(),
        hub,
        db.clone(),
        // Forwarded client requests on connections of their own: a
        // burst of them, or a large txn's answer, never holds up the
        // heartbeats and votes on Raft's connections.
        PeerClients::new(PeerChannels::new(cfg.cluster_id, peer_addr)),
    ));
    Ok(Started {
        raft,
        node,
        log,
        lessor,
        state,
    })
}

/// Serves Raft and forwarded requests to the other members.
fn serve_peers(
    cfg: &Resolved,
    started: &Started,
    listener: tokio::net::TcpListener,
    stopped_tx: &tokio::sync::watch::Sender<Option<Stopped>>,
) -> JoinHandle<Result<(), String>> {
    let lifecycle = &started.node.lifecycle;
    let peer_server = PeerServer::new(PeerService {
        cluster_id: cfg.cluster_id,
        raft: started.raft.clone(),
        handler: started.node.clone(),
        snapshot_receipt: SnapshotReceipt::new(started.raft.clone(), AFTER_SNAPSHOT_CHUNK),
    })
    .max_decoding_message_size(MAX_PEER_MESSAGE_BYTES)
    .max_encoding_message_size(MAX_PEER_MESSAGE_BYTES);
    spawn_server(lifecycle, stopped_tx, "peer server", {
        let token = lifecycle.token();
        tonic::transport::Server::builder()
            // A peer cancels every Raft request that outlives its
            // timeout (one heartbeat for AppendEntries). After a stall
            // or a healed partition many such resets arrive together,
            // and at h2's default limit of 20 the server closed the
            // connection (ENHANCE_YOUR_CALM), failing the requests
            // that were still good: seen in the safety suite's member
            // logs. Peers are members of this cell, not strangers.
            .http2_max_pending_accept_reset_streams(Some(PEER_PENDING_RESETS))
            .initial_stream_window_size(PEER_STREAM_WINDOW)
            .initial_connection_window_size(PEER_CONNECTION_WINDOW)
            .add_service(peer_server)
            .serve_with_incoming_shutdown(
                crate::api::nodelay_incoming(listener),
                token.cancelled_owned(),
            )
    })
}

/// Bootstraps a new cell from `--initial-cluster`. A joining member never
/// bootstraps: the leader replicates to it. (A failed `is_initialized`
/// means Raft stopped; `stopped` says so.)
async fn bootstrap_if_new(cfg: &Resolved, raft: &Raft) {
    if cfg.join.is_empty() && !raft.is_initialized().await.unwrap_or(true) {
        let members = initial_members(cfg);
        tracing::info!(members = ?cfg.initial_cluster, "bootstrapping a new cell");
        if let Err(e) = raft.initialize(members).await {
            // Another member's bootstrap reached us first: that is fine.
            tracing::info!(error = %e, "initialize skipped");
        }
    }
}

/// Starts the member's background jobs: the lessor's loop, publishing its
/// own addresses, snapshots, auto-compaction, and the watch for its
/// removal from the cell (which reports through `stopped_tx`).
fn spawn_jobs(
    cfg: &Resolved,
    started: Started,
    stopped_tx: &tokio::sync::watch::Sender<Option<Stopped>>,
) {
    let Started {
        raft,
        node,
        lessor,
        state,
        ..
    } = started;
    let lifecycle = node.lifecycle.clone();
    let lessor_loop = LessorLoop {
        id: cfg.id,
        raft,
        state,
        lessor,
        grace: Duration::from_millis(cfg.cfg.lease_grace_ms),
        checkpoint_interval: cfg.lease_checkpoint_interval(),
        request_timeout: cfg.request_timeout(),
        quorum_timeout: node.quorum_timeout,
    };
    lifecycle.spawn_owned(|token| lessor_loop.run(token));
    lifecycle.spawn(PublishMember { node: node.clone() }.run());
    lifecycle.spawn(
        SnapshotTrigger {
            raft: node.raft.clone(),
            state: node.state.clone(),
            every: cfg.cfg.snapshot_entries,
        }
        .run(),
    );
    lifecycle.spawn(
        AutoCompaction {
            node: node.clone(),
            retention: cfg.retention,
        }
        .run(),
    );
    let stopped_tx = stopped_tx.clone();
    lifecycle.spawn(async move {
        let why = member_ends(&node).await;
        if why == Stopped::Removed {
            tracing::warn!("this member was removed from the cell; stopping");
            // Let in-flight answers (such as the MemberRemove that
            // removed this leader) reach their clients first.
            tokio::time::sleep(REMOVED_LINGER).await;
        }
        stopped_tx.send_replace(Some(why));
    });
}

/// Serves `/metrics`, `/healthz` and `/readyz`.
fn serve_admin(
    node: &Arc<CellNode>,
    prometheus: Option<PrometheusHandle>,
    listener: tokio::net::TcpListener,
    stopped_tx: &tokio::sync::watch::Sender<Option<Stopped>>,
) -> JoinHandle<Result<(), String>> {
    let lifecycle = &node.lifecycle;
    let admin = crate::admin::router(node.clone(), prometheus);
    spawn_server(lifecycle, stopped_tx, "metrics server", {
        let token = lifecycle.token();
        async move {
            axum::serve(listener, admin)
                .with_graceful_shutdown(token.cancelled_owned())
                .await
        }
    })
}

/// Serves the etcd API to clients.
fn serve_api(
    cfg: &Resolved,
    node: &Arc<CellNode>,
    listener: tokio::net::TcpListener,
    stopped_tx: &tokio::sync::watch::Sender<Option<Stopped>>,
) -> JoinHandle<Result<(), String>> {
    let lifecycle = &node.lifecycle;
    spawn_server(
        lifecycle,
        stopped_tx,
        "client API server",
        crate::api::serve(
            node.clone(),
            listener,
            cfg.cfg.max_request_bytes,
            WatchOptions {
                progress_interval: Duration::from_millis(
                    cfg.cfg.watch_progress_notify_interval_ms.max(100),
                ),
                max_watches: cfg.cfg.max_watches_per_stream,
                max_response_bytes: cfg.cfg.max_request_bytes,
            },
            lifecycle.token().cancelled_owned(),
        ),
    )
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
        let listeners = Listeners::bind(addrs).await?;
        let (client_addr, peer_addr, metrics_addr) = (
            listeners.client_addr,
            listeners.peer_addr,
            listeners.metrics_addr,
        );
        let started = start_raft(&cfg, &db, peer_addr).await?;
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
