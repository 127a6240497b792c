//! etcd v3 `Maintenance`, passed through to the cell's leader: Status
//! (what `etcdctl endpoint status` shows for a proxy endpoint is the
//! leader's), Alarm, Defragment, Hash, HashKV, MoveLeader (only a leader
//! can hand over), Downgrade, and Snapshot (streamed from the leader).

use super::service;
use crate::state::ProxyState;
use crate::upstream::Route;
use latchkey_shared::client::call;
use latchkey_shared::etcd_methods::maintenance::{
    ALARM, DEFRAGMENT, DOWNGRADE, HASH, HASH_KV, MOVE_LEADER, SNAPSHOT, STATUS,
};
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

pub struct MaintenanceService {
    pub state: Arc<ProxyState>,
}

service! {
    impl PbMaintenanceService for MaintenanceService {
        pass_through {
            alarm(PbAlarmRequest) -> PbAlarmResponse = Write, ALARM;
            status(PbStatusRequest) -> PbStatusResponse = Read, STATUS;
            defragment(PbDefragmentRequest) -> PbDefragmentResponse = Write, DEFRAGMENT;
            hash(PbHashRequest) -> PbHashResponse = Read, HASH;
            hash_kv(PbHashKvRequest) -> PbHashKvResponse = Read, HASH_KV;
            move_leader(PbMoveLeaderRequest) -> PbMoveLeaderResponse = Write, MOVE_LEADER;
            downgrade(PbDowngradeRequest) -> PbDowngradeResponse = Write, DOWNGRADE;
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
    }
}
