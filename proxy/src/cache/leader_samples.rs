//! The leader's revision as the read cache sampled it, and the revision
//! every cached answer must reach ([`LeaderSamples::vouched`]): the
//! leader's as sampled [`VOUCH_LAG`] ago.

use std::collections::VecDeque;
use std::time::Duration;
use tokio::time::Instant;

/// How old a sample of the leader's revision is before every answer must
/// reflect it.
pub const VOUCH_LAG: Duration = Duration::from_millis(400);

/// The leader's revision as sampled over the last [`VOUCH_LAG`], and the
/// newest sample older than that.
#[derive(Default)]
pub(super) struct LeaderSamples(VecDeque<(Instant, i64)>);

impl LeaderSamples {
    pub(super) fn add(&mut self, at: Instant, revision: i64) {
        self.0.push_back((at, revision));
        // Keep one sample older than the lag: the one that counts.
        while self.0.len() > 1 && at.duration_since(self.0[1].0) >= VOUCH_LAG {
            self.0.pop_front();
        }
    }

    /// The revision of the newest sample taken at least [`VOUCH_LAG`]
    /// before `now` (0: none yet).
    pub(super) fn vouched(&self, now: Instant) -> i64 {
        self.0
            .iter()
            .rev()
            .find(|(at, _)| now.duration_since(*at) >= VOUCH_LAG)
            .map_or(0, |(_, revision)| *revision)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Samples taken this far apart (the read cache's progress period).
    const STEP: Duration = Duration::from_millis(200);

    #[test]
    fn an_answer_must_reach_the_leaders_revision_once_its_sample_is_a_lag_old() {
        let t0 = Instant::now();
        let mut samples = LeaderSamples::default();
        assert_eq!(samples.vouched(t0), 0, "nothing sampled yet");
        samples.add(t0, 10);
        samples.add(t0 + STEP, 12);
        assert_eq!(
            samples.vouched(t0 + VOUCH_LAG / 2),
            0,
            "no sample is a lag old"
        );
        assert_eq!(samples.vouched(t0 + VOUCH_LAG), 10);
        assert_eq!(samples.vouched(t0 + STEP + VOUCH_LAG), 12);
        // Samples older than the newest one that counts are let go.
        for k in 2..20 {
            samples.add(t0 + STEP * k, 10 + 2 * k as i64);
        }
        let now = t0 + STEP * 19;
        assert_eq!(samples.vouched(now), 10 + 2 * 17);
        assert!(samples.0.len() <= (VOUCH_LAG.as_millis() / STEP.as_millis()) as usize + 1);
    }
}
