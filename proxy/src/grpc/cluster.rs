//! etcd v3 `Cluster`, passed through to the cell. MemberList lists the
//! cell's members (not the proxies, as etcd's grpc-proxy would), so that
//! `etcdctl member add/remove/promote` work through a proxy as against the
//! cell. A client library that syncs its endpoints from MemberList would
//! then talk to the members directly: keep endpoint auto-sync off when
//! going through proxies (etcd's Go client leaves it off by default).

use super::service;
use crate::state::ProxyState;
use latchkey_shared::etcd_methods::cluster::{
    MEMBER_ADD, MEMBER_LIST, MEMBER_PROMOTE, MEMBER_REMOVE, MEMBER_UPDATE,
};
use latchkey_shared::etcdpb::{
    PbClusterService, PbMemberAddRequest, PbMemberAddResponse, PbMemberListRequest,
    PbMemberListResponse, PbMemberPromoteRequest, PbMemberPromoteResponse, PbMemberRemoveRequest,
    PbMemberRemoveResponse, PbMemberUpdateRequest, PbMemberUpdateResponse,
};
use std::sync::Arc;

pub struct ClusterService {
    pub state: Arc<ProxyState>,
}

service! {
    impl PbClusterService for ClusterService {
        pass_through {
            member_add(PbMemberAddRequest) -> PbMemberAddResponse = Write, MEMBER_ADD;
            member_remove(PbMemberRemoveRequest) -> PbMemberRemoveResponse = Write, MEMBER_REMOVE;
            member_update(PbMemberUpdateRequest) -> PbMemberUpdateResponse = Write, MEMBER_UPDATE;
            member_list(PbMemberListRequest) -> PbMemberListResponse = Read, MEMBER_LIST;
            member_promote(PbMemberPromoteRequest) -> PbMemberPromoteResponse = Write, MEMBER_PROMOTE;
        }
    }
}
