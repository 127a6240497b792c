//! Test kit for latchkey: clusters of real `latchkey-cell` processes on
//! 127.0.0.1 and the helpers that integration tests, the proxy's tests and
//! the load test share. Every helper fails by panicking with what it saw,
//! and every wait is bounded.
//!
//! # Layout
//!
//! - [`cluster`]: [`Cluster`] starts, kills, restarts and signals member
//!   processes, hands out etcd clients, and finds the leader and its
//!   followers. It takes the `latchkey-cell` binary as a parameter, so any
//!   crate's tests can start one ([`cell_binary`] finds it outside the cell
//!   crate).
//! - [`certs`]: test CAs and certificates ([`certs::Certs`], by
//!   `scripts/make-certs.sh`) and the TLS identity a test client dials
//!   with.
//! - [`ports`]: [`free_port`], ports no other test of this process holds.
//! - [`process`]: a process's resident memory and CPU time, from `/proc`.
//! - [`eventually`]: [`eventually()`](eventually::eventually), the one
//!   poll-until-deadline loop every wait is built on.
//! - [`metrics`]: [`http_get`] for `/metrics` and `/healthz`, and
//!   [`metric_value`] to read one series from Prometheus text.
//! - [`etcdctl`]: etcd's own command-line client, run once
//!   ([`etcdctl()`](etcdctl::etcdctl), [`try_etcdctl`]) or left running
//!   and read line by line ([`EtcdctlProcess`]), and [`member_id_in`] to
//!   read the space-padded member id it prints.
//! - [`bulk`]: many keys and leases at once ([`put_all`], [`grant_leases`],
//!   [`attach_keys`], [`grant_kept_alive`]) and [`count_keys`].
//! - [`background_writer`]: [`BackgroundWriter`], one key at a time until
//!   stopped, recording what was acknowledged (for membership changes and
//!   failover under load).
//! - [`auth_matrix`]: the permission matrix (four users, every kind of
//!   operation), configured and checked through any etcd endpoint.
//! - [`errors`]: [`err_text`], an etcd-client error as `"Code: message"`.
//! - [`linearizability`]: the checker of recorded key-value histories
//!   (Wing-Gong search with Lowe's memo, per key; unknown outcomes may
//!   have happened any time after their invocation, or never).
//! - [`lock_holders`]: [`Holders`], lock holders as `sh`+`curl`
//!   processes through a proxy (pausable as a whole), and [`FencedLog`],
//!   the fenced resource they write to, with its one-holder-at-a-time
//!   check.
//! - [`etcd`]: [`EtcdCluster`], real etcd members on 127.0.0.1, the
//!   reference latchkey is compared with.
//! - [`proxy`]: [`ProxyProcess`], a real `latchkey-proxy` in front of a
//!   [`Cluster`] or of its own `--dev` cell.
//! - [`proxy_key`]: the one proxies' key file the members and proxies
//!   a test binary starts share.
//! - [`etcdctl_session`]: the scripted etcdctl sessions, run against a
//!   cell's members or a proxy alike.
//! - [`outliers`]: [`outlier_bound`], a bound on outages and gaps taken
//!   from the run itself, so a loaded machine does not fail it.
//!
//! Data flows one way: a test starts a [`Cluster`], talks to its members
//! through `etcd-client` (or etcdctl), and waits with
//! [`eventually()`](eventually::eventually) for what must happen. Raw gRPC
//! stream clients are not here: they belong to the shared client crate.

pub mod auth_matrix;
pub mod background_writer;
pub mod blackhole;
pub mod bulk;
pub mod certs;
pub mod cluster;
pub mod errors;
pub mod etcd;
pub mod etcdctl;
pub mod etcdctl_session;
pub mod eventually;
pub mod linearizability;
pub mod lock_holders;
pub mod metrics;
pub mod outliers;
pub mod ports;
pub mod process;
pub mod proxy;
pub mod proxy_key;

/// How much earlier than "last refresh + TTL" a test may see a lease gone
/// before calling it an early expiry. The members and the test run on one
/// host's monotonic clock, and every delay (forwarding, commit, the expiry
/// tick, the read or watch that sees it) makes an expiry look later, never
/// earlier; what remains is millisecond rounding of checkpointed deadlines
/// and timer granularity.
pub const CLOCK_SLACK: std::time::Duration = std::time::Duration::from_millis(50);

pub use background_writer::BackgroundWriter;
pub use blackhole::{NetFaults, PeerBlackhole};
pub use bulk::{
    attach_keys, count_keys, grant_kept_alive, grant_leases, numbered, put_all, IN_FLIGHT,
};
pub use cluster::{cell_binary, Cluster, MemberSpec};
pub use errors::err_text;
pub use etcd::EtcdCluster;
pub use etcdctl::{etcdctl, member_id_in, try_etcdctl, EtcdctlProcess};
pub use eventually::{eventually, poll_until};
pub use lock_holders::{FencedLog, FencedSummary, FencedWrite, Holders, HOLDER_TTL_SECS};
pub use metrics::{http_get, http_request, metric_value};
pub use outliers::outlier_bound;
pub use ports::free_port;
pub use proxy::{proxy_binary, ProxyProcess};
