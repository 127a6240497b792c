//! [`channel`]: one subscriber's queue of watch items, bounded by count
//! (`--watch-buffer` revisions) AND by the bytes of the events queued
//! (`--watch-buffer-bytes`), so a client that stops reading pins at most
//! that much, whatever the size of the values (review P4). Bytes are
//! counted as [`Revision::bytes`] when an item is queued and given back
//! when it is taken. A revision larger than the byte bound still goes
//! into an empty queue, alone.

use super::shared_watch::{Item, Revision};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use tokio::sync::mpsc;
use tokio::sync::mpsc::error::{SendError, TryRecvError, TrySendError};

/// The sending side (the shared watch, a catch-up).
#[derive(Clone)]
pub struct QueueTx {
    tx: mpsc::Sender<Item>,
    bytes: Arc<AtomicUsize>,
    max_bytes: usize,
}

/// The receiving side (the subscriber).
pub struct QueueRx {
    rx: mpsc::Receiver<Item>,
    bytes: Arc<AtomicUsize>,
}

/// A queue of at most `len` items and about `max_bytes` of events.
pub fn channel(len: usize, max_bytes: usize) -> (QueueTx, QueueRx) {
    let (tx, rx) = mpsc::channel(len.max(1));
    let bytes = Arc::new(AtomicUsize::new(0));
    (
        QueueTx {
            tx,
            bytes: bytes.clone(),
            max_bytes,
        },
        QueueRx { rx, bytes },
    )
}

fn size(item: &Item) -> usize {
    match item {
        Item::Events(revision) => Revision::bytes(revision),
        _ => 0,
    }
}

impl QueueTx {
    /// Queues `item` without waiting: `Full` when the queue holds its
    /// count, or when the item's events would take it past its bytes.
    pub fn try_send(&self, item: Item) -> Result<(), TrySendError<Item>> {
        let size = size(&item);
        let before = self.bytes.fetch_add(size, Ordering::Relaxed);
        if size > 0 && before > 0 && before + size > self.max_bytes {
            self.bytes.fetch_sub(size, Ordering::Relaxed);
            return Err(TrySendError::Full(item));
        }
        self.tx.try_send(item).inspect_err(|_| {
            self.bytes.fetch_sub(size, Ordering::Relaxed);
        })
    }

    /// Queues `item`, waiting for room by count (a cancel, or a hand-over
    /// from a queue that is itself bounded).
    pub async fn send(&self, item: Item) -> Result<(), SendError<Item>> {
        let size = size(&item);
        self.bytes.fetch_add(size, Ordering::Relaxed);
        self.tx.send(item).await.inspect_err(|_| {
            self.bytes.fetch_sub(size, Ordering::Relaxed);
        })
    }

    /// Resolves when the subscriber has gone.
    pub async fn closed(&self) {
        self.tx.closed().await
    }
}

impl QueueRx {
    /// The next item; `None` once every sender is gone and the queue is
    /// empty.
    pub async fn recv(&mut self) -> Option<Item> {
        let item = self.rx.recv().await?;
        self.bytes.fetch_sub(size(&item), Ordering::Relaxed);
        Some(item)
    }

    pub fn try_recv(&mut self) -> Result<Item, TryRecvError> {
        let item = self.rx.try_recv()?;
        self.bytes.fetch_sub(size(&item), Ordering::Relaxed);
        Ok(item)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use latchkey_shared::etcdpb::{PbEvent, PbKeyValue};

    fn revision(revision: i64, value_bytes: usize) -> Item {
        let event = PbEvent {
            kv: Some(PbKeyValue {
                key: b"k".to_vec(),
                value: vec![0; value_bytes],
                ..Default::default()
            }),
            ..Default::default()
        };
        Item::Events(Revision {
            revision,
            events: Arc::from(vec![event]),
            received: tokio::time::Instant::now(),
            herd: 1,
        })
    }

    #[test]
    fn a_queue_is_full_at_its_bytes_before_its_count_and_taking_makes_room() {
        let (tx, mut rx) = channel(1000, 10_000);
        let mut queued = 0;
        while tx.try_send(revision(queued + 1, 1_000)).is_ok() {
            queued += 1;
            assert!(queued < 1000, "never full");
        }
        // Each revision counts its value, key and 48 bytes: nine fit.
        assert_eq!(queued, 9);
        // Progress and cancels carry no events: not held to the bytes.
        assert!(tx.try_send(Item::Progress(9)).is_ok());
        assert!(rx.try_recv().is_ok());
        assert!(tx.try_send(revision(10, 1_000)).is_ok());
    }

    #[test]
    fn a_revision_larger_than_the_bound_goes_into_an_empty_queue_alone() {
        let (tx, mut rx) = channel(10, 100);
        assert!(tx.try_send(revision(1, 1_000)).is_ok());
        assert!(tx.try_send(revision(2, 1)).is_err());
        assert!(rx.try_recv().is_ok());
        assert!(tx.try_send(revision(2, 1)).is_ok());
    }
}
