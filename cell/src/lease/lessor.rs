//! The lessor: lease deadlines, held only by the leader.
//!
//! Refreshes do not go through Raft; they move a deadline in this table.
//! Only the primary lessor (the leader's) expires leases, and it does so by
//! proposing a `LeaseExpire` through Raft, so every member deletes the same
//! keys at the same revision. Deadlines sit in an expiry queue ordered by
//! time, so finding the expired leases never scans every lease.
//!
//! When a node becomes leader it is *promoted* only after it has applied an
//! entry of its own term: from then on the lease table it reads is complete,
//! and every lease gets `now + TTL` (a fresh leader cannot know when clients
//! last refreshed). A demoted lessor forgets every deadline.

use std::collections::{BTreeSet, HashMap};
use std::sync::Mutex;
use tokio::time::{Duration, Instant};

#[derive(Debug, Default)]
struct LessorState {
    primary: bool,
    /// lease id -> (deadline, granted ttl in seconds).
    deadlines: HashMap<i64, (Instant, i64)>,
    /// The same deadlines, ordered by time: the expiry queue.
    queue: BTreeSet<(Instant, i64)>,
    /// Leases whose expiry has been proposed, with the time to propose again
    /// if the revoke has not been applied by then (a lost proposal).
    expiring: HashMap<i64, Instant>,
}

impl LessorState {
    fn set_deadline(&mut self, id: i64, deadline: Instant, ttl: i64) {
        if let Some((old, _)) = self.deadlines.insert(id, (deadline, ttl)) {
            self.queue.remove(&(old, id));
        }
        self.queue.insert((deadline, id));
        self.expiring.remove(&id);
    }

    fn remove(&mut self, id: i64) {
        if let Some((old, _)) = self.deadlines.remove(&id) {
            self.queue.remove(&(old, id));
        }
        self.expiring.remove(&id);
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
#[derive(Debug, Default)]
pub struct Lessor {
    state: Mutex<LessorState>,
}

/// How long the lessor waits for a proposed expiry to be applied before it
/// proposes it again: long enough for a commit under load, short enough
/// that a proposal lost in a leader change costs little.
const EXPIRY_RETRY: Duration = Duration::from_secs(2);

fn ttl_duration(ttl: i64) -> Duration {
    Duration::from_secs(ttl.max(0) as u64)
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

    /// Becomes primary with every lease of the applied state at `now + TTL`.
    pub fn promote(&self, leases: &[(i64, i64)], now: Instant) {
        let mut s = self.lock();
        s.deadlines.clear();
        s.queue.clear();
        s.expiring.clear();
        for &(id, ttl) in leases {
            s.set_deadline(id, now + ttl_duration(ttl), ttl);
        }
        s.primary = true;
    }

    pub fn demote(&self) {
        let mut s = self.lock();
        *s = LessorState::default();
    }

    /// A grant was applied.
    pub fn on_grant(&self, id: i64, ttl: i64, now: Instant) {
        let mut s = self.lock();
        if s.primary {
            s.set_deadline(id, now + ttl_duration(ttl), ttl);
        }
    }

    /// A revoke or expiry was applied.
    pub fn on_remove(&self, id: i64) {
        self.lock().remove(id);
    }

    /// A keep-alive: the lease lives for its TTL from now. Returns the TTL.
    pub fn refresh(&self, id: i64, now: Instant) -> Result<i64, RefreshError> {
        let mut s = self.lock();
        if !s.primary {
            return Err(RefreshError::NotPrimary);
        }
        let Some(&(_, ttl)) = s.deadlines.get(&id) else {
            return Err(RefreshError::NotFound);
        };
        if s.expiring.contains_key(&id) {
            // Its expiry is already proposed; refreshing now would race it.
            return Err(RefreshError::NotFound);
        }
        s.set_deadline(id, now + ttl_duration(ttl), ttl);
        Ok(ttl)
    }

    /// Remaining seconds of a lease, rounded up, as etcd reports them.
    pub fn remaining(&self, id: i64, now: Instant) -> Result<i64, RefreshError> {
        let s = self.lock();
        if !s.primary {
            return Err(RefreshError::NotPrimary);
        }
        let Some(&(deadline, _)) = s.deadlines.get(&id) else {
            return Err(RefreshError::NotFound);
        };
        let left = deadline.saturating_duration_since(now);
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
        self.lock().queue.first().map(|(t, _)| *t)
    }

    pub fn len(&self) -> usize {
        self.lock().deadlines.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_primary_refreshes_and_expires() {
        let lessor = Lessor::new();
        let now = Instant::now();
        lessor.on_grant(1, 5, now);
        assert_eq!(lessor.refresh(1, now), Err(RefreshError::NotPrimary));
        assert!(lessor
            .take_expired(now + Duration::from_secs(60), 10)
            .is_empty());
        lessor.promote(&[(1, 5)], now);
        assert_eq!(lessor.refresh(1, now), Ok(5));
        assert_eq!(lessor.refresh(2, now), Err(RefreshError::NotFound));
    }

    #[test]
    fn expiry_follows_the_last_refresh() {
        let lessor = Lessor::new();
        let t0 = Instant::now();
        lessor.promote(&[(1, 5), (2, 5)], t0);
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
    fn promotion_restarts_every_ttl() {
        let lessor = Lessor::new();
        let t0 = Instant::now();
        lessor.promote(&[(1, 10)], t0);
        lessor.demote();
        assert_eq!(lessor.remaining(1, t0), Err(RefreshError::NotPrimary));
        let t1 = t0 + Duration::from_secs(100);
        lessor.promote(&[(1, 10)], t1);
        assert_eq!(lessor.remaining(1, t1), Ok(10));
    }
}
