//! [`Coalescer`]: one [`SharedWatch`] per distinct [`WatchKey`] per proxy
//! (DESIGN section 4), each on one member's multiplexed stream
//! ([`MemberStream`]), resumed on another member when that stream fails.
//!
//! Joining and leaving happen under one std mutex (the map), so the last
//! subscriber leaving and a new one joining cannot race: the shared watch
//! is removed (and its upstream watch cancelled) only when it has no
//! subscriber at that moment. Creating a shared watch is async (the member
//! must answer); concurrent first joiners of one key wait on the same
//! creation.

use super::pump::{Pump, Upstream};
use super::shared_watch::{Cancel, Item, Join, Mark, Progress, Revision, SharedWatch};
use super::subscriber_queue::{self, QueueRx, QueueTx};
use super::upstream_answer::Answer;
use super::upstream_watches::{Opened, UpstreamWatches};
use super::watch_key::WatchKey;
use crate::metrics_catalog::WATCH_CATCH_UPS;
use crate::upstream::Cell;
use latchkey_shared::ApiError;
use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use tokio::sync::OnceCell;
use tokio_util::sync::CancellationToken;

struct Entry {
    watch: Arc<OnceCell<Arc<SharedWatch>>>,
    /// Cancelled when the entry is removed: its pump cancels the upstream
    /// watch and ends.
    stop: CancellationToken,
}

pub struct Coalescer {
    cell: Cell,
    upstream: Arc<UpstreamWatches>,
    /// A std mutex: held for map operations and `SharedWatch::join/leave`
    /// (no await).
    watches: Mutex<HashMap<WatchKey, Entry>>,
    history_len: usize,
    /// Each subscriber's queue: revisions, and bytes of events.
    queue_len: usize,
    queue_bytes: usize,
}

/// One client watch: its items in order, the shared watch's history
/// backlog first. Dropping it leaves the shared watch.
pub struct Subscription {
    /// The first revision it delivers (the start, or the next revision
    /// for a start of 0).
    pub from: i64,
    backlog: VecDeque<Revision>,
    items: QueueRx,
    /// Joined with [`Progress::Mark`].
    marked: bool,
    place: Option<Place>,
}

impl Subscription {
    /// A subscription fed by the returned sender, delivering from `from`
    /// (for tests of what consumes subscriptions).
    #[cfg(test)]
    pub fn from_channel(from: i64, queue: usize) -> (QueueTx, Subscription) {
        let (tx, items) = subscriber_queue::channel(queue, usize::MAX);
        let subscription = Subscription {
            from,
            backlog: VecDeque::new(),
            items,
            marked: false,
            place: None,
        };
        (tx, subscription)
    }

    /// Where to read how far upstream has delivered, for a subscription on
    /// the shared watch joined with [`Progress::Mark`].
    pub fn mark_reader(&self) -> Option<MarkReader> {
        match &self.place {
            Some(place) if self.marked => Some(MarkReader {
                shared: place.ticket.shared.clone(),
                id: place.ticket.id,
            }),
            _ => None,
        }
    }

    /// The next item; `None` when the subscription closed without a
    /// cancel item: it was dropped for falling behind.
    pub async fn recv(&mut self) -> Option<Item> {
        match self.backlog.pop_front() {
            Some(revision) => Some(Item::Events(revision)),
            None => self.items.recv().await,
        }
    }

    /// A subscription fed by `items` alone (tests of what consumes one).
    #[cfg(test)]
    pub fn of(items: QueueRx) -> Subscription {
        Subscription {
            from: 0,
            backlog: VecDeque::new(),
            items,
            marked: false,
            place: None,
        }
    }
}

/// One subscriber's view of its shared watch's progress.
pub struct MarkReader {
    shared: Arc<SharedWatch>,
    id: u64,
}

impl MarkReader {
    /// See [`SharedWatch::mark`].
    pub fn read(&self) -> Option<Mark> {
        self.shared.mark(self.id)
    }
}

/// A subscriber's place on a shared watch, left when dropped.
struct Place {
    coalescer: Arc<Coalescer>,
    ticket: Ticket,
}

impl Drop for Place {
    fn drop(&mut self) {
        self.coalescer.leave(&self.ticket);
    }
}

/// A client's place on a shared watch; [`Coalescer::leave`] ends it.
pub struct Ticket {
    pub key: WatchKey,
    pub id: u64,
    /// The shared watch it is on: ids are per shared watch, and the key
    /// may name a newer one by the time the ticket is handed back.
    shared: Arc<SharedWatch>,
}

impl Coalescer {
    pub fn new(
        cell: Cell,
        history_len: usize,
        queue_len: usize,
        queue_bytes: usize,
    ) -> Arc<Coalescer> {
        Arc::new(Coalescer {
            upstream: Arc::new(UpstreamWatches::new(cell.clone())),
            cell,
            watches: Mutex::new(HashMap::new()),
            history_len,
            queue_len,
            queue_bytes,
        })
    }

    fn map(&self) -> std::sync::MutexGuard<'_, HashMap<WatchKey, Entry>> {
        self.watches.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Asks every member stream for a progress answer: each shared watch
    /// then learns how far its member has come, and tells its subscribers.
    pub async fn request_progress(&self) {
        self.upstream.request_progress().await;
    }

    /// Whether a shared watch of `key` exists (clients watch it).
    pub fn is_watched(&self, key: &WatchKey) -> bool {
        self.map().contains_key(key)
    }

    /// Upstream watches this proxy holds (one per distinct key).
    pub fn upstream_watches(&self) -> usize {
        self.map().len()
    }

    /// Joins the shared watch for `key` at `start_revision`, creating it
    /// upstream if nobody watches `key` yet.
    pub async fn join(
        self: &Arc<Self>,
        key: WatchKey,
        start_revision: i64,
    ) -> Result<(Join, Option<Ticket>), ApiError> {
        self.join_with(key, start_revision, Progress::Items).await
    }

    /// [`Coalescer::join`], told of progress as `progress` says.
    async fn join_with(
        self: &Arc<Self>,
        key: WatchKey,
        start_revision: i64,
        progress: Progress,
    ) -> Result<(Join, Option<Ticket>), ApiError> {
        let (cell, stop) = {
            let mut map = self.map();
            let entry = map.entry(key.clone()).or_insert_with(|| Entry {
                watch: Arc::new(OnceCell::new()),
                stop: CancellationToken::new(),
            });
            (entry.watch.clone(), entry.stop.clone())
        };
        let created = cell
            .get_or_try_init(|| self.create(key.clone(), stop.clone()))
            .await;
        let shared = match created {
            Ok(shared) => shared.clone(),
            Err(e) => {
                self.forget(&key, &cell);
                return Err(e);
            }
        };
        // Join under the map's lock, against a concurrent last leave.
        let joined = {
            let map = self.map();
            match map.get(&key) {
                Some(entry) if Arc::ptr_eq(&entry.watch, &cell) => {
                    let join = shared.join_with(start_revision, progress);
                    let ticket = match &join {
                        Join::Joined { id, .. } => Some(Ticket {
                            key: key.clone(),
                            id: *id,
                            shared: shared.clone(),
                        }),
                        Join::CatchUp { .. } => None,
                    };
                    Some((join, ticket))
                }
                _ => None,
            }
        };
        match joined {
            Some(joined) => Ok(joined),
            // Removed between creation and now: try again afresh.
            None => Box::pin(self.join_with(key, start_revision, progress)).await,
        }
    }

    /// A client watch ends; the last one out removes the shared watch.
    pub fn leave(&self, ticket: &Ticket) {
        let mut map = self.map();
        ticket.shared.leave(ticket.id);
        // Only the shared watch the ticket is on, if it is still the one
        // for its key, is removed when left empty.
        let current = map
            .get(&ticket.key)
            .and_then(|entry| entry.watch.get())
            .is_some_and(|shared| Arc::ptr_eq(shared, &ticket.shared));
        if current && ticket.shared.subscribers() == 0 {
            if let Some(entry) = map.remove(&ticket.key) {
                entry.stop.cancel();
            }
        }
    }

    /// Removes the shared watch of `key` (it has ended); the next joiner
    /// creates a new one.
    pub(super) fn remove(&self, key: &WatchKey) {
        self.map().remove(key);
    }

    /// Removes the shared watch of `key` if nobody is on it (it was made
    /// for a joiner that then failed, or for a catch-up that ended).
    fn drop_if_unused(&self, key: &WatchKey) {
        let mut map = self.map();
        let unused = map
            .get(key)
            .and_then(|e| e.watch.get())
            .is_some_and(|w| w.subscribers() == 0);
        if unused {
            if let Some(entry) = map.remove(key) {
                entry.stop.cancel();
            }
        }
    }

    /// Drops a failed creation so the next joiner tries again.
    fn forget(&self, key: &WatchKey, cell: &Arc<OnceCell<Arc<SharedWatch>>>) {
        let mut map = self.map();
        if map.get(key).is_some_and(|e| Arc::ptr_eq(&e.watch, cell)) {
            map.remove(key);
        }
    }

    /// Creates `key` upstream from the next revision and starts its pump.
    async fn create(
        self: &Arc<Self>,
        key: WatchKey,
        stop: CancellationToken,
    ) -> Result<Arc<SharedWatch>, ApiError> {
        let Opened {
            stream,
            watch_id,
            answers,
            revision,
        } = self.upstream.open(&key, 0).await?;
        let shared = Arc::new(SharedWatch::new(
            revision + 1,
            self.history_len,
            self.queue_len,
            self.queue_bytes,
        ));
        // The pump removes the shared watch when it ends (compacted,
        // cancelled by the member); the next joiner creates a new one.
        let coalescer = self.clone();
        let ended = key.clone();
        let pump = Pump {
            upstream: self.upstream.clone(),
            on_end: Box::new(move || coalescer.remove(&ended)),
            key,
            shared: shared.clone(),
        };
        tokio::spawn(pump.run(
            Upstream {
                stream,
                watch_id,
                answers,
            },
            stop,
        ));
        Ok(shared)
    }
}

impl Coalescer {
    /// A client watch of `key` from `start_revision` (0: from the next
    /// revision), whatever the shared watch's history holds. A start older
    /// than the history is served by a private upstream watch until it
    /// meets the shared one, then from the shared one: every revision from
    /// the start once, in order. The subscription leaves the shared watch
    /// when dropped.
    pub async fn subscribe(
        self: &Arc<Self>,
        key: WatchKey,
        start_revision: i64,
    ) -> Result<Subscription, ApiError> {
        self.subscribe_with(key, start_revision, Progress::Items)
            .await
    }

    /// [`Coalescer::subscribe`], told of progress as `progress` says while
    /// on the shared watch itself. A subscription that starts by catching
    /// up gets progress as items whatever it asked
    /// ([`Subscription::mark_reader`] is `None` for it).
    pub async fn subscribe_with(
        self: &Arc<Self>,
        key: WatchKey,
        start_revision: i64,
        progress: Progress,
    ) -> Result<Subscription, ApiError> {
        let (join, ticket) = self
            .join_with(key.clone(), start_revision, progress)
            .await?;
        match join {
            // The common case: the shared watch's own queue for this
            // client, nothing in between.
            Join::Joined {
                backlog,
                items,
                from,
                ..
            } => Ok(Subscription {
                from,
                backlog: backlog.into(),
                items,
                marked: progress == Progress::Mark,
                place: ticket.map(|ticket| Place {
                    coalescer: self.clone(),
                    ticket,
                }),
            }),
            Join::CatchUp { join_at } => {
                // Opened here, so a compacted start is the caller's error.
                let opened = match self.upstream.open(&key, start_revision).await {
                    Ok(opened) => opened,
                    Err(e) => {
                        self.drop_if_unused(&key);
                        return Err(e);
                    }
                };
                let (tx, items) = subscriber_queue::channel(self.queue_len, self.queue_bytes);
                let this = self.clone();
                tokio::spawn(async move {
                    this.clone()
                        .catch_up(key.clone(), start_revision, join_at, opened, tx)
                        .await;
                    // The shared watch was made (or kept) for this client
                    // too: one that ends before it joins (it left, or was
                    // compacted) must not leave it behind with nobody on
                    // it (review P4).
                    this.drop_if_unused(&key);
                });
                Ok(Subscription {
                    from: start_revision,
                    backlog: VecDeque::new(),
                    items,
                    marked: false,
                    place: None,
                })
            }
        }
    }

    /// A private watch from `start` until it meets the shared watch at
    /// `join_at` (or later, if the shared history moves on meanwhile).
    async fn catch_up(
        self: Arc<Self>,
        key: WatchKey,
        start: i64,
        mut join_at: i64,
        opened: Opened,
        tx: QueueTx,
    ) {
        let ended = |reason: String| Item::Cancelled(Cancel::Ended { reason });
        let Opened {
            stream,
            watch_id,
            mut answers,
            ..
        } = opened;
        metrics::counter!(WATCH_CATCH_UPS.name).increment(1);
        // The first revision the client has not been given.
        let mut next = start;
        stream.progress_of(watch_id);
        loop {
            if next >= join_at {
                match self.join(key.clone(), next).await {
                    Ok((Join::Joined { backlog, items, .. }, ticket)) => {
                        stream.cancel(watch_id);
                        let _place = ticket.map(|ticket| Place {
                            coalescer: self.clone(),
                            ticket,
                        });
                        forward(backlog, items, &tx).await;
                        return;
                    }
                    // The shared history moved on: keep catching up.
                    Ok((Join::CatchUp { join_at: later }, _)) => join_at = later,
                    Err(e) => {
                        stream.cancel(watch_id);
                        let _ = tx.send(ended(e.to_string())).await;
                        return;
                    }
                }
            }
            let answer = tokio::select! {
                answer = tokio::time::timeout(self.cell.request_timeout, answers.recv()) => answer,
                _ = tx.closed() => {
                    stream.cancel(watch_id);
                    return;
                }
            };
            match answer {
                Ok(Some(Answer::Revisions { revisions, .. })) => {
                    for revision in revisions {
                        if revision.revision >= next {
                            next = revision.revision + 1;
                            // Full: the client is too slow (its channel
                            // closes without a cancel), as on the shared
                            // watch.
                            if tx.try_send(Item::Events(revision)).is_err() {
                                stream.cancel(watch_id);
                                return;
                            }
                        }
                    }
                }
                Ok(Some(Answer::Progress { revision, .. })) => next = next.max(revision + 1),
                Ok(Some(Answer::Created { .. })) => {}
                Ok(Some(Answer::Compacted {
                    compact_revision, ..
                })) => {
                    let _ = tx
                        .send(Item::Cancelled(Cancel::Compacted { compact_revision }))
                        .await;
                    return;
                }
                Ok(Some(Answer::Cancelled { reason, .. })) => {
                    let _ = tx.send(ended(reason)).await;
                    return;
                }
                Ok(None) => {
                    let _ = tx
                        .send(ended("the member's watch stream failed".into()))
                        .await;
                    return;
                }
                // Quiet: ask how far the member has come.
                Err(_) => {}
            }
            if next < join_at {
                stream.progress_of(watch_id);
            }
        }
    }
}

/// Hands a joined subscription's backlog, then its items, to `tx`, until
/// either side ends.
async fn forward(backlog: Vec<Revision>, mut items: QueueRx, tx: &QueueTx) {
    for revision in backlog {
        if tx.send(Item::Events(revision)).await.is_err() {
            return;
        }
    }
    loop {
        tokio::select! {
            item = items.recv() => match item {
                Some(item) => {
                    if tx.send(item).await.is_err() {
                        return;
                    }
                }
                None => return,
            },
            // The client went away while nothing happened: leave now, not
            // at the next event.
            _ = tx.closed() => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::upstream::CellClient;
    use crate::upstream::Route;
    use crate::watch::shared_watch::Item;
    use crate::watch::test_cell::TestCell;
    use latchkey_shared::etcd_methods::kv::PUT;
    use latchkey_shared::etcdpb::{PbPutRequest, PbPutResponse};
    use std::time::Duration;

    fn key(k: &str) -> WatchKey {
        WatchKey::new(k.as_bytes().to_vec(), vec![], &[], false).expect("key")
    }

    async fn revisions(items: &mut Subscription, n: usize) -> Vec<i64> {
        let mut got = Vec::new();
        while got.len() < n {
            match tokio::time::timeout(Duration::from_secs(10), items.recv()).await {
                Ok(Some(Item::Events(r))) => got.push(r.revision),
                Ok(Some(_)) => {}
                other => panic!("after {got:?}: {other:?}"),
            }
        }
        got
    }

    fn joined(join: Join) -> (Vec<i64>, Subscription) {
        match join {
            Join::Joined { backlog, items, .. } => (
                backlog.iter().map(|r| r.revision).collect(),
                Subscription::of(items),
            ),
            Join::CatchUp { join_at } => panic!("catch up to {join_at}"),
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_joiner_older_than_the_history_catches_up_and_joins_without_gap_or_repeat() {
        let test_cell = TestCell::start().await;
        let cell = test_cell.cell.clone();
        // A history of 2 revisions: most joiners must catch up.
        let coalescer = Coalescer::new(cell.clone(), 2, 1024, 16 << 20);
        let first = test_cell.put("k").await;
        let (live, ticket) = coalescer.join(key("k"), 0).await.expect("join");
        let (_, _live) = joined(live);
        let mut written = vec![first];
        for _ in 0..10 {
            written.push(test_cell.put("k").await);
            test_cell.put("elsewhere").await;
        }
        // Joiners from every revision written so far, while writes go on.
        let mut joiners = Vec::new();
        for start in written.clone() {
            let subscription = coalescer
                .subscribe(key("k"), start)
                .await
                .expect("subscribe");
            joiners.push((start, subscription));
        }
        for _ in 0..10 {
            written.push(test_cell.put("k").await);
        }
        for (start, mut rx) in joiners {
            let want: Vec<i64> = written.iter().copied().filter(|r| *r >= start).collect();
            let got = revisions(&mut rx, want.len()).await;
            assert_eq!(got, want, "a joiner from {start}");
            // Nothing more (no repeat) arrives.
            let extra = tokio::time::timeout(Duration::from_millis(200), rx.recv()).await;
            assert!(
                !matches!(extra, Ok(Some(Item::Events(_)))),
                "a joiner from {start} got more: {extra:?}"
            );
        }
        coalescer.leave(&ticket.expect("ticket"));
        test_cell.handle.shutdown().await.expect("shutdown");
    }

    /// The shared watch's member is SIGKILLed while writes go on: the
    /// watch resumes on another member; its subscriber sees every
    /// acknowledged write once, in order, and nothing twice.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_shared_watch_survives_the_death_of_its_member_without_gap_or_repeat() {
        use crate::upstream::Kind;
        use latchkey_cell::metrics_catalog::WATCHERS;
        let mut cluster =
            latchkey_testkit::Cluster::start(latchkey_testkit::cell_binary(), 3, &[]).await;
        let addrs: Vec<String> = cluster.members.iter().map(|m| m.client.clone()).collect();
        let cell: Cell =
            Arc::new(CellClient::new(&addrs, Duration::from_secs(5), None).expect("client"));
        let coalescer = Coalescer::new(cell.clone(), 1024, 1024, 16 << 20);
        let mut rx = coalescer.subscribe(key("k"), 0).await.expect("subscribe");
        // The member serving the watch is the one with a watcher.
        let mut host = None;
        for id in cluster.running() {
            if cluster.metric(id, WATCHERS.name).await == Some(1.0) {
                host = Some(id);
            }
        }
        let host = host.expect("a member serves the watch");
        let mut acked = Vec::new();
        let mut failed = 0;
        for i in 0..60 {
            if i == 20 {
                cluster.kill(host);
            }
            let put = PbPutRequest {
                key: b"k".to_vec(),
                value: i.to_string().into_bytes(),
                ..Default::default()
            };
            match cell
                .call::<_, PbPutResponse>(Route::Leader, Kind::Write, PUT, put)
                .await
            {
                Ok(resp) => acked.push(resp.header.expect("header").revision),
                Err(_) => failed += 1,
            }
        }
        let last = *acked.last().expect("writes went through");
        let mut got = Vec::new();
        while got.last().is_none_or(|r| *r < last) {
            match tokio::time::timeout(Duration::from_secs(20), rx.recv()).await {
                Ok(Some(Item::Events(r))) => got.push(r.revision),
                Ok(Some(_)) => {}
                other => panic!("after {got:?} (acked up to {last}): {other:?}"),
            }
        }
        assert!(
            got.windows(2).all(|w| w[0] < w[1]),
            "out of order or repeated: {got:?}"
        );
        let missing: Vec<i64> = acked.iter().copied().filter(|r| !got.contains(r)).collect();
        assert!(
            missing.is_empty(),
            "acknowledged writes never seen: {missing:?}"
        );
        // Only writes whose outcome was unknown may add to what was acked.
        assert!(
            got.len() <= acked.len() + failed,
            "{} seen, {} acked, {failed} unknown",
            got.len(),
            acked.len()
        );
    }

    /// Subscriber ids are per shared watch: a client of a shared watch
    /// that ended, leaving after a new one was made for its key, must not
    /// take a subscriber of the new one with it.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn leaving_an_ended_shared_watch_leaves_its_successor_alone() {
        let test_cell = TestCell::start().await;
        let coalescer = Coalescer::new(test_cell.cell.clone(), 64, 64, 16 << 20);
        let (_, old) = coalescer.join(key("k"), 0).await.expect("join");
        coalescer.remove(&key("k")); // as its pump does when it ends
        let (new, current) = coalescer.join(key("k"), 0).await.expect("join");
        let (_, mut new) = joined(new);
        coalescer.leave(&old.expect("ticket"));
        assert_eq!(coalescer.upstream_watches(), 1, "the new one stays");
        let r = test_cell.put("k").await;
        assert_eq!(revisions(&mut new, 1).await, vec![r]);
        coalescer.leave(&current.expect("ticket"));
        assert_eq!(coalescer.upstream_watches(), 0);
        test_cell.handle.shutdown().await.expect("shutdown");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn identical_watches_share_one_upstream_watch_which_ends_with_the_last() {
        let test_cell = TestCell::start().await;
        let cell = test_cell.cell.clone();
        let coalescer = Coalescer::new(cell.clone(), 64, 64, 16 << 20);
        let (one, t1) = coalescer.join(key("k"), 0).await.expect("join");
        let (two, t2) = coalescer.join(key("k"), 0).await.expect("join");
        let (other, t3) = coalescer.join(key("other"), 0).await.expect("join");
        assert_eq!(coalescer.upstream_watches(), 2, "one per distinct key");
        let (_, mut one) = joined(one);
        let (_, mut two) = joined(two);
        let (_, mut other) = joined(other);
        let r1 = test_cell.put("k").await;
        let r2 = test_cell.put("other").await;
        let r3 = test_cell.put("k").await;
        assert_eq!(revisions(&mut one, 2).await, vec![r1, r3]);
        assert_eq!(revisions(&mut two, 2).await, vec![r1, r3]);
        assert_eq!(revisions(&mut other, 1).await, vec![r2]);
        // A late joiner from r1 is served from the shared watch's history.
        let (late, t4) = coalescer.join(key("k"), r1).await.expect("join");
        let (backlog, _late) = joined(late);
        assert_eq!(backlog, vec![r1, r3]);
        for ticket in [t1, t2, t4].into_iter().flatten() {
            coalescer.leave(&ticket);
        }
        assert_eq!(
            coalescer.upstream_watches(),
            1,
            "the last out of k removed it"
        );
        coalescer.leave(&t3.expect("ticket"));
        assert_eq!(coalescer.upstream_watches(), 0);
        test_cell.handle.shutdown().await.expect("shutdown");
    }
}
