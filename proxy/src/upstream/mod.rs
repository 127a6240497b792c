//! The cells behind this proxy, as the proxy sees them ("upstream").
//!
//! - [`cell_client`]: [`CellClient`], channels to one cell's members and
//!   the one place a forwarded call is routed, timed and retried (by the
//!   error's retry class only).
//! - [`leader_tracker`]: [`LeaderTracker`], one task per cell that learns
//!   member ids, the leader and which members are up.
//! - [`identity`]: [`CellIdentity`], one task per cell that learns whether
//!   it has authentication on and keeps the proxy's own token fresh.
//! - [`accepted_tokens`]: the client tokens a cell accepted, with their
//!   users, for what the proxy does per user before it asks the cell.
//!
//! [`Upstream`] holds the cells by cell id. A proxy fronts one cell today;
//! DESIGN section 9 routes each tenant (top-level key prefix) to its cell,
//! so callers ask [`Upstream::cell_for`] with the key they serve instead of
//! assuming there is only one.

pub mod accepted_tokens;
pub mod cell_client;
pub mod identity;
pub mod leader_tracker;

pub use cell_client::{Cell, CellClient, Kind, Route, Who};
pub use identity::CellIdentity;
pub use leader_tracker::LeaderTracker;

use std::sync::Arc;

pub struct Upstream {
    /// Every cell this proxy fronts, in configuration order.
    cells: Vec<Cell>,
}

impl Upstream {
    /// The cells, at least one.
    pub fn new(cells: Vec<CellClient>) -> Result<Upstream, latchkey_shared::ApiError> {
        if cells.is_empty() {
            return Err(latchkey_shared::ApiError::invalid("no cell given"));
        }
        Ok(Upstream {
            cells: cells.into_iter().map(Arc::new).collect(),
        })
    }

    /// The cell that holds `key`. With one cell that is always it; with
    /// several, the tenant map of DESIGN section 9 decides.
    pub fn cell_for(&self, _key: &[u8]) -> &Cell {
        &self.cells[0]
    }

    /// The cell for requests that name no key (leases, membership, status).
    /// Leases are cell-wide, so with several cells a lease id would carry
    /// its cell; with one it is the one.
    pub fn home(&self) -> &Cell {
        &self.cells[0]
    }

    pub fn cells(&self) -> &[Cell] {
        &self.cells
    }

    /// Whether every cell has a known leader that answers.
    pub fn not_ready(&self) -> Option<String> {
        self.cells.iter().find_map(|cell| match cell.leader() {
            None => Some(format!(
                "no leader known for the cell at {}",
                cell.members
                    .iter()
                    .map(|m| m.addr.as_str())
                    .collect::<Vec<_>>()
                    .join(",")
            )),
            Some(i) if !cell.members[i].is_up() => Some(format!(
                "the leader at {} does not answer",
                cell.members[i].addr
            )),
            Some(_) => None,
        })
    }
}
