//! A one-member cell behind a proxy, in the fuzzing process: started once,
//! on loopback ports and a data directory of its own, and shared by every
//! input the process runs. The targets that drive it meet the real request
//! path: the proxy's router and its extractors, tonic's decoding, the
//! operations, Raft and the state machine.

use latchkey_cell::cell::CellHandle;
use latchkey_proxy::proxy::{Proxy, ProxyHandle};
use std::net::SocketAddr;
use std::sync::OnceLock;
use std::time::{Duration, Instant};
use tower::ServiceExt;

/// How long a request through the proxy may wait (a lock held by another
/// session, a campaign): short, so that a waiting input costs the fuzzer
/// one second, not five.
const REQUEST_TIMEOUT_MS: u64 = 1000;

pub struct Live {
    pub runtime: tokio::runtime::Runtime,
    /// The proxy's HTTP API, called in process (no socket per input).
    pub http: axum::Router,
    pub proxy_grpc: tonic::transport::Channel,
    pub cell_grpc: tonic::transport::Channel,
    _cell: CellHandle,
    _proxy: ProxyHandle,
    _data: tempfile::TempDir,
}

static LIVE: OnceLock<Live> = OnceLock::new();

impl Live {
    /// The process's cell and proxy, started on the first call.
    pub fn get() -> &'static Live {
        LIVE.get_or_init(|| {
            Live::start().unwrap_or_else(|e| panic!("starting the cell and proxy: {e:#}"))
        })
    }

    fn start() -> anyhow::Result<Live> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()?;
        // Under $TMPDIR, which scripts/fuzz.sh points at a scratch
        // directory (on tmpfs where there is one) and removes after the
        // run: this one is never dropped (it lives in a static, and a crash
        // aborts the process).
        let data = tempfile::tempdir()?;
        let (cell, proxy) = runtime.block_on(start_both(data.path()))?;
        // A lazy channel spawns its worker on the current runtime.
        let entered = runtime.enter();
        let channel = |addr: SocketAddr| {
            tonic::transport::Channel::from_shared(format!("http://{addr}"))
                .map(|e| e.connect_lazy())
        };
        let (proxy_grpc, cell_grpc) = (channel(proxy.grpc_addr)?, channel(cell.client_addr)?);
        drop(entered);
        let live = Live {
            http: latchkey_proxy::http::router(proxy.state.clone()),
            proxy_grpc,
            cell_grpc,
            runtime,
            _cell: cell,
            _proxy: proxy,
            _data: data,
        };
        live.wait_ready()?;
        Ok(live)
    }

    /// Waits until the proxy answers `/readyz` (the cell has a leader).
    fn wait_ready(&self) -> anyhow::Result<()> {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let request = axum::http::Request::get("/readyz").body(axum::body::Body::empty())?;
            let status = self
                .runtime
                .block_on(self.http.clone().oneshot(request))?
                .status();
            if status.is_success() {
                return Ok(());
            }
            if Instant::now() > deadline {
                anyhow::bail!("the proxy was not ready after 60 s (last answer {status})");
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

async fn start_both(dir: &std::path::Path) -> anyhow::Result<(CellHandle, ProxyHandle)> {
    // The cell `--dev` starts, on free loopback ports.
    let key_file = latchkey_proxy::dev::key_file_in(dir)?;
    let cell = latchkey_proxy::dev::start_cell(dir, &key_file, None).await?;
    let key_file = key_file.to_str().expect("a UTF-8 temporary path");
    let cells = cell.client_addr.to_string();
    let timeout = format!("{REQUEST_TIMEOUT_MS}ms");
    let proxy_cfg = <latchkey_proxy::config::Config as clap::Parser>::try_parse_from([
        "latchkey-proxy",
        "--cells",
        &cells,
        "--http-addr",
        "127.0.0.1:0",
        "--grpc-addr",
        "127.0.0.1:0",
        "--metrics-addr",
        "127.0.0.1:0",
        "--request-timeout",
        &timeout,
        "--proxy-key-file",
        key_file,
    ])?
    .validate()?;
    let proxy = Proxy::start(proxy_cfg, None).await?;
    Ok((cell, proxy))
}
