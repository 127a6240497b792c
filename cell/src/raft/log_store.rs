//! The Raft log and vote in RocksDB.
//!
//! Durability: an append is written to RocksDB (readable at once) and its
//! completion callback is handed to the *flusher* thread, which fsyncs the
//! write-ahead log once for every callback that arrived meanwhile and then
//! acknowledges them all. That is group commit: under load one fsync covers
//! many appends, and no append is acknowledged before it is on disk. Votes,
//! truncations and purges are rare and are written with `sync` directly.

use super::{Entry, LogId, NodeId, StorageError, TypeConfig, Vote};
use crate::storage::codec::{decode, encode};
use crate::storage::keys::{self, CF_LOGS, CF_META};
use openraft::storage::{LogFlushed, LogState, RaftLogReader, RaftLogStorage};
use openraft::{OptionalSend, RaftLogId, StorageIOError};
use rocksdb::{Direction, IteratorMode, WriteBatch, WriteOptions, DB};
use std::fmt::Debug;
use std::ops::{Bound, RangeBounds};
use std::sync::mpsc;
use std::sync::Arc;

#[derive(Clone)]
pub struct LogStore {
    db: Arc<DB>,
    flusher: mpsc::Sender<LogFlushed<TypeConfig>>,
}

fn sync_opts() -> WriteOptions {
    let mut o = WriteOptions::default();
    o.set_sync(true);
    o
}

fn io_err(e: impl std::error::Error + Send + Sync + 'static) -> std::io::Error {
    std::io::Error::other(e)
}

impl LogStore {
    /// Opens the store over `db` and starts its flusher thread, which ends
    /// (and lets go of `db`) when the last clone of the store is dropped.
    pub fn new(db: Arc<DB>) -> std::io::Result<Self> {
        let (tx, rx) = mpsc::channel::<LogFlushed<TypeConfig>>();
        let flush_db = db.clone();
        std::thread::Builder::new()
            .name("raft-log-flusher".into())
            .spawn(move || flusher(flush_db, rx))?;
        Ok(LogStore { db, flusher: tx })
    }

    fn cf_logs(&self) -> &rocksdb::ColumnFamily {
        self.db
            .cf_handle(CF_LOGS)
            .expect("column family created at open")
    }

    fn cf_meta(&self) -> &rocksdb::ColumnFamily {
        self.db
            .cf_handle(CF_META)
            .expect("column family created at open")
    }

    // openraft's StorageError is large, but it is what every caller here
    // returns to openraft anyway; boxing it would only add a conversion.
    #[allow(clippy::result_large_err)]
    fn get_meta<T: serde::de::DeserializeOwned>(
        &self,
        key: &[u8],
    ) -> Result<Option<T>, StorageError> {
        let bytes = self
            .db
            .get_cf(self.cf_meta(), key)
            .map_err(|e| StorageIOError::read(&e))?;
        match bytes {
            None => Ok(None),
            Some(b) => Ok(Some(decode(&b).map_err(|e| StorageIOError::read(&e))?)),
        }
    }

    #[allow(clippy::result_large_err)]
    fn last_purged(&self) -> Result<Option<LogId>, StorageError> {
        self.get_meta(keys::META_LAST_PURGED)
    }
}

/// Fsyncs the write-ahead log once per batch of waiting appends.
fn flusher(db: Arc<DB>, rx: mpsc::Receiver<LogFlushed<TypeConfig>>) {
    while let Ok(first) = rx.recv() {
        let mut batch = vec![first];
        while let Ok(more) = rx.try_recv() {
            batch.push(more);
        }
        let started = std::time::Instant::now();
        let result = db.flush_wal(true);
        metrics::histogram!("latchkey_log_fsync_seconds").record(started.elapsed().as_secs_f64());
        metrics::histogram!("latchkey_log_appends_per_fsync").record(batch.len() as f64);
        for cb in batch {
            cb.log_io_completed(result.clone().map_err(io_err));
        }
    }
}

impl RaftLogReader<TypeConfig> for LogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + OptionalSend>(
        &mut self,
        range: RB,
    ) -> Result<Vec<Entry>, StorageError> {
        let start = match range.start_bound() {
            Bound::Included(x) => *x,
            Bound::Excluded(x) => *x + 1,
            Bound::Unbounded => 0,
        };
        let mut out = Vec::new();
        let it = self.db.iterator_cf(
            self.cf_logs(),
            IteratorMode::From(&keys::log_key(start), Direction::Forward),
        );
        for item in it {
            let (k, v) = item.map_err(|e| StorageIOError::read_logs(&e))?;
            let Some(index) = keys::decode_log_index(&k) else {
                break;
            };
            if !range.contains(&index) {
                break;
            }
            let entry: Entry = decode(&v).map_err(|e| StorageIOError::read_logs(&e))?;
            out.push(entry);
        }
        Ok(out)
    }
}

impl RaftLogStorage<TypeConfig> for LogStore {
    type LogReader = Self;

    async fn get_log_state(&mut self) -> Result<LogState<TypeConfig>, StorageError> {
        let last_purged_log_id = self.last_purged()?;
        let mut it = self.db.iterator_cf(self.cf_logs(), IteratorMode::End);
        let last = match it.next() {
            None => None,
            Some(item) => {
                let (_, v) = item.map_err(|e| StorageIOError::read_logs(&e))?;
                let entry: Entry = decode(&v).map_err(|e| StorageIOError::read_logs(&e))?;
                Some(*entry.get_log_id())
            }
        };
        Ok(LogState {
            last_purged_log_id,
            last_log_id: last.or(last_purged_log_id),
        })
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &Vote) -> Result<(), StorageError> {
        let bytes = encode(vote).map_err(|e| StorageIOError::write_vote(&e))?;
        self.db
            .put_cf_opt(self.cf_meta(), keys::META_VOTE, bytes, &sync_opts())
            .map_err(|e| StorageIOError::write_vote(&e))?;
        Ok(())
    }

    async fn read_vote(&mut self) -> Result<Option<Vote>, StorageError> {
        self.get_meta(keys::META_VOTE)
    }

    async fn save_committed(&mut self, committed: Option<LogId>) -> Result<(), StorageError> {
        // Not synced: a committed index lost in a crash is learned again
        // from the leader; it only lets a restart apply sooner.
        let bytes = encode(&committed).map_err(|e| StorageIOError::write(&e))?;
        self.db
            .put_cf(self.cf_meta(), keys::META_COMMITTED, bytes)
            .map_err(|e| StorageIOError::write(&e))?;
        Ok(())
    }

    async fn read_committed(&mut self) -> Result<Option<LogId>, StorageError> {
        Ok(self
            .get_meta::<Option<LogId>>(keys::META_COMMITTED)?
            .flatten())
    }

    async fn append<I>(
        &mut self,
        entries: I,
        callback: LogFlushed<TypeConfig>,
    ) -> Result<(), StorageError>
    where
        I: IntoIterator<Item = Entry> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let mut batch = WriteBatch::default();
        for entry in entries {
            let index = entry.get_log_id().index;
            let bytes = encode(&entry).map_err(|e| StorageIOError::write_logs(&e))?;
            batch.put_cf(self.cf_logs(), keys::log_key(index), bytes);
        }
        self.db
            .write(batch)
            .map_err(|e| StorageIOError::write_logs(&e))?;
        self.flusher.send(callback).map_err(|_| {
            StorageIOError::write_logs(&io_err(std::io::Error::other("log flusher stopped")))
        })?;
        Ok(())
    }

    async fn truncate(&mut self, log_id: LogId) -> Result<(), StorageError> {
        let mut batch = WriteBatch::default();
        batch.delete_range_cf(
            self.cf_logs(),
            keys::log_key(log_id.index),
            keys::log_key(u64::MAX),
        );
        self.db
            .write_opt(batch, &sync_opts())
            .map_err(|e| StorageIOError::write_logs(&e))?;
        Ok(())
    }

    async fn purge(&mut self, log_id: LogId) -> Result<(), StorageError> {
        let bytes = encode(&log_id).map_err(|e| StorageIOError::write_logs(&e))?;
        let mut batch = WriteBatch::default();
        batch.put_cf(self.cf_meta(), keys::META_LAST_PURGED, bytes);
        batch.delete_range_cf(
            self.cf_logs(),
            keys::log_key(0),
            keys::log_key(log_id.index + 1),
        );
        self.db
            .write_opt(batch, &sync_opts())
            .map_err(|e| StorageIOError::write_logs(&e))?;
        Ok(())
    }
}

/// The id of the node that owns this data directory, to refuse starting a
/// directory with another `--id`.
fn stored_u64(db: &DB, key: &[u8]) -> Result<Option<u64>, rocksdb::Error> {
    let cf = db
        .cf_handle(CF_META)
        .expect("column family created at open");
    Ok(db
        .get_cf(cf, key)?
        .and_then(|b| <[u8; 8]>::try_from(b.as_slice()).ok())
        .map(u64::from_be_bytes))
}

fn store_u64(db: &DB, key: &[u8], value: u64) -> Result<(), rocksdb::Error> {
    let cf = db
        .cf_handle(CF_META)
        .expect("column family created at open");
    db.put_cf_opt(cf, key, value.to_be_bytes(), &sync_opts())
}

/// The member id this data directory belongs to, once it has one.
pub fn stored_node_id(db: &DB) -> Result<Option<NodeId>, rocksdb::Error> {
    stored_u64(db, keys::META_NODE_ID)
}

/// The id of the cell this data directory belongs to.
pub fn stored_cluster_id(db: &DB) -> Result<Option<u64>, rocksdb::Error> {
    stored_u64(db, keys::META_CLUSTER_ID)
}

/// Records which member of which cell this directory belongs to.
pub fn store_identity(db: &DB, id: NodeId, cluster_id: u64) -> Result<(), rocksdb::Error> {
    store_u64(db, keys::META_CLUSTER_ID, cluster_id)?;
    store_u64(db, keys::META_NODE_ID, id)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state_machine::store::StateMachineStore;
    use openraft::testing::{StoreBuilder, Suite};

    struct Builder;

    impl StoreBuilder<TypeConfig, LogStore, StateMachineStore, tempfile::TempDir> for Builder {
        async fn build(
            &self,
        ) -> Result<(tempfile::TempDir, LogStore, StateMachineStore), StorageError> {
            let dir = tempfile::tempdir().expect("temp dir");
            let db = crate::storage::open(dir.path()).map_err(|e| StorageIOError::write(&e))?;
            let sm = StateMachineStore::open(dir.path(), None, Default::default())
                .await
                .map_err(|e| StorageIOError::write(&e))?;
            Ok((
                dir,
                LogStore::new(db).map_err(|e| StorageIOError::write(&e))?,
                sm,
            ))
        }
    }

    /// openraft's own conformance suite (~35 tests) over the RocksDB log and
    /// our state machine.
    /// (A plain test: the suite runs its own tokio runtime.)
    #[test]
    fn openraft_storage_conformance() {
        Suite::test_all(Builder).expect("openraft storage suite");
    }
}
