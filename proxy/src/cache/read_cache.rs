//! [`ReadCache`]: serializable reads answered from ranges the proxy keeps
//! current with its own watches (DESIGN section 4), bounded by
//! `--cache-bytes` with least-recently-used eviction.
//!
//! - A range is cached after its second serializable miss, or its first
//!   when clients already watch it (its shared watch exists anyway).
//! - Caching must pay: a range costs a read and a watch to fill and a
//!   cancel to evict, more than forwarding a read, and while it is cached
//!   a member watch and an answer in every progress round (head-of-line
//!   for every other watch of the proxy: 10 000 idle ranges cut lock
//!   grants through the proxy from ~920/s to ~330/s). So a range nobody
//!   has read for 10 s ([`super::slots::IDLE_BEFORE_DROPPED`]) is dropped
//!   ([`SWEEP_EVERY`]), and a full cache takes a new range only in place
//!   of such a range; when clients read more ranges than it holds (random
//!   keys over a large keyspace), it keeps the ones it has and forwards
//!   the rest rather than trading one range for another on every miss.
//!   The least recently used range is found among a few drawn at random
//!   (as Redis does, [`super::slots::least_recently_used`]), so a miss
//!   costs the same with 10 ranges cached or 16 384.
//! - Filling: the whole range at revision R, then a subscription to the
//!   coalescer from R + 1. The miss that admits the range was answered
//!   by a member already: when that answer holds every live key of the
//!   range (no limit cut it, no filter, not keys or a count only) it is
//!   the range at R and fills it; otherwise one serializable read of the
//!   whole range does. The coalescer hands
//!   over every revision after R once, in order, whatever member serves
//!   it, so the cached range is the range as of its revision.
//! - Progress moves the revision on while nothing changes:
//!   [`ReadCache::keep_fresh`] asks the members for progress so a quiet
//!   range stays current. A range reads its shared watch's progress mark
//!   when it is read, not an item per progress round (`Progress::Mark`):
//!   the mark speaks for the range once it has applied every revision its
//!   subscription was queued before the mark. A range not confirmed for
//!   [`STALE_AFTER`] (its upstream watch is lost) answers nothing until the
//!   watch confirms it again; a range whose watch ends is dropped and
//!   filled afresh on a later miss.
//! - Confirmed is not enough: a member cut off from its peers keeps
//!   confirming its own frozen revision (proxy review P2). So
//!   [`ReadCache::keep_fresh`] also asks the leader for its revision every
//!   [`PROGRESS_EVERY`], and a range answers only at or above
//!   [`ReadCache::vouched`]: the leader's revision as sampled at least
//!   [`super::leader_samples::VOUCH_LAG`] ago. A write acknowledged at
//!   time t is then reflected in every answer from about t + 200 ms + the
//!   lag on, whichever member's watch keeps the range; a range on a healthy
//!   member is confirmed past a sample within a progress round, well
//!   inside the lag.
//! - An answer is only given at or above the client's floor; otherwise
//!   the read goes to the cell (the caller's part, see `cache::serve`).

use super::cached_range::CachedRange;
use super::leader_samples::LeaderSamples;
use super::slots::{
    idle, least_recently_used, room, Filled, Room, Slot, Slots, MAX_RANGES, MAX_SEEN,
};
use crate::metrics_catalog::{CACHE_BYTES, CACHE_EVICTIONS, CACHE_NOT_ADMITTED, CACHE_RANGES};
use crate::upstream::{Cell, Kind, Route};
use crate::watch::coalescer::{Coalescer, Subscription};
use crate::watch::shared_watch::Progress;
use crate::watch::{Item, WatchKey};
use latchkey_shared::etcd_methods::kv::RANGE;
use latchkey_shared::etcd_methods::maintenance::STATUS;
use latchkey_shared::etcdpb::{PbRangeRequest, PbRangeResponse, PbStatusRequest, PbStatusResponse};
use latchkey_shared::KeyRange;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// A cached range not confirmed by its watch for this long answers
/// nothing.
pub const STALE_AFTER: Duration = Duration::from_secs(1);

/// How often the members are asked how far every watch has come, and the
/// leader for its revision.
pub const PROGRESS_EVERY: Duration = Duration::from_millis(200);

/// How often progress is asked for while the leader's revision does not
/// move: often enough that a quiet range on a healthy member stays
/// confirmed within [`STALE_AFTER`].
pub const CONFIRM_EVERY: Duration = Duration::from_millis(400);

/// How often ranges left unread ([`super::slots::idle`]) are looked for.
const SWEEP_EVERY: Duration = Duration::from_secs(1);

pub struct ReadCache {
    coalescer: Arc<Coalescer>,
    cell: Cell,
    /// `--cache-bytes`; 0 turns the cache off.
    budget: usize,
    slots: Mutex<Slots>,
    bytes: AtomicI64,
    /// What `Slot::last_used` counts from.
    epoch: Instant,
    /// The leader's revision, sampled.
    samples: Mutex<LeaderSamples>,
}

/// Whether the cache may answer `req`: a serializable read of the
/// current revision.
fn cacheable(req: &PbRangeRequest) -> bool {
    req.serializable && req.revision == 0 && !req.key.is_empty()
}

/// `answer`, the cell's answer to `req` (a cacheable read), as the whole
/// range at the answer's revision, when it holds every live key of the
/// range: no revision filter, not keys or a count only, and nothing left
/// out by a limit.
fn whole_range(req: &PbRangeRequest, answer: &PbRangeResponse) -> Option<CachedRange> {
    let filtered = req.min_mod_revision != 0
        || req.max_mod_revision != 0
        || req.min_create_revision != 0
        || req.max_create_revision != 0;
    let whole = !filtered
        && !req.keys_only
        && !req.count_only
        && !answer.more
        && answer.count == answer.kvs.len() as i64;
    let revision = answer.header.as_ref()?.revision;
    (whole && revision > 0).then(|| CachedRange::new(answer.kvs.clone(), revision))
}

impl ReadCache {
    pub fn new(coalescer: Arc<Coalescer>, cell: Cell, budget: usize) -> Arc<ReadCache> {
        Arc::new(ReadCache {
            coalescer,
            cell,
            budget,
            slots: Mutex::new(Slots::default()),
            bytes: AtomicI64::new(0),
            epoch: Instant::now(),
            samples: Mutex::new(LeaderSamples::default()),
        })
    }

    fn slots(&self) -> MutexGuard<'_, Slots> {
        self.slots.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Now, as `Slot::last_used` counts.
    fn now_ms(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64
    }

    /// Bytes the cached ranges hold.
    pub fn bytes(&self) -> i64 {
        self.bytes.load(Ordering::Relaxed)
    }

    /// Ranges cached or being filled.
    pub fn ranges(&self) -> usize {
        self.slots().by_range.len()
    }

    /// The revision every serializable answer must reach: the leader's as
    /// sampled [`super::leader_samples::VOUCH_LAG`] ago (0 before the
    /// first sample). An answer below it comes from a watch or a member
    /// that has fallen behind the cell, or been cut off from it.
    pub fn vouched(&self) -> i64 {
        self.samples
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .vouched(Instant::now())
    }

    /// The answer to `req` from the cache, at a revision of at least
    /// `floor` and [`vouched`](Self::vouched), if the cache holds its
    /// range confirmed and current enough.
    pub fn answer(&self, req: &PbRangeRequest, floor: i64) -> Option<PbRangeResponse> {
        if self.budget == 0 || !cacheable(req) {
            return None;
        }
        let range = KeyRange::new(req.key.clone(), req.range_end.clone());
        let slot = self.slots().by_range.get(&range).cloned()?;
        slot.last_used.store(self.now_ms(), Ordering::Relaxed);
        let state = slot.state();
        let filled = state.as_ref()?;
        let (revision, confirmed) = filled.known();
        if confirmed.elapsed() > STALE_AFTER || revision < floor.max(self.vouched()) {
            return None;
        }
        // A request the cell would refuse (a bad sort) goes to the cell.
        let mut resp = filled.data.answer(req).ok()?;
        drop(state);
        let mut header = self.cell.last_header();
        header.revision = revision;
        resp.header = Some(header);
        Some(resp)
    }

    /// A cacheable read missed and was answered `answer` by the cell:
    /// cache its range if it is read often enough or watched anyway.
    pub fn missed(self: &Arc<Self>, req: &PbRangeRequest, answer: &PbRangeResponse) {
        if self.budget == 0 || !cacheable(req) {
            return;
        }
        let range = KeyRange::new(req.key.clone(), req.range_end.clone());
        let slot = {
            let mut slots = self.slots();
            if slots.by_range.contains_key(&range) {
                return;
            }
            let watched = [false, true].into_iter().any(|prev_kv| {
                self.coalescer.is_watched(&WatchKey {
                    range: range.clone(),
                    filters: Vec::new(),
                    prev_kv,
                    from_leader: false,
                })
            });
            if !watched && !slots.seen.remove(&range) {
                if slots.seen.len() >= MAX_SEEN {
                    slots.seen.clear();
                }
                slots.seen.insert(range);
                return;
            }
            let now = self.now_ms();
            match room(&slots, now, MAX_RANGES) {
                Room::Free => {}
                Room::Replacing(victim) => self.evict(&mut slots, &victim),
                Room::Full => {
                    metrics::counter!(CACHE_NOT_ADMITTED.name).increment(1);
                    return;
                }
            }
            let slot = Arc::new(Slot {
                range: range.clone(),
                state: Mutex::new(None),
                last_used: AtomicU64::new(now),
                stop: CancellationToken::new(),
            });
            slots.by_range.insert(range, slot.clone());
            slot
        };
        metrics::gauge!(CACHE_RANGES.name).set(self.ranges() as f64);
        tokio::spawn(self.clone().feed(slot, whole_range(req, answer)));
    }

    /// Fills `slot` (from `seed` if given) and keeps it current until its
    /// watch ends or it is evicted.
    async fn feed(self: Arc<Self>, slot: Arc<Slot>, seed: Option<CachedRange>) {
        if let Some(mut items) = self.fill(&slot, seed).await {
            loop {
                let item = tokio::select! {
                    _ = slot.stop.cancelled() => break,
                    item = items.recv() => item,
                };
                let grew = {
                    let mut state = slot.state();
                    let Some(filled) = state.as_mut() else { break };
                    let before = filled.data.bytes() as i64;
                    match item {
                        Some(Item::Events(revision)) => {
                            filled.data.apply(&revision);
                            filled.applied += 1;
                        }
                        Some(Item::Progress(revision)) => filled.data.advance(revision),
                        // Cancelled or dropped: the range can no longer be
                        // kept current.
                        Some(Item::Cancelled(_)) | None => break,
                    }
                    filled.confirmed = Instant::now();
                    filled.data.bytes() as i64 - before
                };
                self.add_bytes(grew);
                if grew > 0 {
                    self.evict_over_budget();
                }
            }
        }
        self.remove(&slot);
    }

    /// Takes `seed` or reads the range whole, then subscribes to its
    /// changes after that revision; `None` when either fails or the range
    /// is too large to cache.
    async fn fill(&self, slot: &Slot, seed: Option<CachedRange>) -> Option<Subscription> {
        let range = &slot.range;
        let data = match seed {
            Some(data) => data,
            None => self.read_whole(range).await?,
        };
        let revision = data.revision();
        if data.bytes() > self.budget / 4 {
            tracing::debug!(bytes = data.bytes(), "range too large to cache");
            return None;
        }
        let key = WatchKey {
            range: range.clone(),
            filters: Vec::new(),
            prev_kv: false,
            from_leader: false,
        };
        let items = self
            .coalescer
            .subscribe_with(key, revision + 1, Progress::Mark)
            .await
            .ok()?;
        self.add_bytes(data.bytes() as i64);
        *slot.state() = Some(Filled {
            data,
            confirmed: Instant::now(),
            applied: 0,
            marks: items.mark_reader(),
        });
        self.evict_over_budget();
        Some(items)
    }

    /// Every live key of `range`, serializably, as one member has it.
    async fn read_whole(&self, range: &KeyRange) -> Option<CachedRange> {
        let read = PbRangeRequest {
            key: range.start.clone(),
            range_end: range.end.clone(),
            serializable: true,
            ..Default::default()
        };
        let resp: PbRangeResponse = self
            .cell
            .call(Route::Any, Kind::Read, RANGE, read)
            .await
            .ok()?;
        let revision = resp.header.map_or(0, |h| h.revision);
        Some(CachedRange::new(resp.kvs, revision))
    }

    fn add_bytes(&self, delta: i64) {
        let now = self.bytes.fetch_add(delta, Ordering::Relaxed) + delta;
        metrics::gauge!(CACHE_BYTES.name).set(now as f64);
    }

    /// Drops `slot` from the cache (if still there) and its bytes.
    fn remove(&self, slot: &Arc<Slot>) {
        {
            let mut slots = self.slots();
            if slots
                .by_range
                .get(&slot.range)
                .is_some_and(|s| Arc::ptr_eq(s, slot))
            {
                slots.by_range.swap_remove(&slot.range);
            }
        }
        self.discard(slot);
        metrics::gauge!(CACHE_RANGES.name).set(self.ranges() as f64);
    }

    /// Ends `slot`'s feed and gives back its bytes (once).
    fn discard(&self, slot: &Slot) {
        slot.stop.cancel();
        let freed = slot.state().take().map_or(0, |f| f.data.bytes() as i64);
        self.add_bytes(-freed);
    }

    /// Drops `slot`, a range in `slots`, from the cache.
    fn evict(&self, slots: &mut Slots, slot: &Arc<Slot>) {
        slots.by_range.swap_remove(&slot.range);
        self.discard(slot);
        metrics::counter!(CACHE_EVICTIONS.name).increment(1);
    }

    /// Drops every range unread for 10 s ([`super::slots::idle`]).
    fn drop_idle(&self) {
        let mut slots = self.slots();
        let idle = idle(&slots, self.now_ms());
        for slot in &idle {
            self.evict(&mut slots, slot);
        }
        drop(slots);
        if !idle.is_empty() {
            metrics::gauge!(CACHE_RANGES.name).set(self.ranges() as f64);
        }
    }

    /// Evicts least recently used ranges until the cache fits its budget.
    fn evict_over_budget(&self) {
        while self.bytes() > self.budget as i64 {
            let mut slots = self.slots();
            let Some(victim) = least_recently_used(&slots) else {
                return;
            };
            self.evict(&mut slots, &victim);
        }
    }

    /// Every [`PROGRESS_EVERY`]: drops idle ranges (every [`SWEEP_EVERY`]),
    /// samples the leader's revision, then asks
    /// the members for progress while ranges are cached, so quiet ones
    /// stay confirmed past the sample; ends with `stop`. While the leader's
    /// revision stands still, the ranges are already past it and progress
    /// only renews their confirmation: asked for every [`CONFIRM_EVERY`]
    /// then. (A range reads its shared watch's progress mark when it is
    /// read; each progress still costs one answer per upstream watch.)
    pub async fn keep_fresh(self: Arc<Self>, stop: CancellationToken) {
        let mut tick = tokio::time::interval(PROGRESS_EVERY);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        // When progress was last asked for, and the leader's revision then.
        let mut asked: Option<(Instant, i64)> = None;
        let mut swept = Instant::now();
        loop {
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tick.tick() => {}
            }
            if swept.elapsed() >= SWEEP_EVERY {
                self.drop_idle();
                swept = Instant::now();
            }
            let leader = self.sample_leader().await;
            if self.ranges() == 0 {
                continue;
            }
            let due = match (asked, leader) {
                (Some((at, then)), Some(now)) => now != then || at.elapsed() >= CONFIRM_EVERY,
                _ => true,
            };
            if due {
                self.coalescer.request_progress().await;
                asked = leader.map(|revision| (Instant::now(), revision));
            }
        }
    }

    /// Asks the leader for its revision (one try: the next tick tries
    /// again) and keeps it as a sample taken when it was asked; the
    /// revision, if the leader answered.
    async fn sample_leader(&self) -> Option<i64> {
        let asked = Instant::now();
        let status = tokio::time::timeout(
            PROGRESS_EVERY,
            self.cell.call::<_, PbStatusResponse>(
                Route::Leader,
                Kind::Read,
                STATUS,
                PbStatusRequest {},
            ),
        )
        .await;
        if let Ok(Ok(PbStatusResponse {
            header: Some(header),
            ..
        })) = status
        {
            self.samples
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .add(asked, header.revision);
            return Some(header.revision);
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use latchkey_shared::etcdpb::{PbKeyValue, PbResponseHeader};

    fn kv(key: &str) -> PbKeyValue {
        PbKeyValue {
            key: key.as_bytes().to_vec(),
            value: b"v".to_vec(),
            create_revision: 2,
            mod_revision: 2,
            version: 1,
            lease: 0,
        }
    }

    fn answer(kvs: Vec<PbKeyValue>, count: i64, more: bool) -> PbRangeResponse {
        PbRangeResponse {
            header: Some(PbResponseHeader {
                revision: 7,
                ..Default::default()
            }),
            kvs,
            count,
            more,
        }
    }

    #[test]
    fn only_an_answer_holding_every_live_key_fills_the_range() {
        let prefix = PbRangeRequest {
            key: b"a/".to_vec(),
            range_end: b"a0".to_vec(),
            serializable: true,
            ..Default::default()
        };
        let both = answer(vec![kv("a/1"), kv("a/2")], 2, false);
        let filled = whole_range(&prefix, &both).expect("the whole range");
        assert_eq!(filled.revision(), 7);
        let all = PbRangeRequest {
            key: b"a/".to_vec(),
            range_end: b"a0".to_vec(),
            ..Default::default()
        };
        assert_eq!(filled.answer(&all).expect("answer").kvs, both.kvs);
        // An absent key is known absent at the answer's revision.
        let none = whole_range(&prefix, &answer(Vec::new(), 0, false)).expect("empty range");
        assert!(none.answer(&all).expect("answer").kvs.is_empty());

        // A limit that left keys out, and every filter or trimmed form.
        let limited = PbRangeRequest {
            limit: 1,
            ..prefix.clone()
        };
        assert!(whole_range(&limited, &answer(vec![kv("a/1")], 2, true)).is_none());
        let trimmed: [fn(&mut PbRangeRequest); 6] = [
            |r| r.keys_only = true,
            |r| r.count_only = true,
            |r| r.min_mod_revision = 2,
            |r| r.max_mod_revision = 9,
            |r| r.min_create_revision = 2,
            |r| r.max_create_revision = 9,
        ];
        for trim in trimmed {
            let mut req = prefix.clone();
            trim(&mut req);
            assert!(whole_range(&req, &both).is_none(), "{req:?}");
        }
        // A limit the range fits in left nothing out.
        assert!(whole_range(&limited, &answer(vec![kv("a/1")], 1, false)).is_some());
        // No header, no revision to fill at.
        let headless = PbRangeResponse {
            header: None,
            ..both.clone()
        };
        assert!(whole_range(&prefix, &headless).is_none());
    }
}
