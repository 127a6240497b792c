//! [`ClientFloors`]: the highest revision each client has been answered
//! by this proxy's serializable reads, so that no later answer to it
//! reflects an older revision (a cached range behind the client, or a
//! member that lags, is never the answer). A client is its connection's
//! address: what the proxy can tell apart without asking the client.
//!
//! Floors of clients quiet for [`IDLE_FORGET`] are forgotten, so the map
//! follows the clients that are connected, not every client ever seen.

use dashmap::DashMap;
use std::net::SocketAddr;
use std::time::Duration;
use tokio::time::Instant;

/// A floor nobody used for this long is dropped.
pub const IDLE_FORGET: Duration = Duration::from_secs(600);

#[derive(Default)]
pub struct ClientFloors {
    floors: DashMap<SocketAddr, (i64, Instant)>,
}

impl ClientFloors {
    /// The lowest revision `client` may be answered with (0: any).
    pub fn floor(&self, client: Option<SocketAddr>) -> i64 {
        client
            .and_then(|c| self.floors.get(&c).map(|f| f.0))
            .unwrap_or(0)
    }

    /// `client` was answered at `revision`.
    pub fn raise(&self, client: Option<SocketAddr>, revision: i64) {
        let Some(client) = client else { return };
        let now = Instant::now();
        let mut floor = self.floors.entry(client).or_insert((revision, now));
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
    async fn a_floor_only_rises_and_is_forgotten_when_idle() {
        let floors = ClientFloors::default();
        let a: SocketAddr = "127.0.0.1:4000".parse().expect("addr");
        let b: SocketAddr = "127.0.0.1:4001".parse().expect("addr");
        floors.raise(Some(a), 10);
        floors.raise(Some(a), 7);
        assert_eq!(floors.floor(Some(a)), 10);
        assert_eq!(floors.floor(Some(b)), 0);
        assert_eq!(floors.floor(None), 0);
        tokio::time::advance(IDLE_FORGET / 2).await;
        floors.raise(Some(b), 3);
        tokio::time::advance(IDLE_FORGET / 2).await;
        floors.sweep();
        assert_eq!(floors.floor(Some(a)), 0, "a was idle");
        assert_eq!(floors.floor(Some(b)), 3);
    }
}
