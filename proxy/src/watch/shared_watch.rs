//! [`SharedWatch`]: ONE upstream watch and every client watch on it
//! (DESIGN section 4). The upstream side publishes each revision's events
//! as one [`Revision`]; the shared watch keeps the newest of them as
//! history and hands each to every subscriber.
//!
//! A client watch joins at its start revision:
//! - at or after what the shared watch has delivered: it just subscribes
//!   (revisions before its start are skipped for it);
//! - inside the history: it gets the history from its start revision as
//!   its backlog and subscribes, both under one lock, so no revision is
//!   missed or repeated between the two;
//! - before the history: the shared watch cannot serve it. It must catch
//!   up on its own upstream watch and join at [`Join::CatchUp::join_at`],
//!   the oldest revision the history still answers for.
//!
//! A subscriber's queue is bounded, by revisions and by bytes
//! ([`super::subscriber_queue`]). A subscriber whose queue is full is
//! dropped at once: its channel closes after the items already queued,
//! with no [`Item::Cancelled`] (there is no room for one). The reader
//! takes a close without a cancel as "too slow" and tells its client to
//! resume after the last revision it got. A slow subscriber never holds
//! up the others or the upstream stream.
//!
//! The state is behind a std mutex: every critical section is a few
//! vector operations and `try_send`s, never an await.

use super::subscriber_queue::{self, QueueRx, QueueTx};
use crate::metrics_catalog::SLOW_WATCHERS;
use latchkey_shared::etcdpb::PbEvent;
use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use tokio::sync::mpsc;

/// The events of one revision that touch the watched range.
#[derive(Debug, Clone, PartialEq)]
pub struct Revision {
    pub revision: i64,
    pub events: Arc<[PbEvent]>,
    /// When the proxy got it from upstream: fan-out delays count from here.
    pub received: tokio::time::Instant,
    /// The subscribers it was published to (1 where nobody counted): the
    /// herd its fan-out spreads.
    pub herd: u32,
}

/// Most bytes of events a shared watch keeps as history, whatever its
/// revision count: a busy key with large values keeps fewer revisions.
pub const HISTORY_BYTES: usize = 8 << 20;

impl Revision {
    /// About what its events hold (keys and values, with previous ones).
    pub fn bytes(&self) -> usize {
        self.events
            .iter()
            .map(|e| {
                let kv = |kv: &Option<latchkey_shared::etcdpb::PbKeyValue>| {
                    kv.as_ref()
                        .map_or(0, |kv| kv.key.len() + kv.value.len() + 48)
                };
                kv(&e.kv) + kv(&e.prev_kv)
            })
            .sum()
    }
}

/// Why a subscriber was cancelled (a slow one gets no cancel: its channel
/// just closes, see the module doc).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Cancel {
    /// The shared watch ended (its upstream watch failed for good).
    Ended { reason: String },
    /// History the watch needed was compacted away.
    Compacted { compact_revision: i64 },
    /// The client may no longer read what it watches (its permission was
    /// revoked, its user deleted, or authentication came on under it):
    /// from [`read_permits`](super::read_permits), never from upstream.
    Revoked(latchkey_shared::ApiError),
}

/// What a subscriber receives, in order.
#[derive(Debug, Clone, PartialEq)]
pub enum Item {
    Events(Revision),
    /// Everything up to this revision has been delivered (a progress
    /// notification from upstream).
    Progress(i64),
    /// The last item: the subscriber is dropped.
    Cancelled(Cancel),
}

/// How a subscriber learns that upstream has delivered everything up to
/// some revision.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Progress {
    /// An [`Item::Progress`] in its queue (client watches, which pass them
    /// on).
    Items,
    /// Nothing queued: it reads [`SharedWatch::mark`] when it needs to
    /// know. The read cache holds thousands of quiet ranges, and an item
    /// per range per progress round was a queue send and a task wake-up for
    /// each of them several times a second.
    Mark,
}

/// How far upstream has delivered, as one subscriber may rely on it: see
/// [`SharedWatch::mark`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Mark {
    /// Every revision up to this one was delivered upstream.
    pub revision: i64,
    /// When upstream said so.
    pub at: tokio::time::Instant,
    /// Revisions queued for the subscriber so far (its backlog included):
    /// the mark speaks for its state only once it has taken this many.
    pub queued: u64,
}

/// The result of [`SharedWatch::join`].
pub enum Join {
    /// Subscribed: `backlog` first (history from the start revision), then
    /// `items` as revisions arrive.
    Joined {
        backlog: Vec<Revision>,
        items: QueueRx,
        id: u64,
        /// The first revision this subscriber is given (its start, or the
        /// next revision for a start of 0).
        from: i64,
    },
    /// The history does not reach back to the start revision: catch up on
    /// a watch of your own, then join at `join_at`.
    CatchUp { join_at: i64 },
}

struct Subscriber {
    id: u64,
    /// The first revision this subscriber wants.
    from: i64,
    tx: QueueTx,
    progress: Progress,
    /// Revisions queued for it, its backlog included.
    queued: u64,
}

struct Inner {
    /// The newest revisions published, oldest first.
    history: VecDeque<Revision>,
    /// What `history` holds, in [`Revision::bytes`].
    history_bytes: usize,
    /// Every revision from here on that touched the range is in `history`
    /// or not published yet: the oldest start revision a joiner can be
    /// served from.
    complete_from: i64,
    /// Every revision below this has been published.
    published_below: i64,
    /// The last progress from upstream: its revision and when it came.
    progressed: Option<(i64, tokio::time::Instant)>,
    subscribers: Vec<Subscriber>,
    next_id: u64,
    ended: Option<Cancel>,
}

/// One upstream watch and its subscribers; see the module doc.
pub struct SharedWatch {
    inner: Mutex<Inner>,
    /// Revisions kept for late joiners.
    history_len: usize,
    /// Items queued per subscriber before it counts as slow.
    queue_len: usize,
    /// Bytes of events queued per subscriber before it counts as slow.
    queue_bytes: usize,
}

impl SharedWatch {
    /// A shared watch whose upstream watch starts at `start_revision`:
    /// joiners from that revision on are served from it.
    pub fn new(
        start_revision: i64,
        history_len: usize,
        queue_len: usize,
        queue_bytes: usize,
    ) -> SharedWatch {
        SharedWatch {
            inner: Mutex::new(Inner {
                history: VecDeque::new(),
                history_bytes: 0,
                complete_from: start_revision,
                published_below: start_revision,
                progressed: None,
                subscribers: Vec::new(),
                next_id: 0,
                ended: None,
            }),
            history_len: history_len.max(1),
            queue_len: queue_len.max(1),
            queue_bytes,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        // A panic while holding the lock leaves vectors in a valid state;
        // carry on with them.
        self.inner
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Subscribers now.
    pub fn subscribers(&self) -> usize {
        self.lock().subscribers.len()
    }

    /// The first revision not published yet: where the upstream watch
    /// resumes after its member fails.
    pub fn resume_from(&self) -> i64 {
        self.lock().published_below
    }

    /// A client watch from `from_revision` (0: from the next revision).
    pub fn join(&self, from_revision: i64) -> Join {
        self.join_with(from_revision, Progress::Items)
    }

    /// A subscriber from `from_revision`, told of progress as `progress`
    /// says.
    pub fn join_with(&self, from_revision: i64, progress: Progress) -> Join {
        let mut inner = self.lock();
        let from = if from_revision <= 0 {
            inner.published_below
        } else {
            from_revision
        };
        if from < inner.complete_from {
            return Join::CatchUp {
                join_at: inner.complete_from,
            };
        }
        let (tx, items) = subscriber_queue::channel(self.queue_len, self.queue_bytes);
        if let Some(cancel) = &inner.ended {
            let _ = tx.try_send(Item::Cancelled(cancel.clone()));
            return Join::Joined {
                backlog: Vec::new(),
                items,
                id: u64::MAX,
                from,
            };
        }
        let backlog: Vec<Revision> = inner
            .history
            .iter()
            .filter(|r| r.revision >= from)
            .cloned()
            .collect();
        let id = inner.next_id;
        inner.next_id += 1;
        inner.subscribers.push(Subscriber {
            id,
            from,
            tx,
            progress,
            queued: backlog.len() as u64,
        });
        Join::Joined {
            backlog,
            items,
            id,
            from,
        }
    }

    /// How far upstream has delivered, for subscriber `id` (joined with
    /// [`Progress::Mark`]); `None` before the first progress, or when the
    /// subscriber is gone (it left, fell behind, or the watch ended: then
    /// what it was queued no longer reaches it, and no mark speaks for it).
    ///
    /// Why the mark holds: revisions are published in order and a progress
    /// at R comes after every revision up to R was published, so every
    /// revision up to `revision` meant for the subscriber is among the
    /// first `queued` it was given. One that has taken `queued` revisions
    /// reflects every change up to `revision`.
    pub fn mark(&self, id: u64) -> Option<Mark> {
        let inner = self.lock();
        let (revision, at) = inner.progressed?;
        let subscriber = inner.subscribers.iter().find(|s| s.id == id)?;
        Some(Mark {
            revision,
            at,
            queued: subscriber.queued,
        })
    }

    /// A client watch ends (the client cancelled it or went away).
    pub fn leave(&self, id: u64) {
        self.lock().subscribers.retain(|s| s.id != id);
    }

    /// The events of one revision, from the upstream watch. Revisions must
    /// come in increasing order; an older one (a resumed upstream watch
    /// repeating what was delivered) is ignored.
    pub fn publish(&self, revision: Revision) {
        let mut inner = self.lock();
        if revision.revision < inner.published_below {
            return;
        }
        inner.published_below = revision.revision + 1;
        let herd = inner
            .subscribers
            .iter()
            .filter(|s| revision.revision >= s.from)
            .count();
        let revision = Revision {
            herd: u32::try_from(herd).unwrap_or(u32::MAX).max(1),
            ..revision
        };
        inner.history_bytes += revision.bytes();
        inner.history.push_back(revision.clone());
        while inner.history.len() > self.history_len
            || (inner.history_bytes > HISTORY_BYTES && inner.history.len() > 1)
        {
            if let Some(dropped) = inner.history.pop_front() {
                inner.history_bytes -= dropped.bytes();
                inner.complete_from = dropped.revision + 1;
            }
        }
        inner.subscribers.retain_mut(|s| {
            if revision.revision < s.from {
                return true;
            }
            match s.tx.try_send(Item::Events(revision.clone())) {
                Ok(()) => {
                    s.queued += 1;
                    true
                }
                Err(mpsc::error::TrySendError::Full(_)) => {
                    // Dropping the sender closes the channel behind what is
                    // queued: the reader's "slow" (see the module doc).
                    metrics::counter!(SLOW_WATCHERS.name).increment(1);
                    tracing::debug!(
                        subscriber = s.id,
                        revision = revision.revision,
                        "slow watcher dropped"
                    );
                    false
                }
                Err(mpsc::error::TrySendError::Closed(_)) => false,
            }
        });
    }

    /// Upstream says every revision below `revision + 1` was delivered.
    pub fn progress(&self, revision: i64) {
        let mut inner = self.lock();
        if revision + 1 > inner.published_below {
            inner.published_below = revision + 1;
        }
        let newest = inner.progressed.map_or(revision, |(r, _)| r.max(revision));
        inner.progressed = Some((newest, tokio::time::Instant::now()));
        inner.subscribers.retain(|s| {
            if s.progress == Progress::Mark {
                return true;
            }
            match s.tx.try_send(Item::Progress(revision)) {
                Ok(()) => true,
                // A full queue already holds newer news; a progress
                // notification is not worth dropping a client for.
                Err(mpsc::error::TrySendError::Full(_)) => true,
                Err(mpsc::error::TrySendError::Closed(_)) => false,
            }
        });
    }

    /// The upstream watch ended for good: every subscriber is cancelled.
    pub fn end(&self, cancel: Cancel) {
        let mut inner = self.lock();
        inner.ended = Some(cancel.clone());
        for s in inner.subscribers.drain(..) {
            let _ = s.tx.try_send(Item::Cancelled(cancel.clone()));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rev(revision: i64) -> Revision {
        Revision {
            revision,
            events: Arc::from(vec![PbEvent::default()]),
            received: tokio::time::Instant::now(),
            herd: 1,
        }
    }

    fn joined(join: Join) -> (Vec<Revision>, QueueRx) {
        match join {
            Join::Joined { backlog, items, .. } => (backlog, items),
            Join::CatchUp { join_at } => panic!("asked to catch up to {join_at}"),
        }
    }

    /// The revisions a subscriber got: its backlog, then what is queued.
    fn revisions(backlog: &[Revision], items: &mut QueueRx) -> Vec<i64> {
        let mut got: Vec<i64> = backlog.iter().map(|r| r.revision).collect();
        while let Ok(item) = items.try_recv() {
            if let Item::Events(r) = item {
                got.push(r.revision);
            }
        }
        got
    }

    #[test]
    fn a_live_joiner_gets_every_revision_from_its_start_once() {
        let watch = SharedWatch::new(10, 8, 100, usize::MAX);
        watch.publish(rev(10));
        let (backlog, mut items) = joined(watch.join(0));
        assert!(backlog.is_empty(), "from the next revision: no backlog");
        let (b2, mut later) = joined(watch.join(13));
        for r in [11, 12, 13, 15] {
            watch.publish(rev(r));
        }
        assert_eq!(revisions(&backlog, &mut items), vec![11, 12, 13, 15]);
        assert_eq!(
            revisions(&b2, &mut later),
            vec![13, 15],
            "nothing before its start"
        );
    }

    #[test]
    fn a_joiner_inside_the_history_gets_it_then_the_live_revisions_without_gap_or_repeat() {
        let watch = SharedWatch::new(1, 8, 100, usize::MAX);
        for r in [2, 4, 5, 7] {
            watch.publish(rev(r));
        }
        let (backlog, mut items) = joined(watch.join(4));
        watch.publish(rev(7)); // a resumed upstream repeating itself
        watch.publish(rev(9));
        assert_eq!(revisions(&backlog, &mut items), vec![4, 5, 7, 9]);
    }

    #[test]
    fn a_joiner_before_the_history_is_told_where_to_join() {
        let watch = SharedWatch::new(1, 2, 100, usize::MAX);
        for r in [2, 4, 5, 7] {
            watch.publish(rev(r));
        }
        // History holds 5 and 7; every revision from 5 on is complete.
        match watch.join(3) {
            Join::CatchUp { join_at } => assert_eq!(join_at, 5),
            Join::Joined { .. } => panic!("revision 4 is no longer held"),
        }
        let (backlog, mut items) = joined(watch.join(5));
        assert_eq!(revisions(&backlog, &mut items), vec![5, 7]);
    }

    #[test]
    fn history_is_bounded_by_bytes_as_well_as_by_revisions() {
        use latchkey_shared::etcdpb::PbKeyValue;
        let watch = SharedWatch::new(1, 1000, 100, usize::MAX);
        let big = |revision: i64| Revision {
            revision,
            events: Arc::from(vec![PbEvent {
                kv: Some(PbKeyValue {
                    value: vec![0; 1 << 20],
                    ..Default::default()
                }),
                ..Default::default()
            }]),
            received: tokio::time::Instant::now(),
            herd: 1,
        };
        for r in 1..=20 {
            watch.publish(big(r));
        }
        // Seven revisions of just over 1 MiB fit in 8 MiB: a joiner from
        // before them must catch up.
        match watch.join(1) {
            Join::CatchUp { join_at } => assert_eq!(join_at, 14),
            Join::Joined { .. } => panic!("20 MiB of history kept"),
        }
    }

    #[test]
    fn a_subscriber_holding_its_bytes_is_dropped_however_few_revisions_it_holds() {
        let watch = SharedWatch::new(1, 8, 1000, 3 << 10);
        let (_, mut slow) = joined(watch.join(0));
        let big = |revision| Revision {
            revision,
            events: Arc::from(vec![PbEvent {
                kv: Some(latchkey_shared::etcdpb::PbKeyValue {
                    value: vec![0; 1 << 10],
                    ..Default::default()
                }),
                ..Default::default()
            }]),
            received: tokio::time::Instant::now(),
            herd: 1,
        };
        for r in 1..=5 {
            watch.publish(big(r));
        }
        assert_eq!(watch.subscribers(), 0, "3 KiB of 1 KiB revisions is full");
        assert_eq!(revisions(&[], &mut slow), vec![1, 2]);
    }

    #[test]
    fn a_slow_subscriber_is_dropped_and_the_others_get_everything() {
        let watch = SharedWatch::new(1, 8, 2, usize::MAX);
        let (_, mut slow) = joined(watch.join(0));
        let (_, mut fast) = joined(watch.join(0));
        let mut fast_got = Vec::new();
        for r in 1..=5 {
            watch.publish(rev(r));
            while let Ok(Item::Events(got)) = fast.try_recv() {
                fast_got.push(got.revision);
            }
        }
        assert_eq!(fast_got, vec![1, 2, 3, 4, 5]);
        assert_eq!(watch.subscribers(), 1, "the slow one is gone");
        // The slow one reads what was queued, then the channel is closed
        // without a cancel: it resumes after revision 2.
        assert_eq!(revisions(&[], &mut slow), vec![1, 2]);
        assert!(matches!(
            slow.try_recv(),
            Err(mpsc::error::TryRecvError::Disconnected)
        ));
    }

    #[test]
    fn ending_cancels_everyone_and_refuses_new_joiners_with_the_reason() {
        let watch = SharedWatch::new(1, 8, 8, usize::MAX);
        let (_, mut items) = joined(watch.join(0));
        watch.end(Cancel::Compacted {
            compact_revision: 7,
        });
        let cancelled = Item::Cancelled(Cancel::Compacted {
            compact_revision: 7,
        });
        assert_eq!(items.try_recv().ok(), Some(cancelled.clone()));
        let (_, mut late) = joined(watch.join(0));
        assert_eq!(late.try_recv().ok(), Some(cancelled));
        assert_eq!(watch.subscribers(), 0);
    }

    #[test]
    fn progress_moves_the_resume_point_and_reaches_subscribers() {
        let watch = SharedWatch::new(1, 8, 8, usize::MAX);
        let (_, mut items) = joined(watch.join(0));
        watch.progress(20);
        assert_eq!(watch.resume_from(), 21);
        assert_eq!(items.try_recv().ok(), Some(Item::Progress(20)));
        watch.publish(rev(15));
        assert!(
            items.try_recv().is_err(),
            "a revision already covered is not news"
        );
    }

    fn joined_id(join: Join) -> (Vec<Revision>, QueueRx, u64) {
        match join {
            Join::Joined {
                backlog, items, id, ..
            } => (backlog, items, id),
            Join::CatchUp { join_at } => panic!("asked to catch up to {join_at}"),
        }
    }

    #[test]
    fn a_marked_subscriber_reads_progress_from_the_mark_with_what_it_was_queued() {
        let watch = SharedWatch::new(1, 8, 8, usize::MAX);
        watch.publish(rev(2));
        let (backlog, mut items, id) = joined_id(watch.join_with(2, Progress::Mark));
        assert_eq!(backlog.len(), 1);
        assert_eq!(watch.mark(id), None, "no progress yet");
        watch.publish(rev(3));
        watch.progress(5);
        let mark = watch.mark(id).expect("a mark");
        assert_eq!(
            (mark.revision, mark.queued),
            (5, 2),
            "the backlog and revision 3"
        );
        assert_eq!(
            items.try_recv().ok().map(|i| matches!(i, Item::Events(_))),
            Some(true)
        );
        assert!(items.try_recv().is_err(), "no progress item for it");
        // An older progress (a resumed watch on a member behind) does not
        // take the mark back.
        watch.progress(4);
        assert_eq!(watch.mark(id).map(|m| m.revision), Some(5));
    }

    #[test]
    fn a_marked_subscriber_dropped_as_slow_has_no_mark() {
        let watch = SharedWatch::new(1, 8, 2, usize::MAX);
        let (_, _items, id) = joined_id(watch.join_with(0, Progress::Mark));
        watch.progress(1);
        assert!(watch.mark(id).is_some());
        for r in 2..=4 {
            watch.publish(rev(r));
        }
        watch.progress(4);
        assert_eq!(
            watch.mark(id),
            None,
            "revision 4 never reached it: no mark may speak for it"
        );
    }
}
