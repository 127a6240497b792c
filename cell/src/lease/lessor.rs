//! The lessor: lease deadlines.
//!
//! Refreshes do not go through Raft; they move a deadline here, on the
//! leader. Only the primary lessor (the leader's) expires leases, and it
//! does so by proposing a `LeaseExpire` through Raft, so every member
//! deletes the same keys at the same revision. Deadlines sit in an expiry
//! queue ordered by time, so finding the expired leases never scans every
//! lease.
//!
//! Every lease has a *base* deadline: its last refresh plus its TTL. The
//! primary checkpoints changed bases through Raft, in batches at a bounded
//! rate ([`Lessor::take_checkpoints`]). Every member's lessor (primary or
//! not) keeps the bases it learns from grants and applied checkpoints, on
//! its own monotonic clock, so followers hold a recent estimate of when
//! each lease dies.
//!
//! A member that becomes leader is *promoted* once it has applied an entry
//! of its own term (its lease table is then complete) and gives each lease
//!
//! ```text
//! deadline = base + grace
//! ```
//!
//! The old leader may have confirmed refreshes it never checkpointed (at
//! most a checkpoint interval, plus the checkpoints' lag, before it lost
//! its quorum): each promised its client the lease until that refresh plus
//! the TTL, a base the new leader never saw. The grace covers them, so
//! long as it exceeds the checkpoint interval and lag; and it gives a
//! lease near its end time to reach the new leader. A dead lease dies no
//! later than `base + grace`, however many times leadership changes,
//! because the grace is never checkpointed: bases move only when a client
//! refreshes. (etcd restarts every TTL on election, so under leader churn
//! its dead leases can live forever.) An earlier formula, `max(base,
//! min(now + grace, base + grace))`, gave a lease whose base was more than
//! the grace ahead only its base: a lease with a 60 s TTL refreshed just
//! before a leader change died up to a checkpoint interval before the
//! time its client had been promised.

use crate::mvcc::lease_table::LeaseSeed;
use crate::state_machine::store::LeaseObserver;
use indexmap::IndexSet;
use std::collections::{BTreeSet, HashMap};
use std::sync::Mutex;
use tokio::sync::watch;
use tokio::time::{Duration, Instant};

#[derive(Debug, Clone, Copy)]
struct Clock {
    /// The granted TTL in seconds.
    ttl: i64,
    /// Last refresh (or grant) + TTL, as far as this member knows.
    base: Instant,
    /// When the primary expires it: `base`, or later after a promotion.
    deadline: Instant,
}

#[derive(Debug, Default)]
struct LessorState {
    primary: bool,
    clocks: HashMap<i64, Clock>,
    /// `(deadline, id)` of every lease: the expiry queue.
    queue: BTreeSet<(Instant, i64)>,
    /// Leases refreshed since their last checkpoint (primary only), in the
    /// order they first became so: checkpoints take the oldest first. A
    /// hash set handed out the same ids first each time, so while leases
    /// were refreshed faster than checkpoints carried them (100 000 a
    /// second on a loaded debug build), the ids at the end of its order
    /// were never checkpointed, and a new leader expired 2 000 live leases
    /// from their grant-time bases.
    dirty: IndexSet<i64>,
    /// Leases whose expiry has been proposed, with the time to propose again
    /// if the revoke has not been applied by then (a lost proposal).
    expiring: HashMap<i64, Instant>,
}

impl LessorState {
    fn set(&mut self, id: i64, clock: Clock) {
        if let Some(old) = self.clocks.insert(id, clock) {
            self.queue.remove(&(old.deadline, id));
        }
        self.queue.insert((clock.deadline, id));
        self.expiring.remove(&id);
    }

    fn remove(&mut self, id: i64) {
        if let Some(old) = self.clocks.remove(&id) {
            self.queue.remove(&(old.deadline, id));
        }
        self.expiring.remove(&id);
        // Order among the rest barely changes (the last one moves here).
        self.dirty.swap_remove(&id);
    }
}

/// Why a refresh was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RefreshError {
    /// This lessor is not the primary (not the leader, or not yet promoted).
    NotPrimary,
    NotFound,
}

/// A std mutex, not a tokio one: every critical section is a few map
/// operations and none is held across an `.await`. Lock order: the state
/// machine's lock, then this one (apply notifies the lessor while holding
/// the state machine).
#[derive(Debug)]
pub struct Lessor {
    state: Mutex<LessorState>,
    /// Whether this lessor is primary, for callers that wait for a
    /// promotion (a new leader's first commit) instead of polling.
    primary: watch::Sender<bool>,
}

impl Default for Lessor {
    fn default() -> Self {
        Lessor {
            state: Mutex::new(LessorState::default()),
            primary: watch::Sender::new(false),
        }
    }
}

/// How long the lessor waits for a proposed expiry to be applied before it
/// proposes it again: long enough for a commit under load, short enough
/// that a proposal lost in a leader change costs little.
const EXPIRY_RETRY: Duration = Duration::from_secs(2);

/// `now + d`, saturating far in the future instead of overflowing.
fn after(now: Instant, d: Duration) -> Instant {
    now.checked_add(d)
        .unwrap_or_else(|| now + Duration::from_secs(100 * 365 * 24 * 3600))
}

fn ttl_duration(ttl: i64) -> Duration {
    Duration::from_secs(ttl.max(0) as u64)
}

fn ms_duration(ms: i64) -> Duration {
    Duration::from_millis(ms.max(0) as u64)
}

impl Lessor {
    pub fn new() -> Self {
        Lessor::default()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, LessorState> {
        // A panic while holding this lock leaves plain maps behind, still
        // consistent enough to serve; recover instead of cascading.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn is_primary(&self) -> bool {
        self.lock().primary
    }

    /// Waits until this lessor is primary, or `deadline`: false if it is
    /// not primary by then.
    pub async fn wait_primary(&self, deadline: Instant) -> bool {
        let mut rx = self.primary.subscribe();
        let primary = tokio::time::timeout_at(deadline, rx.wait_for(|p| *p))
            .await
            .is_ok_and(|r| r.is_ok());
        primary
    }

    /// Starts over from loaded state (startup, snapshot install): every
    /// lease's base is its checkpointed remaining time, or its TTL, from now.
    pub fn load(&self, leases: &[LeaseSeed], now: Instant) {
        let mut s = self.lock();
        let primary = s.primary;
        *s = LessorState {
            primary,
            ..LessorState::default()
        };
        for &(id, ttl, remaining_ms) in leases {
            let base = after(
                now,
                remaining_ms.map_or_else(|| ttl_duration(ttl), ms_duration),
            );
            s.set(
                id,
                Clock {
                    ttl,
                    base,
                    deadline: base,
                },
            );
        }
    }

    /// Becomes primary over the applied lease table `leases`; see the module
    /// documentation for the deadline each lease gets.
    pub fn promote(&self, leases: &[LeaseSeed], now: Instant, grace: Duration) {
        let mut s = self.lock();
        let known = std::mem::take(&mut s.clocks);
        s.queue.clear();
        s.expiring.clear();
        // Leases refreshed but not yet checkpointed stay marked: a member
        // demoted and promoted again (a short loss of quorum) must still
        // checkpoint them, or a later leader would start them from an older
        // deadline.
        for &(id, ttl, remaining_ms) in leases {
            let base = known.get(&id).map_or_else(
                || {
                    after(
                        now,
                        remaining_ms.map_or_else(|| ttl_duration(ttl), ms_duration),
                    )
                },
                |c| c.base,
            );
            s.set(
                id,
                Clock {
                    ttl,
                    base,
                    deadline: after(base, grace),
                },
            );
        }
        let LessorState { dirty, clocks, .. } = &mut *s;
        dirty.retain(|id| clocks.contains_key(id));
        s.primary = true;
        drop(s);
        self.primary.send_replace(true);
    }

    /// No longer leader: keep the bases (a later checkpoint refines them),
    /// drop any grace, expire nothing.
    pub fn demote(&self) {
        self.primary.send_replace(false);
        let mut s = self.lock();
        s.primary = false;
        s.expiring.clear();
        let clocks: Vec<(i64, Clock)> = s.clocks.iter().map(|(id, c)| (*id, *c)).collect();
        for (id, c) in clocks {
            s.set(
                id,
                Clock {
                    deadline: c.base,
                    ..c
                },
            );
        }
    }

    /// A grant was applied.
    pub fn on_grant(&self, id: i64, ttl: i64, now: Instant) {
        let base = after(now, ttl_duration(ttl));
        self.lock().set(
            id,
            Clock {
                ttl,
                base,
                deadline: base,
            },
        );
    }

    /// A checkpoint was applied: `(id, remaining ms)` as the leader saw it.
    /// The primary knows better (it wrote them); others take them as bases.
    pub fn on_checkpoint(&self, entries: &[(i64, i64)], now: Instant) {
        let mut s = self.lock();
        if s.primary {
            return;
        }
        for &(id, remaining_ms) in entries {
            if let Some(c) = s.clocks.get(&id).copied() {
                let base = after(now, ms_duration(remaining_ms));
                s.set(
                    id,
                    Clock {
                        base,
                        deadline: base,
                        ..c
                    },
                );
            }
        }
    }

    /// A revoke or expiry was applied.
    pub fn on_remove(&self, id: i64) {
        self.lock().remove(id);
    }

    fn refresh_one(s: &mut LessorState, id: i64, now: Instant) -> Result<i64, RefreshError> {
        let Some(c) = s.clocks.get(&id).copied() else {
            return Err(RefreshError::NotFound);
        };
        if s.expiring.contains_key(&id) {
            // Its expiry is already proposed; refreshing now would race it.
            return Err(RefreshError::NotFound);
        }
        // Never shorter than a refresh already granted: two confirmations
        // may finish out of order.
        let base = after(now, ttl_duration(c.ttl)).max(c.base);
        s.set(
            id,
            Clock {
                base,
                deadline: base.max(c.deadline),
                ..c
            },
        );
        s.dirty.insert(id);
        Ok(c.ttl)
    }

    /// A keep-alive: the lease lives for its TTL from now. Returns the TTL.
    pub fn refresh(&self, id: i64, now: Instant) -> Result<i64, RefreshError> {
        let mut s = self.lock();
        if !s.primary {
            return Err(RefreshError::NotPrimary);
        }
        Self::refresh_one(&mut s, id, now)
    }

    /// Refreshes many leases under one lock: each id's TTL, or -1 if it
    /// does not exist (or is being expired).
    pub fn refresh_many(&self, ids: &[i64], now: Instant) -> Result<Vec<i64>, RefreshError> {
        let mut s = self.lock();
        if !s.primary {
            return Err(RefreshError::NotPrimary);
        }
        Ok(ids
            .iter()
            .map(|id| Self::refresh_one(&mut s, *id, now).unwrap_or(-1))
            .collect())
    }

    /// Up to `max` leases refreshed since their last checkpoint, as
    /// `(id, remaining ms)`; they count as checkpointed from here on.
    pub fn take_checkpoints(&self, now: Instant, max: usize) -> Vec<(i64, i64)> {
        let mut s = self.lock();
        if !s.primary {
            return Vec::new();
        }
        let take = max.min(s.dirty.len());
        let ids: Vec<i64> = s.dirty.drain(..take).collect();
        let mut out = Vec::with_capacity(ids.len());
        for id in ids {
            if let Some(c) = s.clocks.get(&id) {
                let left = c.base.saturating_duration_since(now);
                out.push((id, left.as_millis().min(i64::MAX as u128) as i64));
            }
        }
        out
    }

    /// Remaining seconds of a lease, rounded up, as etcd reports them.
    pub fn remaining(&self, id: i64, now: Instant) -> Result<i64, RefreshError> {
        let s = self.lock();
        if !s.primary {
            return Err(RefreshError::NotPrimary);
        }
        let Some(c) = s.clocks.get(&id) else {
            return Err(RefreshError::NotFound);
        };
        let left = c.deadline.saturating_duration_since(now);
        Ok(left.as_millis().div_ceil(1000) as i64)
    }

    /// Leases past their deadline and not yet being expired (or whose
    /// expiry proposal is overdue). Marks them as being expired.
    pub fn take_expired(&self, now: Instant, max: usize) -> Vec<i64> {
        let mut s = self.lock();
        if !s.primary {
            return Vec::new();
        }
        let mut out = Vec::new();
        let due: Vec<(Instant, i64)> = s.queue.range(..=(now, i64::MAX)).copied().collect();
        for (_, id) in due {
            if out.len() >= max {
                break;
            }
            match s.expiring.get(&id) {
                Some(retry_at) if *retry_at > now => continue,
                _ => {}
            }
            s.expiring.insert(id, now + EXPIRY_RETRY);
            out.push(id);
        }
        out
    }

    /// The earliest deadline, so the expiry task can sleep until then.
    pub fn next_deadline(&self) -> Option<Instant> {
        let s = self.lock();
        if !s.primary {
            return None;
        }
        s.queue.first().map(|(t, _)| *t)
    }

    pub fn len(&self) -> usize {
        self.lock().clocks.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl LeaseObserver for Lessor {
    fn load(&self, leases: &[LeaseSeed], now: Instant) {
        Lessor::load(self, leases, now)
    }
    fn on_grant(&self, id: i64, ttl: i64, now: Instant) {
        Lessor::on_grant(self, id, ttl, now)
    }
    fn on_remove(&self, id: i64) {
        Lessor::on_remove(self, id)
    }
    fn on_checkpoint(&self, entries: &[(i64, i64)], now: Instant) {
        Lessor::on_checkpoint(self, entries, now)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GRACE: Duration = Duration::from_secs(3);

    #[test]
    fn only_the_primary_refreshes_and_expires() {
        let lessor = Lessor::new();
        let now = Instant::now();
        lessor.on_grant(1, 5, now);
        assert_eq!(lessor.refresh(1, now), Err(RefreshError::NotPrimary));
        assert!(lessor
            .take_expired(now + Duration::from_secs(60), 10)
            .is_empty());
        lessor.promote(&[(1, 5, None)], now, GRACE);
        assert_eq!(lessor.refresh(1, now), Ok(5));
        assert_eq!(lessor.refresh(2, now), Err(RefreshError::NotFound));
        assert_eq!(lessor.refresh_many(&[1, 2, 1], now), Ok(vec![5, -1, 5]));
    }

    #[test]
    fn expiry_follows_the_last_refresh() {
        let lessor = Lessor::new();
        let t0 = Instant::now();
        lessor.on_grant(1, 5, t0);
        lessor.on_grant(2, 5, t0);
        lessor.promote(&[(1, 5, None), (2, 5, None)], t0, Duration::ZERO);
        lessor
            .refresh(1, t0 + Duration::from_secs(4))
            .expect("refresh");
        let expired = lessor.take_expired(t0 + Duration::from_secs(6), 10);
        assert_eq!(expired, vec![2]);
        // Being expired: not handed out again until the retry interval.
        assert!(lessor
            .take_expired(t0 + Duration::from_secs(6), 10)
            .is_empty());
        // Past the retry interval lease 2 is handed out again (its expiry
        // was not applied), together with lease 1, now due too.
        let mut due = lessor.take_expired(t0 + Duration::from_secs(9), 10);
        due.sort();
        assert_eq!(due, vec![1, 2]);
        lessor.on_remove(2);
        assert_eq!(
            lessor.take_expired(t0 + Duration::from_secs(20), 10),
            vec![1]
        );
    }

    #[test]
    fn a_new_leader_gives_every_lease_its_base_plus_grace_and_dead_ones_no_more() {
        let t0 = Instant::now();
        let secs = Duration::from_secs;
        // A follower learned both leases from their grant at t0 (TTL 10).
        let follower = Lessor::new();
        follower.on_grant(1, 10, t0);
        follower.on_grant(2, 10, t0);
        // The old leader checkpointed lease 1 refreshed at t0+8 (base t0+18)
        // and saw nothing from lease 2's client again.
        follower.on_checkpoint(&[(1, 10_000)], t0 + secs(8));
        // It becomes leader at t0+9. Lease 1's client may have refreshed it
        // again after t0+8 and been promised until then + 10 s: it gets its
        // base plus the grace, t0+21. Lease 2 (base t0+10) gets until
        // base + grace = t0+13.
        let seeds = [(1, 10, None), (2, 10, None)];
        follower.promote(&seeds, t0 + secs(9), GRACE);
        assert_eq!(follower.remaining(1, t0 + secs(9)), Ok(12));
        assert_eq!(follower.remaining(2, t0 + secs(9)), Ok(4));
        // Leadership moves on at t0+11.5 and back at t0+11.9: the grace is
        // never checkpointed, so dead lease 2 still dies by base + grace =
        // t0+13, not a fresh now + grace each time.
        follower.demote();
        follower.promote(&seeds, t0 + Duration::from_millis(11_900), GRACE);
        assert!(follower
            .take_expired(t0 + Duration::from_millis(12_900), 10)
            .is_empty());
        assert_eq!(follower.take_expired(t0 + secs(13), 10), vec![2]);
    }

    #[test]
    fn checkpoints_carry_refreshed_leases_once() {
        let lessor = Lessor::new();
        let t0 = Instant::now();
        lessor.on_grant(1, 10, t0);
        lessor.on_grant(2, 10, t0);
        lessor.promote(&[(1, 10, None), (2, 10, None)], t0, GRACE);
        assert!(lessor.take_checkpoints(t0, 10).is_empty());
        lessor
            .refresh(1, t0 + Duration::from_secs(1))
            .expect("refresh");
        assert_eq!(
            lessor.take_checkpoints(t0 + Duration::from_secs(2), 10),
            vec![(1, 9_000)]
        );
        assert!(lessor
            .take_checkpoints(t0 + Duration::from_secs(2), 10)
            .is_empty());
    }

    /// Leases refreshed faster than checkpoints carry them: every lease is
    /// still checkpointed within a full turn of batches (oldest first), so
    /// none is left with its grant-time base for a new leader to expire.
    #[test]
    fn checkpoints_take_the_oldest_refreshed_first_so_none_is_starved() {
        const LEASES: i64 = 10_000;
        const BATCH: usize = 1_000;
        let lessor = Lessor::new();
        let t0 = Instant::now();
        let seeds: Vec<LeaseSeed> = (1..=LEASES).map(|id| (id, 10, None)).collect();
        for &(id, ttl, _) in &seeds {
            lessor.on_grant(id, ttl, t0);
        }
        lessor.promote(&seeds, t0, GRACE);
        let mut checkpointed = std::collections::HashSet::new();
        let turns = LEASES as usize / BATCH;
        for round in 1..=turns as u64 {
            // Every lease refreshed again before each batch is taken.
            let now = t0 + Duration::from_millis(round);
            for id in 1..=LEASES {
                lessor.refresh(id, now).expect("refresh");
            }
            let batch = lessor.take_checkpoints(now, BATCH);
            assert_eq!(batch.len(), BATCH);
            checkpointed.extend(batch.into_iter().map(|(id, _)| id));
        }
        assert_eq!(
            checkpointed.len(),
            LEASES as usize,
            "leases never checkpointed in {turns} batches of {BATCH}"
        );
    }

    #[test]
    fn absurd_ttls_saturate_instead_of_overflowing() {
        let lessor = Lessor::new();
        let now = Instant::now();
        lessor.on_grant(1, i64::MAX, now);
        lessor.promote(&[(1, i64::MAX, Some(i64::MAX))], now, GRACE);
        assert_eq!(lessor.refresh(1, now), Ok(i64::MAX));
        assert!(lessor
            .take_expired(now + Duration::from_secs(3600), 10)
            .is_empty());
    }
}
