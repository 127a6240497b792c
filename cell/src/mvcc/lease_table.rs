//! The replicated part of leases: which leases exist, their granted TTL,
//! the keys attached to each and the remaining time of each lease's last
//! checkpoint. Live deadlines are not here: they live in the
//! lessor (`crate::lease::lessor`), because refreshes do not go through
//! Raft.

use imbl::{OrdMap, OrdSet};
use serde::{Deserialize, Serialize};

/// What a member knows of one lease when it (re)loads its state: id, TTL
/// and the remaining milliseconds of its last checkpoint, if any.
pub type LeaseSeed = (i64, i64, Option<i64>);

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseRecord {
    pub id: i64,
    /// The TTL granted, in seconds.
    pub ttl: i64,
    pub keys: OrdSet<Vec<u8>>,
    /// Milliseconds the lease had left at its last checkpoint.
    pub checkpoint_ms: Option<i64>,
}

#[derive(Debug, Clone, Default)]
pub struct LeaseTable {
    leases: OrdMap<i64, LeaseRecord>,
}

/// Snapshot form of one lease.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct LeaseImage {
    pub id: i64,
    pub ttl: i64,
    pub keys: Vec<Vec<u8>>,
    #[serde(default)]
    pub checkpoint_ms: Option<i64>,
}

impl LeaseTable {
    pub fn get(&self, id: i64) -> Option<&LeaseRecord> {
        self.leases.get(&id)
    }

    pub fn contains(&self, id: i64) -> bool {
        self.leases.contains_key(&id)
    }

    pub fn len(&self) -> usize {
        self.leases.len()
    }

    pub fn is_empty(&self) -> bool {
        self.leases.is_empty()
    }

    /// Every lease as `(id, ttl, checkpointed ms left)`, in id order: what
    /// a lessor starts from.
    pub fn seeds(&self) -> Vec<LeaseSeed> {
        self.leases
            .values()
            .map(|l| (l.id, l.ttl, l.checkpoint_ms))
            .collect()
    }

    /// Records a checkpoint: `(id, ms left)`; unknown ids are skipped.
    pub fn checkpoint(&mut self, entries: &[(i64, i64)]) {
        for &(id, ms) in entries {
            if let Some(lease) = self.leases.get_mut(&id) {
                lease.checkpoint_ms = Some(ms);
            }
        }
    }

    pub fn insert(&mut self, id: i64, ttl: i64) {
        self.leases.insert(
            id,
            LeaseRecord {
                id,
                ttl,
                keys: OrdSet::new(),
                checkpoint_ms: None,
            },
        );
    }

    pub fn remove(&mut self, id: i64) -> Option<LeaseRecord> {
        self.leases.remove(&id)
    }

    pub fn attach(&mut self, id: i64, key: &[u8]) {
        if let Some(lease) = self.leases.get_mut(&id) {
            lease.keys.insert(key.to_vec());
        }
    }

    pub fn detach(&mut self, id: i64, key: &[u8]) {
        if let Some(lease) = self.leases.get_mut(&id) {
            lease.keys.remove(key);
        }
    }

    pub fn image(&self) -> Vec<LeaseImage> {
        self.leases
            .values()
            .map(|l| LeaseImage {
                id: l.id,
                ttl: l.ttl,
                keys: l.keys.iter().cloned().collect(),
                checkpoint_ms: l.checkpoint_ms,
            })
            .collect()
    }

    pub fn from_image(image: Vec<LeaseImage>) -> Self {
        let mut table = LeaseTable::default();
        for l in image {
            table.leases.insert(
                l.id,
                LeaseRecord {
                    id: l.id,
                    ttl: l.ttl,
                    keys: l.keys.into_iter().collect(),
                    checkpoint_ms: l.checkpoint_ms,
                },
            );
        }
        table
    }
}
