//! Starting a member: storage, Raft, servers and background tasks, and
//! stopping them on SIGINT or SIGTERM.

use crate::config::Resolved;
use crate::lease::lessor::Lessor;
use crate::membership::discover_identity;
use crate::node::CellNode;
use crate::raft::log_store::{self, LogStore};
use crate::raft::network::{NetworkFactory, MAX_PEER_MESSAGE_BYTES};
use crate::raft::peer_service::PeerService;
use crate::raft::{Member, Raft};
use crate::state_machine::backup::decode_state_file;
use crate::state_machine::store::{has_state, write_initial_state, StateMachineStore};
use crate::watch::hub::WatchHub;
use crate::watch::stream::WatchOptions;
use anyhow::{bail, Context};
use latchkey_shared::peer::peer_server::PeerServer;
use openraft::SnapshotPolicy;
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use tokio::sync::watch;

fn init_tracing(filter: &str) {
    let filter = tracing_subscriber::EnvFilter::try_new(filter)
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_target(false)
        .try_init();
}

fn raft_config(cfg: &Resolved) -> anyhow::Result<openraft::Config> {
    let c = &cfg.cfg;
    let config = openraft::Config {
        cluster_name: format!("latchkey-{:x}", cfg.cluster_id),
        heartbeat_interval: c.heartbeat_ms,
        election_timeout_min: c.election_timeout_ms,
        election_timeout_max: c.election_timeout_ms * 2,
        // openraft's default (200 ms) makes a large snapshot time out and be
        // resent forever; a snapshot of a full keyspace takes seconds.
        install_snapshot_timeout: 60_000,
        snapshot_policy: SnapshotPolicy::LogsSinceLast(c.snapshot_entries),
        max_in_snapshot_log_to_keep: c.snapshot_keep_entries,
        // openraft 0.9 gives every AppendEntries the heartbeat interval as
        // its whole timeout. A follower that fell behind is sent batches of
        // this many entries; at openraft's default (300 entries of up to
        // 128 puts each) one batch could take longer than the interval on a
        // loaded machine, time out, and be resent forever: the follower
        // never caught up (seen with 100 000 leases on 2 cores). Smaller
        // batches always make progress.
        max_payload_entries: 32,
        ..Default::default()
    };
    Ok(config.validate()?)
}

async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(s) => s,
                Err(_) => {
                    let _ = ctrl_c.await;
                    return;
                }
            };
        tokio::select! {
            _ = ctrl_c => {},
            _ = term.recv() => {},
        }
    }
    #[cfg(not(unix))]
    let _ = ctrl_c.await;
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
        if stored.is_some() || has_state(&cfg.data_dir) {
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
        write_initial_state(&cfg.data_dir, &state)?;
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
                &cfg.cfg.peer_addr,
                std::time::Duration::from_secs(60),
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

/// Resolves when this member has been removed from the cell's membership
/// (after having been in it): a removed member stops, as in etcd.
async fn removed_from_cell(raft: Raft, id: u64) {
    let mut rx = raft.metrics();
    let mut was_member = false;
    loop {
        {
            let m = rx.borrow_and_update();
            let membership = m.membership_config.membership();
            let is_member = membership.get_node(&id).is_some();
            // Only a configuration this member has applied (so committed)
            // counts: an appended one may still be replaced.
            let applied =
                m.membership_config.log_id().map(|l| l.index) <= m.last_applied.map(|l| l.index);
            if is_member {
                was_member = true;
            } else if was_member && applied && membership.nodes().next().is_some() {
                return;
            }
        }
        if rx.changed().await.is_err() {
            std::future::pending::<()>().await;
        }
    }
}

/// Runs a member until it is told to stop.
pub async fn run(mut cfg: Resolved) -> anyhow::Result<()> {
    init_tracing(&cfg.cfg.log);
    let client_addr = parse_addr("--client-addr", &cfg.cfg.client_addr)?;
    let peer_addr = parse_addr("--peer-addr", &cfg.cfg.peer_addr)?;
    let metrics_addr = parse_addr("--metrics-addr", &cfg.cfg.metrics_addr)?;

    // Latency histograms in real buckets (not summaries), from 0.5 ms (an
    // fsync on a fast disk) to 10 s (past any request timeout).
    const LATENCY_BUCKETS: &[f64] = &[
        0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0,
    ];
    let prometheus = metrics_exporter_prometheus::PrometheusBuilder::new()
        .set_buckets_for_metric(
            metrics_exporter_prometheus::Matcher::Suffix("_seconds".into()),
            LATENCY_BUCKETS,
        )
        .context("metric buckets")?
        .install_recorder()
        .context("installing the metrics recorder")?;

    std::fs::create_dir_all(&cfg.data_dir)
        .with_context(|| format!("creating {}", cfg.data_dir.display()))?;
    let db = crate::storage::open(&cfg.data_dir)
        .with_context(|| format!("opening the log in {}", cfg.data_dir.display()))?;
    settle_identity(&mut cfg, &db).await?;

    let lessor = Arc::new(Lessor::new());
    let hub = Arc::new(WatchHub::new());
    let sm = StateMachineStore::open(&cfg.data_dir, Some(lessor.clone()), hub.clone())
        .await
        .with_context(|| format!("loading the snapshot in {}", cfg.data_dir.display()))?;
    let shared = sm.shared();
    let raft = Raft::new(
        cfg.id,
        Arc::new(raft_config(&cfg)?),
        NetworkFactory,
        LogStore::new(db.clone()),
        sm,
    )
    .await
    .context("starting raft")?;
    let node = Arc::new(CellNode::new(
        &cfg,
        raft.clone(),
        shared,
        lessor,
        hub,
        db.clone(),
    ));

    let (stop_tx, stop_rx) = watch::channel(false);
    let stopped = move || {
        let mut rx = stop_rx.clone();
        async move {
            let _ = rx.wait_for(|s| *s).await;
        }
    };

    // Peers first: the others may already be electing and need our vote.
    let peer_listener = tokio::net::TcpListener::bind(peer_addr)
        .await
        .with_context(|| format!("binding --peer-addr {peer_addr}"))?;
    let peer_server = PeerServer::new(PeerService { node: node.clone() })
        .max_decoding_message_size(MAX_PEER_MESSAGE_BYTES)
        .max_encoding_message_size(MAX_PEER_MESSAGE_BYTES);
    let peer_task = tokio::spawn({
        let stopped = stopped();
        async move {
            tonic::transport::Server::builder()
                .tcp_nodelay(true)
                .add_service(peer_server)
                .serve_with_incoming_shutdown(
                    tokio_stream::wrappers::TcpListenerStream::new(peer_listener),
                    stopped,
                )
                .await
        }
    });

    // A joining member never bootstraps: the leader replicates to it.
    if cfg.join.is_empty() && !raft.is_initialized().await? {
        let members: BTreeMap<u64, Member> = cfg
            .initial_cluster
            .iter()
            .map(|(id, addr)| {
                (
                    *id,
                    Member {
                        peer_addr: addr.clone(),
                    },
                )
            })
            .collect();
        tracing::info!(members = ?cfg.initial_cluster, "bootstrapping a new cell");
        if let Err(e) = raft.initialize(members).await {
            // Another member's bootstrap reached us first: that is fine.
            tracing::info!(error = %e, "initialize skipped");
        }
    }

    tokio::spawn(node.clone().run_lessor_promotion());
    tokio::spawn(node.clone().run_lease_expiry());
    tokio::spawn(node.clone().run_lease_checkpoints());
    tokio::spawn(node.clone().run_publish_member());
    tokio::spawn(crate::auto_compaction::run(node.clone(), cfg.retention));

    let admin_listener = tokio::net::TcpListener::bind(metrics_addr)
        .await
        .with_context(|| format!("binding --metrics-addr {metrics_addr}"))?;
    let admin = crate::admin::router(node.clone(), prometheus);
    let admin_task = tokio::spawn({
        let stopped = stopped();
        async move {
            axum::serve(admin_listener, admin)
                .with_graceful_shutdown(stopped)
                .await
        }
    });

    let api_listener = tokio::net::TcpListener::bind(client_addr)
        .await
        .with_context(|| format!("binding --client-addr {client_addr}"))?;
    let api_task = tokio::spawn(crate::api::serve(
        node.clone(),
        api_listener,
        cfg.cfg.max_request_bytes,
        WatchOptions {
            progress_interval: std::time::Duration::from_millis(
                cfg.cfg.watch_progress_notify_interval_ms.max(100),
            ),
            max_watches: cfg.cfg.max_watches_per_stream,
            max_response_bytes: cfg.cfg.max_request_bytes,
        },
        stopped(),
    ));
    tracing::info!(id = cfg.id, %client_addr, %peer_addr, %metrics_addr, data_dir = %cfg.data_dir.display(), "latchkey-cell started");

    tokio::select! {
        _ = shutdown_signal() => tracing::info!("stopping"),
        _ = removed_from_cell(raft.clone(), cfg.id) => {
            tracing::warn!("this member was removed from the cell; stopping");
            // Let in-flight answers (such as the MemberRemove that removed
            // this leader) reach their clients first.
            tokio::time::sleep(std::time::Duration::from_secs(2)).await;
        }
        r = api_task => { r??; bail!("the client API server stopped") }
    }
    let _ = stop_tx.send(true);
    if let Err(e) = raft.shutdown().await {
        tracing::warn!(error = %e, "raft shutdown");
    }
    let _ = peer_task.await;
    let _ = admin_task.await;
    Ok(())
}
