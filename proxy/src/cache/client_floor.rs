//! [`ClientFloors`]: the highest revision each client has been answered
//! by this proxy in each cell (revisions are per cell), so that no later
//! serializable answer to it from that cell reflects an older revision (a
//! cached range behind the client, or a member that lags, is never the
//! answer). A client is its connection's address: what the proxy can tell
//! apart without asking the client. A cell is the proxy's client of it
//! ([`CellKey`]).
//!
//! Floors of clients quiet for [`IDLE_FORGET`] are forgotten, so the map
//! follows the clients that are connected, not every client ever seen.

use dashmap::DashMap;
use std::net::SocketAddr;
use std::time::Duration;
use tokio::time::Instant;

/// A floor nobody used for this long is dropped.
pub const IDLE_FORGET: Duration = Duration::from_secs(600);

/// Which cell a floor is in: the address of the proxy's client of the
/// cell, which the proxy keeps as long as it runs (see
/// `upstream::Upstream::client`), so it names one cell throughout.
pub type CellKey = usize;

/// The [`CellKey`] of the cell `client` calls.
pub fn cell_key<T>(client: &std::sync::Arc<T>) -> CellKey {
    std::sync::Arc::as_ptr(client) as *const () as usize
}

#[derive(Default)]
pub struct ClientFloors {
    floors: DashMap<(SocketAddr, CellKey), (i64, Instant)>,
}

impl ClientFloors {
    /// The lowest revision `client` may be answered with in `cell` (0:
    /// any).
    pub fn floor(&self, client: Option<SocketAddr>, cell: CellKey) -> i64 {
        client
            .and_then(|c| self.floors.get(&(c, cell)).map(|f| f.0))
            .unwrap_or(0)
    }

    /// `client` was answered at `revision` in `cell`.
    pub fn raise(&self, client: Option<SocketAddr>, cell: CellKey, revision: i64) {
        let Some(client) = client else { return };
        let now = Instant::now();
        let mut floor = self.floors.entry((client, cell)).or_insert((revision, now));
        floor.0 = floor.0.max(revision);
        floor.1 = now;
    }

    /// Forgets the floors of clients quiet since `IDLE_FORGET`.
    pub fn sweep(&self) {
        let now = Instant::now();
        self.floors
            .retain(|_, (_, used)| now.duration_since(*used) < IDLE_FORGET);
    }

    pub fn len(&self) -> usize {
        self.floors.len()
    }

    pub fn is_empty(&self) -> bool {
        self.floors.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_floor_only_rises_is_per_cell_and_is_forgotten_when_idle() {
        let floors = ClientFloors::default();
        let a: SocketAddr = "127.0.0.1:4000".parse().expect("addr");
        let b: SocketAddr = "127.0.0.1:4001".parse().expect("addr");
        let (home, other) = (std::sync::Arc::new(1), std::sync::Arc::new(2));
        let (home, other) = (cell_key(&home), cell_key(&other));
        floors.raise(Some(a), home, 10);
        floors.raise(Some(a), home, 7);
        assert_eq!(floors.floor(Some(a), home), 10);
        assert_eq!(floors.floor(Some(a), other), 0, "another cell's revisions");
        floors.raise(Some(a), other, 4);
        assert_eq!(floors.floor(Some(a), other), 4);
        assert_eq!(floors.floor(Some(a), home), 10);
        assert_eq!(floors.floor(Some(b), home), 0);
        assert_eq!(floors.floor(None, home), 0);
        tokio::time::advance(IDLE_FORGET / 2).await;
        floors.raise(Some(b), home, 3);
        tokio::time::advance(IDLE_FORGET / 2).await;
        floors.sweep();
        assert_eq!(floors.floor(Some(a), home), 0, "a was idle");
        assert_eq!(floors.floor(Some(b), home), 3);
    }
}
