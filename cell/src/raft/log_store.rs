//! The Raft log and vote in RocksDB.
//!
//! Durability: an append is written to RocksDB (readable at once) and its
//! completion callback is handed to the *flusher* thread, which fsyncs the
//! write-ahead log once for every callback that arrived meanwhile and then
//! acknowledges them all; no append is acknowledged before it is on disk.
//! openraft 0.9 waits for each append's fsync before the next append, so
//! in practice one fsync covers one append: group commit happens earlier,
//! in `super::proposer`, which puts concurrent writes into one entry
//! (`latchkey_log_writes_per_fsync` shows it). Votes, truncations and
//! purges are rare and are written with `sync` directly.
//!
//! Purges go through the [`LogPurger`] (`super::log_purger`), which never
//! deletes past the snapshot on disk.

use super::log_purger::LogPurger;
use super::{Entry, LogId, NodeId, StorageError, TypeConfig, Vote};
use crate::metrics_catalog::{LOG_APPENDS_PER_FSYNC, LOG_FSYNC_SECONDS, LOG_WRITES_PER_FSYNC};
use crate::storage::codec::{decode, encode};
use crate::storage::keys::{self, CF_LOGS, CF_META};
use crate::storage::{io_err, read_meta, sync_opts};
use openraft::storage::{LogFlushed, LogState, RaftLogReader, RaftLogStorage};
use openraft::{EntryPayload, OptionalSend, RaftLogId, StorageIOError};
use rocksdb::{Direction, IteratorMode, WriteBatch, DB};
use std::fmt::Debug;
use std::ops::{Bound, RangeBounds};
use std::sync::{mpsc, Arc, Mutex};
use std::thread::JoinHandle;

#[derive(Clone)]
pub struct LogStore {
    db: Arc<DB>,
    flusher: Arc<Flusher>,
    purger: Arc<LogPurger>,
}

/// The flusher thread and the way to it. [`Flusher::stop`] closes the
/// channel and joins the thread, so nothing is inside RocksDB when the
/// process exits (cell review A7: a flusher still in `flush_wal` while the
/// process ran RocksDB's static destructors crashed with SIGSEGV).
struct Flusher {
    tx: Mutex<Option<mpsc::Sender<Flush>>>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

/// An append waiting for its fsync, and how many client writes it holds.
struct Flush {
    callback: LogFlushed<TypeConfig>,
    writes: usize,
}

impl Flusher {
    fn start(db: Arc<DB>) -> std::io::Result<Flusher> {
        let (tx, rx) = mpsc::channel::<Flush>();
        let thread = std::thread::Builder::new()
            .name("raft-log-flusher".into())
            .spawn(move || flusher(db, rx))?;
        Ok(Flusher {
            tx: Mutex::new(Some(tx)),
            thread: Mutex::new(Some(thread)),
        })
    }

    fn send(&self, flush: Flush) -> Result<(), Flush> {
        let tx = self.tx.lock().unwrap_or_else(|e| e.into_inner());
        match tx.as_ref() {
            Some(tx) => tx.send(flush).map_err(|e| e.0),
            None => Err(flush),
        }
    }

    /// Acknowledges what is queued, then ends the thread and waits for it.
    fn stop(&self) {
        drop(self.tx.lock().unwrap_or_else(|e| e.into_inner()).take());
        let thread = self.thread.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(thread) = thread {
            if thread.join().is_err() {
                tracing::error!("the log flusher thread panicked");
            }
        }
    }
}

/// The last store clone gone (openraft dropped its copies) also ends the
/// thread, and waits for it.
impl Drop for Flusher {
    fn drop(&mut self) {
        self.stop();
    }
}

impl LogStore {
    /// Opens the store over `db` and starts its flusher thread, which runs
    /// until [`LogStore::stop_flusher`].
    pub fn new(db: Arc<DB>, purger: Arc<LogPurger>) -> std::io::Result<Self> {
        let flusher = Arc::new(Flusher::start(db.clone())?);
        Ok(LogStore {
            db,
            flusher,
            purger,
        })
    }

    /// Acknowledges the appends already queued, then stops and joins the
    /// flusher thread; later appends fail. Called once Raft has shut down.
    pub fn stop_flusher(&self) {
        self.flusher.stop();
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
        read_meta(&self.db, key).map_err(|e| StorageIOError::read(&e).into())
    }

    #[allow(clippy::result_large_err)]
    fn last_purged(&self) -> Result<Option<LogId>, StorageError> {
        self.get_meta(keys::META_LAST_PURGED)
    }
}

/// Fsyncs the write-ahead log once per batch of waiting appends.
fn flusher(db: Arc<DB>, rx: mpsc::Receiver<Flush>) {
    while let Ok(first) = rx.recv() {
        let mut batch = vec![first];
        while let Ok(more) = rx.try_recv() {
            batch.push(more);
        }
        let started = std::time::Instant::now();
        let result = db.flush_wal(true);
        crate::crash_point!(crate::chaos::LOG_APPEND_AFTER_FSYNC);
        metrics::histogram!(LOG_FSYNC_SECONDS.name).record(started.elapsed().as_secs_f64());
        metrics::histogram!(LOG_APPENDS_PER_FSYNC.name).record(batch.len() as f64);
        let writes: usize = batch.iter().map(|f| f.writes).sum();
        if writes > 0 {
            metrics::histogram!(LOG_WRITES_PER_FSYNC.name).record(writes as f64);
        }
        for flush in batch {
            flush
                .callback
                .log_io_completed(result.clone().map_err(io_err));
        }
    }
}

/// Bytes of stored entries one AppendEntries carries at most (a larger
/// single entry goes alone). openraft 0.9 gives every AppendEntries the
/// heartbeat interval as its whole timeout and bounds a batch only by
/// `max_payload_entries`; entries that group commit filled (up to
/// `--max-request-bytes` each) made a 32-entry batch many megabytes, which
/// a loaded follower could not take within the interval, so the batch
/// timed out and was resent, and writes waited past their timeout (seen
/// with 100 000 leased keys written in 128-put txns, debug build, 2 cores).
pub const MAX_APPEND_BYTES: usize = 1024 * 1024;

impl LogStore {
    /// The entries with an index in `range`, in order, stopping before the
    /// entry that would take their stored size over `max_bytes` (never
    /// before the first).
    fn read_entries(
        &self,
        range: impl RangeBounds<u64>,
        max_bytes: usize,
    ) -> Result<Vec<Entry>, StorageError> {
        let start = match range.start_bound() {
            Bound::Included(x) => *x,
            Bound::Excluded(x) => *x + 1,
            Bound::Unbounded => 0,
        };
        let mut out = Vec::new();
        let mut bytes = 0usize;
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
            bytes = bytes.saturating_add(v.len());
            if bytes > max_bytes && !out.is_empty() {
                break;
            }
            let entry: Entry = decode(&v).map_err(|e| StorageIOError::read_logs(&e))?;
            out.push(entry);
        }
        Ok(out)
    }
}

impl RaftLogReader<TypeConfig> for LogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + OptionalSend>(
        &mut self,
        range: RB,
    ) -> Result<Vec<Entry>, StorageError> {
        self.read_entries(range, usize::MAX)
    }

    /// What replication sends: at most [`MAX_APPEND_BYTES`] of entries.
    async fn limited_get_log_entries(
        &mut self,
        start: u64,
        end: u64,
    ) -> Result<Vec<Entry>, StorageError> {
        self.read_entries(start..end, MAX_APPEND_BYTES)
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
        crate::crash_point!(crate::chaos::VOTE_SAVE);
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
        let mut writes = 0;
        for entry in entries {
            if let EntryPayload::Normal(req) = &entry.payload {
                writes += req.writes();
            }
            let index = entry.get_log_id().index;
            let bytes = encode(&entry).map_err(|e| StorageIOError::write_logs(&e))?;
            batch.put_cf(self.cf_logs(), keys::log_key(index), bytes);
        }
        self.db
            .write(batch)
            .map_err(|e| StorageIOError::write_logs(&e))?;
        crate::crash_point!(crate::chaos::LOG_APPEND_BEFORE_FSYNC);
        if self.flusher.send(Flush { callback, writes }).is_err() {
            let stopped = std::io::Error::other("log flusher stopped");
            return Err(StorageIOError::write_logs(&stopped).into());
        }
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
        self.purger
            .request(log_id)
            .map_err(|e| StorageIOError::write_logs(&e))?;
        Ok(())
    }
}

/// Records that the log starts after `at` (a new member restored from a
/// state file has its image at `at` and no entries up to it).
pub fn mark_purged_through(db: &DB, at: LogId) -> std::io::Result<()> {
    super::log_purger::delete_through(db, at)
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
    use crate::raft::snapshot_data::SnapshotData;
    use crate::raft::SnapshotMeta;
    use crate::state_machine::store::StateMachineStore;
    use openraft::storage::{RaftSnapshotBuilder, RaftStateMachine};
    use openraft::testing::{StoreBuilder, Suite};

    struct Builder;

    impl StoreBuilder<TypeConfig, LogStore, StateMachineStore, tempfile::TempDir> for Builder {
        async fn build(
            &self,
        ) -> Result<(tempfile::TempDir, LogStore, StateMachineStore), StorageError> {
            let dir = tempfile::tempdir().expect("temp dir");
            let db = crate::storage::open(dir.path()).map_err(|e| StorageIOError::write(&e))?;
            let sm = StateMachineStore::open(dir.path(), None, Default::default(), None)
                .await
                .map_err(|e| StorageIOError::write(&e))?;
            let purger = LogPurger::ungated(db.clone());
            Ok((
                dir,
                LogStore::new(db, purger).map_err(|e| StorageIOError::write(&e))?,
                sm,
            ))
        }
    }

    fn put(index: u64) -> Entry {
        Entry {
            log_id: LogId::new(openraft::CommittedLeaderId::new(1, 1), index),
            payload: openraft::EntryPayload::Normal(crate::raft::command::Request::Put(
                latchkey_shared::etcdpb::PbPutRequest {
                    key: format!("k{index}").into_bytes(),
                    value: b"v".to_vec(),
                    ..Default::default()
                },
            )),
        }
    }

    struct Member {
        db: Arc<DB>,
        log: LogStore,
        sm: StateMachineStore,
    }

    async fn open_member(dir: &std::path::Path) -> Member {
        let db = crate::storage::open(dir).expect("open the log");
        let purger = LogPurger::gated(db.clone()).expect("purger");
        let sm = StateMachineStore::open(dir, None, Default::default(), Some(purger.clone()))
            .await
            .expect("open the state machine");
        let log = LogStore::new(db.clone(), purger).expect("log store");
        Member { db, log, sm }
    }

    /// Appends, commits and applies entries `from..=to`.
    async fn write(m: &mut Member, from: u64, to: u64) {
        use openraft::storage::RaftLogStorageExt;
        let entries: Vec<Entry> = (from..=to).map(put).collect();
        m.log
            .blocking_append(entries.clone())
            .await
            .expect("append");
        let last = *entries.last().expect("entries").get_log_id();
        m.log.save_committed(Some(last)).await.expect("commit");
        m.sm.apply(entries).await.expect("apply");
    }

    fn leader_snapshot(index: u64) -> (SnapshotMeta, Box<SnapshotData>) {
        use std::io::Write;
        let image = encode(&crate::state_machine::CellState::default().image()).expect("image");
        let mut file = tempfile::tempfile().expect("temp file");
        file.write_all(&image).expect("write the image");
        let data = SnapshotData::new(file, 0).expect("image");
        let meta = SnapshotMeta {
            last_log_id: Some(LogId::new(openraft::CommittedLeaderId::new(2, 2), index)),
            snapshot_id: format!("leader-{index}"),
            ..Default::default()
        };
        (meta, Box::new(data))
    }

    /// A2 (cell review): openraft purges the log as soon as it has asked
    /// the state machine to install a snapshot, before the snapshot is on
    /// disk. A crash in between left the old snapshot with the log after it
    /// deleted, and the member could not start again.
    #[tokio::test]
    async fn a2_a_crash_while_a_snapshot_installs_restarts_from_the_old_one_and_its_log() {
        let dir = tempfile::tempdir().expect("temp dir");
        let mut m = open_member(dir.path()).await;
        write(&mut m, 1, 10).await;
        m.sm.get_snapshot_builder()
            .await
            .build_snapshot()
            .await
            .expect("a snapshot at 10");
        write(&mut m, 11, 20).await;
        // A leader's snapshot at 30 arrives; openraft purges through it
        // while the state machine is still writing it; then the crash.
        let (meta, _) = leader_snapshot(30);
        m.log
            .purge(meta.last_log_id.expect("id"))
            .await
            .expect("purge");
        drop(m);

        let mut m = open_member(dir.path()).await;
        openraft::storage::StorageHelper::new(&mut m.log, &mut m.sm)
            .get_initial_state()
            .await
            .expect("the member starts again");
        let (applied, _) = m.sm.applied_state().await.expect("applied");
        assert_eq!(applied.map(|l| l.index), Some(20), "re-applied 11..=20");
        let state = m.log.get_log_state().await.expect("log state");
        assert_eq!(state.last_purged_log_id.map(|l| l.index), Some(10));
    }

    /// A2, the other half: once the installed snapshot is on disk, the
    /// purge openraft asked for is carried out.
    #[tokio::test]
    async fn a2_the_purge_completes_once_the_installed_snapshot_is_on_disk() {
        let dir = tempfile::tempdir().expect("temp dir");
        let mut m = open_member(dir.path()).await;
        write(&mut m, 1, 20).await;
        let (meta, data) = leader_snapshot(30);
        m.log
            .purge(meta.last_log_id.expect("id"))
            .await
            .expect("purge");
        assert_eq!(
            m.log.try_get_log_entries(0..).await.expect("read").len(),
            20
        );
        m.sm.install_snapshot(&meta, data).await.expect("install");
        assert!(m
            .log
            .try_get_log_entries(0..)
            .await
            .expect("read")
            .is_empty());
        let state = m.log.get_log_state().await.expect("log state");
        assert_eq!(state.last_purged_log_id, meta.last_log_id);
    }

    /// A7 (cell review): the flusher thread was never joined, so it could
    /// still be inside RocksDB when the process exited (SIGSEGV, or
    /// "pthread lock: Invalid argument" and an abort). Once the last store
    /// is dropped, the thread is gone and holds no database.
    #[tokio::test]
    async fn a7_dropping_the_log_store_joins_the_flusher_and_releases_the_database() {
        let dir = tempfile::tempdir().expect("temp dir");
        let mut m = open_member(dir.path()).await;
        write(&mut m, 1, 50).await;
        let Member { db, log, sm } = m;
        drop(sm);
        drop(log);
        assert_eq!(
            Arc::strong_count(&db),
            1,
            "the flusher let go of the database"
        );
    }

    fn put_of(index: u64, value_bytes: usize) -> Entry {
        let mut entry = put(index);
        if let openraft::EntryPayload::Normal(crate::raft::command::Request::Put(p)) =
            &mut entry.payload
        {
            p.value = vec![b'v'; value_bytes];
        }
        entry
    }

    /// Replication reads a byte-bounded prefix of what it asks for, so one
    /// AppendEntries of full entries fits its heartbeat-long timeout; an
    /// entry larger than the bound goes alone, and nothing is skipped.
    #[tokio::test]
    async fn replication_reads_at_most_a_megabyte_of_entries_and_never_none() {
        use openraft::storage::RaftLogStorageExt;
        let dir = tempfile::tempdir().expect("temp dir");
        let mut m = open_member(dir.path()).await;
        let value = 300 * 1024;
        let mut entries: Vec<Entry> = (1..=10).map(|i| put_of(i, value)).collect();
        entries.push(put_of(11, 3 * MAX_APPEND_BYTES));
        m.log.blocking_append(entries).await.expect("append");

        let mut next = 1;
        let mut batches = Vec::new();
        while next <= 11 {
            let batch = m.log.limited_get_log_entries(next, 12).await.expect("read");
            assert!(!batch.is_empty(), "a read from {next} returned nothing");
            let indexes: Vec<u64> = batch.iter().map(|e| e.log_id.index).collect();
            let expected: Vec<u64> = (next..next + batch.len() as u64).collect();
            assert_eq!(
                indexes, expected,
                "entries in order from {next}, none skipped"
            );
            let bytes: usize = batch.iter().map(|e| encode(e).expect("encode").len()).sum();
            assert!(
                batch.len() == 1 || bytes <= MAX_APPEND_BYTES,
                "{} entries of {bytes} bytes in one read",
                batch.len()
            );
            next += batch.len() as u64;
            batches.push(batch.len());
        }
        assert_eq!(batches, vec![3, 3, 3, 1, 1], "3 of 300 KiB per megabyte");
        assert_eq!(
            m.log.try_get_log_entries(1..12).await.expect("read").len(),
            11,
            "reads that are not replication get every entry"
        );
    }

    /// openraft's own conformance suite (~35 tests) over the RocksDB log and
    /// our state machine.
    /// (A plain test: the suite runs its own tokio runtime.)
    #[test]
    fn openraft_storage_conformance() {
        Suite::test_all(Builder).expect("openraft storage suite");
    }
}
