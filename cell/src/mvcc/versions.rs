//! One key's versions, oldest first, each as small as it can be held.
//!
//! A version is one slot (its revision and a pointer) and one shared
//! record (everything else but the key, which the keyspace's map holds
//! once for all versions). The event and read types ([`KeyValue`], the
//! borrowed [`KvRef`]) are built from a slot, a record and the key when
//! asked for. Held as one `KeyValue` per version, a version cost three
//! allocations (the record, its key, its value); 48 bytes more of a 256-byte
//! value than now.
//!
//! [`Versions`] is a persistent sequence, like the map that holds it: a
//! clone is O(1) and shares the versions, and a write to a shared one
//! copies only what it must. Most keys hold a few versions, so a short
//! history is one shared slice of exactly its length, copied on write (at
//! most [`SHORT`] slots of 24 bytes). `imbl::Vector` alone held every key of
//! 3 to 64 versions in a chunk of 64 slots (1.5 KiB) however few it used:
//! with 10 000 keys of about 20 versions each after the comparison suite,
//! 17 MB for 5 MB of slots. A long history is an `imbl::Vector`, whose
//! chunks of 64 are shared between clones, so a key written a million times
//! costs the same per write as a key written twice.

use super::keyspace::KeyValue;
use imbl::Vector;
use std::cmp::Ordering;
use std::sync::Arc;

/// A change to a key at some revision: a new version, or a tombstone.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Version {
    pub mod_revision: i64,
    /// The place of this change among the changes of its revision (etcd's
    /// sub-revision): history replays a revision in this order, the order
    /// in which live watchers saw it (cell review M3).
    pub sub: u32,
    /// `None` is a deletion (tombstone). Shared, so that copying a key's
    /// history (what a persistent map does when a reader or the apply
    /// rollback point still holds the old one) copies pointers, not values.
    pub record: Option<Arc<Record>>,
}

/// What a live version holds besides its key and revision.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    pub create_revision: i64,
    pub version: i64,
    pub lease: i64,
    pub value: Box<[u8]>,
}

impl Version {
    /// What it counts for in the keyspace's quota: a fixed overhead per
    /// version stands for the revision, version and lease fields and the
    /// index entry, so a quota also bounds the number of versions, not only
    /// their payload.
    pub fn bytes(&self, key: &[u8]) -> u64 {
        const VERSION_OVERHEAD: u64 = 48;
        VERSION_OVERHEAD
            + self
                .record
                .as_ref()
                .map_or(0, |r| (key.len() + r.value.len()) as u64)
    }

    /// The key-value of a live version, borrowed.
    pub fn view<'a>(&'a self, key: &'a [u8]) -> Option<KvRef<'a>> {
        self.record.as_deref().map(|r| KvRef {
            key,
            value: &r.value,
            create_revision: r.create_revision,
            mod_revision: self.mod_revision,
            version: r.version,
            lease: r.lease,
        })
    }
}

/// A live key-value as the keyspace holds it, borrowed: what reads and
/// compares look at without copying.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KvRef<'a> {
    pub key: &'a [u8],
    pub value: &'a [u8],
    pub create_revision: i64,
    pub mod_revision: i64,
    pub version: i64,
    pub lease: i64,
}

impl KvRef<'_> {
    pub fn to_key_value(&self) -> KeyValue {
        KeyValue {
            key: self.key.to_vec(),
            value: self.value.to_vec(),
            create_revision: self.create_revision,
            mod_revision: self.mod_revision,
            version: self.version,
            lease: self.lease,
        }
    }
}

/// The longest history kept as one slice.
const SHORT: usize = 32;

#[derive(Debug, Clone)]
pub enum Versions {
    Short(Arc<[Version]>),
    Long(Arc<Vector<Version>>),
}

impl Default for Versions {
    fn default() -> Self {
        Versions::Short(Arc::from(Vec::new()))
    }
}

impl FromIterator<Version> for Versions {
    fn from_iter<I: IntoIterator<Item = Version>>(iter: I) -> Self {
        Versions::from_vec(iter.into_iter().collect())
    }
}

impl std::ops::Index<usize> for Versions {
    type Output = Version;

    fn index(&self, index: usize) -> &Version {
        match self.get(index) {
            Some(v) => v,
            None => panic!("version {index} of a history of {}", self.len()),
        }
    }
}

impl Versions {
    fn from_vec(versions: Vec<Version>) -> Self {
        if versions.len() <= SHORT {
            Versions::Short(Arc::from(versions))
        } else {
            Versions::Long(Arc::new(versions.into_iter().collect()))
        }
    }

    pub fn len(&self) -> usize {
        match self {
            Versions::Short(s) => s.len(),
            Versions::Long(v) => v.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn get(&self, index: usize) -> Option<&Version> {
        match self {
            Versions::Short(s) => s.get(index),
            Versions::Long(v) => v.get(index),
        }
    }

    pub fn last(&self) -> Option<&Version> {
        self.len().checked_sub(1).and_then(|i| self.get(i))
    }

    /// Oldest first; reversible, for the newest-first searches of reads.
    pub fn iter(&self) -> Iter<'_> {
        match self {
            Versions::Short(s) => Iter::Short(s.iter()),
            Versions::Long(v) => Iter::Long(v.iter()),
        }
    }

    /// As `slice::binary_search_by`.
    pub fn binary_search_by(
        &self,
        mut f: impl FnMut(&Version) -> Ordering,
    ) -> Result<usize, usize> {
        match self {
            Versions::Short(s) => s.binary_search_by(f),
            Versions::Long(v) => v.binary_search_by(|x| f(x)),
        }
    }

    pub fn push_back(&mut self, version: Version) {
        match self {
            Versions::Short(s) if s.len() < SHORT => {
                let mut grown = Vec::with_capacity(s.len() + 1);
                grown.extend(s.iter().cloned());
                grown.push(version);
                *s = Arc::from(grown);
            }
            Versions::Short(s) => {
                let mut long: Vector<Version> = s.iter().cloned().collect();
                long.push_back(version);
                *self = Versions::Long(Arc::new(long));
            }
            Versions::Long(v) => Arc::make_mut(v).push_back(version),
        }
    }

    pub fn pop_back(&mut self) -> Option<Version> {
        match self {
            Versions::Short(s) => {
                let (last, rest) = s.split_last()?;
                let last = last.clone();
                *s = Arc::from(rest);
                Some(last)
            }
            Versions::Long(v) => Arc::make_mut(v).pop_back(),
        }
    }

    /// Drops the `n` oldest versions.
    pub fn drop_oldest(&mut self, n: usize) {
        *self = self.iter().skip(n).cloned().collect();
    }
}

/// The versions of a [`Versions`], in either direction.
pub enum Iter<'a> {
    Short(std::slice::Iter<'a, Version>),
    Long(imbl::vector::Iter<'a, Version, imbl::shared_ptr::DefaultSharedPtr>),
}

impl<'a> Iterator for Iter<'a> {
    type Item = &'a Version;

    fn next(&mut self) -> Option<&'a Version> {
        match self {
            Iter::Short(i) => i.next(),
            Iter::Long(i) => i.next(),
        }
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        match self {
            Iter::Short(i) => i.size_hint(),
            Iter::Long(i) => i.size_hint(),
        }
    }
}

impl DoubleEndedIterator for Iter<'_> {
    fn next_back(&mut self) -> Option<Self::Item> {
        match self {
            Iter::Short(i) => i.next_back(),
            Iter::Long(i) => i.next_back(),
        }
    }
}

impl ExactSizeIterator for Iter<'_> {}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(rev: i64) -> Version {
        Version {
            mod_revision: rev,
            sub: 0,
            record: None,
        }
    }

    fn revs(versions: &Versions) -> Vec<i64> {
        versions.iter().map(|v| v.mod_revision).collect()
    }

    #[test]
    fn a_history_grows_past_the_short_form_and_keeps_its_order() {
        let mut versions = Versions::default();
        for rev in 1..=100 {
            versions.push_back(v(rev));
            assert_eq!(versions.len() as i64, rev);
            assert_eq!(versions.last().map(|v| v.mod_revision), Some(rev));
        }
        assert!(matches!(versions, Versions::Long(_)));
        assert_eq!(revs(&versions), (1..=100).collect::<Vec<_>>());
        assert_eq!(versions[40].mod_revision, 41);
        let newest_at_or_before_50 = versions.iter().rev().find(|v| v.mod_revision <= 50);
        assert_eq!(newest_at_or_before_50.map(|v| v.mod_revision), Some(50));
        assert_eq!(
            versions.binary_search_by(|v| v.mod_revision.cmp(&70)),
            Ok(69)
        );
    }

    #[test]
    fn a_clone_does_not_see_later_writes() {
        for len in [1, SHORT - 1, SHORT, 80] {
            let mut versions: Versions = (1..=len as i64).map(v).collect();
            let before = versions.clone();
            versions.push_back(v(1000));
            versions.pop_back();
            versions.pop_back();
            versions.push_back(v(2000));
            assert_eq!(revs(&before), (1..=len as i64).collect::<Vec<_>>());
            assert_eq!(versions.len(), len);
            assert_eq!(versions.last().map(|v| v.mod_revision), Some(2000));
        }
    }

    #[test]
    fn dropping_the_oldest_keeps_the_rest_and_shrinks_to_the_short_form() {
        let mut versions: Versions = (1..=100).map(v).collect();
        versions.drop_oldest(90);
        assert_eq!(revs(&versions), (91..=100).collect::<Vec<_>>());
        assert!(matches!(versions, Versions::Short(_)));
        versions.drop_oldest(50);
        assert!(versions.is_empty());
        assert_eq!(versions.pop_back().map(|v| v.mod_revision), None);
    }
}
