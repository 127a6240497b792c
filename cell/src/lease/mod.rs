//! The leader's lease deadlines: the [`lessor`] (a table of deadlines and
//! the expiry queue, pure) and the [`lessor_loop`] (the one task that
//! promotes and demotes it with leadership, checkpoints refreshed leases
//! through Raft and proposes expiries), and [`leader_leases`]: the
//! refreshes and time-to-live only the leader answers. Which leases exist is replicated
//! state: `crate::mvcc::lease_table`.

pub mod leader_leases;
pub mod lessor;
pub mod lessor_loop;
