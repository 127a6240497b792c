//! [`Proxy::start`]: binds the three addresses, connects the upstream
//! cells lazily, and spawns the servers, the leader trackers and the
//! keep-alive batcher under one [`Lifecycle`]; [`ProxyHandle::shutdown`]
//! stops them all.

use crate::cache::ReadCache;
use crate::config::Config;
use crate::session::{KeepAliveBatcher, SessionTable};
use crate::state::ProxyState;
use crate::tls::ProxyTls;
use crate::upstream::identity::Credentials;
use crate::upstream::{CellClient, CellMaker, Upstream};
use crate::watch::cell_coalescers::CellCoalescers;
use crate::{admin, grpc, http};
use anyhow::Context;
use latchkey_shared::client::RefreshStream;
use latchkey_shared::lifecycle::Lifecycle;
use latchkey_shared::tls::{Incoming, RemotePeer};
use metrics_exporter_prometheus::PrometheusHandle;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::task::JoinHandle;

/// How long shutdown waits for tasks to end.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

pub struct Proxy;

pub struct ProxyHandle {
    pub http_addr: SocketAddr,
    pub grpc_addr: SocketAddr,
    pub metrics_addr: SocketAddr,
    pub state: Arc<ProxyState>,
    lifecycle: Lifecycle,
    servers: Vec<JoinHandle<anyhow::Result<()>>>,
}

async fn bind(flag: &str, addr: &str) -> anyhow::Result<tokio::net::TcpListener> {
    tokio::net::TcpListener::bind(addr)
        .await
        .with_context(|| format!("binding {flag} {addr}"))
}

impl Proxy {
    pub async fn start(
        cfg: Config,
        prometheus: Option<PrometheusHandle>,
    ) -> anyhow::Result<ProxyHandle> {
        // HELP text and units for `/metrics` (a no-op without a recorder;
        // with `--dev`, the embedded cell's start describes the cell's).
        crate::metrics_catalog::describe();
        let tls = ProxyTls::load(&cfg)?;
        let http_listener = Incoming::new(bind("--http-addr", &cfg.http_addr).await?, tls.http)?;
        let grpc_listener = Incoming::new(bind("--grpc-addr", &cfg.grpc_addr).await?, tls.grpc)?;
        let metrics_listener = Incoming::new(
            bind("--metrics-addr", &cfg.metrics_addr).await?,
            tls.metrics,
        )?;
        let http_addr = http_listener.local_addr();
        let grpc_addr = grpc_listener.local_addr();
        let metrics_addr = metrics_listener.local_addr();

        let lifecycle = Lifecycle::new();
        let proxy_key = match &cfg.proxy_key_file {
            Some(path) => {
                Some(latchkey_shared::auth::proxy_key::read_own(path).context("--proxy-key-file")?)
            }
            None => None,
        };
        let maker = CellMaker {
            request_timeout: cfg.request_timeout,
            tls: tls.upstream.clone(),
            proxy_key,
            credentials: read_credentials(&cfg)?,
            lifecycle: lifecycle.clone(),
        };
        let home = CellClient::new(&cfg.cells, cfg.request_timeout, tls.upstream.as_ref())?;
        let upstream = Arc::new(Upstream::new(home, Some(maker)));
        upstream.start_home();
        let sessions = Arc::new(SessionTable::new());
        let coalescers = CellCoalescers::new(
            upstream.home(),
            cfg.watch_history,
            cfg.watch_buffer,
            cfg.watch_buffer_bytes,
        );
        let cache = ReadCache::new(
            coalescers.home().clone(),
            upstream.home().clone(),
            cfg.cache_bytes,
        );
        let state = Arc::new(ProxyState {
            upstream,
            sessions: sessions.clone(),
            extensions: Default::default(),
            coalescers,
            fanout: crate::watch::fanout::Fanout::new(cfg.fanout_jitter),
            client_watches: crate::watch::client_watches::ClientWatches::new(
                cfg.max_watches,
                cfg.max_watches_per_stream,
            ),
            cache: cache.clone(),
            floors: Default::default(),
            retention: latchkey_shared::idempotency::RetentionLease::new(cfg.idempotency_retention),
            request_timeout: cfg.request_timeout,
            max_request_bytes: cfg.max_request_bytes,
            lifecycle: lifecycle.clone(),
            auth_attempts: crate::ops::auth::attempts_per_address(),
            read_permits: Default::default(),
            tenant_limits: Arc::new(crate::tenant_limits::TenantLimits::new(cfg.rate_share)),
            token_checks: crate::ops::rates::token_checks(),
        });
        let (extensions, upstream, coalescer) = (
            state.extensions.clone(),
            state.upstream.clone(),
            state.coalescers.home().clone(),
        );
        lifecycle.spawn_owned(|token| extensions.follow(upstream, coalescer, token));
        let follower = state.upstream.clone();
        let every = cfg.directory_interval;
        lifecycle.spawn_owned(|token| crate::upstream::directory::follow(follower, every, token));
        let batcher = KeepAliveBatcher {
            table: sessions,
            stream: RefreshStream::new(cfg.cells.iter().cloned())?
                .with_tls(tls.upstream.clone())
                .with_own_credentials(state.upstream.home().own_credentials.clone()),
            tick: cfg.refresh_tick,
            upstream: state.upstream.clone(),
            extensions: state.extensions.clone(),
            tls: tls.upstream,
        };
        lifecycle.spawn_owned(|token| batcher.run(token));
        lifecycle.spawn_owned(|token| cache.keep_fresh(token));
        let permits = state.read_permits.clone();
        let home = state.upstream.home().clone();
        lifecycle.spawn_owned(|token| permits.run(home.clone(), token));
        let rates = state.tenant_limits.clone();
        lifecycle.spawn_owned(|token| rates.keep_current(home, token));
        let sweeper = state.clone();
        lifecycle.spawn_owned(|token| async move {
            let mut tick = tokio::time::interval(crate::cache::client_floor::IDLE_FORGET / 10);
            while token.run_until_cancelled(tick.tick()).await.is_some() {
                sweeper.floors.sweep();
            }
        });

        let mut servers = Vec::new();
        let token = lifecycle.token();
        servers.push(tokio::spawn(grpc::serve(
            state.clone(),
            grpc_listener,
            token.clone().cancelled_owned(),
        )));
        let api = http::router(state.clone());
        servers.push(tokio::spawn(serve_http(
            api,
            http_listener,
            token.clone().cancelled_owned(),
        )));
        let admin = admin::router(state.clone(), prometheus);
        servers.push(tokio::spawn(serve_http(
            admin,
            metrics_listener,
            token.cancelled_owned(),
        )));
        tracing::info!(%http_addr, %grpc_addr, %metrics_addr, cells = ?cfg.cells, "proxy listening");
        Ok(ProxyHandle {
            http_addr,
            grpc_addr,
            metrics_addr,
            state,
            lifecycle,
            servers,
        })
    }
}

/// `--cell-user` and the first line of `--cell-password-file`.
fn read_credentials(cfg: &Config) -> anyhow::Result<Option<Credentials>> {
    let (Some(user), Some(file)) = (&cfg.cell_user, &cfg.cell_password_file) else {
        return Ok(None);
    };
    let text = std::fs::read_to_string(file)
        .with_context(|| format!("--cell-password-file {}", file.display()))?;
    let password = text.lines().next().unwrap_or_default().to_string();
    if password.is_empty() {
        anyhow::bail!(
            "--cell-password-file {}: the first line is empty",
            file.display()
        );
    }
    Ok(Some(Credentials {
        user: user.clone(),
        password,
    }))
}

async fn serve_http(
    router: axum::Router,
    listener: Incoming,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let service = router.into_make_service_with_connect_info::<RemotePeer>();
    axum::serve(listener, service)
        .with_graceful_shutdown(shutdown)
        .await?;
    Ok(())
}

impl ProxyHandle {
    /// Resolves when a server ends on its own (it failed).
    pub async fn failed(&mut self) -> anyhow::Error {
        let (result, index, _) = futures::future::select_all(self.servers.iter_mut()).await;
        self.servers.remove(index);
        match result {
            Ok(Ok(())) => anyhow::anyhow!("a server ended"),
            Ok(Err(e)) => e,
            Err(e) => anyhow::anyhow!("a server panicked: {e}"),
        }
    }

    /// Stops the servers and every task, waiting a few seconds for them.
    pub async fn shutdown(self) -> anyhow::Result<()> {
        let left = self.lifecycle.shutdown(SHUTDOWN_GRACE).await;
        for server in self.servers {
            let _ = tokio::time::timeout(SHUTDOWN_GRACE, server).await;
        }
        if left > 0 {
            tracing::warn!(left, "tasks still running after shutdown");
        }
        Ok(())
    }
}
