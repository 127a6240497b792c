//! etcd v3 `Maintenance` service: Status, Alarm, Snapshot (the portable
//! state file `--restore` reads), Defragment (compacts this member's Raft
//! log storage) and MoveLeader. Hash, HashKV and Downgrade are answered
//! `unimplemented`.

use super::not_built;
use crate::mvcc::keyspace::KeySpace;
use crate::node::CellNode;
use crate::ops::auth_gate::AuthGate;
use crate::state_machine::backup::encode_state_file;
use latchkey_shared::etcdpb::{
    PbAlarmRequest, PbAlarmResponse, PbDefragmentRequest, PbDefragmentResponse, PbDowngradeRequest,
    PbDowngradeResponse, PbHashKvRequest, PbHashKvResponse, PbHashRequest, PbHashResponse,
    PbMaintenanceService, PbMoveLeaderRequest, PbMoveLeaderResponse, PbSnapshotRequest,
    PbSnapshotResponse, PbStatusRequest, PbStatusResponse,
};
use latchkey_shared::ApiError;
use std::pin::Pin;
use std::sync::Arc;
use tokio_stream::Stream;
use tonic::{Request, Response, Status};

/// Bytes per Snapshot response message.
const SNAPSHOT_CHUNK_BYTES: usize = 64 * 1024;

/// The etcd API version latchkey speaks; clients use it for feature checks.
pub const ETCD_API_VERSION: &str = "3.5.0";

pub struct MaintenanceService {
    pub node: Arc<CellNode>,
    /// Admin only once authentication is on (etcd's rule).
    pub gate: Arc<AuthGate>,
}

#[tonic::async_trait]
impl PbMaintenanceService for MaintenanceService {
    async fn alarm(
        &self,
        request: Request<PbAlarmRequest>,
    ) -> Result<Response<PbAlarmResponse>, Status> {
        self.gate
            .caller(request.metadata())?
            .require_admin("alarms")?;
        // latchkey raises no alarms: quota is enforced per request instead
        // of by a sticky NOSPACE alarm.
        Ok(Response::new(PbAlarmResponse {
            header: Some(self.node.header_now()),
            alarms: vec![],
        }))
    }

    async fn status(
        &self,
        _request: Request<PbStatusRequest>,
    ) -> Result<Response<PbStatusResponse>, Status> {
        let m = self.node.raft.metrics().borrow().clone();
        let is_learner = !m
            .membership_config
            .membership()
            .voter_ids()
            .any(|id| id == self.node.id);
        let (revision, bytes) = self
            .node
            .state
            .read(|s| (s.keys.revision(), s.keys.bytes()));
        let mut errors = Vec::new();
        if m.current_leader.is_none() {
            errors.push(ApiError::no_leader().message);
        }
        Ok(Response::new(PbStatusResponse {
            header: Some(self.node.header(revision)),
            version: ETCD_API_VERSION.to_string(),
            db_size: (crate::storage::stored_bytes(&self.node.db) + bytes) as i64,
            leader: m.current_leader.unwrap_or(0),
            raft_index: m.last_log_index.unwrap_or(0),
            raft_term: m.current_term,
            raft_applied_index: m.last_applied.map_or(0, |l| l.index),
            errors,
            db_size_in_use: bytes as i64,
            is_learner,
            storage_version: String::new(),
            db_size_quota: self.node.limits.quota_bytes as i64,
            ..Default::default()
        }))
    }

    async fn defragment(
        &self,
        request: Request<PbDefragmentRequest>,
    ) -> Result<Response<PbDefragmentResponse>, Status> {
        self.gate
            .caller(request.metadata())?
            .require_admin("defragment")?;
        // The keyspace lives in memory and is rebuilt compactly by every
        // snapshot; what can fragment is the log store, so take a snapshot
        // (which purges the log behind it) and compact RocksDB.
        let _ = self.node.raft.trigger().snapshot().await;
        let db = self.node.db.clone();
        tokio::task::spawn_blocking(move || crate::storage::compact(&db))
            .await
            .map_err(|e| ApiError::internal(e.to_string()))?;
        Ok(Response::new(PbDefragmentResponse {
            header: Some(self.node.header_now()),
        }))
    }

    /// A hash of this member's whole keyspace history, as it has applied
    /// it (not linearizable, as in etcd: operators ask each member).
    async fn hash(
        &self,
        request: Request<PbHashRequest>,
    ) -> Result<Response<PbHashResponse>, Status> {
        self.gate
            .caller(request.metadata())?
            .require_admin("hash")?;
        let keys = self.node.state.read(|s| s.keys.clone());
        let revision = keys.revision();
        let hash = hash_until(keys, revision).await?;
        Ok(Response::new(PbHashResponse {
            header: Some(self.node.header(revision)),
            hash,
        }))
    }

    /// A hash of this member's history up to a revision (0: now): members
    /// that applied the same log give the same hash for the same revision.
    async fn hash_kv(
        &self,
        request: Request<PbHashKvRequest>,
    ) -> Result<Response<PbHashKvResponse>, Status> {
        self.gate
            .caller(request.metadata())?
            .require_admin("hash_kv")?;
        let keys = self.node.state.read(|s| s.keys.clone());
        let revision = keys.check_readable(request.get_ref().revision)?;
        let current = keys.revision();
        let compact_revision = keys.compact_revision();
        let hash = hash_until(keys, revision).await?;
        Ok(Response::new(PbHashKvResponse {
            header: Some(self.node.header(current)),
            hash,
            compact_revision,
            hash_revision: revision,
        }))
    }

    type SnapshotStream =
        Pin<Box<dyn Stream<Item = Result<PbSnapshotResponse, Status>> + Send + 'static>>;

    async fn snapshot(
        &self,
        request: Request<PbSnapshotRequest>,
    ) -> Result<Response<Self::SnapshotStream>, Status> {
        self.gate
            .caller(request.metadata())?
            .require_admin("a snapshot")?;
        // A consistent point: one clone of this member's applied state
        // (O(1)), encoded off the async threads.
        let state = self.node.state.read(|s| s.clone());
        let revision = state.keys.revision();
        let file = tokio::task::spawn_blocking(move || encode_state_file(&state))
            .await
            .map_err(|e| ApiError::internal(e.to_string()))?
            .map_err(|e| ApiError::internal(format!("{e:#}")))?;
        let header = self.node.header(revision);
        let total = file.len();
        let mut sent = 0;
        let chunks: Vec<Result<PbSnapshotResponse, Status>> = file
            .chunks(SNAPSHOT_CHUNK_BYTES)
            .map(|chunk| {
                sent += chunk.len();
                Ok(PbSnapshotResponse {
                    header: Some(header),
                    remaining_bytes: (total - sent) as u64,
                    blob: chunk.to_vec(),
                    version: ETCD_API_VERSION.to_string(),
                })
            })
            .collect();
        tracing::info!(bytes = total, revision, "streaming a state snapshot");
        Ok(Response::new(Box::pin(tokio_stream::iter(chunks))))
    }

    async fn move_leader(
        &self,
        request: Request<PbMoveLeaderRequest>,
    ) -> Result<Response<PbMoveLeaderResponse>, Status> {
        self.gate
            .caller(request.metadata())?
            .require_admin("move-leader")?;
        self.node
            .move_leader(request.into_inner().target_id)
            .await?;
        Ok(Response::new(PbMoveLeaderResponse {
            header: Some(self.node.header_now()),
        }))
    }

    async fn downgrade(
        &self,
        request: Request<PbDowngradeRequest>,
    ) -> Result<Response<PbDowngradeResponse>, Status> {
        self.gate
            .caller(request.metadata())?
            .require_admin("downgrade")?;
        Err(not_built("Downgrade"))
    }
}

/// `keys.hash_until(revision)`, off the async workers: a whole keyspace
/// takes a while to hash.
async fn hash_until(keys: KeySpace, revision: i64) -> Result<u32, ApiError> {
    tokio::task::spawn_blocking(move || keys.hash_until(revision))
        .await
        .map_err(|e| ApiError::internal(e.to_string()))
}
