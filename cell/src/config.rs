//! Command-line configuration, with `LATCHKEY_*` environment fallbacks.

use anyhow::{bail, Context};
use clap::Parser;
use latchkey_shared::auth::proxy_key::ProxyKeys;
use latchkey_shared::{limits, telemetry};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

/// latchkey-cell: one member of a Raft-replicated, etcd v3 compatible
/// coordination store.
#[derive(Debug, Clone, Parser)]
#[command(name = "latchkey-cell", version, about, long_about = None)]
pub struct Config {
    /// This member's id: a positive integer, unique in the cell and never
    /// reused. It must match its entry in --initial-cluster. With --join it
    /// may be left out: the id MemberAdd gave this peer address is used.
    #[arg(long, env = "LATCHKEY_ID")]
    pub id: Option<u64>,

    /// Directory for the Raft log, vote and snapshots. Created if missing;
    /// a directory belongs to one member id for life.
    #[arg(long, env = "LATCHKEY_DATA_DIR")]
    pub data_dir: Option<PathBuf>,

    /// Address for clients: the etcd v3 gRPC API.
    #[arg(long, env = "LATCHKEY_CLIENT_ADDR", default_value = "127.0.0.1:7801")]
    pub client_addr: String,

    /// Address for the other members (Raft and forwarded requests).
    #[arg(long, env = "LATCHKEY_PEER_ADDR", default_value = "127.0.0.1:7901")]
    pub peer_addr: String,

    /// The peer address the other members dial, and the one
    /// --initial-cluster names for this member: host:port, where host may
    /// be a DNS name (default: --peer-addr). Needed when --peer-addr binds
    /// a wildcard (0.0.0.0:7901), e.g. in Kubernetes, where the pod's
    /// stable DNS name outlives its IP.
    #[arg(long, env = "LATCHKEY_ADVERTISE_PEER_ADDR")]
    pub advertise_peer_addr: Option<String>,

    /// The client address MemberList publishes for this member (host:port;
    /// default: --client-addr).
    #[arg(long, env = "LATCHKEY_ADVERTISE_CLIENT_ADDR")]
    pub advertise_client_addr: Option<String>,

    /// Every voting member as id=peer-address, comma separated, e.g.
    /// 1=127.0.0.1:7901,2=127.0.0.1:7902,3=127.0.0.1:7903. The same on
    /// every member; used only to bootstrap a new cell.
    #[arg(long, env = "LATCHKEY_INITIAL_CLUSTER")]
    pub initial_cluster: Option<String>,

    /// Join a running cell instead of bootstrapping one: client URLs of
    /// its members, comma separated. Add this member first (etcdctl member
    /// add NAME --peer-urls=http://PEER-ADDR [--learner]).
    #[arg(long, env = "LATCHKEY_JOIN", conflicts_with = "initial_cluster")]
    pub join: Option<String>,

    /// Start a NEW cell from a state file saved by `etcdctl snapshot save`
    /// (Maintenance.Snapshot): its keys, history, revision and leases. Give
    /// the same file to every member of the new cell; the data directory
    /// must be empty.
    #[arg(long, env = "LATCHKEY_RESTORE", conflicts_with = "join")]
    pub restore: Option<PathBuf>,

    /// With --restore: move the restored revision on by this much and
    /// compact everything before it (as `etcdutl snapshot restore
    /// --bump-revision N --mark-compacted`), so no revision the old cell
    /// may have issued after the backup (a fencing token, a create or mod
    /// revision a client compares on) is issued again, and no watch resumes
    /// across the gap. Use it whenever clients may have used the old cell
    /// after the backup was taken, with more than the writes it took since
    /// (1000000000 leaves room for any). Every member of the new cell takes
    /// the same value. Without --restore it does nothing (a member that
    /// restarts, or joins, keeps it set harmlessly).
    #[arg(long, env = "LATCHKEY_RESTORE_BUMP_REVISION", default_value_t = 0,
        value_parser = clap::value_parser!(u64).range(0..=(1u64 << 62)))]
    pub restore_bump_revision: u64,

    /// Address for /metrics (Prometheus), /healthz and /readyz.
    #[arg(long, env = "LATCHKEY_METRICS_ADDR", default_value = "127.0.0.1:7811")]
    pub metrics_addr: String,

    /// A one-member cell in ./latchkey-data on the default addresses; no
    /// other flag needed.
    #[arg(long, env = "LATCHKEY_DEV")]
    pub dev: bool,

    /// Member name reported by MemberList (defaults to "cell-<id>").
    #[arg(long, env = "LATCHKEY_NAME")]
    pub name: Option<String>,

    /// Largest value a put may carry, in bytes.
    #[arg(long, env = "LATCHKEY_MAX_VALUE_BYTES", default_value_t = limits::DEFAULT_MAX_VALUE_BYTES)]
    pub max_value_bytes: usize,

    /// Largest gRPC request accepted, in bytes.
    #[arg(long, env = "LATCHKEY_MAX_REQUEST_BYTES", default_value_t = limits::DEFAULT_MAX_REQUEST_BYTES)]
    pub max_request_bytes: usize,

    /// Keyspace quota in bytes (all kept versions of keys and values);
    /// writes beyond it fail with "database space exceeded".
    #[arg(long, env = "LATCHKEY_QUOTA_BYTES", default_value_t = limits::DEFAULT_QUOTA_BYTES)]
    pub quota_bytes: u64,

    /// Shortest lease TTL granted, in seconds; a grant asking for less gets
    /// this (as etcd raises it to its minimum).
    #[arg(long, env = "LATCHKEY_MIN_TTL", default_value_t = limits::DEFAULT_MIN_TTL_SECS)]
    pub min_ttl: i64,

    /// How long a request waits for a leader (or for its commit) before it
    /// fails, in milliseconds.
    #[arg(long, env = "LATCHKEY_REQUEST_TIMEOUT_MS", default_value_t = 5000)]
    pub request_timeout_ms: u64,

    /// Raft heartbeat interval in milliseconds. openraft also uses it as the
    /// timeout of every replication request.
    #[arg(long, env = "LATCHKEY_HEARTBEAT_MS", default_value_t = 150)]
    pub heartbeat_ms: u64,

    /// Minimum Raft election timeout in milliseconds; the maximum is 5/4 of
    /// this. openraft also gives a leader a lease of the maximum, during
    /// which followers refuse to vote, so a dead leader is replaced after
    /// roughly 2.25x to 2.5x this value (0.9-1 s at the default 400), or
    /// up to 5x for a member that lost an earlier election on the length
    /// of its log.
    #[arg(long, env = "LATCHKEY_ELECTION_TIMEOUT_MS", default_value_t = 400)]
    pub election_timeout_ms: u64,

    /// Take a snapshot every this many applied log entries, and every this
    /// many client writes (group commit puts many writes in one entry). The
    /// default is etcd's `--snapshot-count`: a snapshot encodes the whole
    /// state, and every 10 000 writes it cost a loaded 2-core cell its p99.
    #[arg(long, env = "LATCHKEY_SNAPSHOT_ENTRIES", default_value_t = 100_000)]
    pub snapshot_entries: u64,

    /// Log entries kept behind a snapshot, so slightly lagging followers
    /// catch up from the log rather than by a snapshot.
    #[arg(long, env = "LATCHKEY_SNAPSHOT_KEEP_ENTRIES", default_value_t = 1_000)]
    pub snapshot_keep_entries: u64,

    /// Longest lease TTL granted, in seconds (etcd's maximum by default).
    #[arg(long, env = "LATCHKEY_MAX_TTL", default_value_t = limits::MAX_TTL_SECS)]
    pub max_ttl: i64,

    /// After a leader change, a lease whose last checkpoint says it is due
    /// (or nearly) still gets this long, in milliseconds, for its client to
    /// reach the new leader; never more than this past its checkpointed
    /// deadline. A dead lease thus expires at most TTL + this after its last
    /// refresh, however often leadership changes.
    #[arg(long, env = "LATCHKEY_LEASE_GRACE_MS", default_value_t = 5_000)]
    pub lease_grace_ms: u64,

    /// How often the leader checkpoints refreshed lease deadlines through
    /// Raft (one entry covers up to 10 000 leases), in milliseconds.
    #[arg(
        long,
        env = "LATCHKEY_LEASE_CHECKPOINT_INTERVAL_MS",
        default_value_t = 1_000
    )]
    pub lease_checkpoint_interval_ms: u64,

    /// How often a watch that asked for progress notifications and was sent
    /// nothing meanwhile gets one, in milliseconds (etcd: 10 minutes).
    #[arg(
        long,
        env = "LATCHKEY_WATCH_PROGRESS_NOTIFY_INTERVAL_MS",
        default_value_t = 600_000
    )]
    pub watch_progress_notify_interval_ms: u64,

    /// Watches one watch stream may hold; more are refused with a reason.
    #[arg(
        long,
        env = "LATCHKEY_MAX_WATCHES_PER_STREAM",
        default_value_t = 100_000
    )]
    pub max_watches_per_stream: usize,

    /// "periodic" (retention is a duration) or "revision" (retention is a
    /// number of revisions), as etcd's --auto-compaction-mode.
    #[arg(
        long,
        env = "LATCHKEY_AUTO_COMPACTION_MODE",
        default_value = "periodic"
    )]
    pub auto_compaction_mode: String,

    /// History to keep; "0" turns automatic compaction off. Periodic mode:
    /// a duration such as "30m", "1h", "90s", or a bare number of hours
    /// (as etcd). Revision mode: a number of revisions.
    #[arg(long, env = "LATCHKEY_AUTO_COMPACTION_RETENTION", default_value = "0")]
    pub auto_compaction_retention: String,

    /// Keys (one per line) with which proxies write latchkey's own records
    /// under `\0latchkey/` (lock delays, audit, idempotency) while
    /// authentication is off; give every proxy the same file. Without it
    /// nothing writes there through this member's client port until
    /// authentication is on, when the role latchkey-proxy does.
    #[arg(long, env = "LATCHKEY_PROXY_KEY_FILE")]
    pub proxy_key_file: Option<PathBuf>,

    #[command(flatten)]
    pub tls: latchkey_shared::tls::flags::ListenerFlags,

    #[command(flatten)]
    pub peer_tls: latchkey_shared::tls::flags::PeerFlags,

    /// Log filter (tracing's EnvFilter syntax), e.g. "info" or
    /// "latchkey_cell=debug". The default shows latchkey's own events and
    /// openraft's warnings; "info" adds openraft's per-vote and
    /// per-replication lines.
    #[arg(long, env = "LATCHKEY_LOG", default_value = telemetry::DEFAULT_LOG_FILTER)]
    pub log: String,

    /// TEST-ONLY (debug builds; a release build has no such flag): serve
    /// `/debug/fail-points` on the metrics address, where the safety suite
    /// arms crash points at the persist steps. Never in production.
    #[cfg(debug_assertions)]
    #[arg(long)]
    pub unsafe_fail_points: bool,

    /// TEST-ONLY (debug builds; a release build has no such flag): a defect
    /// to switch on, for the safety suite to prove it notices
    /// (repeatable). Never in production.
    #[cfg(debug_assertions)]
    #[arg(long, value_enum)]
    pub unsafe_break: Vec<crate::chaos::Break>,
}

/// The configuration after `--dev` and defaults are resolved.
#[derive(Debug, Clone)]
pub struct Resolved {
    pub id: u64,
    pub data_dir: PathBuf,
    pub initial_cluster: BTreeMap<u64, String>,
    /// Client URLs of a running cell to join (empty: bootstrap or restart).
    pub join: Vec<String>,
    pub retention: Retention,
    pub name: String,
    pub cluster_id: u64,
    /// From --proxy-key-file (none without it).
    pub proxy_keys: ProxyKeys,
    pub cfg: Config,
}

/// Parses "1=host:port,2=host:port".
pub fn parse_initial_cluster(s: &str) -> anyhow::Result<BTreeMap<u64, String>> {
    let mut out = BTreeMap::new();
    for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (id, addr) = part
            .split_once('=')
            .with_context(|| format!("'{part}' is not id=address"))?;
        let id: u64 = id
            .trim()
            .parse()
            .with_context(|| format!("member id '{id}' is not a positive integer"))?;
        if id == 0 {
            bail!("member id 0 is reserved; use positive ids");
        }
        let addr = addr.trim();
        if addr.parse::<std::net::SocketAddr>().is_err() && !addr.contains(':') {
            bail!("member {id} address '{addr}' is not host:port");
        }
        if out.insert(id, addr.to_string()).is_some() {
            bail!("member id {id} appears twice in --initial-cluster");
        }
    }
    if out.is_empty() {
        bail!("--initial-cluster names no member");
    }
    Ok(out)
}

/// How much history automatic compaction keeps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Retention {
    Off,
    Revisions(i64),
    Period(Duration),
}

fn parse_duration(s: &str) -> anyhow::Result<Duration> {
    let split = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let (number, unit) = s.split_at(split);
    let n: f64 = number
        .parse()
        .with_context(|| format!("'{s}' is not a duration such as 30m, 1h or 90s"))?;
    let secs = match unit {
        // A bare number is hours, as in etcd.
        "" | "h" => n * 3600.0,
        "m" => n * 60.0,
        "s" => n,
        "ms" => n / 1000.0,
        _ => bail!("'{s}': unknown unit '{unit}' (use ms, s, m or h)"),
    };
    if !secs.is_finite() || secs < 0.0 {
        bail!("'{s}' is not a valid duration");
    }
    Ok(Duration::from_secs_f64(secs))
}

/// Reads `--auto-compaction-mode` and `--auto-compaction-retention`.
pub fn parse_retention(mode: &str, retention: &str) -> anyhow::Result<Retention> {
    let retention = retention.trim();
    match mode {
        "revision" => {
            let n: i64 = retention.parse().with_context(|| {
                format!("--auto-compaction-retention '{retention}' is not a number of revisions")
            })?;
            match n {
                0 => Ok(Retention::Off),
                n if n > 0 => Ok(Retention::Revisions(n)),
                _ => bail!("--auto-compaction-retention must not be negative"),
            }
        }
        "periodic" => match parse_duration(retention)? {
            d if d.is_zero() => Ok(Retention::Off),
            d if d < Duration::from_secs(1) => {
                bail!("--auto-compaction-retention '{retention}' is under one second")
            }
            d => Ok(Retention::Period(d)),
        },
        other => bail!("--auto-compaction-mode '{other}' is neither 'periodic' nor 'revision'"),
    }
}

/// Limits enforced before a request is proposed.
#[derive(Debug, Clone)]
pub struct Limits {
    pub max_value_bytes: usize,
    pub max_request_bytes: usize,
    pub quota_bytes: u64,
    pub min_ttl: i64,
    pub max_ttl: i64,
}

impl Resolved {
    pub fn limits(&self) -> Limits {
        Limits {
            max_value_bytes: self.cfg.max_value_bytes,
            max_request_bytes: self.cfg.max_request_bytes,
            quota_bytes: self.cfg.quota_bytes,
            min_ttl: self.cfg.min_ttl,
            max_ttl: self.cfg.max_ttl,
        }
    }

    /// How long a client request may wait (for a leader, a commit, a read
    /// index) before it fails.
    pub fn request_timeout(&self) -> Duration {
        Duration::from_millis(self.cfg.request_timeout_ms)
    }

    /// The minimum Raft election timeout.
    pub fn election_timeout(&self) -> Duration {
        Duration::from_millis(self.cfg.election_timeout_ms)
    }

    /// How long a leader may go without hearing from a quorum and still
    /// count as leading (check-quorum, `/readyz`): four election timeouts.
    /// (A grant of lease time waits at most one election timeout for its
    /// own confirmation round.) A replacement leader needs about that long to be elected
    /// and act (openraft's leader lease of the maximum election timeout,
    /// then an election), so stepping down by then is in time; one
    /// election timeout was too short on a loaded 2-core machine, where
    /// replication acknowledgements run late (openraft times replication
    /// out at the heartbeat interval, cell review P5) and a leader with a
    /// quorum counted itself cut off.
    pub fn quorum_timeout(&self) -> Duration {
        Duration::from_millis(self.cfg.election_timeout_ms * 4)
    }

    /// How often the leader checkpoints refreshed leases through Raft;
    /// never more often than every 50 ms, which already costs one small
    /// entry per tick.
    pub fn lease_checkpoint_interval(&self) -> Duration {
        Duration::from_millis(self.cfg.lease_checkpoint_interval_ms.max(50))
    }
}

impl Config {
    /// The peer address the other members dial.
    pub fn advertised_peer_addr(&self) -> &str {
        self.advertise_peer_addr
            .as_deref()
            .unwrap_or(&self.peer_addr)
    }

    /// The client address published for this member.
    pub fn advertised_client_addr(&self) -> &str {
        self.advertise_client_addr
            .as_deref()
            .unwrap_or(&self.client_addr)
    }

    pub fn resolve(self) -> anyhow::Result<Resolved> {
        for (flag, addr, advertised) in [
            ("--peer-addr", &self.peer_addr, &self.advertise_peer_addr),
            (
                "--client-addr",
                &self.client_addr,
                &self.advertise_client_addr,
            ),
        ] {
            let wildcard = addr
                .parse::<std::net::SocketAddr>()
                .is_ok_and(|a| a.ip().is_unspecified());
            if wildcard && advertised.is_none() {
                bail!(
                    "{flag} {addr} binds every interface: give the address others reach this \
                     member at with --advertise-{}",
                    &flag[2..]
                );
            }
            if let Some(a) = advertised {
                if !a.contains(':') || a.starts_with(':') || a.ends_with(':') {
                    bail!("--advertise-{} '{a}' is not host:port", &flag[2..]);
                }
            }
        }
        let join: Vec<String> = self
            .join
            .as_deref()
            .unwrap_or_default()
            .split(',')
            .map(str::trim)
            .filter(|u| !u.is_empty())
            .map(String::from)
            .collect();
        if self.join.is_some() && join.is_empty() {
            bail!("--join names no client URL");
        }
        let id = match (self.id, self.dev) {
            (Some(0), _) => bail!("--id must be a positive integer"),
            (Some(id), _) => id,
            (None, true) => 1,
            // Learned from the cell at startup.
            (None, false) if !join.is_empty() => 0,
            (None, false) => bail!("--id is required (or --dev for a one-member cell)"),
        };
        let data_dir = match (&self.data_dir, self.dev) {
            (Some(d), _) => d.clone(),
            (None, true) => PathBuf::from("latchkey-data"),
            (None, false) => bail!("--data-dir is required (or --dev)"),
        };
        let initial_cluster = match (&self.initial_cluster, self.dev) {
            (Some(s), _) => parse_initial_cluster(s)?,
            (None, true) => BTreeMap::from([(id, self.advertised_peer_addr().to_string())]),
            (None, false) if !join.is_empty() => BTreeMap::new(),
            (None, false) => {
                bail!("--initial-cluster (or --join) is required, or --dev for a one-member cell")
            }
        };
        match initial_cluster.get(&id) {
            _ if !join.is_empty() => {}
            Some(addr) if addr != self.advertised_peer_addr() => {
                bail!(
                    "--initial-cluster gives member {id} the address {addr} but its advertised \
                     peer address (--advertise-peer-addr, else --peer-addr) is {}",
                    self.advertised_peer_addr()
                )
            }
            None => bail!("--initial-cluster does not name this member (id {id})"),
            _ => {}
        }
        if self.min_ttl < 1 {
            bail!("--min-ttl must be at least 1 second");
        }
        if self.max_ttl < self.min_ttl || self.max_ttl > limits::MAX_TTL_SECS {
            bail!(
                "--max-ttl must be between --min-ttl and {}",
                limits::MAX_TTL_SECS
            );
        }
        if self.election_timeout_ms <= self.heartbeat_ms * 2 {
            bail!("--election-timeout-ms must be more than twice --heartbeat-ms");
        }
        // A new leader covers the refreshes the old one confirmed but never
        // checkpointed with the grace (crate::lease::lessor).
        if self.lease_grace_ms <= self.lease_checkpoint_interval_ms.max(50) {
            bail!(
                "--lease-grace-ms ({}) must be more than --lease-checkpoint-interval-ms ({}), \
                 or a leader change could end a lease before the time a keep-alive promised",
                self.lease_grace_ms,
                self.lease_checkpoint_interval_ms
            );
        }
        let retention =
            parse_retention(&self.auto_compaction_mode, &self.auto_compaction_retention)?;
        let name = self.name.clone().unwrap_or_else(|| format!("cell-{id}"));
        let proxy_keys = match &self.proxy_key_file {
            Some(path) => ProxyKeys::load(path)?,
            None => ProxyKeys::default(),
        };
        Ok(Resolved {
            id,
            data_dir,
            // A joining member learns the cell's id from the cell.
            cluster_id: crate::ids::cluster_id(&initial_cluster),
            initial_cluster,
            join,
            retention,
            name,
            proxy_keys,
            cfg: self,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn initial_cluster_parses_and_rejects_bad_input() {
        let m = parse_initial_cluster("1=127.0.0.1:7901, 2=127.0.0.1:7902").expect("valid");
        assert_eq!(m.len(), 2);
        assert!(parse_initial_cluster("1=a:1,1=b:2").is_err());
        assert!(parse_initial_cluster("x=a:1").is_err());
        assert!(parse_initial_cluster("0=a:1").is_err());
        assert!(parse_initial_cluster("").is_err());
    }

    #[test]
    fn a_wildcard_bind_needs_an_advertised_address_and_initial_cluster_names_that() {
        let member = |extra: &[&str]| {
            let mut args = vec![
                "latchkey-cell",
                "--id",
                "1",
                "--data-dir",
                "/tmp/x",
                "--initial-cluster",
                "1=cell-0.peers:7901,2=cell-1.peers:7901",
            ];
            args.extend_from_slice(extra);
            Config::parse_from(args).resolve()
        };
        let ok = member(&[
            "--peer-addr",
            "0.0.0.0:7901",
            "--advertise-peer-addr",
            "cell-0.peers:7901",
            "--client-addr",
            "0.0.0.0:7801",
            "--advertise-client-addr",
            "cell-0.peers:7801",
        ])
        .expect("a wildcard bind with DNS names advertised");
        assert_eq!(ok.cfg.advertised_peer_addr(), "cell-0.peers:7901");
        assert_eq!(ok.cfg.advertised_client_addr(), "cell-0.peers:7801");
        let err = |extra: &[&str]| format!("{:#}", member(extra).expect_err("refused"));
        assert!(err(&["--peer-addr", "0.0.0.0:7901"]).contains("--advertise-peer-addr"));
        assert!(err(&[
            "--peer-addr",
            "0.0.0.0:7901",
            "--advertise-peer-addr",
            "cell-0.peers:7901",
            "--client-addr",
            "0.0.0.0:7801",
        ])
        .contains("--advertise-client-addr"));
        assert!(err(&[
            "--peer-addr",
            "0.0.0.0:7901",
            "--advertise-peer-addr",
            "cell-9.peers:7901",
        ])
        .contains("advertised"));
        assert!(err(&[
            "--peer-addr",
            "0.0.0.0:7901",
            "--advertise-peer-addr",
            "cell-0"
        ])
        .contains("not host:port"));
    }

    #[test]
    fn dev_needs_no_other_flag() {
        let cfg = Config::parse_from(["latchkey-cell", "--dev"]);
        let r = cfg.resolve().expect("dev resolves");
        assert_eq!(r.id, 1);
        assert_eq!(
            r.initial_cluster.get(&1).map(String::as_str),
            Some("127.0.0.1:7901")
        );
    }

    #[test]
    fn retention_reads_like_etcd_and_rejects_nonsense() {
        assert_eq!(parse_retention("periodic", "0").ok(), Some(Retention::Off));
        assert_eq!(
            parse_retention("periodic", "1").ok(),
            Some(Retention::Period(Duration::from_secs(3600)))
        );
        assert_eq!(
            parse_retention("periodic", "30m").ok(),
            Some(Retention::Period(Duration::from_secs(1800)))
        );
        assert_eq!(
            parse_retention("revision", "1000").ok(),
            Some(Retention::Revisions(1000))
        );
        assert!(parse_retention("revision", "1h").is_err());
        assert!(parse_retention("revision", "-5").is_err());
        assert!(parse_retention("periodic", "5 parsecs").is_err());
        assert!(parse_retention("periodic", "10ms").is_err());
        assert!(parse_retention("hourly", "1").is_err());
    }
}
