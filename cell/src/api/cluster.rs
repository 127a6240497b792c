//! etcd v3 `Cluster` service: MemberAdd, MemberPromote, MemberRemove,
//! MemberUpdate and MemberList. Changes are made on the leader through
//! Raft joint consensus (see [`crate::membership`]).

use crate::ids::new_member_id;
use crate::membership::parse_peer_urls;
use crate::node::CellNode;
use crate::ops::auth_gate::AuthGate;
use crate::peer::protocol::MembershipChange;
use latchkey_shared::etcdpb::{
    PbClusterService, PbMember, PbMemberAddRequest, PbMemberAddResponse, PbMemberListRequest,
    PbMemberListResponse, PbMemberPromoteRequest, PbMemberPromoteResponse, PbMemberRemoveRequest,
    PbMemberRemoveResponse, PbMemberUpdateRequest, PbMemberUpdateResponse,
};
use std::sync::Arc;
use tonic::{Request, Response, Status};

pub struct ClusterService {
    pub node: Arc<CellNode>,
    /// Admin only once authentication is on (etcd's rule).
    pub gate: Arc<AuthGate>,
}

impl ClusterService {
    /// Every member of the membership this member has applied (so a
    /// configuration proposed but not yet committed is not listed, as in
    /// etcd; review M7), with the client URLs and names members published.
    fn members(&self) -> Vec<PbMember> {
        self.node.state.read(|s| {
            let membership = s.last_membership.membership();
            let voters: Vec<u64> = membership.voter_ids().collect();
            membership
                .nodes()
                .map(|(id, node)| {
                    let attrs = s.members.get(id);
                    PbMember {
                        id: *id,
                        name: attrs.map(|a| a.name.clone()).unwrap_or_default(),
                        peer_ur_ls: vec![format!(
                            "{}://{}",
                            self.node.peer_url_scheme, node.peer_addr
                        )],
                        client_ur_ls: attrs.map(|a| a.client_urls.clone()).unwrap_or_default(),
                        is_learner: !voters.contains(id),
                    }
                })
                .collect()
        })
    }
}

impl ClusterService {
    /// The members after a change, as seen once this member is up to date.
    async fn members_now(&self) -> Result<Vec<PbMember>, Status> {
        self.node.linearizable_barrier().await?;
        Ok(self.members())
    }
}

#[tonic::async_trait]
impl PbClusterService for ClusterService {
    async fn member_add(
        &self,
        request: Request<PbMemberAddRequest>,
    ) -> Result<Response<PbMemberAddResponse>, Status> {
        self.gate
            .caller(request.metadata())?
            .require_admin("adding a member")?;
        let req = request.into_inner();
        let peer_addr = parse_peer_urls(&req.peer_ur_ls)?;
        let taken: Vec<u64> = self.members().iter().map(|m| m.id).collect();
        let id = new_member_id(&peer_addr, |id| taken.contains(&id));
        self.node
            .change_membership(MembershipChange::Add {
                id,
                peer_addr,
                learner: req.is_learner,
            })
            .await?;
        let members = self.members_now().await?;
        let member = members.iter().find(|m| m.id == id).cloned();
        Ok(Response::new(PbMemberAddResponse {
            header: Some(self.node.header_now()),
            member,
            members,
        }))
    }

    async fn member_remove(
        &self,
        request: Request<PbMemberRemoveRequest>,
    ) -> Result<Response<PbMemberRemoveResponse>, Status> {
        self.gate
            .caller(request.metadata())?
            .require_admin("removing a member")?;
        let id = request.into_inner().id;
        self.node
            .change_membership(MembershipChange::Remove { id })
            .await?;
        Ok(Response::new(PbMemberRemoveResponse {
            header: Some(self.node.header_now()),
            members: self.members_now().await?,
        }))
    }

    async fn member_update(
        &self,
        request: Request<PbMemberUpdateRequest>,
    ) -> Result<Response<PbMemberUpdateResponse>, Status> {
        self.gate
            .caller(request.metadata())?
            .require_admin("updating a member")?;
        let req = request.into_inner();
        let peer_addr = parse_peer_urls(&req.peer_ur_ls)?;
        self.node
            .change_membership(MembershipChange::Update {
                id: req.id,
                peer_addr,
            })
            .await?;
        Ok(Response::new(PbMemberUpdateResponse {
            header: Some(self.node.header_now()),
            members: self.members_now().await?,
        }))
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
        request: Request<PbMemberPromoteRequest>,
    ) -> Result<Response<PbMemberPromoteResponse>, Status> {
        self.gate
            .caller(request.metadata())?
            .require_admin("promoting a member")?;
        let id = request.into_inner().id;
        self.node
            .change_membership(MembershipChange::Promote { id })
            .await?;
        Ok(Response::new(PbMemberPromoteResponse {
            header: Some(self.node.header_now()),
            members: self.members_now().await?,
        }))
    }
}
