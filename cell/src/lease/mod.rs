//! Leases: the replicated [`lease_table`] (which leases exist and their keys)
//! and the leader-only [`lessor`] (deadlines, refreshes, expiry).

pub mod lease_table;
pub mod lessor;
