//! Reading a keyspace's history in revision order, a little at a time
//! (cell review P3).
//!
//! A watch that starts in the past, or a watch stream that fell behind,
//! is sent every change since some revision. Rebuilding all of them at
//! once cost memory in proportion to the history asked for (twice over:
//! every event also carried its previous value), so one
//! `watch --rev=1` over a large history could exhaust a member. A
//! [`History`] instead merges the keys' version lists lazily: it holds one
//! cursor per key of the range that has changes in the window, and hands
//! out events in batches of whole revisions, each batch about one response
//! in size.

use super::keyspace::{tombstone_kv, Event, EventKind, KeyRange, KeySpace};
use super::versions::Versions;
use std::cmp::{Ordering, Reverse};
use std::collections::BinaryHeap;
use std::sync::Arc;

/// The changes to the keys of a range with revisions in `from..=to`, in
/// the order they were made (revision, then sub-revision).
pub struct History {
    /// Each key's next change in the window, smallest first.
    next: BinaryHeap<Reverse<KeyCursor>>,
    to: i64,
    with_prev: bool,
}

/// One key's history and the position of its next change to hand out.
struct KeyCursor {
    at: (i64, u32),
    key: Arc<[u8]>,
    versions: Versions,
    index: usize,
}

impl PartialEq for KeyCursor {
    fn eq(&self, other: &Self) -> bool {
        self.at == other.at
    }
}

impl Eq for KeyCursor {}

impl PartialOrd for KeyCursor {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

/// Changes of one revision have distinct sub-revisions, so the order is
/// total over the cursors of one history.
impl Ord for KeyCursor {
    fn cmp(&self, other: &Self) -> Ordering {
        self.at.cmp(&other.at)
    }
}

impl History {
    /// The changes to `range` in `from..=to`. `from` must not be below the
    /// compact revision: older changes are gone. Each event carries the
    /// value before it only when `with_prev`.
    pub fn new(keys: &KeySpace, range: &KeyRange, from: i64, to: i64, with_prev: bool) -> Self {
        let mut next = BinaryHeap::new();
        if !range.is_empty() && from <= to {
            for (key, versions) in keys.versions_in(range) {
                // Versions are in revision order: the first one at or
                // after `from`.
                let index = versions
                    .binary_search_by(|v| match v.mod_revision < from {
                        true => Ordering::Less,
                        false => Ordering::Greater,
                    })
                    .unwrap_or_else(|i| i);
                if let Some(v) = versions.get(index).filter(|v| v.mod_revision <= to) {
                    next.push(Reverse(KeyCursor {
                        at: (v.mod_revision, v.sub),
                        key: key.clone(),
                        versions: versions.clone(),
                        index,
                    }));
                }
            }
        }
        History {
            next,
            to,
            with_prev,
        }
    }

    /// Whether every change has been handed out.
    pub fn is_done(&self) -> bool {
        self.next.is_empty()
    }

    /// The revision of the next change, if any.
    fn peek_revision(&self) -> Option<i64> {
        self.next.peek().map(|Reverse(c)| c.at.0)
    }

    /// The next changes: whole revisions, in order, until their size
    /// reaches `max_bytes` (at least one revision, however large).
    pub fn next_batch(&mut self, max_bytes: usize) -> Vec<Event> {
        let mut batch = Vec::new();
        let mut bytes = 0;
        while let Some(rev) = self.peek_revision() {
            let last = batch.last().map(Event::revision);
            if last.is_some_and(|last| last != rev) && bytes >= max_bytes {
                break;
            }
            let Some(event) = self.next() else { break };
            bytes += event.bytes();
            batch.push(event);
        }
        batch
    }
}

impl Iterator for History {
    type Item = Event;

    fn next(&mut self) -> Option<Event> {
        let Reverse(mut cursor) = self.next.pop()?;
        let v = &cursor.versions[cursor.index];
        let prev = match cursor.index {
            0 => None,
            i if self.with_prev => cursor.versions[i - 1]
                .view(&cursor.key)
                .map(|kv| kv.to_key_value()),
            _ => None,
        };
        let event = match v.view(&cursor.key) {
            Some(kv) => Event {
                kind: EventKind::Put,
                kv: kv.to_key_value(),
                prev,
            },
            None => Event {
                kind: EventKind::Delete,
                kv: tombstone_kv(&cursor.key, v.mod_revision),
                prev,
            },
        };
        cursor.index += 1;
        if let Some(v) = cursor.versions.get(cursor.index) {
            if v.mod_revision <= self.to {
                cursor.at = (v.mod_revision, v.sub);
                self.next.push(Reverse(cursor));
            }
        }
        Some(event)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn all() -> KeyRange {
        KeyRange::new(vec![0], vec![0])
    }

    /// A keyspace with puts, deletes and multi-key revisions over a few
    /// keys, from a fixed seed.
    fn busy_keyspace(revisions: i64) -> KeySpace {
        let mut ks = KeySpace::default();
        let mut seed = 7u64;
        let mut rand = move |n: u64| {
            seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (seed >> 33) % n
        };
        for _ in 0..revisions {
            let rev = ks.next_revision();
            for _ in 0..=rand(3) {
                let key = format!("k{}", rand(20)).into_bytes();
                if rand(5) == 0 {
                    ks.delete(rev, &key);
                } else {
                    ks.put(rev, &key, vec![b'v'; rand(300) as usize], 0);
                }
            }
        }
        ks
    }

    #[test]
    fn hands_out_every_change_of_the_window_once_in_revision_then_sub_revision_order() {
        let ks = busy_keyspace(200);
        let full: Vec<Event> = History::new(&ks, &all(), 1, ks.revision(), true).collect();
        assert!(full.len() > 200, "{} changes", full.len());
        let order: Vec<i64> = full.iter().map(Event::revision).collect();
        assert!(order.windows(2).all(|w| w[0] <= w[1]));
        // A window is exactly the part of the whole that falls in it.
        let window: Vec<Event> = History::new(&ks, &all(), 50, 120, true).collect();
        let expected: Vec<Event> = full
            .iter()
            .filter(|e| (50..=120).contains(&e.revision()))
            .cloned()
            .collect();
        assert_eq!(window, expected);
        // A range sees only its keys; an empty or inverted window nothing.
        let one = KeyRange::new(b"k3".to_vec(), Vec::new());
        let k3: Vec<Event> = History::new(&ks, &one, 1, ks.revision(), true).collect();
        assert!(!k3.is_empty() && k3.iter().all(|e| e.kv.key == b"k3"));
        assert_eq!(History::new(&ks, &all(), 30, 29, true).count(), 0);
    }

    #[test]
    fn the_previous_value_travels_only_when_asked_for() {
        let mut ks = KeySpace::default();
        for value in [b"a", b"b"] {
            let rev = ks.next_revision();
            ks.put(rev, b"k", value.to_vec(), 0);
        }
        let with: Vec<Event> = History::new(&ks, &all(), 3, 3, true).collect();
        assert_eq!(
            with[0].prev.as_ref().map(|p| p.value.clone()),
            Some(b"a".to_vec())
        );
        let without: Vec<Event> = History::new(&ks, &all(), 3, 3, false).collect();
        assert_eq!(without[0].prev, None);
        assert_eq!(without[0].kv, with[0].kv);
    }

    #[test]
    fn batches_keep_revisions_whole_and_stay_near_the_size_asked_for() {
        let ks = busy_keyspace(300);
        let whole: Vec<Event> = History::new(&ks, &all(), 1, ks.revision(), false).collect();
        let largest_revision = whole
            .chunk_by(|a, b| a.revision() == b.revision())
            .map(|r| r.iter().map(Event::bytes).sum::<usize>())
            .max()
            .unwrap_or(0);
        let mut history = History::new(&ks, &all(), 1, ks.revision(), false);
        let mut batches = Vec::new();
        while !history.is_done() {
            batches.push(history.next_batch(2_000));
        }
        assert!(batches.len() > 10, "{} batches", batches.len());
        for (i, batch) in batches.iter().enumerate() {
            let bytes: usize = batch.iter().map(Event::bytes).sum();
            // Under the size plus the revision that crossed it.
            assert!(bytes < 2_000 + largest_revision, "batch {i}: {bytes} bytes");
            if let Some(next) = batches.get(i + 1) {
                assert_ne!(
                    batch.last().map(Event::revision),
                    next.first().map(Event::revision)
                );
            }
        }
        assert_eq!(batches.concat(), whole);
    }
}
