//! [`SessionTable`]: the leases this proxy keeps alive for its clients.
//!
//! A client keep-alive (HTTP or gRPC) is answered at once from the table
//! with the TTL the cell last confirmed, aged by the whole seconds since
//! the batch that confirmed it was sent: never more than the cell said,
//! in etcd's unit of whole seconds (so it can exceed the exact time left
//! by the fraction of a second since the last whole one).
//! The lease is marked refreshed, and the keep-alive batcher sends it to
//! the cell with the next tick's batch.
//!
//! A keep-alive waits for the cell instead when the table cannot answer
//! truthfully: the lease is unknown here (a client that moved from another
//! proxy: the lease is adopted), or what the cell confirmed has run down
//! to under a second (the cell has not answered for a while). A lease the
//! cell says is gone is removed and answered `session_expired`.
//!
//! State is a `DashMap` keyed by lease id (keep-alives of different
//! leases do not contend) plus the list of leases refreshed since the
//! last batch, so a tick touches only those, not all 100 000.

use dashmap::DashMap;
use latchkey_shared::{ApiError, LeaseId};
use std::sync::Mutex;
use std::time::Duration;
use tokio::sync::oneshot;
use tokio::time::Instant;

/// What the cell last said about a lease.
#[derive(Debug, Clone, Copy)]
struct Confirmed {
    /// Seconds the lease had left, counted from `sent`.
    ttl: i64,
    /// When the batch (or grant) that got this answer was sent.
    sent: Instant,
}

impl Confirmed {
    /// The TTL to report at `now`, in etcd's whole seconds: the confirmed
    /// TTL less the whole seconds since it was sent, so right after a
    /// confirmation a client is told what the cell said (etcdctl's
    /// `keep-alive --once` prints the granted TTL, as against etcd).
    /// `None` when less than a second of confirmed time is left: then the
    /// table cannot answer truthfully and the caller waits for the cell.
    fn remaining(&self, now: Instant) -> Option<i64> {
        if self.deadline().saturating_duration_since(now) < Duration::from_secs(1) {
            return None;
        }
        Some(self.aged(now))
    }

    /// The confirmed TTL less the whole seconds since it was sent.
    fn aged(&self, now: Instant) -> i64 {
        let elapsed = now.saturating_duration_since(self.sent).as_secs();
        self.ttl
            .saturating_sub(i64::try_from(elapsed).unwrap_or(i64::MAX))
    }

    fn deadline(&self) -> Instant {
        self.sent + Duration::from_secs(u64::try_from(self.ttl.max(0)).unwrap_or(0))
    }
}

struct Entry {
    /// When the entry was made: an answer to a batch sent before it (a
    /// batch that was in flight when the lease was revoked here) says
    /// nothing about this entry.
    born: Instant,
    confirmed: Option<Confirmed>,
    /// A client refreshed the lease since the last batch took it.
    refreshed: bool,
    /// Keep-alives waiting for the cell's next answer about this lease.
    waiters: Vec<oneshot::Sender<Result<i64, ApiError>>>,
}

impl Entry {
    fn new() -> Entry {
        Entry {
            born: Instant::now(),
            confirmed: None,
            refreshed: false,
            waiters: Vec::new(),
        }
    }
}

/// Most sessions one proxy holds. The design is for 100 000; this bound
/// keeps a client that keeps alive made-up lease ids (each waits for the
/// cell's verdict) from growing the table without end while the cell does
/// not answer.
pub const MAX_SESSIONS: usize = 1_000_000;

/// Most keep-alives of one lease waiting for the cell at once.
const MAX_WAITERS: usize = 64;

/// The answer to a client keep-alive.
pub enum KeepAlive {
    /// The TTL to report now.
    Ttl(i64),
    /// Wait for the cell's answer (carried by the next batch).
    Wait(oneshot::Receiver<Result<i64, ApiError>>),
}

/// How a batch's answer for one lease is applied.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Answer {
    /// The lease lives: its TTL from when the batch was sent.
    Alive(i64),
    /// The cell says the lease does not exist.
    Gone,
}

#[derive(Default)]
pub struct SessionTable {
    entries: DashMap<LeaseId, Entry>,
    /// Leases whose `refreshed` went from false to true since the last
    /// batch. A std mutex: pushed to and swapped out, never held across
    /// an await. Taken after a map shard lock, never before one.
    due: Mutex<Vec<LeaseId>>,
}

impl SessionTable {
    pub fn new() -> SessionTable {
        SessionTable::default()
    }

    /// Sessions in the table.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// A client refreshed `id` at `now`.
    pub fn keep_alive(&self, id: LeaseId, now: Instant) -> Result<KeepAlive, ApiError> {
        // A known lease touches one shard; only a new one counts the table
        // (`len` visits every shard).
        let mut entry = match self.entries.get_mut(&id) {
            Some(entry) => entry,
            None => {
                if self.entries.len() >= MAX_SESSIONS {
                    return Err(ApiError::unavailable(format!(
                        "this proxy holds {MAX_SESSIONS} sessions; use another"
                    )));
                }
                self.entries.entry(id).or_insert_with(Entry::new)
            }
        };
        if !entry.refreshed {
            entry.refreshed = true;
            self.push_due(id);
        }
        if let Some(ttl) = entry.confirmed.and_then(|c| c.remaining(now)) {
            return Ok(KeepAlive::Ttl(ttl));
        }
        // Keep-alives that gave up waiting leave closed senders behind.
        entry.waiters.retain(|w| !w.is_closed());
        if entry.waiters.len() >= MAX_WAITERS {
            return Err(ApiError::unavailable(format!(
                "{MAX_WAITERS} keep-alives of lease {id} already wait for the cell"
            )));
        }
        let (tx, rx) = oneshot::channel();
        entry.waiters.push(tx);
        Ok(KeepAlive::Wait(rx))
    }

    /// Whether the cell has confirmed `id` to this proxy (a grant here, or
    /// a batch's answer).
    pub fn confirmed(&self, id: LeaseId) -> bool {
        self.entries.get(&id).is_some_and(|e| e.confirmed.is_some())
    }

    /// A lease this proxy just granted (its TTL from `sent`).
    pub fn granted(&self, id: LeaseId, ttl: i64, sent: Instant) {
        self.entries.entry(id).or_insert_with(Entry::new).confirmed = Some(Confirmed { ttl, sent });
    }

    /// A lease revoked through this proxy: answered gone to anyone waiting.
    pub fn revoked(&self, id: LeaseId) {
        if let Some((_, entry)) = self.entries.remove(&id) {
            for waiter in entry.waiters {
                let _ = waiter.send(Err(ApiError::session_expired(id)));
            }
        }
    }

    /// A revoke through this proxy whose outcome is unknown: what the cell
    /// confirmed before may no longer hold, so the next keep-alive waits
    /// for the cell.
    pub fn unsure(&self, id: LeaseId) {
        if let Some(mut entry) = self.entries.get_mut(&id) {
            entry.confirmed = None;
        }
    }

    fn push_due(&self, id: LeaseId) {
        if let Ok(mut due) = self.due.lock() {
            due.push(id);
        }
    }

    /// The leases to send in the next batch; each is marked not refreshed,
    /// so a client keep-alive from now on puts it in the batch after.
    /// Leases the cell has confirmed come first: adoptions (possibly made
    /// up by a client) never push a live session out of a batch.
    pub fn take_due(&self) -> Vec<LeaseId> {
        let due = match self.due.lock() {
            Ok(mut due) => std::mem::take(&mut *due),
            Err(_) => Vec::new(),
        };
        let mut known = Vec::with_capacity(due.len());
        let mut adopting = Vec::new();
        for id in due {
            if let Some(mut entry) = self.entries.get_mut(&id) {
                if entry.refreshed {
                    entry.refreshed = false;
                    if entry.confirmed.is_some() {
                        known.push(id);
                    } else {
                        adopting.push(id);
                    }
                }
            }
        }
        known.append(&mut adopting);
        known
    }

    /// After a batch that failed: its leases that keep-alives wait on go
    /// in the next one. The others go again only when their clients keep
    /// them alive again: a failed batch (which the cell may have applied
    /// after all) is not a client's keep-alive, and re-sending it tick
    /// after tick would keep a session alive whose client stopped.
    pub fn retry(&self, ids: &[LeaseId]) {
        for id in ids {
            if let Some(mut entry) = self.entries.get_mut(id) {
                entry.waiters.retain(|w| !w.is_closed());
                if !entry.refreshed && !entry.waiters.is_empty() {
                    entry.refreshed = true;
                    self.push_due(*id);
                }
            }
        }
    }

    /// The cell's answer about `id` to a batch sent at `sent`.
    pub fn answered(&self, id: LeaseId, answer: Answer, sent: Instant) {
        match answer {
            Answer::Alive(ttl) => {
                if let Some(mut entry) = self.entries.get_mut(&id) {
                    if sent < entry.born {
                        return;
                    }
                    let newer = entry.confirmed.is_none_or(|c| c.sent <= sent);
                    if newer {
                        entry.confirmed = Some(Confirmed { ttl, sent });
                    }
                    // Waiters are told the confirmed TTL aged by the whole
                    // seconds since the batch was sent, as the table tells
                    // keep-alives; an answer that came after every second
                    // of it had passed confirms nothing now: they wait for
                    // the next batch that carries the lease (their client's
                    // next keep-alive), or their timeout.
                    let report = entry.confirmed.map(|c| c.aged(Instant::now()));
                    if let Some(report) = report.filter(|r| *r >= 1) {
                        for waiter in entry.waiters.drain(..) {
                            let _ = waiter.send(Ok(report));
                        }
                    }
                }
            }
            Answer::Gone => {
                let fresh = self.entries.get(&id).is_some_and(|e| sent < e.born);
                if !fresh {
                    tracing::debug!(lease_id = %id, "the cell says the lease is gone");
                    self.revoked(id);
                }
            }
        }
    }

    /// Drops sessions nobody refreshed whose confirmed time ran out more
    /// than `grace` ago: the cell has expired them (or another proxy keeps
    /// them, and adopts them back here if their client returns).
    /// Returns how many it dropped (counted as it goes: keep-alives add
    /// entries while it runs, so the table's size before and after says
    /// nothing).
    pub fn sweep(&self, now: Instant, grace: Duration) -> usize {
        let mut dropped = 0;
        self.entries.retain(|_, entry| {
            entry.waiters.retain(|w| !w.is_closed());
            let keep = match entry.confirmed {
                // Never confirmed: kept while a keep-alive still waits.
                None => !entry.waiters.is_empty(),
                Some(c) => entry.refreshed || c.deadline() + grace > now,
            };
            dropped += usize::from(!keep);
            keep
        });
        dropped
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(n: i64) -> LeaseId {
        LeaseId::from(n)
    }

    #[tokio::test(start_paused = true)]
    async fn a_keep_alive_reports_what_the_cell_confirmed_aged_never_more() {
        let table = SessionTable::new();
        let sent = Instant::now();
        table.granted(id(1), 10, sent);
        match table.keep_alive(id(1), sent).expect("room") {
            KeepAlive::Ttl(ttl) => assert_eq!(ttl, 10),
            KeepAlive::Wait(_) => panic!("a granted lease is answered at once"),
        }
        tokio::time::advance(Duration::from_millis(3_700)).await;
        match table.keep_alive(id(1), Instant::now()).expect("room") {
            KeepAlive::Ttl(ttl) => assert_eq!(ttl, 7, "3.7 s after the grant"),
            KeepAlive::Wait(_) => panic!("still confirmed"),
        }
        assert_eq!(table.take_due(), vec![id(1)], "refreshed once, due once");
        assert!(table.take_due().is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn an_unknown_lease_waits_for_the_cell_and_is_adopted() {
        let table = SessionTable::new();
        let Ok(KeepAlive::Wait(rx)) = table.keep_alive(id(7), Instant::now()) else {
            panic!("an unknown lease cannot be answered from the table");
        };
        let due = table.take_due();
        assert_eq!(due, vec![id(7)]);
        table.answered(id(7), Answer::Alive(30), Instant::now());
        assert_eq!(rx.await.expect("answered").expect("alive"), 30);
        assert!(matches!(
            table.keep_alive(id(7), Instant::now()),
            Ok(KeepAlive::Ttl(30))
        ));
    }

    #[tokio::test(start_paused = true)]
    async fn a_lease_the_cell_says_is_gone_answers_session_expired() {
        let table = SessionTable::new();
        table.granted(id(2), 2, Instant::now());
        tokio::time::advance(Duration::from_millis(1_500)).await;
        // 2 s confirmed, 1.5 s ago: under a second left, so it waits.
        let Ok(KeepAlive::Wait(rx)) = table.keep_alive(id(2), Instant::now()) else {
            panic!("under a second confirmed must wait for the cell");
        };
        table.answered(id(2), Answer::Gone, Instant::now());
        let err = rx.await.expect("answered").expect_err("gone");
        assert_eq!(err.code, latchkey_shared::ErrorCode::SessionExpired);
        assert!(table.is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn an_older_answer_never_replaces_a_newer_one() {
        let table = SessionTable::new();
        let early = Instant::now();
        tokio::time::advance(Duration::from_secs(1)).await;
        let late = Instant::now();
        table.granted(id(3), 10, late);
        table.answered(id(3), Answer::Alive(10), early);
        // 1.5 s confirmed by the newer answer; 0.5 s by the older one,
        // which would make the keep-alive wait.
        tokio::time::advance(Duration::from_millis(8_500)).await;
        assert!(matches!(
            table.keep_alive(id(3), Instant::now()),
            Ok(KeepAlive::Ttl(2))
        ));
    }

    #[tokio::test(start_paused = true)]
    async fn sessions_nobody_refreshes_are_swept_after_their_time_runs_out() {
        let table = SessionTable::new();
        table.granted(id(4), 5, Instant::now());
        table.granted(id(5), 5, Instant::now());
        let grace = Duration::from_secs(1);
        tokio::time::advance(Duration::from_secs(5)).await;
        let _ = table.keep_alive(id(5), Instant::now()).expect("room");
        assert_eq!(table.sweep(Instant::now(), grace), 0, "within the grace");
        tokio::time::advance(Duration::from_secs(2)).await;
        assert_eq!(table.sweep(Instant::now(), grace), 1);
        assert_eq!(table.len(), 1, "the refreshed one stays");
    }

    #[tokio::test(start_paused = true)]
    async fn an_answer_to_a_batch_sent_before_a_revoke_says_nothing_after_it() {
        let table = SessionTable::new();
        table.granted(id(8), 10, Instant::now());
        let _ = table.keep_alive(id(8), Instant::now()).expect("room");
        let due = table.take_due();
        let sent = Instant::now();
        tokio::time::advance(Duration::from_millis(10)).await;
        // Revoked here while the batch is in flight; a client keeps the
        // id alive again: it must wait for a batch sent after this.
        table.revoked(id(8));
        let Ok(KeepAlive::Wait(mut rx)) = table.keep_alive(id(8), Instant::now()) else {
            panic!("a revoked lease is not answered from the table");
        };
        table.answered(due[0], Answer::Alive(10), sent);
        assert!(rx.try_recv().is_err(), "the old batch's answer was taken");
        table.answered(due[0], Answer::Gone, sent);
        assert!(rx.try_recv().is_err(), "the old batch's answer was taken");
        assert_eq!(table.len(), 1);
        let _ = table.take_due();
        table.answered(id(8), Answer::Gone, Instant::now());
        let err = rx.await.expect("answered").expect_err("gone");
        assert_eq!(err.code, latchkey_shared::ErrorCode::SessionExpired);
    }

    /// P8: a failed batch is not a client's keep-alive. Its leases go
    /// again only if a keep-alive waits on them or their client refreshes
    /// them again.
    #[tokio::test(start_paused = true)]
    async fn a_failed_batch_sends_again_only_what_clients_still_keep_alive() {
        let table = SessionTable::new();
        table.granted(id(10), 10, Instant::now());
        let _ = table.keep_alive(id(10), Instant::now()).expect("room");
        let Ok(KeepAlive::Wait(waiting)) = table.keep_alive(id(11), Instant::now()) else {
            panic!("an unknown lease waits for the cell");
        };
        let due = table.take_due();
        assert_eq!(due, vec![id(10), id(11)]);
        table.retry(&due);
        assert_eq!(
            table.take_due(),
            vec![id(11)],
            "only the lease a keep-alive waits on goes again"
        );
        table.retry(&[id(11)]);
        drop(waiting);
        let _ = table.take_due();
        table.retry(&[id(11)]);
        assert!(table.take_due().is_empty(), "nobody waits any more");
        // The client of 10 keeps it alive again: it goes in the next batch.
        let _ = table.keep_alive(id(10), Instant::now()).expect("room");
        assert_eq!(table.take_due(), vec![id(10)]);
    }

    /// P8: an answer that came after every second it confirmed had
    /// passed is not passed on as "TTL 1": the waiter waits for a batch
    /// that carries the lease again.
    #[tokio::test(start_paused = true)]
    async fn waiters_are_never_told_a_ttl_the_cell_has_not_confirmed() {
        let table = SessionTable::new();
        let Ok(KeepAlive::Wait(mut rx)) = table.keep_alive(id(12), Instant::now()) else {
            panic!("an unknown lease waits for the cell");
        };
        assert_eq!(table.take_due(), vec![id(12)]);
        let sent = Instant::now();
        tokio::time::advance(Duration::from_millis(1_200)).await;
        // 1 s from the send, 1.2 s ago: nothing confirmed is left.
        table.answered(id(12), Answer::Alive(1), sent);
        assert!(rx.try_recv().is_err(), "told a TTL not confirmed");
        // The client keeps it alive again; that batch's answer is passed on.
        let Ok(KeepAlive::Wait(again)) = table.keep_alive(id(12), Instant::now()) else {
            panic!("nothing confirmed: the keep-alive waits");
        };
        assert_eq!(table.take_due(), vec![id(12)]);
        table.answered(id(12), Answer::Alive(1), Instant::now());
        assert_eq!(rx.await.expect("answered").expect("alive"), 1);
        assert_eq!(again.await.expect("answered").expect("alive"), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn made_up_ids_nobody_waits_for_are_swept_and_waiters_are_bounded() {
        let table = SessionTable::new();
        let mut waiting = Vec::new();
        for n in 0..MAX_WAITERS {
            match table.keep_alive(id(9), Instant::now()) {
                Ok(KeepAlive::Wait(rx)) => waiting.push(rx),
                _ => panic!("keep-alive {n} of an unknown lease must wait"),
            }
        }
        assert!(table.keep_alive(id(9), Instant::now()).is_err(), "bounded");
        // The clients give up; a sweep (the cell never answered) drops it.
        drop(waiting);
        assert!(
            table.keep_alive(id(9), Instant::now()).is_ok(),
            "closed waiters pruned"
        );
        assert_eq!(table.sweep(Instant::now(), Duration::from_secs(1)), 1);
        assert!(table.is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn confirmed_sessions_go_before_adoptions_in_a_batch() {
        let table = SessionTable::new();
        let _ = table.keep_alive(id(20), Instant::now()).expect("room");
        table.granted(id(21), 10, Instant::now());
        let _ = table.keep_alive(id(21), Instant::now()).expect("room");
        assert_eq!(table.take_due(), vec![id(21), id(20)]);
    }
}
