//! etcd v3 `Maintenance` service: Status and Alarm. Defragment, Snapshot,
//! MoveLeader, Hash and Downgrade are answered `unimplemented` until they
//! are built (the watches and membership issue adds Snapshot, Defragment
//! and MoveLeader).

use super::not_built;
use crate::node::CellNode;
use latchkey_shared::etcdpb::{
    PbAlarmRequest, PbAlarmResponse, PbDefragmentRequest, PbDefragmentResponse, PbDowngradeRequest,
    PbDowngradeResponse, PbHashKvRequest, PbHashKvResponse, PbHashRequest, PbHashResponse,
    PbMaintenanceService, PbMoveLeaderRequest, PbMoveLeaderResponse, PbSnapshotRequest,
    PbSnapshotResponse, PbStatusRequest, PbStatusResponse,
};
use std::pin::Pin;
use std::sync::Arc;
use tokio_stream::Stream;
use tonic::{Request, Response, Status};

/// The etcd API version latchkey speaks; clients use it for feature checks.
pub const ETCD_API_VERSION: &str = "3.5.0";

pub struct MaintenanceService {
    pub node: Arc<CellNode>,
}

#[tonic::async_trait]
impl PbMaintenanceService for MaintenanceService {
    async fn alarm(
        &self,
        _request: Request<PbAlarmRequest>,
    ) -> Result<Response<PbAlarmResponse>, Status> {
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
            errors.push("etcdserver: no leader".to_string());
        }
        Ok(Response::new(PbStatusResponse {
            header: Some(self.node.header(revision)),
            version: ETCD_API_VERSION.to_string(),
            db_size: bytes as i64,
            leader: m.current_leader.unwrap_or(0),
            raft_index: m.last_log_index.unwrap_or(0),
            raft_term: m.current_term,
            raft_applied_index: m.last_applied.map_or(0, |l| l.index),
            errors,
            db_size_in_use: bytes as i64,
            is_learner,
            storage_version: String::new(),
            ..Default::default()
        }))
    }

    async fn defragment(
        &self,
        _request: Request<PbDefragmentRequest>,
    ) -> Result<Response<PbDefragmentResponse>, Status> {
        Err(not_built("Defragment"))
    }

    async fn hash(
        &self,
        _request: Request<PbHashRequest>,
    ) -> Result<Response<PbHashResponse>, Status> {
        Err(not_built("Hash"))
    }

    async fn hash_kv(
        &self,
        _request: Request<PbHashKvRequest>,
    ) -> Result<Response<PbHashKvResponse>, Status> {
        Err(not_built("HashKV"))
    }

    type SnapshotStream =
        Pin<Box<dyn Stream<Item = Result<PbSnapshotResponse, Status>> + Send + 'static>>;

    async fn snapshot(
        &self,
        _request: Request<PbSnapshotRequest>,
    ) -> Result<Response<Self::SnapshotStream>, Status> {
        Err(not_built("Snapshot"))
    }

    async fn move_leader(
        &self,
        _request: Request<PbMoveLeaderRequest>,
    ) -> Result<Response<PbMoveLeaderResponse>, Status> {
        Err(not_built("MoveLeader"))
    }

    async fn downgrade(
        &self,
        _request: Request<PbDowngradeRequest>,
    ) -> Result<Response<PbDowngradeResponse>, Status> {
        Err(not_built("Downgrade"))
    }
}
