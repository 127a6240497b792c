//! The multi-version keyspace: every key with its history of versions, the
//! global revision and the compaction point.
//!
//! It is a plain value (persistent maps from `imbl`, so a clone is O(1) and
//! shares structure): the state machine mutates it while a snapshot of an
//! earlier clone is being serialised on another thread.

use super::image::{KeyHistory, KeySpaceImage};
use super::tenants::TenantBook;
use super::versions::{KvRef, Record, Version, Versions};
use imbl::OrdMap;
use latchkey_shared::directory::{Ownership, OWNERSHIP_KEY};
use latchkey_shared::tenant::{self, TenantRecord, TENANT_PREFIX};
use latchkey_shared::ApiError;
use serde::{Deserialize, Serialize};
use std::sync::Arc;

/// One version of a key, as etcd's `mvccpb.KeyValue` describes it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeyValue {
    // As bytes, not a sequence of u8 (the same bincode, written and read
    // whole instead of byte by byte: a snapshot of large values encodes
    // many times faster).
    #[serde(with = "serde_bytes")]
    pub key: Vec<u8>,
    #[serde(with = "serde_bytes")]
    pub value: Vec<u8>,
    pub create_revision: i64,
    pub mod_revision: i64,
    pub version: i64,
    pub lease: i64,
}

impl KeyValue {
    pub fn view(&self) -> KvRef<'_> {
        KvRef {
            key: &self.key,
            value: &self.value,
            create_revision: self.create_revision,
            mod_revision: self.mod_revision,
            version: self.version,
            lease: self.lease,
        }
    }
}

/// What a change did to a key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventKind {
    Put,
    Delete,
}

/// One change to one key, as a watch reports it. A delete carries the key
/// and its deletion revision in `kv`, the rest zero, as etcd does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    pub kind: EventKind,
    pub kv: KeyValue,
    /// The value before this change, when history still has it.
    pub prev: Option<KeyValue>,
}

impl Event {
    pub fn revision(&self) -> i64 {
        self.kv.mod_revision
    }

    /// Roughly what the event costs on the wire.
    pub fn bytes(&self) -> usize {
        let kv = |kv: &KeyValue| kv.key.len() + kv.value.len() + 32;
        kv(&self.kv) + self.prev.as_ref().map_or(0, kv)
    }
}

pub(super) fn tombstone_kv(key: &[u8], rev: i64) -> KeyValue {
    KeyValue {
        key: key.to_vec(),
        value: Vec::new(),
        create_revision: 0,
        mod_revision: rev,
        version: 0,
        lease: 0,
    }
}

pub use latchkey_shared::KeyRange;

/// The keyspace with its history.
#[derive(Debug, Clone)]
pub struct KeySpace {
    /// Keys are shared too: a persistent map copies a node's keys whenever
    /// it writes into a node someone else still holds (a reader's clone,
    /// apply's rollback point), and a shared key copies as a pointer
    /// (profiled: cloning `Vec<u8>` keys was most of the cost of a put).
    keys: OrdMap<Arc<[u8]>, Versions>,
    revision: i64,
    compact_revision: i64,
    /// Bytes of every version kept, for the quota.
    bytes: u64,
    live_keys: u64,
    /// Changes made since the last [`KeySpace::take_changes`], in order: what
    /// the state machine hands to watchers after each entry. Never part of a
    /// snapshot.
    changes: Vec<Event>,
    /// The revision last written and the sub-revision its next change gets.
    next_sub: (i64, u32),
    /// Who owns which keys and what each tenant uses: kept on every put
    /// and delete, built again when a tenant's record changes. Never part
    /// of a snapshot.
    tenants: TenantBook,
    /// Which keys this cell owns (DESIGN section 9), from its ownership
    /// record; `None`: every key (no record, a cell on its own). Kept
    /// when the record is written or deleted. Never part of a snapshot.
    ownership: Option<Arc<Ownership>>,
}

/// An empty keyspace is at revision 1, as etcd's is: clients read a
/// revision of 0 as "none".
impl Default for KeySpace {
    fn default() -> Self {
        KeySpace {
            keys: OrdMap::new(),
            revision: 1,
            compact_revision: 0,
            bytes: 0,
            live_keys: 0,
            changes: Vec::new(),
            next_sub: (0, 0),
            tenants: TenantBook::default(),
            ownership: None,
        }
    }
}

impl KeySpace {
    pub fn revision(&self) -> i64 {
        self.revision
    }

    pub fn compact_revision(&self) -> i64 {
        self.compact_revision
    }

    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// The tenants and what each uses now.
    pub fn tenants(&self) -> &TenantBook {
        &self.tenants
    }

    /// What this cell owns, if a directory gave it an ownership record.
    pub fn ownership(&self) -> Option<&Ownership> {
        self.ownership.as_deref()
    }

    /// `wrong_cell` unless this cell owns every key from `key` to `end`
    /// (etcd's `key` and `range_end`) for reading. Free while the cell owns
    /// everything.
    pub fn check_owned(&self, key: &[u8], end: &[u8]) -> Result<(), ApiError> {
        match &self.ownership {
            None => Ok(()),
            Some(o) => o.check_read(&KeyRange::new(key.to_vec(), end.to_vec())),
        }
    }

    /// The compact revision a read or watch of `key`..`end` meets: the
    /// keyspace's, or above it where a moved-in prefix's revisions begin
    /// (the ones below are its old cell's).
    pub fn compacted_for(&self, key: &[u8], end: &[u8]) -> i64 {
        let floor = self
            .ownership
            .as_ref()
            .filter(|o| !o.floors.is_empty())
            .map_or(0, |o| o.floor(&KeyRange::new(key.to_vec(), end.to_vec())));
        if floor > 0 {
            self.compact_revision.max(floor + 1)
        } else {
            self.compact_revision
        }
    }

    /// [`check_owned`](Self::check_owned) for writing: also refused for a
    /// prefix the cell is losing.
    pub fn check_owned_write(&self, key: &[u8], end: &[u8]) -> Result<(), ApiError> {
        match &self.ownership {
            None => Ok(()),
            Some(o) => o.check_write(&KeyRange::new(key.to_vec(), end.to_vec())),
        }
    }

    /// `wrong_cell` unless this cell owns `key` for a move's import
    /// (arriving keys included).
    pub fn check_owned_import(&self, key: &[u8]) -> Result<(), ApiError> {
        match &self.ownership {
            None => Ok(()),
            Some(o) => o.check_import(&KeyRange::new(key.to_vec(), Vec::new())),
        }
    }

    /// Reads the ownership record again. One that does not decode owns
    /// nothing: a cell refuses what it cannot tell it owns.
    fn reload_ownership(&mut self) {
        self.ownership = self.get(OWNERSHIP_KEY).map(|kv| {
            Arc::new(Ownership::decode(kv.value).unwrap_or_else(|e| {
                tracing::error!(error = %e, "ownership record does not decode; owning no key");
                Ownership::nothing()
            }))
        });
    }

    /// Builds the tenants' book again: their records, then every live key
    /// under their prefixes.
    fn rebuild_tenants(&mut self) {
        let mut records = Vec::new();
        self.scan(&KeyRange::prefix(TENANT_PREFIX), self.revision, |kv| {
            match TenantRecord::decode(kv.value) {
                Ok(r) => records.push(r),
                Err(e) => tracing::error!(
                    key = %kv.key.escape_ascii(), error = %e,
                    "tenant record does not decode; its tenant is not counted"
                ),
            }
            true
        });
        let mut book = TenantBook::new(records);
        for prefix in book.all_prefixes() {
            self.scan(&KeyRange::prefix(&prefix), self.revision, |kv| {
                book.on_put(kv.key, None, kv.value.len());
                true
            });
        }
        self.tenants = book;
    }

    pub fn live_keys(&self) -> u64 {
        self.live_keys
    }

    /// The changes made since the last call, in the order they were made.
    pub fn take_changes(&mut self) -> Vec<Event> {
        std::mem::take(&mut self.changes)
    }

    /// Every change to a key in `range` with a revision in `from..=to`,
    /// rebuilt from history at once, in the order they were made
    /// (revision, then sub-revision), with previous values. Tests compare
    /// with it; watches read history a batch at a time
    /// ([`super::history::History`]).
    #[cfg(test)]
    pub fn history(&self, range: &KeyRange, from: i64, to: i64) -> Vec<Event> {
        super::history::History::new(self, range, from, to, true).collect()
    }

    /// Each key in `range` with its versions, in key order.
    pub(super) fn versions_in<'a>(
        &'a self,
        range: &'a KeyRange,
    ) -> impl Iterator<Item = (&'a Arc<[u8]>, &'a Versions)> + 'a {
        self.keys
            .range::<_, [u8]>(range.bounds())
            .filter(|(key, _)| range.admits(key))
    }

    fn future_revision(&self, revision: i64) -> ApiError {
        ApiError::future_revision().with_message(format!(
            "revision {revision} is newer than the current revision {}",
            self.revision
        ))
    }

    /// Checks that `revision` (0 = current) can be read.
    pub fn check_readable(&self, revision: i64) -> Result<i64, ApiError> {
        if revision <= 0 {
            return Ok(self.revision);
        }
        if revision > self.revision {
            return Err(self.future_revision(revision));
        }
        if revision < self.compact_revision {
            return Err(
                ApiError::compacted(self.compact_revision).with_message(format!(
                    "revision {revision} has been compacted at {}",
                    self.compact_revision
                )),
            );
        }
        Ok(revision)
    }

    /// The live key-values in `range` at `revision` (must be readable), in
    /// key order. `visit` returns false to stop early.
    pub fn scan<'a>(
        &'a self,
        range: &KeyRange,
        revision: i64,
        mut visit: impl FnMut(KvRef<'a>) -> bool,
    ) {
        if range.is_empty() {
            return;
        }
        for (key, versions) in self.keys.range::<_, [u8]>(range.bounds()) {
            if !range.admits(key) {
                continue;
            }
            if let Some(kv) = visible(key, versions, revision) {
                if !visit(kv) {
                    return;
                }
            }
        }
    }

    /// The live value of one key now.
    pub fn get<'a>(&'a self, key: &'a [u8]) -> Option<KvRef<'a>> {
        self.keys
            .get(key)
            .and_then(|v| visible(key, v, self.revision))
    }

    /// A hash of every version kept at revisions up to `revision` (tombstones
    /// included), in key and revision order: members that applied the same
    /// log agree on it, so operators compare it across members (etcd's
    /// HashKV). FNV-1a, folded to 32 bits as etcd's hash is.
    pub fn hash_until(&self, revision: i64) -> u32 {
        let mut h = crate::ids::FNV_OFFSET;
        for (key, versions) in &self.keys {
            for v in versions.iter().filter(|v| v.mod_revision <= revision) {
                h = crate::ids::fnv1a(h, key.iter().copied());
                h = crate::ids::fnv1a(h, v.mod_revision.to_be_bytes());
                match &v.record {
                    Some(record) => {
                        h = crate::ids::fnv1a(h, [1]);
                        h = crate::ids::fnv1a(h, record.create_revision.to_be_bytes());
                        h = crate::ids::fnv1a(h, record.version.to_be_bytes());
                        h = crate::ids::fnv1a(h, record.lease.to_be_bytes());
                        h = crate::ids::fnv1a(h, record.value.iter().copied());
                    }
                    None => h = crate::ids::fnv1a(h, [0]),
                }
            }
        }
        (h ^ (h >> 32)) as u32
    }

    /// Starts a write transaction: the revision it will commit at.
    pub fn next_revision(&self) -> i64 {
        self.revision + 1
    }

    /// The sub-revision of the next change at `rev`.
    fn take_sub(&mut self, rev: i64) -> u32 {
        if self.next_sub.0 != rev {
            self.next_sub = (rev, 0);
        }
        let sub = self.next_sub.1;
        self.next_sub.1 += 1;
        sub
    }

    /// Writes `key` at revision `rev` (from [`Self::next_revision`]).
    /// Returns the previous live value.
    pub fn put(&mut self, rev: i64, key: &[u8], value: Vec<u8>, lease: i64) -> Option<KeyValue> {
        self.put_with(rev, key, value, lease, None)
    }

    /// [`put`](Self::put) of a key moved in from another cell: it keeps
    /// the create revision and version it had there (`origin`), so a lock
    /// queue keeps its order and a holder its fencing token.
    pub fn import(
        &mut self,
        rev: i64,
        key: &[u8],
        value: Vec<u8>,
        lease: i64,
        origin: (i64, i64),
    ) -> Option<KeyValue> {
        self.put_with(rev, key, value, lease, Some(origin))
    }

    fn put_with(
        &mut self,
        rev: i64,
        key: &[u8],
        value: Vec<u8>,
        lease: i64,
        origin: Option<(i64, i64)>,
    ) -> Option<KeyValue> {
        let sub = self.take_sub(rev);
        let versions = self.keys.entry(Arc::from(key)).or_default();
        let prev = versions
            .last()
            .and_then(|v| v.view(key))
            .map(|kv| kv.to_key_value());
        let (create_revision, key_version) = origin.unwrap_or_else(|| {
            (
                prev.as_ref().map_or(rev, |p| p.create_revision),
                prev.as_ref().map_or(1, |p| p.version + 1),
            )
        });
        let kv = KeyValue {
            key: key.to_vec(),
            value,
            create_revision,
            mod_revision: rev,
            version: key_version,
            lease,
        };
        let version = Version {
            mod_revision: rev,
            sub,
            record: Some(Arc::new(Record {
                create_revision: kv.create_revision,
                version: kv.version,
                lease,
                value: kv.value.as_slice().into(),
            })),
        };
        self.bytes += version.bytes(key);
        // What watchers see as the value before this revision.
        let mut event_prev = prev.clone();
        // Two writes of one key in one revision (a nested txn) keep only the
        // last, as etcd does; watchers see one change, as history does.
        if let Some(last) = versions.last() {
            if last.mod_revision == rev {
                let old = versions.pop_back().map_or(0, |v| v.bytes(key));
                self.bytes -= old;
                if let Some(pos) = self.changes.iter().rposition(|e| e.kv.key == key) {
                    event_prev = self.changes.remove(pos).prev;
                }
            }
        }
        versions.push_back(version);
        if prev.is_none() {
            self.live_keys += 1;
        }
        self.tenants
            .on_put(key, prev.as_ref().map(|p| p.value.len()), kv.value.len());
        self.changes.push(Event {
            kind: EventKind::Put,
            kv,
            prev: event_prev,
        });
        self.revision = self.revision.max(rev);
        if tenant::is_record(key) {
            self.rebuild_tenants();
        }
        if key == OWNERSHIP_KEY {
            self.reload_ownership();
        }
        prev
    }

    /// Deletes `key` at revision `rev`; returns the deleted value, if live.
    pub fn delete(&mut self, rev: i64, key: &[u8]) -> Option<KeyValue> {
        // Taken even when nothing is deleted: a gap does not change the order.
        let sub = self.take_sub(rev);
        let versions = self.keys.get_mut(key)?;
        let prev = versions.last().and_then(|v| v.view(key))?.to_key_value();
        let tombstone = Version {
            mod_revision: rev,
            sub,
            record: None,
        };
        self.bytes += tombstone.bytes(key);
        versions.push_back(tombstone);
        self.live_keys -= 1;
        self.tenants.on_delete(key, prev.value.len());
        self.changes.push(Event {
            kind: EventKind::Delete,
            kv: tombstone_kv(key, rev),
            prev: Some(prev.clone()),
        });
        self.revision = self.revision.max(rev);
        if tenant::is_record(key) {
            self.rebuild_tenants();
        }
        if key == OWNERSHIP_KEY {
            self.reload_ownership();
        }
        Some(prev)
    }

    /// Deletes every live key under `prefix` at `rev` without a change for
    /// watchers (see `txn::drop_given_away`); returns them.
    pub fn drop_prefix(&mut self, rev: i64, prefix: &[u8]) -> Vec<KeyValue> {
        let victims = self.live_keys_in(&KeyRange::prefix(prefix));
        let changes = self.changes.len();
        for victim in &victims {
            self.delete(rev, &victim.key);
        }
        self.changes.truncate(changes);
        victims
    }

    /// The live keys in `range` now.
    pub fn live_keys_in(&self, range: &KeyRange) -> Vec<KeyValue> {
        let mut out = Vec::new();
        self.scan(range, self.revision, |kv| {
            out.push(kv.to_key_value());
            true
        });
        out
    }

    /// A restore's bump (`--restore-bump-revision`): the revision moves on
    /// by `by`, and everything before the new revision is compacted, so no
    /// revision up to it is issued again and nothing older is read or
    /// watched.
    /// The revision becomes at least `above`: the next write gets a
    /// higher one. History stays (nothing changed at the revisions
    /// skipped, so a read or watch there sees what it saw before).
    pub fn raise_revision(&mut self, above: i64) {
        self.revision = self.revision.max(above);
    }

    pub fn bump_revision(&mut self, by: i64) {
        if by <= 0 {
            return;
        }
        self.revision = self.revision.saturating_add(by);
        // After the compact revision, at the current one: cannot fail.
        let _ = self.compact(self.revision);
    }

    /// Drops history older than `revision`: each key keeps its newest
    /// version at or before it (a tombstone only if it is exactly at
    /// `revision`) and everything after it. Reads at `revision` and later are
    /// unaffected, and every change at `revision` and later stays in history
    /// for watchers, as etcd allows a watch from the compact revision.
    pub fn compact(&mut self, revision: i64) -> Result<(), ApiError> {
        if revision <= self.compact_revision {
            return Err(
                ApiError::compacted(self.compact_revision).with_message(format!(
                    "revision {revision} is not after the compact revision {}",
                    self.compact_revision
                )),
            );
        }
        if revision > self.revision {
            return Err(self.future_revision(revision));
        }
        let mut emptied = Vec::new();
        let keys: Vec<Arc<[u8]>> = self.keys.keys().cloned().collect();
        for key in keys {
            let Some(versions) = self.keys.get_mut(&*key) else {
                continue;
            };
            // Index of the newest version at or before `revision`.
            let Some(pivot) = versions.iter().rposition(|v| v.mod_revision <= revision) else {
                continue;
            };
            let drop =
                if versions[pivot].record.is_none() && versions[pivot].mod_revision < revision {
                    pivot + 1
                } else {
                    pivot
                };
            if drop == 0 {
                continue;
            }
            let dropped: u64 = versions.iter().take(drop).map(|v| v.bytes(&key)).sum();
            versions.drop_oldest(drop);
            self.bytes -= dropped;
            if versions.is_empty() {
                emptied.push(key);
            }
        }
        for key in emptied {
            self.keys.remove(&*key);
        }
        self.compact_revision = revision;
        Ok(())
    }

    pub fn image(&self) -> KeySpaceImage {
        KeySpaceImage {
            revision: self.revision,
            compact_revision: self.compact_revision,
            keys: self
                .keys
                .iter()
                .map(|(key, versions)| KeyHistory {
                    key: key.clone(),
                    versions: versions.clone(),
                })
                .collect(),
        }
    }

    pub fn from_image(image: KeySpaceImage) -> Self {
        let mut ks = KeySpace {
            revision: image.revision,
            compact_revision: image.compact_revision,
            ..KeySpace::default()
        };
        for KeyHistory { key, versions } in image.keys {
            ks.bytes += versions.iter().map(|v| v.bytes(&key)).sum::<u64>();
            if versions.last().is_some_and(|v| v.record.is_some()) {
                ks.live_keys += 1;
            }
            ks.keys.insert(key, versions);
        }
        ks.rebuild_tenants();
        ks.reload_ownership();
        ks
    }
}

/// The version of a key visible at `revision`, if it is live there.
fn visible<'a>(key: &'a [u8], versions: &'a Versions, revision: i64) -> Option<KvRef<'a>> {
    // Histories are short after compaction; newest first is the common case.
    versions
        .iter()
        .rev()
        .find(|v| v.mod_revision <= revision)
        .and_then(|v| v.view(key))
}

#[cfg(test)]
mod tests {
    use super::*;
    use latchkey_shared::ErrorCode;

    fn all() -> KeyRange {
        KeyRange::new(vec![0], vec![0])
    }

    fn keys_at(ks: &KeySpace, rev: i64) -> Vec<(String, String)> {
        let mut out = Vec::new();
        ks.scan(&all(), rev, |kv| {
            out.push((
                String::from_utf8_lossy(&kv.key).into(),
                String::from_utf8_lossy(&kv.value).into(),
            ));
            true
        });
        out
    }

    #[test]
    fn versions_and_revisions_follow_etcd() {
        let mut ks = KeySpace::default();
        ks.put(1, b"a", b"1".to_vec(), 0);
        ks.put(2, b"a", b"2".to_vec(), 0);
        let kv = ks.get(b"a").expect("live");
        assert_eq!((kv.create_revision, kv.mod_revision, kv.version), (1, 2, 2));
        ks.delete(3, b"a");
        assert!(ks.get(b"a").is_none());
        ks.put(4, b"a", b"3".to_vec(), 0);
        let kv = ks.get(b"a").expect("live again");
        assert_eq!((kv.create_revision, kv.mod_revision, kv.version), (4, 4, 1));
        assert_eq!(keys_at(&ks, 1), vec![("a".into(), "1".into())]);
        assert_eq!(keys_at(&ks, 3), vec![]);
    }

    #[test]
    fn compaction_keeps_reads_at_and_after_the_compact_revision() {
        let mut ks = KeySpace::default();
        ks.put(1, b"a", b"1".to_vec(), 0);
        ks.put(2, b"b", b"1".to_vec(), 0);
        ks.put(3, b"a", b"2".to_vec(), 0);
        ks.delete(4, b"b");
        ks.put(5, b"c", b"1".to_vec(), 0);
        let before: Vec<_> = (4..=5).map(|r| keys_at(&ks, r)).collect();
        let bytes_before = ks.bytes();
        ks.compact(4).expect("compact");
        let after: Vec<_> = (4..=5).map(|r| keys_at(&ks, r)).collect();
        assert_eq!(before, after);
        assert!(ks.bytes() < bytes_before);
        assert_eq!(ks.check_readable(3).unwrap_err().code, ErrorCode::Compacted);
        assert_eq!(
            ks.check_readable(6).unwrap_err().code,
            ErrorCode::FutureRevision
        );
        assert_eq!(ks.compact(4).unwrap_err().code, ErrorCode::Compacted);
    }

    #[test]
    fn ranges_select_like_etcd() {
        let mut ks = KeySpace::default();
        for (i, k) in ["a", "b", "c"].iter().enumerate() {
            ks.put(i as i64 + 1, k.as_bytes(), vec![], 0);
        }
        let count = |r: KeyRange| ks.live_keys_in(&r).len();
        assert_eq!(count(KeyRange::single(b"b".to_vec())), 1);
        assert_eq!(count(KeyRange::new(b"a".to_vec(), b"c".to_vec())), 2);
        assert_eq!(count(KeyRange::new(b"b".to_vec(), vec![0])), 2);
        assert_eq!(count(KeyRange::new(b"c".to_vec(), b"a".to_vec())), 0);
    }

    #[test]
    fn image_round_trip_keeps_history_and_accounting() {
        let mut ks = KeySpace::default();
        ks.put(1, b"a", b"1".to_vec(), 0);
        ks.put(2, b"a", b"2".to_vec(), 7);
        ks.delete(3, b"a");
        ks.put(4, b"b", b"x".to_vec(), 0);
        let copy = KeySpace::from_image(ks.image());
        assert_eq!(copy.bytes(), ks.bytes());
        assert_eq!(copy.live_keys(), 1);
        for rev in 1..=4 {
            assert_eq!(keys_at(&copy, rev), keys_at(&ks, rev));
        }
    }

    #[test]
    fn history_replays_every_change_in_revision_order_with_prev_values() {
        let mut ks = KeySpace::default();
        ks.put(1, b"b", b"1".to_vec(), 0);
        ks.put(2, b"a", b"1".to_vec(), 0);
        ks.put(3, b"b", b"2".to_vec(), 0);
        ks.delete(4, b"a");
        let live = ks.take_changes();
        let replay = ks.history(&all(), 1, 4);
        assert_eq!(live, replay, "what watchers saw live equals the replay");
        let summary: Vec<_> = replay
            .iter()
            .map(|e| {
                (
                    e.kind,
                    e.kv.key.clone(),
                    e.revision(),
                    e.prev.as_ref().map(|p| p.value.clone()),
                )
            })
            .collect();
        assert_eq!(
            summary,
            vec![
                (EventKind::Put, b"b".to_vec(), 1, None),
                (EventKind::Put, b"a".to_vec(), 2, None),
                (EventKind::Put, b"b".to_vec(), 3, Some(b"1".to_vec())),
                (EventKind::Delete, b"a".to_vec(), 4, Some(b"1".to_vec())),
            ]
        );
        assert_eq!(ks.history(&all(), 3, 3).len(), 1);
        assert!(ks.take_changes().is_empty());
    }

    /// Keys and values encode as bytes: the same bincode as a sequence of
    /// u8, so snapshots and state files of either kind read alike.
    #[test]
    fn key_values_encode_as_plain_byte_sequences_did() {
        #[derive(Serialize)]
        struct Plain {
            key: Vec<u8>,
            value: Vec<u8>,
            create_revision: i64,
            mod_revision: i64,
            version: i64,
            lease: i64,
        }
        let kv = KeyValue {
            key: b"k".to_vec(),
            value: vec![7; 300],
            create_revision: 2,
            mod_revision: 3,
            version: 2,
            lease: 9,
        };
        let plain = Plain {
            key: kv.key.clone(),
            value: kv.value.clone(),
            create_revision: 2,
            mod_revision: 3,
            version: 2,
            lease: 9,
        };
        let bytes = crate::storage::codec::encode(&kv).expect("encode");
        assert_eq!(
            bytes,
            crate::storage::codec::encode(&plain).expect("encode")
        );
        let back: KeyValue = crate::storage::codec::decode(&bytes).expect("decode");
        assert_eq!(back, kv);
    }

    /// M3 (cell review): a txn's changes reached live watchers in op order
    /// but a watch replaying history got them in key order.
    #[test]
    fn m3_history_replays_the_changes_of_one_revision_in_the_order_they_were_made() {
        let mut ks = KeySpace::default();
        ks.put(2, b"z", b"0".to_vec(), 0);
        ks.put(3, b"b", b"1".to_vec(), 0);
        ks.put(3, b"a", b"1".to_vec(), 0);
        ks.delete(3, b"z");
        ks.put(3, b"c", b"1".to_vec(), 0);
        let live = ks.take_changes();
        let keys = |events: &[Event]| -> Vec<Vec<u8>> {
            events.iter().map(|e| e.kv.key.clone()).collect()
        };
        assert_eq!(
            keys(&live),
            [b"z", b"b", b"a", b"z", b"c"].map(|k| k.to_vec())
        );
        assert_eq!(ks.history(&all(), 2, 3), live);
        // The order survives a snapshot.
        let restored = KeySpace::from_image(ks.image());
        assert_eq!(restored.history(&all(), 2, 3), live);
    }

    #[test]
    fn compaction_keeps_every_change_from_the_compact_revision_on() {
        let mut ks = KeySpace::default();
        ks.put(1, b"a", b"1".to_vec(), 0);
        ks.put(2, b"b", b"1".to_vec(), 0);
        ks.delete(3, b"b");
        ks.put(4, b"a", b"2".to_vec(), 0);
        let before = ks.history(&all(), 3, 4);
        ks.compact(3).expect("compact");
        // The deletion at the compact revision is still there for a watch
        // that starts at it, as etcd allows.
        assert_eq!(ks.history(&all(), 3, 4).len(), before.len());
        ks.compact(4).expect("compact");
        assert_eq!(ks.history(&all(), 4, 4).len(), 1);
        assert_eq!(ks.live_keys(), 1);
    }

    #[test]
    fn two_writes_of_a_key_in_one_revision_are_one_change() {
        let mut ks = KeySpace::default();
        ks.put(1, b"k", b"old".to_vec(), 0);
        ks.take_changes();
        ks.put(2, b"k", b"first".to_vec(), 0);
        ks.put(2, b"k", b"second".to_vec(), 0);
        let changes = ks.take_changes();
        assert_eq!(changes.len(), 1);
        assert_eq!(changes[0].kv.value, b"second".to_vec());
        assert_eq!(
            changes[0].prev.as_ref().map(|p| p.value.clone()),
            Some(b"old".to_vec())
        );
        assert_eq!(changes, ks.history(&all(), 2, 2));
    }
}
