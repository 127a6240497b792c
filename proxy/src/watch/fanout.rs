//! Fan-out with jitter (DESIGN section 4): each subscriber's revisions are
//! handed to its client a fixed offset after they reached the proxy, the
//! offsets spread evenly over `--fanout-jitter`, so that 100 000 clients
//! watching one key do not all re-read in the same millisecond.
//!
//! The offset is fixed per subscriber, so its revisions keep their order;
//! it is derived from the subscriber's id (a hash), so it needs no random
//! source and a test can predict it.

use super::coalescer::Subscription;
use super::shared_watch::Item;
use crate::metrics_catalog::{FANOUT_DELAY_SECONDS, WATCH_EVENTS_OUT};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Hands out the offsets of `--fanout-jitter`, one per client watch.
pub struct Fanout {
    jitter: Duration,
    next: AtomicU64,
}

impl Fanout {
    pub fn new(jitter: Duration) -> Fanout {
        Fanout {
            jitter,
            next: AtomicU64::new(0),
        }
    }

    /// The offset of the next client watch.
    pub fn next_offset(&self) -> Duration {
        offset(self.jitter, self.next.fetch_add(1, Ordering::Relaxed))
    }
}

/// A subscriber's delay in `[0, jitter)`, spread evenly over the ids.
pub fn offset(jitter: Duration, subscriber: u64) -> Duration {
    if jitter.is_zero() {
        return Duration::ZERO;
    }
    // splitmix64: consecutive ids land far apart.
    let mut x = subscriber.wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^= x >> 31;
    let nanos = jitter.as_nanos() * u128::from(x) / (u128::from(u64::MAX) + 1);
    Duration::from_nanos(u64::try_from(nanos).unwrap_or(u64::MAX))
}

/// One client watch's items, each revision handed out no earlier than its
/// arrival at the proxy plus the client's offset. Progress and cancel
/// items are not held back: they carry no news a herd would re-read.
pub struct Paced {
    items: Subscription,
    offset: Duration,
    /// Looked up once: every delivery of every client records into them.
    delay: metrics::Histogram,
    events_out: metrics::Counter,
}

impl Paced {
    pub fn new(items: Subscription, offset: Duration) -> Paced {
        Paced {
            items,
            offset,
            delay: metrics::histogram!(FANOUT_DELAY_SECONDS.name),
            events_out: metrics::counter!(WATCH_EVENTS_OUT.name),
        }
    }

    /// The next item when it is due; `None` when the subscription closed
    /// (with no cancel item before it: dropped as too slow).
    pub async fn next(&mut self) -> Option<Item> {
        let item = self.items.recv().await?;
        if let Item::Events(revision) = &item {
            let due = revision.received + self.offset;
            if due > tokio::time::Instant::now() {
                tokio::time::sleep_until(due).await;
            }
            self.delay.record(revision.received.elapsed().as_secs_f64());
            self.events_out.increment(revision.events.len() as u64);
        }
        Some(item)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_jitter_no_delay_and_offsets_spread_evenly_over_the_window() {
        assert_eq!(offset(Duration::ZERO, 7), Duration::ZERO);
        let jitter = Duration::from_millis(200);
        let offsets: Vec<Duration> = (0..10_000).map(|id| offset(jitter, id)).collect();
        assert!(offsets.iter().all(|o| *o < jitter));
        // Ten buckets of 20 ms, each within 20 % of its share.
        let mut buckets = [0usize; 10];
        for o in &offsets {
            buckets[(o.as_millis() / 20) as usize] += 1;
        }
        for (i, n) in buckets.iter().enumerate() {
            assert!((800..=1200).contains(n), "bucket {i} holds {n} of 10 000");
        }
        assert_eq!(
            offset(jitter, 42),
            offset(jitter, 42),
            "fixed per subscriber"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_revision_goes_out_at_its_arrival_plus_the_offset_never_before_and_in_order() {
        use crate::watch::Revision;
        use std::sync::Arc;
        use tokio::time::Instant;
        let start = Instant::now();
        let (tx, subscription) = Subscription::from_channel(0, 8);
        let offset = Duration::from_millis(150);
        let mut paced = Paced::new(subscription, offset);
        for (revision, after) in [(5, 0), (6, 40)] {
            tx.send(Item::Events(Revision {
                revision,
                events: Arc::from(vec![]),
                received: start + Duration::from_millis(after),
            }))
            .await
            .expect("send");
        }
        tx.send(Item::Progress(6)).await.expect("send");
        drop(tx);
        let mut got = Vec::new();
        while let Some(item) = paced.next().await {
            got.push((item, Instant::now() - start));
        }
        let shape: Vec<(String, u128)> = got
            .iter()
            .map(|(item, at)| {
                let what = match item {
                    Item::Events(r) => format!("rev {}", r.revision),
                    other => format!("{other:?}"),
                };
                (what, at.as_millis())
            })
            .collect();
        assert_eq!(
            shape,
            vec![
                ("rev 5".to_string(), 150),
                ("rev 6".to_string(), 190),
                ("Progress(6)".to_string(), 190)
            ]
        );
    }
}
