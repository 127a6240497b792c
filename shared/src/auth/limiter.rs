//! [`AttemptLimiter`]: attempts per key (a user name, a source address) as
//! token buckets, so guessing passwords is slow for one user and for one
//! source, and an argon2 check per attempt cannot be made to eat the CPU.
//! [`TokenBuckets`]: the buckets themselves, with a rate per call (a
//! proxy's tenant rates).

use crate::ApiError;
use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;
use tokio::time::Instant;

/// Keys remembered at most; past it, the buckets that have refilled (and
/// so say nothing) are forgotten first.
const MAX_KEYS: usize = 65_536;

/// The longest wait a refusal names (a rate near 0 would name years).
const MAX_WAIT: Duration = Duration::from_secs(3600);

struct Bucket {
    tokens: f64,
    at: Instant,
    /// The rate and burst it was last taken from with.
    rate: f64,
    burst: f64,
}

/// Token buckets by key, each with the rate and burst its caller gives:
/// the one mechanism behind [`AttemptLimiter`] and a proxy's tenant rates.
#[derive(Default)]
pub struct TokenBuckets {
    buckets: Mutex<HashMap<String, Bucket>>,
}

impl TokenBuckets {
    /// Takes one token from `key`'s bucket (`per_second` sustained, `burst`
    /// at once) at `now`, or says how long until one is free. Past
    /// [`MAX_KEYS`] keys, a new key is refused for a second unless some
    /// bucket has refilled (and is forgotten).
    pub fn take(
        &self,
        key: &str,
        per_second: f64,
        burst: f64,
        now: Instant,
    ) -> Result<(), Duration> {
        let burst = burst.max(1.0);
        let mut buckets = self.buckets.lock().unwrap_or_else(|e| e.into_inner());
        if buckets.len() >= MAX_KEYS && !buckets.contains_key(key) {
            buckets.retain(|_, b| refilled(b, now) < b.burst);
        }
        if buckets.len() >= MAX_KEYS && !buckets.contains_key(key) {
            // Every remembered key is busy: a flood of distinct keys.
            return Err(Duration::from_secs(1));
        }
        let bucket = buckets.entry(key.to_string()).or_insert(Bucket {
            tokens: burst,
            at: now,
            rate: per_second,
            burst,
        });
        (bucket.rate, bucket.burst) = (per_second, burst);
        bucket.tokens = refilled(bucket, now).min(burst);
        // Two callers with instants a little apart: time never runs back.
        bucket.at = bucket.at.max(now);
        if bucket.tokens >= 1.0 {
            bucket.tokens -= 1.0;
            return Ok(());
        }
        let wait = (1.0 - bucket.tokens) / per_second;
        Err(Duration::try_from_secs_f64(wait)
            .unwrap_or(MAX_WAIT)
            .min(MAX_WAIT))
    }

    /// Gives back a token taken from `key`, up to `burst`.
    pub fn give_back(&self, key: &str, burst: f64) {
        let mut buckets = self.buckets.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(bucket) = buckets.get_mut(key) {
            bucket.tokens = (bucket.tokens + 1.0).min(burst.max(1.0));
        }
    }
}

pub struct AttemptLimiter {
    /// Attempts per second, sustained.
    rate: f64,
    /// Attempts at once.
    burst: f64,
    /// What the error names ("Authenticate attempts by one user").
    what: &'static str,
    buckets: TokenBuckets,
}

impl AttemptLimiter {
    pub fn new(what: &'static str, per_second: f64, burst: u32) -> AttemptLimiter {
        AttemptLimiter {
            rate: per_second,
            burst: f64::from(burst.max(1)),
            what,
            buckets: TokenBuckets::default(),
        }
    }

    /// Takes one attempt for `key` at `now`, or says how long until one is
    /// free (`rate_limited`).
    pub fn take(&self, key: &str, now: Instant) -> Result<(), ApiError> {
        self.buckets
            .take(key, self.rate, self.burst, now)
            .map_err(|wait| ApiError::rate_limited(self.what, wait))
    }

    /// Gives back the attempt `take` took for `key` (it turned out not to
    /// count: a right password, where only failures are limited).
    pub fn refund(&self, key: &str) {
        self.buckets.give_back(key, self.burst);
    }
}

fn refilled(bucket: &Bucket, now: Instant) -> f64 {
    bucket.tokens + now.saturating_duration_since(bucket.at).as_secs_f64() * bucket.rate
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ErrorCode;

    #[test]
    fn a_burst_then_the_rate_and_each_key_alone() {
        let limiter = AttemptLimiter::new("attempts", 2.0, 3);
        let t0 = Instant::now();
        for _ in 0..3 {
            limiter.take("alice", t0).expect("within the burst");
        }
        let e = limiter.take("alice", t0).expect_err("past the burst");
        assert_eq!(e.code, ErrorCode::RateLimited);
        assert_eq!(e.retry_after(), Some(Duration::from_millis(500)));
        limiter
            .take("bob", t0)
            .expect("another key has its own bucket");
        limiter
            .take("alice", t0 + Duration::from_millis(500))
            .expect("one attempt back after 1/rate");
        assert!(limiter
            .take("alice", t0 + Duration::from_millis(500))
            .is_err());
        for _ in 0..3 {
            limiter
                .take("alice", t0 + Duration::from_secs(60))
                .expect("refilled to the burst, no more");
        }
        assert!(limiter.take("alice", t0 + Duration::from_secs(60)).is_err());
        limiter.refund("alice");
        limiter
            .take("alice", t0 + Duration::from_secs(60))
            .expect("a refunded attempt");
    }
}
