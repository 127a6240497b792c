//! etcd v3 `Maintenance`, passed through to the cell's leader: Status
//! (what `etcdctl endpoint status` shows for a proxy endpoint is the
//! leader's), Alarm, Defragment, Hash, HashKV, MoveLeader (only a leader
//! can hand over), Downgrade, and Snapshot (streamed from the leader).

use super::forward;
use crate::state::ProxyState;
use crate::upstream::{Kind, Route};
use latchkey_shared::client::call;
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

pub const STATUS: &str = crate::upstream::leader_tracker::STATUS;
const SNAPSHOT: &str = "/etcdserverpb.Maintenance/Snapshot";

pub struct MaintenanceService {
    pub state: Arc<ProxyState>,
}

#[tonic::async_trait]
impl PbMaintenanceService for MaintenanceService {
    async fn alarm(
        &self,
        request: Request<PbAlarmRequest>,
    ) -> Result<Response<PbAlarmResponse>, Status> {
        let cell = self.state.upstream.home().clone();
        forward(
            &cell,
            Route::Leader,
            Kind::Write,
            "/etcdserverpb.Maintenance/Alarm",
            request,
        )
        .await
    }

    async fn status(
        &self,
        request: Request<PbStatusRequest>,
    ) -> Result<Response<PbStatusResponse>, Status> {
        let cell = self.state.upstream.home().clone();
        forward(&cell, Route::Leader, Kind::Read, STATUS, request).await
    }

    async fn defragment(
        &self,
        request: Request<PbDefragmentRequest>,
    ) -> Result<Response<PbDefragmentResponse>, Status> {
        let cell = self.state.upstream.home().clone();
        forward(
            &cell,
            Route::Leader,
            Kind::Write,
            "/etcdserverpb.Maintenance/Defragment",
            request,
        )
        .await
    }

    async fn hash(
        &self,
        request: Request<PbHashRequest>,
    ) -> Result<Response<PbHashResponse>, Status> {
        let cell = self.state.upstream.home().clone();
        forward(
            &cell,
            Route::Leader,
            Kind::Read,
            "/etcdserverpb.Maintenance/Hash",
            request,
        )
        .await
    }

    async fn hash_kv(
        &self,
        request: Request<PbHashKvRequest>,
    ) -> Result<Response<PbHashKvResponse>, Status> {
        let cell = self.state.upstream.home().clone();
        forward(
            &cell,
            Route::Leader,
            Kind::Read,
            "/etcdserverpb.Maintenance/HashKV",
            request,
        )
        .await
    }

    type SnapshotStream =
        Pin<Box<dyn Stream<Item = Result<PbSnapshotResponse, Status>> + Send + 'static>>;

    async fn snapshot(
        &self,
        request: Request<PbSnapshotRequest>,
    ) -> Result<Response<Self::SnapshotStream>, Status> {
        let cell = self.state.upstream.home().clone();
        let member = cell.pick(Route::Leader, 0);
        let channel = cell.members[member].channel.clone();
        let chunks = call::server_streaming::<PbSnapshotRequest, PbSnapshotResponse>(
            channel, SNAPSHOT, request,
        )
        .await?;
        Ok(Response::new(Box::pin(chunks)))
    }

    async fn move_leader(
        &self,
        request: Request<PbMoveLeaderRequest>,
    ) -> Result<Response<PbMoveLeaderResponse>, Status> {
        let cell = self.state.upstream.home().clone();
        forward(
            &cell,
            Route::Leader,
            Kind::Write,
            "/etcdserverpb.Maintenance/MoveLeader",
            request,
        )
        .await
    }

    async fn downgrade(
        &self,
        request: Request<PbDowngradeRequest>,
    ) -> Result<Response<PbDowngradeResponse>, Status> {
        let cell = self.state.upstream.home().clone();
        forward(
            &cell,
            Route::Leader,
            Kind::Write,
            "/etcdserverpb.Maintenance/Downgrade",
            request,
        )
        .await
    }
}
