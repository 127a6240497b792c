//! The cell's integration tests: ONE binary (it links once), numbered by
//! area. Every test starts real `latchkey-cell` processes on 127.0.0.1 and
//! cleans them up when its `Cluster` is dropped.

mod harness;
mod t10_kv;
mod t20_lease;
mod t30_failover;
mod t40_watch;
mod t50_etcdctl;
mod t60_membership;
mod t70_sessions;
