//! Fan-out with jitter (DESIGN section 4): each subscriber's revisions are
//! handed to its client a fixed share of a window after they reached the
//! proxy, the shares spread evenly, so that 100 000 clients watching one
//! key do not all re-read in the same millisecond.
//!
//! The window grows with the herd: a revision published to n subscribers
//! of one shared watch is spread over (n - 1) x [`PER_SUBSCRIBER`], at
//! most `--fanout-jitter`. So a herd re-reads at about a thousand a second
//! per watched key, and a watch with one subscriber (a lock or election
//! waiter, one client's watch) is delivered at once: there is no herd to
//! spread (issue 29).
//!
//! The share is fixed per subscriber, derived from its id (a hash), so it
//! needs no random source and a test can predict it; a subscriber hands
//! its revisions out one after another, so they keep their order.

use super::coalescer::Subscription;
use super::read_permits::ReadPermit;
use super::shared_watch::{Cancel, Item};
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

    /// The pace of the next client watch.
    pub fn next_pace(&self) -> Pace {
        Pace {
            offset: offset(self.jitter, self.next.fetch_add(1, Ordering::Relaxed)),
            jitter: self.jitter,
        }
    }
}

/// How much of each revision's window is added per subscriber of it.
pub const PER_SUBSCRIBER: Duration = Duration::from_millis(1);

/// One client watch's place in the fan-out: its offset inside the widest
/// window, `--fanout-jitter`.
#[derive(Debug, Clone, Copy, Default)]
pub struct Pace {
    pub offset: Duration,
    pub jitter: Duration,
}

impl Pace {
    /// The delay of a revision published to `herd` subscribers: the same
    /// share of that herd's window as `offset` is of the widest.
    pub fn delay(&self, herd: u32) -> Duration {
        if self.jitter.is_zero() || herd <= 1 {
            return Duration::ZERO;
        }
        let window = (PER_SUBSCRIBER * (herd - 1)).min(self.jitter);
        self.offset
            .mul_f64(window.as_secs_f64() / self.jitter.as_secs_f64())
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
/// arrival at the proxy plus the client's delay for its herd. Progress and cancel
/// items are not held back: they carry no news a herd would re-read.
pub struct Paced {
    items: Subscription,
    pace: Pace,
    /// The client's standing, when its watch reads for a user: revoked,
    /// it ends the items with [`Cancel::Revoked`].
    permit: Option<ReadPermit>,
    /// Looked up once: every delivery of every client records into them.
    delay: metrics::Histogram,
    events_out: metrics::Counter,
}

impl Paced {
    pub fn new(items: Subscription, pace: Pace) -> Paced {
        Paced {
            items,
            pace,
            permit: None,
            delay: metrics::histogram!(FANOUT_DELAY_SECONDS.name),
            events_out: metrics::counter!(WATCH_EVENTS_OUT.name),
        }
    }

    /// Ends the items with [`Cancel::Revoked`] once `permit` is revoked.
    pub fn stands_on(mut self, permit: ReadPermit) -> Paced {
        self.permit = Some(permit);
        self
    }

    /// The next item when it is due; `None` when the subscription closed
    /// (with no cancel item before it: dropped as too slow).
    pub async fn next(&mut self) -> Option<Item> {
        let item = match self.until_revoked(Wait::Item).await {
            Ok(item) => item?,
            Err(revoked) => return Some(revoked),
        };
        if let Item::Events(revision) = &item {
            let due = revision.received + self.pace.delay(revision.herd);
            if due > tokio::time::Instant::now() {
                // A revoke while the events wait for their slot wins.
                if let Err(revoked) = self.until_revoked(Wait::Until(due)).await {
                    return Some(revoked);
                }
            }
            self.delay.record(revision.received.elapsed().as_secs_f64());
            self.events_out.increment(revision.events.len() as u64);
        }
        Some(item)
    }

    /// What `wait` gives, unless the permit is revoked first: then the
    /// cancel item (once; the permit is dropped).
    async fn until_revoked(&mut self, wait: Wait) -> Result<Option<Item>, Item> {
        let waited = async {
            match wait {
                Wait::Item => self.items.recv().await,
                Wait::Until(due) => {
                    tokio::time::sleep_until(due).await;
                    None
                }
            }
        };
        let Some(permit) = &mut self.permit else {
            return Ok(waited.await);
        };
        let revoked = tokio::select! {
            biased;
            why = permit.revoked() => why,
            got = waited => return Ok(got),
        };
        self.permit = None;
        Err(Item::Cancelled(Cancel::Revoked(revoked)))
    }
}

/// What [`Paced::until_revoked`] waits for.
enum Wait {
    Item,
    Until(tokio::time::Instant),
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

    #[test]
    fn the_window_grows_with_the_herd_and_one_subscriber_waits_for_nothing() {
        let pace = Pace {
            offset: Duration::from_millis(150),
            jitter: Duration::from_millis(200),
        };
        assert_eq!(pace.delay(1), Duration::ZERO, "no herd, no wait");
        // 41 subscribers: a 40 ms window, of which this one takes 3/4.
        assert_eq!(pace.delay(41), Duration::from_millis(30));
        // Past 201 subscribers the window is the whole jitter.
        assert_eq!(pace.delay(10_000), Duration::from_millis(150));
        let off = Pace {
            offset: Duration::ZERO,
            jitter: Duration::ZERO,
        };
        assert_eq!(off.delay(10_000), Duration::ZERO);
    }

    #[tokio::test(start_paused = true)]
    async fn a_revision_goes_out_at_its_arrival_plus_the_offset_never_before_and_in_order() {
        use crate::watch::Revision;
        use std::sync::Arc;
        use tokio::time::Instant;
        let start = Instant::now();
        let (tx, subscription) = Subscription::from_channel(0, 8);
        let pace = Pace {
            offset: Duration::from_millis(150),
            jitter: Duration::from_millis(200),
        };
        let mut paced = Paced::new(subscription, pace);
        for (revision, after) in [(5, 0), (6, 40)] {
            tx.send(Item::Events(Revision {
                revision,
                events: Arc::from(vec![]),
                received: start + Duration::from_millis(after),
                herd: 10_000,
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
