//! The watch hub: the state machine publishes every applied revision's
//! changes here, and every watch stream of this member subscribes.
//!
//! The hub is a `tokio::sync::broadcast` ring of fixed capacity. Publishing
//! is O(1) and never waits: a subscriber that falls more than the capacity
//! behind loses its place and recovers from history (see
//! [`stream`](super::stream)). So a slow watcher cannot stall the apply loop
//! or any other watcher.

use crate::mvcc::keyspace::Event;
use std::sync::Arc;
use std::time::Instant;
use tokio::sync::broadcast;

/// Revisions of changes the ring holds before a lagging subscriber loses
/// its place. Each holds its events' values, so this also bounds memory.
pub const RING_REVISIONS: usize = 1024;

/// The changes of one revision.
#[derive(Debug)]
pub struct Changes {
    pub revision: i64,
    pub events: Vec<Event>,
    /// When the revision was applied, for commit-to-send latency.
    pub applied_at: Instant,
}

/// What subscribers receive.
#[derive(Debug)]
pub enum Notice {
    Changes(Changes),
    /// The state was replaced (a snapshot was installed): every subscriber
    /// must recover from history, as if it had lagged.
    Reset,
}

pub struct WatchHub {
    tx: broadcast::Sender<Arc<Notice>>,
}

impl Default for WatchHub {
    fn default() -> Self {
        Self::new()
    }
}

impl WatchHub {
    pub fn new() -> Self {
        let (tx, _) = broadcast::channel(RING_REVISIONS);
        WatchHub { tx }
    }

    /// Subscribes from now on. Subscribe BEFORE reading the state a stream
    /// starts from: then every revision after that state arrives here.
    pub fn subscribe(&self) -> broadcast::Receiver<Arc<Notice>> {
        self.tx.subscribe()
    }

    /// Publishes the changes of one applied entry, one notice per revision
    /// (a lease expiry entry spans several). Call after the state holds them.
    pub fn publish(&self, events: Vec<Event>, applied_at: Instant) {
        if events.is_empty() || self.tx.receiver_count() == 0 {
            return;
        }
        let mut batch: Vec<Event> = Vec::new();
        for event in events {
            if batch
                .last()
                .is_some_and(|e| e.revision() != event.revision())
            {
                self.send_batch(std::mem::take(&mut batch), applied_at);
            }
            batch.push(event);
        }
        self.send_batch(batch, applied_at);
    }

    fn send_batch(&self, events: Vec<Event>, applied_at: Instant) {
        let Some(revision) = events.first().map(Event::revision) else {
            return;
        };
        // No subscribers is not an error: nobody is watching.
        let _ = self.tx.send(Arc::new(Notice::Changes(Changes {
            revision,
            events,
            applied_at,
        })));
    }

    /// Tells every subscriber the state was replaced.
    pub fn reset(&self) {
        let _ = self.tx.send(Arc::new(Notice::Reset));
    }
}
