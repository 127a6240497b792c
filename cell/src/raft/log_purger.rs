//! Purging the Raft log, never past the snapshot on disk.
//!
//! openraft purges the log as soon as it has *asked* the state machine to
//! install a snapshot, before that snapshot is on disk (cell review A2).
//! The purger deletes entries only through the snapshot on disk, and the
//! rest once the state machine says the newer snapshot is durable, so a
//! crash in between restarts from the old snapshot and the log after it.

use super::LogId;
use crate::storage::codec::encode;
use crate::storage::keys::{self, CF_LOGS, CF_META};
use crate::storage::{io_err, read_meta, sync_opts};
use rocksdb::{WriteBatch, DB};
use std::sync::{Arc, Mutex};

/// Deletes purged log entries, never past the snapshot on disk unless it
/// is told to (see the module doc).
pub struct LogPurger {
    db: Arc<DB>,
    /// `None`: purge at once, openraft's contract alone (its storage suite,
    /// which has no snapshot file).
    gate: Option<Mutex<PurgeGate>>,
}

#[derive(Debug, Default)]
struct PurgeGate {
    /// The last log id the snapshot on disk covers.
    durable: Option<LogId>,
    /// How far openraft asked to purge.
    requested: Option<LogId>,
    /// How far entries are deleted (and `META_LAST_PURGED` says so).
    deleted: Option<LogId>,
}

impl LogPurger {
    /// A purger that never deletes past the snapshot on disk; the state
    /// machine reports each snapshot it makes durable.
    pub fn gated(db: Arc<DB>) -> std::io::Result<Arc<LogPurger>> {
        let deleted = read_meta::<LogId>(&db, keys::META_LAST_PURGED)?;
        Ok(Arc::new(LogPurger {
            db,
            gate: Some(Mutex::new(PurgeGate {
                deleted,
                requested: deleted,
                durable: None,
            })),
        }))
    }

    /// A purger that deletes what openraft purges at once.
    pub fn ungated(db: Arc<DB>) -> Arc<LogPurger> {
        Arc::new(LogPurger { db, gate: None })
    }

    /// openraft asks to purge through `upto`.
    pub(super) fn request(&self, upto: LogId) -> std::io::Result<()> {
        let Some(gate) = &self.gate else {
            return self.delete_through(upto);
        };
        let mut g = gate.lock().unwrap_or_else(|e| e.into_inner());
        g.requested = g.requested.max(Some(upto));
        self.catch_up(&mut g)
    }

    /// The snapshot covering the log through `at` is on disk.
    pub fn snapshot_durable(&self, at: Option<LogId>) -> std::io::Result<()> {
        let Some(gate) = &self.gate else {
            return Ok(());
        };
        let mut g = gate.lock().unwrap_or_else(|e| e.into_inner());
        g.durable = g.durable.max(at);
        self.catch_up(&mut g)
    }

    fn catch_up(&self, g: &mut PurgeGate) -> std::io::Result<()> {
        let allowed = g.requested.min(g.durable);
        match allowed {
            Some(upto) if allowed > g.deleted => {
                self.delete_through(upto)?;
                g.deleted = Some(upto);
                Ok(())
            }
            _ => Ok(()),
        }
    }

    fn delete_through(&self, upto: LogId) -> std::io::Result<()> {
        delete_through(&self.db, upto)
    }
}

/// Deletes the log through `upto` and records that it starts after it.
pub fn delete_through(db: &DB, upto: LogId) -> std::io::Result<()> {
    crate::crash_point!(crate::chaos::LOG_PURGE);
    let cf = |name| db.cf_handle(name).expect("column family created at open");
    let mut batch = WriteBatch::default();
    batch.put_cf(
        cf(CF_META),
        keys::META_LAST_PURGED,
        encode(&upto).map_err(io_err)?,
    );
    batch.delete_range_cf(cf(CF_LOGS), keys::log_key(0), keys::log_key(upto.index + 1));
    db.write_opt(batch, &sync_opts()).map_err(io_err)
}
