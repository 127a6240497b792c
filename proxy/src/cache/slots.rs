//! Which ranges the read cache holds: each range's slot and state, and
//! the choices of admission and eviction ([`room`], [`idle`],
//! [`least_recently_used`]) that [`super::read_cache::ReadCache`] acts on.

use super::cached_range::CachedRange;
use crate::watch::coalescer::MarkReader;
use indexmap::IndexMap;
use latchkey_shared::KeyRange;
use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// Most ranges cached at once. Each holds a watch on a member and costs an
/// item per progress round, cached or idle.
pub(super) const MAX_RANGES: usize = 16_384;

/// Ranges remembered as missed once; past this the memory is cleared.
pub(super) const MAX_SEEN: usize = MAX_RANGES;

/// A range unread for this long is dropped; a full cache replaces only
/// such a range.
pub(super) const IDLE_BEFORE_DROPPED: Duration = Duration::from_secs(10);

/// Ranges drawn to find the least recently used one.
pub(super) const EVICTION_SAMPLES: usize = 8;

pub(super) struct Filled {
    pub(super) data: CachedRange,
    /// When its subscription last gave it an item.
    pub(super) confirmed: Instant,
    /// Revisions of its subscription applied.
    pub(super) applied: u64,
    /// Its shared watch's progress (none while its subscription catches
    /// up: progress then comes as items).
    pub(super) marks: Option<MarkReader>,
}

impl Filled {
    /// The revision the range is known to reflect, and when that was last
    /// confirmed: its own, or its shared watch's progress mark once every
    /// revision queued for it before the mark has been applied.
    pub(super) fn known(&self) -> (i64, Instant) {
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
pub(super) struct Slot {
    pub(super) range: KeyRange,
    pub(super) state: Mutex<Option<Filled>>,
    /// When it was last read: milliseconds since the cache's epoch.
    pub(super) last_used: AtomicU64,
    /// Ends the range's feed (eviction).
    pub(super) stop: CancellationToken,
}

impl Slot {
    pub(super) fn state(&self) -> MutexGuard<'_, Option<Filled>> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

#[derive(Default)]
pub(super) struct Slots {
    /// Indexed as well as keyed: eviction draws ranges at random.
    pub(super) by_range: IndexMap<KeyRange, Arc<Slot>>,
    /// Ranges missed once.
    pub(super) seen: HashSet<KeyRange>,
}

/// Whether one more range fits among `slots`, at most `max`.
pub(super) enum Room {
    Free,
    /// In place of this range, unread for [`IDLE_BEFORE_DROPPED`].
    Replacing(Arc<Slot>),
    /// Every range drawn was read more recently.
    Full,
}

pub(super) fn room(slots: &Slots, now_ms: u64, max: usize) -> Room {
    if slots.by_range.len() < max {
        return Room::Free;
    }
    match least_recently_used(slots) {
        Some(victim) if is_idle(&victim, now_ms) => Room::Replacing(victim),
        _ => Room::Full,
    }
}

/// Whether `slot` has gone unread for [`IDLE_BEFORE_DROPPED`] at `now_ms`.
pub(super) fn is_idle(slot: &Slot, now_ms: u64) -> bool {
    now_ms
        .checked_sub(IDLE_BEFORE_DROPPED.as_millis() as u64)
        .is_some_and(|since| slot.last_used.load(Ordering::Relaxed) <= since)
}

/// The ranges unread for [`IDLE_BEFORE_DROPPED`] at `now_ms`.
pub(super) fn idle(slots: &Slots, now_ms: u64) -> Vec<Arc<Slot>> {
    slots
        .by_range
        .values()
        .filter(|slot| is_idle(slot, now_ms))
        .cloned()
        .collect()
}

/// The least recently read of [`EVICTION_SAMPLES`] ranges drawn at random
/// (all of them when there are no more).
pub(super) fn least_recently_used(slots: &Slots) -> Option<Arc<Slot>> {
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
}
