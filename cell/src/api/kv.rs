//! etcd v3 `KV` service: the gRPC face of [`ops::kv`](crate::ops::kv).

use crate::ops::auth_gate::AuthGate;
use crate::ops::kv::Kv;
use latchkey_shared::auth::view::range_of;
use latchkey_shared::auth::Caller;
use latchkey_shared::etcdpb::{
    PbCompactionRequest, PbCompactionResponse, PbDeleteRequest, PbDeleteResponse, PbKvService,
    PbPutRequest, PbPutResponse, PbRangeRequest, PbRangeResponse, PbRangeStreamResponse,
    PbTxnRequest, PbTxnResponse,
};
use latchkey_shared::KeyRange;
use std::pin::Pin;
use std::sync::Arc;
use tokio_stream::Stream;
use tonic::{Request as GrpcRequest, Response as GrpcResponse, Status};

pub struct KvService {
    pub kv: Kv,
    /// Who may read and write what: checked before every operation.
    pub gate: Arc<AuthGate>,
}

impl KvService {
    /// A move's arriving keys are the proxies' until it commits.
    fn refuse_arriving(&self, caller: &Caller, ranges: &[KeyRange]) -> Result<(), Status> {
        if caller.writes_records() {
            return Ok(());
        }
        Ok(self.kv.refuse_arriving(ranges)?)
    }
}

/// How many key-values one RangeStream message carries.
const RANGE_STREAM_CHUNK: usize = 1000;

#[tonic::async_trait]
impl PbKvService for KvService {
    async fn range(
        &self,
        request: GrpcRequest<PbRangeRequest>,
    ) -> Result<GrpcResponse<PbRangeResponse>, Status> {
        let caller = self.gate.caller(request.metadata())?;
        caller.check_range(request.get_ref())?;
        // A move's arriving keys are refused on the state the read is
        // answered from (not here, on a member that may be behind).
        let arriving_ok = caller.writes_records();
        Ok(GrpcResponse::new(
            self.kv.range(request.get_ref(), arriving_ok).await?,
        ))
    }

    type RangeStreamStream =
        Pin<Box<dyn Stream<Item = Result<PbRangeStreamResponse, Status>> + Send + 'static>>;

    async fn range_stream(
        &self,
        request: GrpcRequest<PbRangeRequest>,
    ) -> Result<GrpcResponse<Self::RangeStreamStream>, Status> {
        let caller = self.gate.caller(request.metadata())?;
        caller.check_range(request.get_ref())?;
        let resp = self
            .kv
            .range(request.get_ref(), caller.writes_records())
            .await?;
        let header = resp.header;
        let (count, more) = (resp.count, resp.more);
        let mut chunks: Vec<PbRangeStreamResponse> = resp
            .kvs
            .chunks(RANGE_STREAM_CHUNK)
            .map(|kvs| PbRangeStreamResponse {
                range_response: Some(PbRangeResponse {
                    header,
                    kvs: kvs.to_vec(),
                    more,
                    count,
                }),
            })
            .collect();
        if chunks.is_empty() {
            chunks.push(PbRangeStreamResponse {
                range_response: Some(PbRangeResponse {
                    header,
                    kvs: vec![],
                    more,
                    count,
                }),
            });
        }
        Ok(GrpcResponse::new(Box::pin(tokio_stream::iter(
            chunks.into_iter().map(Ok),
        ))))
    }

    async fn put(
        &self,
        request: GrpcRequest<PbPutRequest>,
    ) -> Result<GrpcResponse<PbPutResponse>, Status> {
        let caller = self.gate.caller(request.metadata())?;
        caller.check_put(request.get_ref())?;
        self.refuse_arriving(&caller, &[range_of(&request.get_ref().key, &[])])?;
        Ok(GrpcResponse::new(self.kv.put(request.into_inner()).await?))
    }

    async fn delete_range(
        &self,
        request: GrpcRequest<PbDeleteRequest>,
    ) -> Result<GrpcResponse<PbDeleteResponse>, Status> {
        let caller = self.gate.caller(request.metadata())?;
        caller.check_delete(request.get_ref())?;
        let r = request.get_ref();
        self.refuse_arriving(&caller, &[range_of(&r.key, &r.range_end)])?;
        Ok(GrpcResponse::new(
            self.kv.delete_range(request.into_inner()).await?,
        ))
    }

    async fn txn(
        &self,
        request: GrpcRequest<PbTxnRequest>,
    ) -> Result<GrpcResponse<PbTxnResponse>, Status> {
        let caller = self.gate.caller(request.metadata())?;
        caller.check_txn(request.get_ref())?;
        self.refuse_arriving(&caller, &latchkey_shared::txn_op::ranges(request.get_ref()))?;
        let arriving_ok = caller.writes_records();
        Ok(GrpcResponse::new(
            self.kv.txn(request.into_inner(), arriving_ok).await?,
        ))
    }

    async fn compact(
        &self,
        request: GrpcRequest<PbCompactionRequest>,
    ) -> Result<GrpcResponse<PbCompactionResponse>, Status> {
        self.gate
            .caller(request.metadata())?
            .require_admin("compaction")?;
        Ok(GrpcResponse::new(
            self.kv.compact(request.into_inner()).await?,
        ))
    }
}
