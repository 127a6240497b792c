//! The cell's integration tests: ONE binary (it links once), numbered by
//! area. Every test starts real `latchkey-cell` processes on 127.0.0.1
//! through `latchkey_testkit::Cluster`, which cleans them up when dropped.
//! Tests that drive lease streams by hand use the one shared client
//! (`latchkey_shared::client`), as a proxy would.

mod t10_kv;
mod t20_lease;
mod t30_failover;
mod t40_watch;
mod t50_etcdctl;
mod t60_membership;
mod t70_sessions;
mod t80_sharing;
mod t90_tls;
mod t95_auth;
mod t96_tenants;

/// The binary under test; cargo builds it for this test binary.
pub const CELL_BIN: &str = env!("CARGO_BIN_EXE_latchkey-cell");
