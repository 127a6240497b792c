//! etcd v3 `KV`: writes to the leader, never resent once their outcome is
//! unknown; ranges through `cache::range` (linearizable ones to the
//! leader, serializable ones from the read cache or any member).

use super::forward;
use crate::state::ProxyState;
use crate::upstream::{Kind, Route};
use latchkey_shared::client::call;
use latchkey_shared::etcdpb::{
    PbCompactionRequest, PbCompactionResponse, PbDeleteRequest, PbDeleteResponse, PbKvService,
    PbPutRequest, PbPutResponse, PbRangeRequest, PbRangeResponse, PbRangeStreamResponse,
    PbTxnRequest, PbTxnResponse,
};
use std::pin::Pin;
use std::sync::Arc;
use tokio_stream::Stream;
use tonic::{Request, Response, Status};

pub struct KvService {
    pub state: Arc<ProxyState>,
}

pub const RANGE: &str = "/etcdserverpb.KV/Range";
pub const RANGE_STREAM: &str = "/etcdserverpb.KV/RangeStream";
pub const PUT: &str = "/etcdserverpb.KV/Put";
pub const DELETE_RANGE: &str = "/etcdserverpb.KV/DeleteRange";
pub const TXN: &str = "/etcdserverpb.KV/Txn";
pub const COMPACT: &str = "/etcdserverpb.KV/Compact";

/// Where a range is served: any member when the client accepts a
/// possibly stale answer, the leader otherwise.
pub fn range_route(req: &PbRangeRequest) -> Route {
    if req.serializable {
        Route::Any
    } else {
        Route::Leader
    }
}

#[tonic::async_trait]
impl PbKvService for KvService {
    async fn range(
        &self,
        request: Request<PbRangeRequest>,
    ) -> Result<Response<PbRangeResponse>, Status> {
        let started = tokio::time::Instant::now();
        let client = request.remote_addr();
        let result = crate::cache::range(&self.state, client, request.into_inner()).await;
        super::record("grpc", RANGE, started, result.as_ref().err());
        result.map(Response::new).map_err(Into::into)
    }

    type RangeStreamStream =
        Pin<Box<dyn Stream<Item = Result<PbRangeStreamResponse, Status>> + Send + 'static>>;

    async fn range_stream(
        &self,
        request: Request<PbRangeRequest>,
    ) -> Result<Response<Self::RangeStreamStream>, Status> {
        let cell = self.state.upstream.cell_for(&request.get_ref().key).clone();
        let member = cell.pick(range_route(request.get_ref()), 0);
        let channel = cell.members[member].channel.clone();
        let answers = call::server_streaming::<PbRangeRequest, PbRangeStreamResponse>(
            channel,
            RANGE_STREAM,
            request,
        )
        .await?;
        Ok(Response::new(Box::pin(answers)))
    }

    async fn put(&self, request: Request<PbPutRequest>) -> Result<Response<PbPutResponse>, Status> {
        let cell = self.state.upstream.cell_for(&request.get_ref().key).clone();
        forward(&cell, Route::Leader, Kind::Write, PUT, request).await
    }

    async fn delete_range(
        &self,
        request: Request<PbDeleteRequest>,
    ) -> Result<Response<PbDeleteResponse>, Status> {
        let cell = self.state.upstream.cell_for(&request.get_ref().key).clone();
        forward(&cell, Route::Leader, Kind::Write, DELETE_RANGE, request).await
    }

    async fn txn(&self, request: Request<PbTxnRequest>) -> Result<Response<PbTxnResponse>, Status> {
        let key = request
            .get_ref()
            .compare
            .first()
            .map(|c| c.key.clone())
            .unwrap_or_default();
        let cell = self.state.upstream.cell_for(&key).clone();
        forward(&cell, Route::Leader, Kind::Write, TXN, request).await
    }

    async fn compact(
        &self,
        request: Request<PbCompactionRequest>,
    ) -> Result<Response<PbCompactionResponse>, Status> {
        let cell = self.state.upstream.home().clone();
        forward(&cell, Route::Leader, Kind::Write, COMPACT, request).await
    }
}
