//! etcd v3 `KV`: the gRPC face of [`ops::kv`](crate::ops::kv) (ranges
//! through the read cache, writes to the leader), and RangeStream passed
//! through to one member.

use super::answer;
use crate::ops;
use crate::state::ProxyState;
use crate::upstream::Route;
use latchkey_shared::client::call;
use latchkey_shared::etcd_methods::kv::RANGE_STREAM;
use latchkey_shared::etcdpb::{
    PbCompactionRequest, PbCompactionResponse, PbDeleteRequest, PbDeleteResponse, PbKvService,
    PbPutRequest, PbPutResponse, PbRangeRequest, PbRangeResponse, PbRangeStreamResponse,
    PbTxnRequest, PbTxnResponse,
};
use latchkey_shared::tls::RemotePeer;
use std::pin::Pin;
use std::sync::Arc;
use tokio_stream::Stream;
use tonic::{Request, Response, Status};

pub struct KvService {
    pub state: Arc<ProxyState>,
}

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
        let client = RemotePeer::of(&request).map(|p| p.addr);
        let result = ops::kv::range(&self.state, client, request.into_inner()).await;
        answer(result)
    }

    type RangeStreamStream =
        Pin<Box<dyn Stream<Item = Result<PbRangeStreamResponse, Status>> + Send + 'static>>;

    async fn range_stream(
        &self,
        request: Request<PbRangeRequest>,
    ) -> Result<Response<Self::RangeStreamStream>, Status> {
        let req = request.get_ref();
        let range = latchkey_shared::KeyRange::new(req.key.clone(), req.range_end.clone());
        let cell = self.state.upstream.route([&range])?;
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
        let client = RemotePeer::of(&request).map(|p| p.addr);
        let result = ops::kv::put(&self.state, client, request.into_inner()).await;
        answer(result)
    }

    async fn delete_range(
        &self,
        request: Request<PbDeleteRequest>,
    ) -> Result<Response<PbDeleteResponse>, Status> {
        let client = RemotePeer::of(&request).map(|p| p.addr);
        let result = ops::kv::delete_range(&self.state, client, request.into_inner()).await;
        answer(result)
    }

    async fn txn(&self, request: Request<PbTxnRequest>) -> Result<Response<PbTxnResponse>, Status> {
        let client = RemotePeer::of(&request).map(|p| p.addr);
        let result = ops::kv::txn(&self.state, client, request.into_inner()).await;
        answer(result)
    }

    async fn compact(
        &self,
        request: Request<PbCompactionRequest>,
    ) -> Result<Response<PbCompactionResponse>, Status> {
        let result = ops::kv::compact(&self.state, request.into_inner()).await;
        answer(result)
    }
}
