//! [`WatchSet`]: the watches of one stream by id, with the watches of a
//! single key also indexed by that key, so a change is matched against the
//! watches of its own key and the stream's range watches, not against
//! every watch of the stream. (A proxy's read cache keeps thousands of
//! single-key watches on a stream: matched one by one, they halved the
//! cell's puts.)

use crate::mvcc::keyspace::{Event, EventKind, KeyRange};
use std::collections::{BTreeMap, BTreeSet, HashMap};

pub(super) struct Watch {
    pub(super) range: KeyRange,
    /// The first revision this watch may be sent. Live revisions move the
    /// stream's `seen`, not each watch: the watch is owed every revision
    /// from `max(next_rev, seen + 1)` on.
    pub(super) next_rev: i64,
    pub(super) no_put: bool,
    pub(super) no_delete: bool,
    pub(super) prev_kv: bool,
    pub(super) progress_notify: bool,
    pub(super) fragment: bool,
    /// Nothing sent since the last progress tick.
    pub(super) idle: bool,
}

impl Watch {
    pub(super) fn wants(&self, event: &Event) -> bool {
        event.revision() >= self.next_rev
            && self.range.contains(&event.kv.key)
            && match event.kind {
                EventKind::Put => !self.no_put,
                EventKind::Delete => !self.no_delete,
            }
    }

    /// The key it watches, when it watches exactly one.
    fn single_key(&self) -> Option<&[u8]> {
        self.range
            .end
            .is_empty()
            .then_some(self.range.start.as_slice())
    }
}

#[derive(Default)]
pub(super) struct WatchSet {
    by_id: BTreeMap<i64, Watch>,
    /// The single-key watches, by key.
    by_key: HashMap<Vec<u8>, Vec<i64>>,
    /// Every other watch: a range or a prefix.
    spans: BTreeSet<i64>,
}

impl WatchSet {
    pub(super) fn len(&self) -> usize {
        self.by_id.len()
    }

    pub(super) fn contains(&self, id: i64) -> bool {
        self.by_id.contains_key(&id)
    }

    pub(super) fn get(&self, id: i64) -> Option<&Watch> {
        self.by_id.get(&id)
    }

    pub(super) fn get_mut(&mut self, id: i64) -> Option<&mut Watch> {
        self.by_id.get_mut(&id)
    }

    pub(super) fn ids(&self) -> Vec<i64> {
        self.by_id.keys().copied().collect()
    }

    pub(super) fn values_mut(&mut self) -> impl Iterator<Item = &mut Watch> {
        self.by_id.values_mut()
    }

    pub(super) fn iter(&self) -> impl Iterator<Item = (i64, &Watch)> {
        self.by_id.iter().map(|(id, w)| (*id, w))
    }

    /// Adds `watch` as `id` (an id not in the set).
    pub(super) fn insert(&mut self, id: i64, watch: Watch) {
        match watch.single_key() {
            Some(key) => self.by_key.entry(key.to_vec()).or_default().push(id),
            None => {
                self.spans.insert(id);
            }
        }
        self.by_id.insert(id, watch);
    }

    pub(super) fn remove(&mut self, id: i64) -> Option<Watch> {
        let watch = self.by_id.remove(&id)?;
        match watch.single_key() {
            Some(key) => {
                if let Some(ids) = self.by_key.get_mut(key) {
                    ids.retain(|other| *other != id);
                    if ids.is_empty() {
                        self.by_key.remove(key);
                    }
                }
            }
            None => {
                self.spans.remove(&id);
            }
        }
        Some(watch)
    }

    /// The watches that want `event`, in no particular order.
    pub(super) fn wanting<'a>(&'a self, event: &'a Event) -> impl Iterator<Item = i64> + 'a {
        let own_key = self.by_key.get(event.kv.key.as_slice());
        own_key
            .into_iter()
            .flatten()
            .copied()
            .chain(self.spans.iter().copied())
            .filter(move |id| self.by_id.get(id).is_some_and(|w| w.wants(event)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mvcc::keyspace::KeyValue;

    fn watch(start: &str, end: &str, next_rev: i64) -> Watch {
        Watch {
            range: KeyRange::new(start.as_bytes().to_vec(), end.as_bytes().to_vec()),
            next_rev,
            no_put: false,
            no_delete: false,
            prev_kv: false,
            progress_notify: false,
            fragment: false,
            idle: true,
        }
    }

    fn put(key: &str, revision: i64) -> Event {
        Event {
            kind: EventKind::Put,
            kv: KeyValue {
                key: key.as_bytes().to_vec(),
                value: b"v".to_vec(),
                create_revision: revision,
                mod_revision: revision,
                version: 1,
                lease: 0,
            },
            prev: None,
        }
    }

    fn wanting(set: &WatchSet, event: &Event) -> Vec<i64> {
        let mut ids: Vec<i64> = set.wanting(event).collect();
        ids.sort();
        ids
    }

    #[test]
    fn a_change_reaches_the_watches_of_its_key_and_the_ranges_holding_it() {
        let mut set = WatchSet::default();
        set.insert(1, watch("a", "", 0));
        set.insert(2, watch("a", "", 0));
        set.insert(3, watch("b", "", 0));
        set.insert(4, watch("a", "c", 0)); // [a, c)
        set.insert(5, watch("c", "d", 0));
        set.insert(6, watch("a", "", 9)); // from a later revision
        let mut no_put = watch("a", "", 0);
        no_put.no_put = true;
        set.insert(7, no_put);
        assert_eq!(wanting(&set, &put("a", 5)), vec![1, 2, 4]);
        assert_eq!(wanting(&set, &put("a", 9)), vec![1, 2, 4, 6]);
        assert_eq!(wanting(&set, &put("b", 5)), vec![3, 4]);
        assert_eq!(wanting(&set, &put("z", 5)), Vec::<i64>::new());

        assert!(set.remove(1).is_some());
        assert!(set.remove(4).is_some());
        assert!(set.remove(4).is_none(), "removed once");
        assert_eq!(wanting(&set, &put("a", 9)), vec![2, 6]);
        assert_eq!(wanting(&set, &put("b", 5)), vec![3]);
        for id in [2, 3, 5, 6, 7] {
            set.remove(id);
        }
        assert_eq!(set.len(), 0);
        assert!(
            set.by_key.is_empty() && set.spans.is_empty(),
            "no index left"
        );
    }
}
