//! latchkey's `Moves` service (`proto/moves.proto`): what a proxy asks of
//! a cell while it moves a key prefix into it from another cell. Only a
//! proxy may ask.

use crate::node::CellNode;
use crate::ops::auth_gate::AuthGate;
use crate::raft::command::{Reply, Request};
use latchkey_shared::moves_pb::moves_server::Moves;
use latchkey_shared::moves_pb::{RaiseRevisionRequest, RaiseRevisionResponse};
use latchkey_shared::ApiError;
use std::sync::Arc;
use tonic::{Request as GrpcRequest, Response, Status};

pub struct MovesService {
    pub node: Arc<CellNode>,
    pub gate: Arc<AuthGate>,
}

#[tonic::async_trait]
impl Moves for MovesService {
    async fn raise_revision(
        &self,
        request: GrpcRequest<RaiseRevisionRequest>,
    ) -> Result<Response<RaiseRevisionResponse>, Status> {
        if !self.gate.caller(request.metadata())?.writes_records() {
            return Err(ApiError::permission_denied(
                "only a proxy (role latchkey-proxy, or the proxies' key) moves prefixes between cells",
            )
            .into());
        }
        let above = request.into_inner().above;
        if above < 0 {
            return Err(
                ApiError::invalid(format!("above must not be negative, not {above}")).into(),
            );
        }
        let resp = self.node.write(Request::RaiseRevision { above }).await?;
        match resp.result {
            Ok(Reply::RevisionRaised) => Ok(Response::new(RaiseRevisionResponse {
                header: Some(self.node.header(resp.revision)),
            })),
            Ok(other) => {
                Err(ApiError::internal(format!("raise_revision answered {other:?}")).into())
            }
            Err(e) => Err(e.into()),
        }
    }
}
