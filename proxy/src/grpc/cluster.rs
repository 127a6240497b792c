//! etcd v3 `Cluster`, passed through to the cell. MemberList lists the
//! cell's members (not the proxies, as etcd's grpc-proxy would), so that
//! `etcdctl member add/remove/promote` work through a proxy as against the
//! cell. A client library that syncs its endpoints from MemberList would
//! then talk to the members directly: keep endpoint auto-sync off when
//! going through proxies (etcd's Go client leaves it off by default).

use super::forward;
use crate::state::ProxyState;
use crate::upstream::{Kind, Route};
use latchkey_shared::etcdpb::{
    PbClusterService, PbMemberAddRequest, PbMemberAddResponse, PbMemberListRequest,
    PbMemberListResponse, PbMemberPromoteRequest, PbMemberPromoteResponse, PbMemberRemoveRequest,
    PbMemberRemoveResponse, PbMemberUpdateRequest, PbMemberUpdateResponse,
};
use std::sync::Arc;
use tonic::{Request, Response, Status};

pub const MEMBER_LIST: &str = "/etcdserverpb.Cluster/MemberList";

pub struct ClusterService {
    pub state: Arc<ProxyState>,
}

#[tonic::async_trait]
impl PbClusterService for ClusterService {
    async fn member_add(
        &self,
        request: Request<PbMemberAddRequest>,
    ) -> Result<Response<PbMemberAddResponse>, Status> {
        let cell = self.state.upstream.home().clone();
        forward(
            &cell,
            Route::Leader,
            Kind::Write,
            "/etcdserverpb.Cluster/MemberAdd",
            request,
        )
        .await
    }

    async fn member_remove(
        &self,
        request: Request<PbMemberRemoveRequest>,
    ) -> Result<Response<PbMemberRemoveResponse>, Status> {
        let cell = self.state.upstream.home().clone();
        forward(
            &cell,
            Route::Leader,
            Kind::Write,
            "/etcdserverpb.Cluster/MemberRemove",
            request,
        )
        .await
    }

    async fn member_update(
        &self,
        request: Request<PbMemberUpdateRequest>,
    ) -> Result<Response<PbMemberUpdateResponse>, Status> {
        let cell = self.state.upstream.home().clone();
        forward(
            &cell,
            Route::Leader,
            Kind::Write,
            "/etcdserverpb.Cluster/MemberUpdate",
            request,
        )
        .await
    }

    async fn member_list(
        &self,
        request: Request<PbMemberListRequest>,
    ) -> Result<Response<PbMemberListResponse>, Status> {
        let cell = self.state.upstream.home().clone();
        forward(&cell, Route::Leader, Kind::Read, MEMBER_LIST, request).await
    }

    async fn member_promote(
        &self,
        request: Request<PbMemberPromoteRequest>,
    ) -> Result<Response<PbMemberPromoteResponse>, Status> {
        let cell = self.state.upstream.home().clone();
        forward(
            &cell,
            Route::Leader,
            Kind::Write,
            "/etcdserverpb.Cluster/MemberPromote",
            request,
        )
        .await
    }
}
