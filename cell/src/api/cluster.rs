//! etcd v3 `Cluster` service: MemberList. Membership changes (add, remove,
//! update, promote) come with the watches and membership issue and are
//! answered `unimplemented` until then.

use super::not_built;
use crate::node::CellNode;
use latchkey_shared::etcdpb::{
    PbClusterService, PbMember, PbMemberAddRequest, PbMemberAddResponse, PbMemberListRequest,
    PbMemberListResponse, PbMemberPromoteRequest, PbMemberPromoteResponse, PbMemberRemoveRequest,
    PbMemberRemoveResponse, PbMemberUpdateRequest, PbMemberUpdateResponse,
};
use std::sync::Arc;
use tonic::{Request, Response, Status};

pub struct ClusterService {
    pub node: Arc<CellNode>,
}

impl ClusterService {
    /// Every member of the current membership config, with the client URLs
    /// and names members have published.
    fn members(&self) -> Vec<PbMember> {
        let m = self.node.raft.metrics().borrow().clone();
        let membership = m.membership_config.membership();
        let voters: Vec<u64> = membership.voter_ids().collect();
        self.node.state.read(|s| {
            membership
                .nodes()
                .map(|(id, node)| {
                    let attrs = s.members.get(id);
                    PbMember {
                        id: *id,
                        name: attrs.map(|a| a.name.clone()).unwrap_or_default(),
                        peer_ur_ls: vec![format!("http://{}", node.peer_addr)],
                        client_ur_ls: attrs.map(|a| a.client_urls.clone()).unwrap_or_default(),
                        is_learner: !voters.contains(id),
                    }
                })
                .collect()
        })
    }
}

#[tonic::async_trait]
impl PbClusterService for ClusterService {
    async fn member_add(
        &self,
        _request: Request<PbMemberAddRequest>,
    ) -> Result<Response<PbMemberAddResponse>, Status> {
        Err(not_built("MemberAdd"))
    }

    async fn member_remove(
        &self,
        _request: Request<PbMemberRemoveRequest>,
    ) -> Result<Response<PbMemberRemoveResponse>, Status> {
        Err(not_built("MemberRemove"))
    }

    async fn member_update(
        &self,
        _request: Request<PbMemberUpdateRequest>,
    ) -> Result<Response<PbMemberUpdateResponse>, Status> {
        Err(not_built("MemberUpdate"))
    }

    async fn member_list(
        &self,
        request: Request<PbMemberListRequest>,
    ) -> Result<Response<PbMemberListResponse>, Status> {
        if request.get_ref().linearizable {
            self.node.linearizable_barrier().await?;
        }
        Ok(Response::new(PbMemberListResponse {
            header: Some(self.node.header_now()),
            members: self.members(),
        }))
    }

    async fn member_promote(
        &self,
        _request: Request<PbMemberPromoteRequest>,
    ) -> Result<Response<PbMemberPromoteResponse>, Status> {
        Err(not_built("MemberPromote"))
    }
}
