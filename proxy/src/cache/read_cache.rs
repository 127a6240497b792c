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
//!   grants through the proxy from ~920/s to ~330/s). So a range nobody has read
//!   for [`IDLE_BEFORE_DROPPED`] is dropped ([`SWEEP_EVERY`]), and a full
//!   cache takes a new range only in place of such a range; when clients
//!   read more ranges than it holds
//!   (random keys over a large keyspace), it keeps the ones it has and
//!   forwards the rest rather than trading one range for another on every
//!   miss. The least recently used range is found among
//!   [`EVICTION_SAMPLES`] drawn at random (as Redis does), so a miss costs
//!   the same with 10 ranges cached or 16 384.
//! - Filling: one serializable read of the whole range at revision R,
//!   then a subscription to the coalescer from R + 1. The coalescer hands
//!   over every revision after R once, in order, whatever member serves
//!   it, so the cached range is the range as of its revision.
//! - Progress moves the revision on while nothing changes:
//!   [`ReadCache::keep_fresh`] asks the members for progress so a quiet
//!   range stays current. A range reads its shared watch's progress mark
//!   when it is read, not an item per progress round (`Progress::Mark`):
//!   the mark speaks for the range once it has applied every revision its
//!   subscription was queued before the mark. A range not confirmed for [`STALE_AFTER`]
//!   (its upstream watch is lost) answers nothing until the watch confirms
//!   it again; a range whose watch ends is dropped and filled afresh on a
//!   later miss.
//! - Confirmed is not enough: a member cut off from its peers keeps
//!   confirming its own frozen revision (proxy review P2). So
//!   [`ReadCache::keep_fresh`] also asks the leader for its revision every
//!   [`PROGRESS_EVERY`], and a range answers only at or above
//!   [`ReadCache::vouched`]: the leader's revision as sampled at least
//!   [`VOUCH_LAG`] ago. A write acknowledged at time t is then reflected
//!   in every answer from about t + [`PROGRESS_EVERY`] + [`VOUCH_LAG`] on,
//!   whichever member's watch keeps the range; a range on a healthy
//!   member is confirmed past a sample within a progress round, well
//!   inside the lag.
//! - An answer is only given at or above the client's floor; otherwise
//!   the read goes to the cell (the caller's part, see `cache::serve`).

use super::cached_range::CachedRange;
use crate::metrics_catalog::{CACHE_BYTES, CACHE_EVICTIONS, CACHE_NOT_ADMITTED, CACHE_RANGES};
use crate::upstream::{Cell, Kind, Route};
use crate::watch::coalescer::{Coalescer, MarkReader, Subscription};
use crate::watch::shared_watch::Progress;
use crate::watch::{Item, WatchKey};
use indexmap::IndexMap;
use latchkey_shared::etcd_methods::kv::RANGE;
use latchkey_shared::etcd_methods::maintenance::STATUS;
use latchkey_shared::etcdpb::{PbRangeRequest, PbRangeResponse, PbStatusRequest, PbStatusResponse};
use latchkey_shared::KeyRange;
use std::collections::{HashSet, VecDeque};
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

/// How old a sample of the leader's revision is before every answer must
/// reflect it ([`ReadCache::vouched`]).
pub const VOUCH_LAG: Duration = Duration::from_millis(400);

/// Most ranges cached at once. Each holds a watch on a member and costs an
/// item per progress round, cached or idle.
const MAX_RANGES: usize = 16_384;

/// Ranges remembered as missed once; past this the memory is cleared.
const MAX_SEEN: usize = MAX_RANGES;

/// A range unread for this long is dropped; a full cache replaces only
/// such a range.
const IDLE_BEFORE_DROPPED: Duration = Duration::from_secs(10);

/// How often ranges unread for [`IDLE_BEFORE_DROPPED`] are looked for.
const SWEEP_EVERY: Duration = Duration::from_secs(1);

/// Ranges drawn to find the least recently used one.
const EVICTION_SAMPLES: usize = 8;

struct Filled {
    data: CachedRange,
    /// When its subscription last gave it an item.
    confirmed: Instant,
    /// Revisions of its subscription applied.
    applied: u64,
    /// Its shared watch's progress (none while its subscription catches
    /// up: progress then comes as items).
    marks: Option<MarkReader>,
}

impl Filled {
    /// The revision the range is known to reflect, and when that was last
    /// confirmed: its own, or its shared watch's progress mark once every
    /// revision queued for it before the mark has been applied.
    fn known(&self) -> (i64, Instant) {
        let own = (self.data.revision(), self.confirmed);
        match self.marks.as_ref().and_then(MarkReader::read) {
            Some(mark) if mark.queued == self.applied => {
                (own.0.max(mark.revision), own.1.max(mark.at))
            }
            _ => own,
        }
    }
}

/// One cached range: filling (no data yet) or filled.
struct Slot {
    range: KeyRange,
    state: Mutex<Option<Filled>>,
    /// When it was last read: milliseconds since the cache's epoch.
    last_used: AtomicU64,
    /// Ends the range's feed (eviction).
    stop: CancellationToken,
}

impl Slot {
    fn state(&self) -> MutexGuard<'_, Option<Filled>> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

#[derive(Default)]
struct Slots {
    /// Indexed as well as keyed: eviction draws ranges at random.
    by_range: IndexMap<KeyRange, Arc<Slot>>,
    /// Ranges missed once.
    seen: HashSet<KeyRange>,
}

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

/// The leader's revision as sampled over the last [`VOUCH_LAG`], and the
/// newest sample older than that.
#[derive(Default)]
struct LeaderSamples(VecDeque<(Instant, i64)>);

impl LeaderSamples {
    fn add(&mut self, at: Instant, revision: i64) {
        self.0.push_back((at, revision));
        // Keep one sample older than the lag: the one that counts.
        while self.0.len() > 1 && at.duration_since(self.0[1].0) >= VOUCH_LAG {
            self.0.pop_front();
        }
    }

    /// The revision of the newest sample taken at least [`VOUCH_LAG`]
    /// before `now` (0: none yet).
    fn vouched(&self, now: Instant) -> i64 {
        self.0
            .iter()
            .rev()
            .find(|(at, _)| now.duration_since(*at) >= VOUCH_LAG)
            .map_or(0, |(_, revision)| *revision)
    }
}

/// Whether one more range fits among `slots`, at most `max`.
enum Room {
    Free,
    /// In place of this range, unread for [`IDLE_BEFORE_DROPPED`].
    Replacing(Arc<Slot>),
    /// Every range drawn was read more recently.
    Full,
}

fn room(slots: &Slots, now_ms: u64, max: usize) -> Room {
    if slots.by_range.len() < max {
        return Room::Free;
    }
    match least_recently_used(slots) {
        Some(victim) if is_idle(&victim, now_ms) => Room::Replacing(victim),
        _ => Room::Full,
    }
}

/// Whether `slot` has gone unread for [`IDLE_BEFORE_DROPPED`] at `now_ms`.
fn is_idle(slot: &Slot, now_ms: u64) -> bool {
    now_ms
        .checked_sub(IDLE_BEFORE_DROPPED.as_millis() as u64)
        .is_some_and(|since| slot.last_used.load(Ordering::Relaxed) <= since)
}

/// The ranges unread for [`IDLE_BEFORE_DROPPED`] at `now_ms`.
fn idle(slots: &Slots, now_ms: u64) -> Vec<Arc<Slot>> {
    slots
        .by_range
        .values()
        .filter(|slot| is_idle(slot, now_ms))
        .cloned()
        .collect()
}

/// The least recently read of [`EVICTION_SAMPLES`] ranges drawn at random
/// (all of them when there are no more).
fn least_recently_used(slots: &Slots) -> Option<Arc<Slot>> {
    let n = slots.by_range.len();
    let draw = |k: usize| {
        if n <= EVICTION_SAMPLES {
            k
        } else {
            fastrand::usize(..n)
        }
    };
    (0..n.min(EVICTION_SAMPLES))
        .map(draw)
        .filter_map(|i| slots.by_range.get_index(i).map(|(_, slot)| slot))
        .min_by_key(|slot| slot.last_used.load(Ordering::Relaxed))
        .cloned()
}

/// Whether the cache may answer `req`: a serializable read of the
/// current revision.
fn cacheable(req: &PbRangeRequest) -> bool {
    req.serializable && req.revision == 0 && !req.key.is_empty()
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
    /// sampled [`VOUCH_LAG`] ago (0 before the first sample). An answer
    /// below it comes from a watch or a member that has fallen behind the
    /// cell, or been cut off from it.
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

    /// A cacheable read missed: cache its range if it is read often enough
    /// or watched anyway.
    pub fn missed(self: &Arc<Self>, req: &PbRangeRequest) {
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
        tokio::spawn(self.clone().feed(slot));
    }

    /// Fills `slot` and keeps it current until its watch ends or it is
    /// evicted.
    async fn feed(self: Arc<Self>, slot: Arc<Slot>) {
        if let Some(mut items) = self.fill(&slot).await {
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

    /// Reads the range whole and subscribes to its changes after that
    /// read; `None` when either fails or the range is too large to cache.
    async fn fill(&self, slot: &Slot) -> Option<Subscription> {
        let range = &slot.range;
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
        let data = CachedRange::new(resp.kvs, revision);
        if data.bytes() > self.budget / 4 {
            tracing::debug!(bytes = data.bytes(), "range too large to cache");
            return None;
        }
        let key = WatchKey {
            range: range.clone(),
            filters: Vec::new(),
            prev_kv: false,
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

    /// Drops every range unread for [`IDLE_BEFORE_DROPPED`].
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

    /// Slots of single keys `k0`, `k1`, ..., each last read at the given
    /// millisecond.
    fn slots_read_at(times: &[u64]) -> Slots {
        let mut slots = Slots::default();
        for (i, at) in times.iter().enumerate() {
            let range = KeyRange::new(format!("k{i}").into_bytes(), Vec::new());
            let slot = Arc::new(Slot {
                range: range.clone(),
                state: Mutex::new(None),
                last_used: AtomicU64::new(*at),
                stop: CancellationToken::new(),
            });
            slots.by_range.insert(range, slot);
        }
        slots
    }

    fn key_of(room: Room) -> Option<Vec<u8>> {
        match room {
            Room::Replacing(victim) => Some(victim.range.start.clone()),
            Room::Free | Room::Full => None,
        }
    }

    /// A full cache trades a range only for one nobody reads any more:
    /// when every range is in use (random reads over more keys than it
    /// holds), a newcomer is forwarded instead of evicting a range that
    /// would be missed and filled again a moment later.
    #[test]
    fn a_full_cache_replaces_only_a_range_left_unread() {
        let idle = IDLE_BEFORE_DROPPED.as_millis() as u64;
        let now = 100_000;
        let busy = slots_read_at(&[now - 10, now - idle + 1, now - 500, now]);
        assert!(matches!(room(&busy, now, 5), Room::Free));
        assert!(
            matches!(room(&busy, now, 4), Room::Full),
            "every range was read within {IDLE_BEFORE_DROPPED:?}: nothing to replace"
        );
        let one_idle = slots_read_at(&[now - 10, now - idle - 1, now - idle + 1, now]);
        assert_eq!(key_of(room(&one_idle, now, 4)), Some(b"k1".to_vec()));
    }

    /// A range nobody read for 10 s costs a member watch and a share of
    /// every progress round and answers nothing: the sweep drops exactly
    /// those, however full the cache.
    #[test]
    fn the_sweep_drops_only_ranges_unread_for_ten_seconds() {
        let idle = IDLE_BEFORE_DROPPED.as_millis() as u64;
        let now = 100_000;
        let slots = slots_read_at(&[now - idle - 1, now - 10, now - idle, now - idle + 1, 0]);
        let mut dropped: Vec<Vec<u8>> = super::idle(&slots, now)
            .iter()
            .map(|slot| slot.range.start.clone())
            .collect();
        dropped.sort();
        assert_eq!(
            dropped,
            vec![b"k0".to_vec(), b"k2".to_vec(), b"k4".to_vec()]
        );
        let young = slots_read_at(&[0, 5]);
        assert!(
            super::idle(&young, idle - 1).is_empty(),
            "nothing is idle before the cache is 10 s old"
        );
    }

    /// Over many ranges the victim is drawn, not searched for, and is the
    /// oldest of its draw: with nine ranges in ten idle, an idle one.
    #[test]
    fn the_victim_is_the_least_recently_read_of_its_draw() {
        fastrand::seed(29);
        let now = 1_000_000;
        let times: Vec<u64> = (0..10_000)
            .map(|i| if i % 10 == 0 { now } else { i })
            .collect();
        let slots = slots_read_at(&times);
        for _ in 0..100 {
            let victim = least_recently_used(&slots).expect("a victim");
            assert!(
                victim.last_used.load(Ordering::Relaxed) < now,
                "the victim was read at {now}, with 9 000 idle ranges to draw from"
            );
        }
        let few = slots_read_at(&[30, 10, 20]);
        assert_eq!(
            least_recently_used(&few).map(|v| v.range.start.clone()),
            Some(b"k1".to_vec()),
            "up to {EVICTION_SAMPLES} ranges, every one is looked at"
        );
    }

    #[test]
    fn an_answer_must_reach_the_leaders_revision_once_its_sample_is_a_lag_old() {
        let t0 = Instant::now();
        let mut samples = LeaderSamples::default();
        assert_eq!(samples.vouched(t0), 0, "nothing sampled yet");
        samples.add(t0, 10);
        samples.add(t0 + PROGRESS_EVERY, 12);
        assert_eq!(
            samples.vouched(t0 + VOUCH_LAG / 2),
            0,
            "no sample is a lag old"
        );
        assert_eq!(samples.vouched(t0 + VOUCH_LAG), 10);
        assert_eq!(samples.vouched(t0 + PROGRESS_EVERY + VOUCH_LAG), 12);
        // Samples older than the newest one that counts are let go.
        for k in 2..20 {
            samples.add(t0 + PROGRESS_EVERY * k, 10 + 2 * k as i64);
        }
        let now = t0 + PROGRESS_EVERY * 19;
        assert_eq!(samples.vouched(now), 10 + 2 * 17);
        assert!(
            samples.0.len() <= (VOUCH_LAG.as_millis() / PROGRESS_EVERY.as_millis()) as usize + 1
        );
    }
}
