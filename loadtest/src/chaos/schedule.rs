//! The faults of one run, drawn from a seed: the same seed gives the same
//! kinds in the same order at the same offsets, and the same targets
//! wherever the cell's state (who leads) is the same.

use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::time::Duration;

/// Everything the suite can do to a cell and its clients.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, clap::ValueEnum)]
pub enum FaultKind {
    /// The leader cut off from every other member, both ways.
    LeaderPartition,
    /// One follower cut off from every other member, both ways.
    MinorityPartition,
    /// Packets from the leader to its followers dropped; theirs reach it.
    OneWayPartition,
    /// One member loses 30% of the packets it sends to its peers.
    LossyLink,
    /// The leader SIGKILLed, restarted at heal.
    LeaderKill,
    /// The leader SIGSTOPped past the election timeout, SIGCONTed at heal.
    LeaderPause,
    /// A lock holder (a client process) SIGSTOPped past its session's TTL.
    ClientPause,
    /// A member crashes at its next log append, after writing and before
    /// the fsync (fail point `log-append-before-fsync`; a debug build
    /// started with `--unsafe-fail-points`), restarted at heal.
    LogAppendCrash,
    /// The leader crashes right after its next commit, before answering
    /// (fail point `committed-before-answer`): writes that happened with
    /// no answer.
    CommitCrash,
    /// Every member SIGKILLed and restarted at once.
    CellRestart,
}

impl FaultKind {
    pub const ALL: [FaultKind; 10] = [
        FaultKind::LeaderPartition,
        FaultKind::MinorityPartition,
        FaultKind::OneWayPartition,
        FaultKind::LossyLink,
        FaultKind::LeaderKill,
        FaultKind::LeaderPause,
        FaultKind::ClientPause,
        FaultKind::LogAppendCrash,
        FaultKind::CommitCrash,
        FaultKind::CellRestart,
    ];

    pub fn name(self) -> &'static str {
        match self {
            FaultKind::LeaderPartition => "leader-partition",
            FaultKind::MinorityPartition => "minority-partition",
            FaultKind::OneWayPartition => "one-way-partition",
            FaultKind::LossyLink => "lossy-link",
            FaultKind::LeaderKill => "leader-kill",
            FaultKind::LeaderPause => "leader-pause",
            FaultKind::ClientPause => "client-pause",
            FaultKind::LogAppendCrash => "log-append-crash",
            FaultKind::CommitCrash => "commit-crash",
            FaultKind::CellRestart => "cell-restart",
        }
    }

    /// A fault of one member, which a cell of three must ride out with a
    /// short write outage (the availability bound applies to these).
    pub fn single_member(self) -> bool {
        !matches!(self, FaultKind::ClientPause | FaultKind::CellRestart)
    }

    /// A fault that takes the leader away, so the cell must elect another
    /// before it writes again: its outage is an election and a client
    /// finding the new leader.
    pub fn deposes_leader(self) -> bool {
        matches!(
            self,
            FaultKind::LeaderPartition
                | FaultKind::OneWayPartition
                | FaultKind::LeaderKill
                | FaultKind::LeaderPause
                | FaultKind::CommitCrash
        )
    }

    /// How long the fault holds before it is healed.
    fn hold(self, rng: &mut ChaCha8Rng) -> Duration {
        let ms = match self {
            // Past the 1 s session TTL of the lock holders, with room for
            // the expiry to land.
            FaultKind::ClientPause => rng.random_range(2_000..3_000),
            // A restart of every member is its own outage; the hold is
            // the time they stay down.
            FaultKind::CellRestart => rng.random_range(200..1_000),
            // The election timeout is 400 ms: every hold is several times
            // that, so a new leader must be elected.
            _ => rng.random_range(2_000..4_500),
        };
        Duration::from_millis(ms)
    }
}

/// One fault of the plan.
#[derive(Debug, Clone, Copy)]
pub struct Step {
    pub kind: FaultKind,
    /// From the start of the workload.
    pub at: Duration,
    pub hold: Duration,
    /// Picks the target where there is a choice (which follower).
    pub pick: u64,
}

/// Quiet time before the first fault: the workload warms up.
const WARM_UP: Duration = Duration::from_secs(2);
/// Quiet time after the last heal: the cell settles before the checks.
const COOL_DOWN: Duration = Duration::from_secs(3);

/// Faults of `kinds` for a run of `duration`: the kinds shuffled and
/// cycled, each held for a while and then healed, with 1-2 s of quiet in
/// between, until the time is used up.
pub fn plan(seed: u64, duration: Duration, kinds: &[FaultKind]) -> Vec<Step> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut steps = Vec::new();
    if kinds.is_empty() {
        return steps;
    }
    let mut at = WARM_UP;
    let mut order: Vec<FaultKind> = Vec::new();
    loop {
        if order.is_empty() {
            order = kinds.to_vec();
            order.shuffle(&mut rng);
        }
        let kind = order.pop().expect("refilled above");
        let hold = kind.hold(&mut rng);
        if at + hold + COOL_DOWN > duration {
            break;
        }
        steps.push(Step {
            kind,
            at,
            hold,
            pick: rng.random(),
        });
        at += hold + Duration::from_millis(rng.random_range(1_000..2_000));
    }
    steps
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_seed_gives_the_same_plan_and_another_seed_another() {
        let a = plan(7, Duration::from_secs(60), &FaultKind::ALL);
        let b = plan(7, Duration::from_secs(60), &FaultKind::ALL);
        let c = plan(8, Duration::from_secs(60), &FaultKind::ALL);
        let shape = |p: &[Step]| -> Vec<(FaultKind, Duration, Duration, u64)> {
            p.iter().map(|s| (s.kind, s.at, s.hold, s.pick)).collect()
        };
        assert_eq!(shape(&a), shape(&b));
        assert_ne!(shape(&a), shape(&c));
    }

    #[test]
    fn a_plan_fits_its_duration_and_uses_every_kind_before_repeating_one() {
        let duration = Duration::from_secs(60);
        let p = plan(3, duration, &FaultKind::ALL);
        let last = p.last().expect("faults");
        assert!(last.at + last.hold + COOL_DOWN <= duration);
        assert!(p.windows(2).all(|w| w[0].at + w[0].hold < w[1].at));
        let mut first: Vec<FaultKind> = p
            .iter()
            .take(FaultKind::ALL.len())
            .map(|s| s.kind)
            .collect();
        first.sort();
        first.dedup();
        assert_eq!(first.len(), FaultKind::ALL.len().min(p.len()));
    }
}
