//! [`ProxyProcess`]: a real `latchkey-proxy` process on free loopback
//! ports, in front of given cell members or (`--dev`) of its own embedded
//! cell. Killed when dropped; its log is printed if the test failed.

use crate::eventually::eventually;
use crate::metrics::{http_get, metric_value};
use crate::ports::free_port;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use tokio::time::Duration;

/// The environment variable that names the `latchkey-proxy` binary for
/// tests outside the proxy crate.
pub const PROXY_BIN_ENV: &str = "LATCHKEY_PROXY_BIN";

/// The `latchkey-proxy` binary next to the running test binary (see
/// [`cell_binary`](crate::cell_binary)), or `$LATCHKEY_PROXY_BIN`.
pub fn proxy_binary() -> PathBuf {
    if let Some(path) = std::env::var_os(PROXY_BIN_ENV) {
        return PathBuf::from(path);
    }
    let exe = std::env::current_exe().expect("the test binary's path");
    let bin = exe
        .parent()
        .and_then(|deps| deps.parent())
        .expect("the test binary runs from target/<profile>/deps")
        .join("latchkey-proxy");
    assert!(
        bin.exists(),
        "{} is missing: run `cargo build -p latchkey-proxy` or set {PROXY_BIN_ENV}",
        bin.display()
    );
    bin
}

/// Log lines a failed test prints per proxy.
const LOG_TAIL: usize = 200;

pub struct ProxyProcess {
    /// `127.0.0.1:port` of the HTTP API, the gRPC API and `/metrics`.
    pub http: String,
    pub grpc: String,
    pub metrics: String,
    child: Child,
    log: PathBuf,
    /// Holds the log (and, with `--dev`, the data directory).
    _dir: tempfile::TempDir,
}

impl ProxyProcess {
    /// A proxy in front of the cell members at `cells` (client addresses),
    /// with `extra_args`, ready (its `/readyz` says so) when this returns.
    pub async fn start(bin: &Path, cells: &[String], extra_args: &[&str]) -> ProxyProcess {
        let joined = cells.join(",");
        let mut args = vec!["--cells", joined.as_str()];
        args.extend_from_slice(extra_args);
        Self::spawn(bin, &args).await
    }

    /// `latchkey-proxy --dev`: a one-member cell in the proxy's process,
    /// with its data in a fresh temporary directory.
    pub async fn dev(bin: &Path) -> ProxyProcess {
        Self::spawn(bin, &["--dev"]).await
    }

    /// `latchkey-proxy` with exactly `args` (its addresses are added).
    pub async fn spawn(bin: &Path, args: &[&str]) -> ProxyProcess {
        let dir = tempfile::tempdir().expect("temp dir");
        let data = dir.path().join("data");
        let log = dir.path().join("proxy.log");
        let [http, grpc, metrics] = [0; 3].map(|_| format!("127.0.0.1:{}", free_port()));
        let file = std::fs::File::create(&log).expect("log file");
        let child = Command::new(bin)
            .args([
                "--http-addr",
                &http,
                "--grpc-addr",
                &grpc,
                "--metrics-addr",
                &metrics,
            ])
            .args(["--data-dir", data.to_str().expect("utf-8 path")])
            .args(args)
            .args(crate::proxy_key::flag_unless_given(args.iter().copied()))
            .stdin(Stdio::null())
            .stdout(file.try_clone().map_or_else(|_| Stdio::null(), Stdio::from))
            .stderr(file)
            .spawn()
            .unwrap_or_else(|e| panic!("spawn {}: {e}", bin.display()));
        let proxy = ProxyProcess {
            http,
            grpc,
            metrics,
            child,
            log,
            _dir: dir,
        };
        proxy.wait_ready(Duration::from_secs(30)).await;
        proxy
    }

    /// Waits until `/readyz` on the metrics port (plain text unless
    /// `--metrics-tls`) answers 200 (every cell has a leader).
    pub async fn wait_ready(&self, timeout: Duration) {
        eventually(timeout, async || {
            match http_get(&self.metrics, "/readyz").await {
                Some(r) if r.starts_with("HTTP/1.1 200") => Ok(()),
                other => Err(format!("proxy at {} not ready: {other:?}", self.metrics)),
            }
        })
        .await
    }

    /// The proxy's `/metrics` text.
    pub async fn metrics(&self) -> String {
        http_get(&self.metrics, "/metrics")
            .await
            .unwrap_or_default()
    }

    /// One series from the proxy's `/metrics` (see [`metric_value`]).
    pub async fn metric(&self, series: &str) -> Option<f64> {
        metric_value(&self.metrics().await, series)
    }

    /// SIGKILLs the proxy.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// The process id, for measuring its CPU and memory.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for ProxyProcess {
    fn drop(&mut self) {
        self.kill();
        if std::thread::panicking() {
            if let Ok(text) = std::fs::read_to_string(&self.log) {
                let tail: Vec<&str> = text.lines().rev().take(LOG_TAIL).collect();
                eprintln!("--- proxy {} log (last {LOG_TAIL} lines) ---", self.http);
                for line in tail.into_iter().rev() {
                    eprintln!("{line}");
                }
            }
        }
    }
}
