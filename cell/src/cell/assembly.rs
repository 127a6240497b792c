//! How [`Cell::start`](super::Cell::start) assembles a member, one named
//! step each: parse and bind the three listeners, start Raft and the
//! member around it, serve the peers, bootstrap a new cell, start the
//! background jobs, serve `/metrics` and the etcd API. Each server reports
//! an early end as a [`Stopped`] reason.

use super::tls::MemberTls;
use crate::config::Resolved;
use crate::jobs::auto_compaction::AutoCompaction;
use crate::jobs::publish_member::PublishMember;
use crate::jobs::snapshot_trigger::SnapshotTrigger;
use crate::lease::lessor::Lessor;
use crate::lease::lessor_loop::LessorLoop;
use crate::node::CellNode;
use crate::peer::client::PeerClients;
use crate::peer::server::{PeerService, AFTER_SNAPSHOT_CHUNK};
use crate::raft::election_nudge::ElectionNudge;
use crate::raft::log_purger::LogPurger;
use crate::raft::log_store::LogStore;
use crate::raft::network::{
    NetworkFactory, PeerChannels, MAX_PEER_MESSAGE_BYTES, PEER_CONNECTION_WINDOW,
    PEER_STREAM_WINDOW, SNAPSHOT_CHUNK_BYTES,
};
use crate::raft::snapshot_receipt::SnapshotReceipt;
use crate::raft::{Member, Raft};
use crate::state_machine::store::StateMachineStore;
use crate::state_machine::watch_hub::WatchHub;
use crate::watch::stream::WatchOptions;
use anyhow::Context;
use latchkey_shared::lifecycle::Lifecycle;
use latchkey_shared::peer::peer_server::PeerServer;
use latchkey_shared::tls::{ClientTls, Incoming};
use metrics_exporter_prometheus::PrometheusHandle;
use openraft::SnapshotPolicy;
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::task::JoinHandle;
/// How many streams a peer may reset before the peer server has accepted
/// them (h2's guard against the rapid-reset attack; its default is 20).
const PEER_PENDING_RESETS: usize = 10_000;
/// How long a removed member goes on answering (the MemberRemove that
/// removed a leader must reach its client) before it stops.
const REMOVED_LINGER: Duration = Duration::from_secs(2);

pub(super) fn raft_config(cfg: &Resolved) -> anyhow::Result<openraft::Config> {
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

pub(super) fn parse_addr(flag: &str, addr: &str) -> anyhow::Result<SocketAddr> {
    addr.parse()
        .with_context(|| format!("{flag} '{addr}' is not ip:port"))
}

/// The members a new cell starts with (`--initial-cluster`).
pub(super) fn initial_members(cfg: &Resolved) -> BTreeMap<u64, Member> {
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
pub(super) async fn member_ends(node: &CellNode) -> Stopped {
    let membership = node.membership();
    tokio::select! {
        why = removed_here(node.raft.clone(), node.id) => why,
        _ = membership.removed_elsewhere() => Stopped::Removed,
    }
}

pub(super) async fn removed_here(raft: Raft, id: u64) -> Stopped {
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

/// Spawns a server; its result is reported once, as a `Stopped` reason
/// when it ends before shutdown.
pub(super) fn spawn_server<F, E>(
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

/// The member's three listeners, bound (and their TLS loaded) before Raft
/// starts: once Raft runs, a failure to start must stop it.
pub(super) struct Listeners {
    pub(super) peer: Incoming,
    pub(super) peer_addr: SocketAddr,
    pub(super) admin: Incoming,
    pub(super) metrics_addr: SocketAddr,
    pub(super) api: Incoming,
    pub(super) client_addr: SocketAddr,
}

impl Listeners {
    /// The addresses as the flags give them, refused before anything is
    /// opened if one is not `ip:port`.
    pub(super) fn parse(cfg: &Resolved) -> anyhow::Result<[SocketAddr; 3]> {
        Ok([
            parse_addr("--client-addr", &cfg.cfg.client_addr)?,
            parse_addr("--peer-addr", &cfg.cfg.peer_addr)?,
            parse_addr("--metrics-addr", &cfg.cfg.metrics_addr)?,
        ])
    }

    pub(super) async fn bind(
        [client_addr, peer_addr, metrics_addr]: [SocketAddr; 3],
        tls: &MemberTls,
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
            peer: Incoming::new(peer, tls.peer.clone())?,
            admin: Incoming::new(admin, tls.metrics.clone())?,
            api: Incoming::new(api, tls.client.clone())?,
        })
    }
}

/// Raft started on the member's storage, and the member around it.
pub(super) struct Started {
    pub(super) raft: Raft,
    pub(super) node: Arc<CellNode>,
    pub(super) log: LogStore,
    pub(super) lessor: Arc<Lessor>,
    pub(super) state: crate::state_machine::store::SharedState,
}

/// Loads the state machine from its snapshot, starts Raft on the log and
/// builds the member around it.
pub(super) async fn start_raft(
    cfg: &Resolved,
    db: &Arc<rocksdb::DB>,
    peer_addr: SocketAddr,
    peer_tls: Option<ClientTls>,
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
    let channels = PeerChannels::new(cfg.cluster_id, peer_addr, peer_tls.clone());
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
        PeerClients::new(PeerChannels::new(cfg.cluster_id, peer_addr, peer_tls)),
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
pub(super) fn serve_peers(
    cfg: &Resolved,
    started: &Started,
    listener: Incoming,
    stopped_tx: &tokio::sync::watch::Sender<Option<Stopped>>,
) -> JoinHandle<Result<(), String>> {
    let lifecycle = &started.node.lifecycle;
    // With peer TLS every connection has a certificate of the cell's CA;
    // each request is also checked against the membership.
    let names_checked = cfg.cfg.peer_tls.server_files().is_some();
    let peer_server = PeerServer::new(PeerService {
        cluster_id: cfg.cluster_id,
        raft: started.raft.clone(),
        handler: started.node.clone(),
        snapshot_receipt: SnapshotReceipt::new(started.raft.clone(), AFTER_SNAPSHOT_CHUNK),
        leader_contact: started.node.leader_contact.clone(),
        names_checked,
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
            .serve_with_incoming_shutdown(listener, token.cancelled_owned())
    })
}

/// Bootstraps a new cell from `--initial-cluster`. A joining member never
/// bootstraps: the leader replicates to it. (A failed `is_initialized`
/// means Raft stopped; `stopped` says so.)
pub(super) async fn bootstrap_if_new(cfg: &Resolved, raft: &Raft) {
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
pub(super) fn spawn_jobs(
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
pub(super) fn serve_admin(
    node: &Arc<CellNode>,
    prometheus: Option<PrometheusHandle>,
    listener: Incoming,
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
pub(super) fn serve_api(
    cfg: &Resolved,
    node: &Arc<CellNode>,
    listener: Incoming,
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
            cfg.proxy_keys.clone(),
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
