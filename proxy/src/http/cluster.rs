//! `GET /v1/cluster`: the cell's leader, members, revision and Raft term.

use super::model::ErrorBody;
use super::{answer, Answer};
use crate::state::ProxyState;
use crate::upstream::{Kind, Route};
use axum::extract::State;
use latchkey_shared::etcd_methods::cluster::MEMBER_LIST;
use latchkey_shared::etcd_methods::maintenance::STATUS;
use latchkey_shared::etcdpb::{
    PbMemberListRequest, PbMemberListResponse, PbStatusRequest, PbStatusResponse,
};
use latchkey_shared::MemberId;
use serde::{Deserialize, Serialize};
use std::sync::Arc;
use utoipa::ToSchema;

#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct Member {
    /// The member id, hex (as etcdctl shows it).
    pub id: String,
    pub name: String,
    pub peer_urls: Vec<String>,
    pub client_urls: Vec<String>,
    pub is_learner: bool,
    pub is_leader: bool,
}

#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct ClusterStatus {
    /// The cell's id (etcd's cluster id), hex.
    pub cell_id: String,
    /// The leader's member id, hex.
    pub leader: String,
    pub raft_term: u64,
    /// The cell's current revision.
    pub revision: i64,
    pub members: Vec<Member>,
}

/// The cell's leader, members, revision and Raft term.
#[utoipa::path(get, path = "/v1/cluster", tag = "cluster",
    responses((status = 200, body = ClusterStatus), (status = "5XX", body = ErrorBody)))]
pub async fn status(State(state): State<Arc<ProxyState>>) -> Answer<ClusterStatus> {
    let cell = state.upstream.home();
    let (status, members) = tokio::try_join!(
        cell.call::<_, PbStatusResponse>(Route::Leader, Kind::Read, STATUS, PbStatusRequest {}),
        cell.call::<_, PbMemberListResponse>(
            Route::Leader,
            Kind::Read,
            MEMBER_LIST,
            PbMemberListRequest { linearizable: true }
        ),
    )?;
    let header = status.header.unwrap_or_default();
    answer(ClusterStatus {
        cell_id: MemberId(header.cluster_id).to_string(),
        leader: MemberId(status.leader).to_string(),
        raft_term: status.raft_term,
        revision: header.revision,
        members: members
            .members
            .iter()
            .map(|m| Member {
                id: MemberId(m.id).to_string(),
                name: m.name.clone(),
                peer_urls: m.peer_ur_ls.clone(),
                client_urls: m.client_ur_ls.clone(),
                is_learner: m.is_learner,
                is_leader: m.id == status.leader,
            })
            .collect(),
    })
}
