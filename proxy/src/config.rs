//! Command-line configuration, with `LATCHKEY_*` environment fallbacks.

use anyhow::{bail, Context};
use clap::Parser;
use latchkey_shared::{limits, telemetry};
use std::path::PathBuf;
use std::time::Duration;

/// latchkey-proxy: the stateless front door to latchkey cells, serving
/// HTTP/JSON and the etcd v3 gRPC API.
#[derive(Debug, Clone, Parser)]
#[command(name = "latchkey-proxy", version, about, long_about = None)]
pub struct Config {
    /// Address of the HTTP/JSON API (`/v1/...`, `/healthz`, `/readyz`).
    #[arg(long, env = "LATCHKEY_HTTP_ADDR", default_value = "127.0.0.1:7700")]
    pub http_addr: String,

    /// Address of the etcd v3 gRPC API.
    #[arg(long, env = "LATCHKEY_GRPC_ADDR", default_value = "127.0.0.1:7701")]
    pub grpc_addr: String,

    /// Address for /metrics (Prometheus), /healthz and /readyz.
    #[arg(long, env = "LATCHKEY_METRICS_ADDR", default_value = "127.0.0.1:7711")]
    pub metrics_addr: String,

    /// Client addresses of the cell's members, comma separated.
    #[arg(
        long,
        env = "LATCHKEY_CELLS",
        value_delimiter = ',',
        default_value = "127.0.0.1:7801"
    )]
    pub cells: Vec<String>,

    /// How often one refresh batch goes to the cell, carrying every lease a
    /// client refreshed since (e.g. "500ms", "1s").
    #[arg(long, env = "LATCHKEY_REFRESH_TICK", default_value = "500ms", value_parser = humantime::parse_duration)]
    pub refresh_tick: Duration,

    /// How often the proxy reads the directory of cells from the home cell
    /// (the cell of --cells). It also reads it at once when a cell answers
    /// that it no longer owns a request's keys.
    #[arg(long, env = "LATCHKEY_DIRECTORY_INTERVAL", default_value = "500ms", value_parser = humantime::parse_duration)]
    pub directory_interval: Duration,

    /// How long a client request may take, retries included (e.g. "5s").
    #[arg(long, env = "LATCHKEY_REQUEST_TIMEOUT", default_value = "5s", value_parser = humantime::parse_duration)]
    pub request_timeout: Duration,

    /// Each watch event reaches the clients watching its key spread over
    /// a window of 1 ms per client watching it, at most this long (each
    /// client at its own fixed share of the window), so that many clients
    /// do not re-read at once, and one client waits for nothing; "0" sends
    /// at once.
    #[arg(long, env = "LATCHKEY_FANOUT_JITTER", default_value = "100ms", value_parser = humantime::parse_duration)]
    pub fanout_jitter: Duration,

    /// Revisions each shared watch keeps (up to 8 MiB) for clients that
    /// start from an older revision: a client that reconnects within a few
    /// seconds of a busy key joins without an upstream watch of its own.
    #[arg(long, env = "LATCHKEY_WATCH_HISTORY", default_value_t = 1024)]
    pub watch_history: usize,

    /// Revisions queued for one client watch. A client that falls this
    /// far behind is cancelled (gRPC cancel reason, SSE error event,
    /// both naming the revision to resume from) so it slows nobody else.
    #[arg(long, env = "LATCHKEY_WATCH_BUFFER", default_value_t = 1024)]
    pub watch_buffer: usize,

    /// Bytes of events queued for one client watch (16 MiB): a client
    /// that holds this much unread is cancelled as too slow, as at
    /// `--watch-buffer` revisions, however few revisions that is.
    #[arg(long, env = "LATCHKEY_WATCH_BUFFER_BYTES", default_value_t = 16 << 20,
        value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..))]
    pub watch_buffer_bytes: usize,

    /// Client watches (gRPC and SSE) this proxy holds at most; past it a
    /// new watch is refused with `too_many_watches` (SSE: HTTP 429).
    #[arg(long, env = "LATCHKEY_MAX_WATCHES", default_value_t = 1_000_000,
        value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..))]
    pub max_watches: usize,

    /// Watches one client gRPC Watch stream holds at most; past it a
    /// create is refused (created and cancelled, the reason naming the
    /// limit), and the client opens another stream.
    #[arg(long, env = "LATCHKEY_MAX_WATCHES_PER_STREAM", default_value_t = 10_000,
        value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..))]
    pub max_watches_per_stream: usize,

    /// Memory for the serializable read cache, in bytes: ranges read
    /// often (or watched) are kept current by the proxy's watches and
    /// answered from here; least recently used out first. 0 turns it off.
    #[arg(long, env = "LATCHKEY_CACHE_BYTES", default_value_t = 64 << 20)]
    pub cache_bytes: usize,

    /// This proxy's share of each tenant's request rates, between 0 and 1:
    /// a tenant's `requests_per_second` (and per user) are for all proxies
    /// together, and each enforces rate x share. Give 1/N with N proxies
    /// behind one balancer that spreads clients evenly (the Helm chart
    /// sets 1/replicas).
    #[arg(long, env = "LATCHKEY_RATE_SHARE", default_value_t = 1.0)]
    pub rate_share: f64,

    /// How long an `Idempotency-Key` is remembered: a retry within it gets
    /// the first attempt's answer. Records are kept between this and 1.1
    /// times this (e.g. "24h", "10m").
    #[arg(long, env = "LATCHKEY_IDEMPOTENCY_RETENTION", default_value = "24h", value_parser = humantime::parse_duration)]
    pub idempotency_retention: Duration,

    /// Largest HTTP request body accepted, in bytes (the cell's request
    /// limit by default; a value over the cell's value limit is refused by
    /// the cell).
    #[arg(long, env = "LATCHKEY_MAX_REQUEST_BYTES", default_value_t = limits::DEFAULT_MAX_REQUEST_BYTES)]
    pub max_request_bytes: usize,

    #[command(flatten)]
    pub tls: latchkey_shared::tls::flags::ListenerFlags,

    #[command(flatten)]
    pub upstream_tls: latchkey_shared::tls::flags::UpstreamFlags,

    /// The user this proxy authenticates as to its cells once they have
    /// authentication on (it needs the root role: it writes latchkey's
    /// records, refreshes every session and watches any range for its
    /// clients, after checking each client's own permission with the
    /// client's token). Without it, a cell with authentication on refuses
    /// the proxy's own calls.
    #[arg(long, env = "LATCHKEY_CELL_USER", requires = "cell_password_file")]
    pub cell_user: Option<String>,

    /// A file holding --cell-user's password (its first line), so that it
    /// is in no process listing.
    #[arg(long, env = "LATCHKEY_CELL_PASSWORD_FILE", requires = "cell_user")]
    pub cell_password_file: Option<PathBuf>,

    /// A file whose first line is the key this proxy presents to its cells
    /// when it writes latchkey's own records (lock delays, audit,
    /// idempotency) while authentication is off: the same file as the
    /// cells' --proxy-key-file. Without it, a cell refuses those writes
    /// until authentication is on. With --dev, a key in --data-dir is made
    /// for the embedded cell and this proxy when none is given.
    #[arg(long, env = "LATCHKEY_PROXY_KEY_FILE")]
    pub proxy_key_file: Option<PathBuf>,

    /// Run a one-member cell inside this process (data in --data-dir, on
    /// free loopback ports) with this proxy in front of it; --cells is
    /// ignored.
    #[arg(long, env = "LATCHKEY_DEV")]
    pub dev: bool,

    /// The embedded cell's data directory (with --dev).
    #[arg(long, env = "LATCHKEY_DATA_DIR", default_value = "latchkey-data")]
    pub data_dir: PathBuf,

    /// Log filter (tracing's EnvFilter syntax), e.g. "info" or
    /// "latchkey_proxy=debug". The default shows latchkey's own events and
    /// openraft's warnings; "info" adds openraft's per-vote and
    /// per-replication lines.
    #[arg(long, env = "LATCHKEY_LOG", default_value = telemetry::DEFAULT_LOG_FILTER)]
    pub log: String,

    /// TEST-ONLY (debug builds; a release build has no such flag): retry
    /// writes whose outcome is unknown, a defect for the safety suite to
    /// catch. Never in production.
    #[cfg(debug_assertions)]
    #[arg(long)]
    pub unsafe_retry_ambiguous_writes: bool,

    /// TEST-ONLY (debug builds; a release build has no such flag): a
    /// write's revision does not raise its client's floor, so read-your-
    /// writes breaks: a defect for the safety suite to catch.
    #[cfg(debug_assertions)]
    #[arg(long)]
    pub unsafe_forget_write_floors: bool,

    /// TEST-ONLY (debug builds; a release build has no such flag): a
    /// prefix move switches cells without fencing the source, so writes
    /// taken during the switch are lost: a defect for the safety suite to
    /// catch.
    #[cfg(debug_assertions)]
    #[arg(long)]
    pub unsafe_unfenced_moves: bool,
}

/// Shortest refresh tick: below it the batches are mostly empty, and the
/// cell's leader answers one per tick per proxy.
const MIN_TICK: Duration = Duration::from_millis(10);

impl Config {
    /// Checks what clap cannot.
    pub fn validate(self) -> anyhow::Result<Config> {
        if self.cells.iter().all(|c| c.trim().is_empty()) {
            bail!("--cells needs at least one member address");
        }
        for addr in &self.cells {
            latchkey_shared::client::endpoint(addr).with_context(|| format!("--cells {addr}"))?;
        }
        let tls = self.upstream_tls.files().is_some();
        for addr in &self.cells {
            match addr.split_once("://") {
                Some(("https", _)) if !tls => {
                    bail!("--cells {addr}: https needs --cacert, the CA that signs the members' certificates")
                }
                Some(("http", _)) if tls => {
                    bail!("--cells {addr}: with --cacert the proxy speaks TLS to every member; name them https:// or host:port")
                }
                _ => {}
            }
        }
        if self.dev && tls {
            bail!("--dev: the embedded cell speaks plain text on loopback; --cacert, --cert and --key are for cells of their own");
        }
        if self.refresh_tick < MIN_TICK {
            bail!("--refresh-tick must be at least {MIN_TICK:?}");
        }
        if self.directory_interval < MIN_TICK {
            bail!("--directory-interval must be at least {MIN_TICK:?}");
        }
        if self.watch_buffer == 0 {
            bail!("--watch-buffer must be at least 1");
        }
        if !(self.rate_share > 0.0 && self.rate_share <= 1.0) {
            bail!(
                "--rate-share must be more than 0 and at most 1, not {}",
                self.rate_share
            );
        }
        if self.request_timeout.is_zero() {
            bail!("--request-timeout must be more than 0");
        }
        if self.idempotency_retention < Duration::from_secs(1)
            || self.idempotency_retention.as_secs() > limits::MAX_TTL_SECS as u64
        {
            bail!(
                "--idempotency-retention must be 1s to {} s",
                limits::MAX_TTL_SECS
            );
        }
        Ok(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_the_documented_ports() {
        let cfg = Config::parse_from(["latchkey-proxy"])
            .validate()
            .expect("valid");
        assert_eq!(cfg.http_addr, "127.0.0.1:7700");
        assert_eq!(cfg.grpc_addr, "127.0.0.1:7701");
        assert_eq!(cfg.metrics_addr, "127.0.0.1:7711");
        assert_eq!(cfg.cells, vec!["127.0.0.1:7801"]);
        assert_eq!(cfg.refresh_tick, Duration::from_millis(500));
    }

    #[test]
    fn cells_and_durations_parse_and_bad_ones_are_refused() {
        let cfg = Config::parse_from([
            "latchkey-proxy",
            "--cells",
            "127.0.0.1:1,127.0.0.1:2",
            "--refresh-tick",
            "1s",
        ])
        .validate()
        .expect("valid");
        assert_eq!(cfg.cells.len(), 2);
        assert_eq!(cfg.refresh_tick, Duration::from_secs(1));
        assert!(Config::try_parse_from(["latchkey-proxy", "--refresh-tick", "soon"]).is_err());
        let bad = Config::parse_from(["latchkey-proxy", "--cells", "https://x:1"]).validate();
        assert!(bad.is_err());
        let fast = Config::parse_from(["latchkey-proxy", "--refresh-tick", "1ms"]).validate();
        assert!(fast.is_err());
    }
}
