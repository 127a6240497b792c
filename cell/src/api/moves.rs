//! latchkey's `Moves` service (`proto/moves.proto`): what a proxy asks of
//! a cell while it moves a key prefix into it from another cell. Only a
//! proxy may ask.

use crate::node::CellNode;
use crate::ops::auth_gate::AuthGate;
use crate::raft::command::{Imported, Reply, Request};
use latchkey_shared::moves_pb::moves_server::Moves;
use latchkey_shared::moves_pb::{
    ImportRequest, ImportResponse, RaiseRevisionRequest, RaiseRevisionResponse,
};
use latchkey_shared::ApiError;
use std::sync::Arc;
use tonic::{Request as GrpcRequest, Response, Status};

/// The highest revision a move may raise a cell to.
const MAX_RAISE: i64 = 1 << 60;

pub struct MovesService {
    pub node: Arc<CellNode>,
    pub gate: Arc<AuthGate>,
}

impl MovesService {
    fn only_proxies(&self, metadata: &tonic::metadata::MetadataMap) -> Result<(), Status> {
        if self.gate.caller(metadata)?.writes_records() {
            return Ok(());
        }
        Err(ApiError::permission_denied(
            "only a proxy (role latchkey-proxy, or the proxies' key) moves prefixes between cells",
        )
        .into())
    }
}

#[tonic::async_trait]
impl Moves for MovesService {
    async fn import(
        &self,
        request: GrpcRequest<ImportRequest>,
    ) -> Result<Response<ImportResponse>, Status> {
        self.only_proxies(request.metadata())?;
        let request = request.into_inner();
        let deletes = request.deletes.into_iter().map(|key| Imported {
            key,
            value: Vec::new(),
            lease: 0,
            create_revision: 0,
            version: 0,
            deleted: true,
        });
        let keys: Vec<Imported> = request
            .kvs
            .into_iter()
            .map(|kv| Imported {
                key: kv.key,
                value: kv.value,
                lease: kv.lease,
                create_revision: kv.create_revision,
                version: kv.version,
                deleted: false,
            })
            .chain(deletes)
            .collect();
        if keys.len() > latchkey_shared::limits::MAX_TXN_OPS {
            return Err(ApiError::too_many_txn_ops().into());
        }
        let resp = self.node.write(Request::Import(keys)).await?;
        match resp.result {
            Ok(Reply::Imported) => Ok(Response::new(ImportResponse {
                header: Some(self.node.header(resp.revision)),
            })),
            Ok(other) => Err(ApiError::internal(format!("import answered {other:?}")).into()),
            Err(e) => Err(e.into()),
        }
    }

    async fn raise_revision(
        &self,
        request: GrpcRequest<RaiseRevisionRequest>,
    ) -> Result<Response<RaiseRevisionResponse>, Status> {
        self.only_proxies(request.metadata())?;
        let above = request.into_inner().above;
        // Far above any revision a cell reaches, and far below where the
        // next revision would overflow.
        if !(0..=MAX_RAISE).contains(&above) {
            return Err(
                ApiError::invalid(format!("above must be 0 to {MAX_RAISE}, not {above}")).into(),
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
