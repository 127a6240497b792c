//! `--dev`: a one-member cell inside the proxy's process, on free
//! loopback ports, with its data in `--data-dir`; the proxy fronts it.
//! Both take the proxies' key from `--proxy-key-file`, or else from
//! `proxy.key` in `--data-dir`, made at the first start.

use crate::config::Config;
use anyhow::Context;
use latchkey_cell::cell::{Cell, CellHandle};
use latchkey_shared::auth::proxy_key;
use metrics_exporter_prometheus::PrometheusHandle;
use std::path::{Path, PathBuf};

/// `--proxy-key-file`, or `proxy.key` in `--data-dir` (made when missing).
pub fn proxy_key_file(cfg: &Config) -> anyhow::Result<PathBuf> {
    if let Some(path) = &cfg.proxy_key_file {
        return Ok(path.clone());
    }
    key_file_in(&cfg.data_dir)
}

/// `proxy.key` in `dir` (both made when missing).
pub fn key_file_in(dir: &Path) -> anyhow::Result<PathBuf> {
    std::fs::create_dir_all(dir).with_context(|| format!("--data-dir {}", dir.display()))?;
    let path = dir.join("proxy.key");
    proxy_key::create_or_read(&path)?;
    Ok(path)
}

pub async fn start_cell(
    data_dir: &Path,
    proxy_key_file: &Path,
    prometheus: Option<PrometheusHandle>,
) -> anyhow::Result<CellHandle> {
    let dir = data_dir
        .to_str()
        .ok_or_else(|| anyhow::anyhow!("--data-dir {} is not UTF-8", data_dir.display()))?;
    let key_file = proxy_key_file.to_str().ok_or_else(|| {
        anyhow::anyhow!("--proxy-key-file {} is not UTF-8", proxy_key_file.display())
    })?;
    let cfg = <latchkey_cell::config::Config as clap::Parser>::try_parse_from([
        "latchkey-cell",
        "--dev",
        "--data-dir",
        dir,
        // The cell's own ports are the proxy's business only: free ones,
        // so a dev proxy never collides with a cell on 7801. They are
        // chosen here, not left to the cell as port 0, because the cell
        // records its peer address in its membership.
        "--client-addr",
        &free_port()?,
        "--peer-addr",
        &free_port()?,
        "--metrics-addr",
        &free_port()?,
        "--proxy-key-file",
        key_file,
    ])?
    .resolve()?;
    Cell::start(cfg, prometheus).await
}

/// A loopback address with a port nobody listens on now.
fn free_port() -> anyhow::Result<String> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
    Ok(listener.local_addr()?.to_string())
}

/// The lines `--dev` prints once everything listens.
pub fn try_these(http: &std::net::SocketAddr, grpc: &std::net::SocketAddr) -> String {
    format!(
        "latchkey is up: a one-member cell and a proxy.\n\
         Try:\n  \
         curl -s -X PUT --data-binary 'hello' {http}/v1/kv/greeting\n  \
         curl -s {http}/v1/kv/greeting\n  \
         curl -s -X POST -H 'content-type: application/json' -d '{{\"ttl\": 30}}' {http}/v1/sessions\n  \
         curl -sN {http}/v1/watch/greeting\n  \
         etcdctl --endpoints={grpc} get greeting\n\
         The API: {http}/v1/openapi.json\n"
    )
}
