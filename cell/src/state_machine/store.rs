//! openraft's `RaftStateMachine` over a shared [`CellState`].
//!
//! The state lives in memory behind a std `RwLock` (readers take it for one
//! range scan, apply for one batch; never across an `.await`). It is made
//! durable by snapshots: a snapshot clones the state (O(1): the maps are
//! persistent), serialises the clone on a blocking thread while apply goes
//! on, and replaces `snapshot.bin` atomically. A restart loads that file and
//! openraft replays the log after it.

use super::{CellState, StateImage};
use crate::metrics_catalog::{
    APPLIED_INDEX, KEYS, KEYSPACE_BYTES, LEASES, REVISION, SNAPSHOTS_BUILT, SNAPSHOTS_INSTALLED,
    SNAPSHOT_BUILD_SECONDS, SNAPSHOT_INSTALLED_BYTES, TENANT_BYTES, TENANT_KEYS,
};
use crate::mvcc::lease_table::LeaseSeed;
use crate::mvcc::tenants::Usage;
use crate::raft::command::{Reply, Request, Response};
use crate::raft::log_purger::LogPurger;
use crate::raft::snapshot_data::SnapshotData;
use crate::raft::{
    Entry, LogId, Snapshot, SnapshotMeta, StorageError, StoredMembership, TypeConfig,
};
use crate::state_machine::snapshot_file::{
    open_snapshot, read_snapshot_file, receiving_snapshot, write_first_snapshot, SnapshotDir,
    SnapshotFile,
};
use crate::state_machine::watch_hub::WatchHub;
use crate::storage::codec::{decode, encode};
use openraft::storage::{RaftSnapshotBuilder, RaftStateMachine};
use openraft::{EntryPayload, OptionalSend, RaftLogId, StorageIOError};
use std::collections::BTreeSet;
use std::panic::AssertUnwindSafe;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use tokio::sync::watch;

/// What apply tells the leader's lessor (which lives above the state
/// machine, in `crate::lease`) about leases: every member's lessor follows
/// grants, removals and checkpoints as they are applied.
pub trait LeaseObserver: Send + Sync {
    /// Starts over from loaded state (startup, snapshot install).
    fn load(&self, leases: &[LeaseSeed], now: tokio::time::Instant);
    fn on_grant(&self, id: i64, ttl: i64, now: tokio::time::Instant);
    fn on_remove(&self, id: i64);
    fn on_checkpoint(&self, entries: &[(i64, i64)], now: tokio::time::Instant);
}

/// The shared view of the state machine that API handlers read.
#[derive(Clone)]
pub struct SharedState {
    state: Arc<RwLock<CellState>>,
    applied: watch::Receiver<u64>,
}

impl SharedState {
    /// Runs `f` on the current state under the read lock.
    pub fn read<T>(&self, f: impl FnOnce(&CellState) -> T) -> T {
        let guard = self.state.read().unwrap_or_else(|e| e.into_inner());
        f(&guard)
    }

    /// Waits until the state machine has applied `index`.
    pub async fn wait_applied(&self, index: u64) -> bool {
        let mut rx = self.applied.clone();
        let ok = rx.wait_for(|applied| *applied >= index).await.is_ok();
        ok
    }
}

pub struct StateMachineStore {
    state: Arc<RwLock<CellState>>,
    files: Arc<SnapshotDir>,
    applied_tx: watch::Sender<u64>,
    applied_rx: watch::Receiver<u64>,
    lessor: Option<Arc<dyn LeaseObserver>>,
    hub: Arc<WatchHub>,
    snapshot_seq: Arc<AtomicU64>,
    /// The tenants whose use the gauges show.
    tenant_gauges: BTreeSet<String>,
}

/// Makes `state` the starting point of a new member in `dir` (a restore):
/// a snapshot at log position `at` holding the cell's first membership. The
/// caller marks the log purged through `at`, so the log builds on the image
/// and a member that joins later is sent the image, not a log that starts
/// from nothing (cell review S2).
pub fn write_restored_state(
    dir: &Path,
    mut state: CellState,
    at: LogId,
    membership: StoredMembership,
) -> std::io::Result<()> {
    state.last_applied = Some(at);
    state.last_membership = membership.clone();
    let data = encode(&state.image()).map_err(std::io::Error::other)?;
    let file = SnapshotFile {
        meta: SnapshotMeta {
            last_log_id: Some(at),
            last_membership: membership,
            snapshot_id: "restored".to_string(),
        },
        data,
    };
    write_first_snapshot(dir, &file)
}

impl StateMachineStore {
    /// Sets each tenant's gauges; a tenant deleted since the last batch
    /// shows 0 (the metrics crate keeps a series once made).
    fn export_tenant_use(&mut self, tenant_use: Vec<(String, Usage)>) {
        let now: BTreeSet<String> = tenant_use.iter().map(|(name, _)| name.clone()).collect();
        let gone = self.tenant_gauges.difference(&now).cloned();
        let zeros = gone
            .map(|name| (name, Usage::default()))
            .collect::<Vec<_>>();
        for (tenant, usage) in tenant_use.into_iter().chain(zeros) {
            metrics::gauge!(TENANT_KEYS.name, "tenant" => tenant.clone()).set(usage.keys as f64);
            metrics::gauge!(TENANT_BYTES.name, "tenant" => tenant).set(usage.bytes as f64);
        }
        self.tenant_gauges = now;
    }

    /// Opens the state machine of `dir`, starting from its snapshot if any.
    /// `purger` learns of every snapshot made durable.
    pub async fn open(
        dir: &Path,
        lessor: Option<Arc<dyn LeaseObserver>>,
        hub: Arc<WatchHub>,
        purger: Option<Arc<LogPurger>>,
    ) -> std::io::Result<Self> {
        let (state, on_disk) = match read_snapshot_file(dir)? {
            Some(file) => {
                let image: StateImage = decode(&file.data).map_err(std::io::Error::other)?;
                (CellState::from_image(image), Some(file.meta.last_log_id))
            }
            None => (CellState::default(), None),
        };
        let files = Arc::new(SnapshotDir::open(dir, on_disk, purger)?);
        let applied = state.last_applied.map_or(0, |l| l.index);
        if let Some(lessor) = &lessor {
            lessor.load(&state.leases.seeds(), tokio::time::Instant::now());
        }
        let (applied_tx, applied_rx) = watch::channel(applied);
        Ok(StateMachineStore {
            tenant_gauges: BTreeSet::new(),
            state: Arc::new(RwLock::new(state)),
            files,
            applied_tx,
            applied_rx,
            lessor,
            hub,
            snapshot_seq: Arc::new(AtomicU64::new(0)),
        })
    }

    pub fn shared(&self) -> SharedState {
        SharedState {
            state: self.state.clone(),
            applied: self.applied_rx.clone(),
        }
    }

    fn write_lock(&self) -> std::sync::RwLockWriteGuard<'_, CellState> {
        self.state.write().unwrap_or_else(|e| e.into_inner())
    }

    /// Tells the lessor what an applied request changed.
    fn notify_lessor(&self, req: &Request, resp: &Response) {
        let Some(lessor) = &self.lessor else { return };
        let now = tokio::time::Instant::now();
        match (req, &resp.result) {
            (Request::Batch(reqs), Ok(Reply::Batch(resps))) => reqs
                .iter()
                .zip(resps)
                .for_each(|(req, resp)| self.notify_lessor(req, resp)),
            (_, Ok(Reply::LeaseGranted { id, ttl })) => lessor.on_grant(*id, *ttl, now),
            (Request::LeaseRevoke { id }, Ok(_)) => lessor.on_remove(*id),
            (_, Ok(Reply::LeasesExpired { expired })) => {
                expired.iter().for_each(|id| lessor.on_remove(*id))
            }
            (Request::LeaseCheckpoint { entries }, Ok(_)) => lessor.on_checkpoint(entries, now),
            _ => {}
        }
    }
}

pub struct SnapshotBuilder {
    state: CellState,
    files: Arc<SnapshotDir>,
    seq: u64,
}

impl RaftSnapshotBuilder<TypeConfig> for SnapshotBuilder {
    async fn build_snapshot(&mut self) -> Result<Snapshot, StorageError> {
        let state = std::mem::take(&mut self.state);
        let files = self.files.clone();
        let seq = self.seq;
        let started = std::time::Instant::now();
        let (meta, bytes, snapshot) = tokio::task::spawn_blocking(
            move || -> std::io::Result<(SnapshotMeta, usize, Option<(SnapshotMeta, SnapshotData)>)> {
                let image = state.image();
                let data = encode(&image).map_err(std::io::Error::other)?;
                let snapshot_id = match image.last_applied {
                    Some(l) => format!("{}-{}-{}", l.leader_id.term, l.index, seq),
                    None => format!("0-0-{seq}"),
                };
                let meta = SnapshotMeta {
                    last_log_id: image.last_applied,
                    last_membership: image.last_membership.clone(),
                    snapshot_id,
                };
                let bytes = data.len();
                // An install may have put a newer image on disk meanwhile;
                // then this one is not written, and what is returned is the
                // newer one (openraft ignores an older build anyway).
                files.replace(&SnapshotFile {
                    meta: meta.clone(),
                    data,
                })?;
                Ok((meta, bytes, open_snapshot(files.path())?))
            },
        )
        .await
        .map_err(|e| StorageIOError::write_snapshot(None, &e))?
        .map_err(|e| StorageIOError::write_snapshot(None, &e))?;
        let Some((on_disk, data)) = snapshot else {
            let gone = std::io::Error::other("the snapshot file vanished after it was written");
            return Err(StorageIOError::write_snapshot(None, &gone).into());
        };
        metrics::histogram!(SNAPSHOT_BUILD_SECONDS.name).record(started.elapsed().as_secs_f64());
        metrics::counter!(SNAPSHOTS_BUILT.name).increment(1);
        tracing::info!(snapshot_id = %meta.snapshot_id, bytes, "snapshot built");
        Ok(Snapshot {
            meta: on_disk,
            snapshot: Box::new(data),
        })
    }
}

impl RaftStateMachine<TypeConfig> for StateMachineStore {
    type SnapshotBuilder = SnapshotBuilder;

    async fn applied_state(&mut self) -> Result<(Option<LogId>, StoredMembership), StorageError> {
        let s = self.state.read().unwrap_or_else(|e| e.into_inner());
        Ok((s.last_applied, s.last_membership.clone()))
    }

    async fn apply<I>(&mut self, entries: I) -> Result<Vec<Response>, StorageError>
    where
        I: IntoIterator<Item = Entry> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let mut out = Vec::new();
        let mut last_index = None;
        let mut changes = Vec::new();
        let tenant_use: Vec<(String, Usage)>;
        {
            let mut s = self.write_lock();
            // O(1): the maps are persistent. What the state goes back to if
            // apply panics, so no half-applied batch is ever served.
            let before = s.clone();
            let applied = std::panic::catch_unwind(AssertUnwindSafe(|| {
                for entry in entries {
                    let log_id = *entry.get_log_id();
                    #[cfg(test)]
                    tests::maybe_panic(log_id.index);
                    s.last_applied = Some(log_id);
                    last_index = Some(log_id.index);
                    let resp = match &entry.payload {
                        EntryPayload::Blank => Response {
                            revision: s.keys.revision(),
                            result: Ok(Reply::None),
                        },
                        EntryPayload::Membership(m) => {
                            s.last_membership = StoredMembership::new(Some(log_id), m.clone());
                            Response {
                                revision: s.keys.revision(),
                                result: Ok(Reply::None),
                            }
                        }
                        EntryPayload::Normal(req) => {
                            s.writes_applied += req.writes() as u64;
                            let resp = s.apply(log_id.index, req);
                            self.notify_lessor(req, &resp);
                            changes.extend(s.keys.take_changes());
                            resp
                        }
                    };
                    out.push(resp);
                }
            }));
            if applied.is_err() {
                // A bug, not an input: apply is deterministic, so every
                // member would fail alike. Stop applying (openraft stops
                // this member on a storage error) and keep serving only
                // what was whole before this batch.
                *s = before;
                let at = last_index.unwrap_or_default();
                tracing::error!(index = at, "apply panicked; this member stops");
                let log_id = s.last_applied.unwrap_or_default();
                return Err(StorageIOError::apply(
                    log_id,
                    &std::io::Error::other(format!("apply panicked at log index {at}")),
                )
                .into());
            }
            metrics::gauge!(REVISION.name).set(s.keys.revision() as f64);
            metrics::gauge!(KEYS.name).set(s.keys.live_keys() as f64);
            metrics::gauge!(LEASES.name).set(s.leases.len() as f64);
            metrics::gauge!(KEYSPACE_BYTES.name).set(s.keys.bytes() as f64);
            tenant_use = s
                .keys
                .tenants()
                .iter()
                .map(|t| (t.record.name.clone(), t.usage))
                .collect();
        }
        self.export_tenant_use(tenant_use);
        // Watchers hear of the changes once the state holds them.
        self.hub.publish(changes, std::time::Instant::now());
        if let Some(index) = last_index {
            metrics::gauge!(APPLIED_INDEX.name).set(index as f64);
            self.applied_tx.send_replace(index);
        }
        Ok(out)
    }

    async fn get_snapshot_builder(&mut self) -> Self::SnapshotBuilder {
        let state = self.state.read().unwrap_or_else(|e| e.into_inner()).clone();
        let seq = self.snapshot_seq.fetch_add(1, Ordering::Relaxed);
        SnapshotBuilder {
            state,
            files: self.files.clone(),
            seq,
        }
    }

    async fn begin_receiving_snapshot(&mut self) -> Result<Box<SnapshotData>, StorageError> {
        let data = receiving_snapshot(self.files.path())
            .map_err(|e| StorageIOError::write_snapshot(None, &e))?;
        Ok(Box::new(data))
    }

    async fn install_snapshot(
        &mut self,
        meta: &SnapshotMeta,
        mut snapshot: Box<SnapshotData>,
    ) -> Result<(), StorageError> {
        let data = snapshot
            .read_all()
            .await
            .map_err(|e| StorageIOError::read_snapshot(Some(meta.signature()), &e))?;
        metrics::gauge!(SNAPSHOT_INSTALLED_BYTES.name).set(data.len() as f64);
        // Decoding the image, building the maps and writing the file take
        // seconds of CPU for a large state: a blocking thread does them,
        // not a tokio worker (cell review P7).
        let files = self.files.clone();
        let file_meta = meta.clone();
        let state = tokio::task::spawn_blocking(move || -> std::io::Result<CellState> {
            let image: StateImage = decode(&data).map_err(std::io::Error::other)?;
            let mut state = CellState::from_image(image);
            // The meta is authoritative for what the snapshot covers.
            state.last_applied = file_meta.last_log_id;
            state.last_membership = file_meta.last_membership.clone();
            // Only then may the log be purged through it (cell review A2).
            files.replace(&SnapshotFile {
                meta: file_meta,
                data,
            })?;
            Ok(state)
        })
        .await
        .map_err(|e| StorageIOError::read_snapshot(Some(meta.signature()), &e))?
        .map_err(|e| StorageIOError::read_snapshot(Some(meta.signature()), &e))?;
        let applied = state.last_applied.map_or(0, |l| l.index);
        let leases = state.leases.seeds();
        let replaced = std::mem::replace(&mut *self.write_lock(), state);
        // Freeing the old state is as large a job as building the new one.
        tokio::task::spawn_blocking(move || drop(replaced));
        if let Some(lessor) = &self.lessor {
            lessor.load(&leases, tokio::time::Instant::now());
        }
        self.applied_tx.send_replace(applied);
        self.hub.reset();
        metrics::counter!(SNAPSHOTS_INSTALLED.name).increment(1);
        tracing::info!(snapshot_id = %meta.snapshot_id, applied, "snapshot installed");
        Ok(())
    }

    async fn get_current_snapshot(&mut self) -> Result<Option<Snapshot>, StorageError> {
        let files = self.files.clone();
        let current = tokio::task::spawn_blocking(move || open_snapshot(files.path()))
            .await
            .map_err(|e| StorageIOError::read_snapshot(None, &e))?
            .map_err(|e| StorageIOError::read_snapshot(None, &e))?;
        Ok(current.map(|(meta, data)| Snapshot {
            meta,
            snapshot: Box::new(data),
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::raft::LogId;
    use latchkey_shared::etcdpb::PbPutRequest;
    use std::cell::Cell;

    thread_local! {
        /// The log index at which apply panics on this thread, if any.
        /// Per thread, so tests running beside this one are untouched.
        static PANIC_AT: Cell<Option<u64>> = const { Cell::new(None) };
    }

    pub(super) fn maybe_panic(index: u64) {
        if PANIC_AT.with(Cell::get) == Some(index) {
            panic!("injected panic in apply at index {index}");
        }
    }

    fn put(index: u64, key: &str) -> Entry {
        Entry {
            log_id: LogId::new(openraft::CommittedLeaderId::new(1, 1), index),
            payload: EntryPayload::Normal(Request::Put(PbPutRequest {
                key: key.as_bytes().to_vec(),
                value: b"v".to_vec(),
                ..Default::default()
            })),
        }
    }

    #[tokio::test]
    async fn a_panic_in_apply_fails_the_batch_and_leaves_the_state_as_before_it() {
        let dir = tempfile::tempdir().expect("temp dir");
        let mut sm = StateMachineStore::open(dir.path(), None, Default::default(), None)
            .await
            .expect("open");
        sm.apply([put(1, "a")]).await.expect("first batch applies");
        let shared = sm.shared();
        let revision_before = shared.read(|s| s.keys.revision());
        PANIC_AT.with(|p| p.set(Some(3)));
        let failed = sm.apply([put(2, "b"), put(3, "c")]).await;
        PANIC_AT.with(|p| p.set(None));
        assert!(failed.is_err(), "a panicking apply must fail");
        // Neither "b" (applied before the panic) nor "c" is visible: the
        // batch is undone, not half-applied.
        let (revision, applied, keys) =
            shared.read(|s| (s.keys.revision(), s.last_applied, s.keys.live_keys()));
        assert_eq!(revision, revision_before);
        assert_eq!(applied.map(|l| l.index), Some(1));
        assert_eq!(keys, 1);
    }
}
