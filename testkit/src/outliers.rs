//! Bounds on durations that a loaded machine stretches: an outage, a gap
//! between writes. An absolute bound (say 3 s) fails when the 2-core CI
//! machine runs at half speed, although nothing is wrong; a bound on the
//! median alone passes a cell that is slow everywhere. [`outlier_bound`]
//! takes both from one run: a sample fails only when it exceeds the floor
//! AND twice the run's own median, so one fault that took far longer than
//! the others of the same run (split votes that repeat, a restarted leader
//! that stalls the cell) is still caught on a slow day, while a run that is
//! uniformly slow is the load test's to measure (its `failover` scenario
//! reports the time to a new leader and the longest write gap).

use std::time::Duration;

/// How far above the run's median a sample may go.
pub const OVER_MEDIAN: u32 = 2;

/// The largest allowed sample: `floor`, or [`OVER_MEDIAN`] times the
/// median of `samples` when that is larger. Never below `floor`, so it is
/// never stricter than the absolute bound it replaces.
pub fn outlier_bound(floor: Duration, samples: &[Duration]) -> Duration {
    let mut sorted = samples.to_vec();
    sorted.sort();
    let median = sorted.get(sorted.len() / 2).copied().unwrap_or_default();
    floor.max(median * OVER_MEDIAN)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(v: &[u64]) -> Vec<Duration> {
        v.iter().map(|m| Duration::from_millis(*m)).collect()
    }

    #[test]
    fn the_floor_holds_for_a_fast_run_and_none() {
        let floor = Duration::from_secs(3);
        assert_eq!(outlier_bound(floor, &[]), floor);
        assert_eq!(outlier_bound(floor, &ms(&[900, 1_100, 1_300])), floor);
    }

    #[test]
    fn a_slow_run_raises_the_bound_but_one_outlier_still_exceeds_it() {
        let floor = Duration::from_secs(3);
        // Every outage about 2 s: the machine is slow, the bound is 4 s.
        let slow = ms(&[1_800, 2_000, 2_100, 2_200, 4_400]);
        let bound = outlier_bound(floor, &slow);
        assert_eq!(bound, Duration::from_millis(4_200));
        // The 4.4 s one (twice the others) is still over it.
        assert!(slow.iter().any(|s| *s > bound));
    }
}
