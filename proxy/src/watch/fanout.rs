//! Fan-out with jitter (DESIGN section 4): each subscriber's revisions are
//! handed to its client a fixed offset after they reached the proxy, the
//! offsets spread evenly over `--fanout-jitter`, so that 100 000 clients
//! watching one key do not all re-read in the same millisecond.
//!
//! The offset is fixed per subscriber, so its revisions keep their order;
//! it is derived from the subscriber's id (a hash), so it needs no random
//! source and a test can predict it.

use std::future::Future;
use std::time::Duration;
use tokio::time::Instant;

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

/// Hands `item` to `send` once `received + offset` has come; returns what
/// `send` returns (false: the client is gone).
pub async fn deliver_at<T, F, Fut>(item: T, received: Instant, offset: Duration, send: F) -> bool
where
    F: FnOnce(T) -> Fut,
    Fut: Future<Output = bool>,
{
    tokio::time::sleep_until(received + offset).await;
    let sent = send(item).await;
    metrics::histogram!("latchkey_proxy_fanout_delay_seconds")
        .record(received.elapsed().as_secs_f64());
    sent
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
    async fn an_item_goes_out_at_its_arrival_plus_the_offset_never_before() {
        let received = Instant::now();
        let offset = Duration::from_millis(150);
        let sent_at = std::sync::Arc::new(std::sync::Mutex::new(None));
        let seen = sent_at.clone();
        let ok = deliver_at(7, received, offset, |item| async move {
            *seen.lock().expect("lock") = Some((item, Instant::now()));
            true
        })
        .await;
        assert!(ok);
        let (item, at) = sent_at.lock().expect("lock").expect("sent");
        assert_eq!(item, 7);
        assert_eq!(at - received, offset);
    }
}
