//! etcd v3 `Lease` service.

use super::expect_reply;
use crate::node::CellNode;
use crate::raft::command::{Reply, Request};
use futures::{Stream, StreamExt};
use latchkey_shared::etcdpb::{
    PbLeaseGrantRequest, PbLeaseGrantResponse, PbLeaseKeepAliveRequest, PbLeaseKeepAliveResponse,
    PbLeaseLeasesRequest, PbLeaseLeasesResponse, PbLeaseRevokeRequest, PbLeaseRevokeResponse,
    PbLeaseService, PbLeaseStatus, PbLeaseTimeToLiveRequest, PbLeaseTimeToLiveResponse,
};
use latchkey_shared::{ApiError, ErrorCode};
use std::pin::Pin;
use std::sync::Arc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request as GrpcRequest, Response as GrpcResponse, Status, Streaming};

pub struct LeaseService {
    pub node: Arc<CellNode>,
}

/// Keep-alive replies buffered per stream. A client that stops reading its
/// replies stops being served (its requests wait) rather than growing memory.
const KEEPALIVE_BUFFER: usize = 64;

/// Keep-alives of one stream in flight at once.
const KEEPALIVE_CONCURRENCY: usize = 256;

async fn keep_alive_reply(node: &CellNode, id: i64) -> Result<PbLeaseKeepAliveResponse, Status> {
    match node.keep_alive(id).await {
        Ok(ttl) => Ok(PbLeaseKeepAliveResponse {
            header: Some(node.header_now()),
            id,
            ttl,
        }),
        // etcd answers a keep-alive for an unknown lease with TTL 0 on the
        // stream rather than ending the stream.
        Err(e) if e.code == ErrorCode::LeaseNotFound => Ok(PbLeaseKeepAliveResponse {
            header: Some(node.header_now()),
            id,
            ttl: 0,
        }),
        Err(e) => Err(e.into()),
    }
}

#[tonic::async_trait]
impl PbLeaseService for LeaseService {
    async fn lease_grant(
        &self,
        request: GrpcRequest<PbLeaseGrantRequest>,
    ) -> Result<GrpcResponse<PbLeaseGrantResponse>, Status> {
        let mut req = request.into_inner();
        // A TTL below the minimum is raised to it, as etcd does (review M4):
        // clients that grant 1 s leases work unchanged.
        req.ttl = req.ttl.max(self.node.limits.min_ttl);
        if req.ttl > self.node.limits.max_ttl {
            // etcd's exact text: clients recognise the error by it.
            return Err(ApiError::lease_ttl_too_large().into());
        }
        if req.id < 0 {
            return Err(
                ApiError::invalid("lease id must be positive (0 lets the cell choose)").into(),
            );
        }
        let resp = self
            .node
            .write(Request::LeaseGrant {
                id: req.id,
                ttl: req.ttl,
            })
            .await?;
        let (id, ttl) = expect_reply!(resp, Reply::LeaseGranted { id, ttl } => (id, ttl))?;
        Ok(GrpcResponse::new(PbLeaseGrantResponse {
            header: Some(self.node.header(resp.revision)),
            id,
            ttl,
            error: String::new(),
        }))
    }

    async fn lease_revoke(
        &self,
        request: GrpcRequest<PbLeaseRevokeRequest>,
    ) -> Result<GrpcResponse<PbLeaseRevokeResponse>, Status> {
        let id = request.get_ref().id;
        let resp = self.node.write(Request::LeaseRevoke { id }).await?;
        expect_reply!(resp, Reply::LeaseRevoked => ())?;
        Ok(GrpcResponse::new(PbLeaseRevokeResponse {
            header: Some(self.node.header(resp.revision)),
        }))
    }

    type LeaseKeepAliveStream =
        Pin<Box<dyn Stream<Item = Result<PbLeaseKeepAliveResponse, Status>> + Send + 'static>>;

    async fn lease_keep_alive(
        &self,
        request: GrpcRequest<Streaming<PbLeaseKeepAliveRequest>>,
    ) -> Result<GrpcResponse<Self::LeaseKeepAliveStream>, Status> {
        let inbound = request.into_inner();
        let (tx, rx) = tokio::sync::mpsc::channel(KEEPALIVE_BUFFER);
        let node = self.node.clone();
        self.node.lifecycle.spawn(async move {
            // Keep-alives of one stream are served concurrently: a proxy
            // refreshes thousands of leases on one stream, and each may need
            // a round trip to the leader. Replies carry their lease id, so
            // their order does not matter.
            let replies = inbound
                .take_while(|m| futures::future::ready(m.is_ok()))
                .filter_map(|m| futures::future::ready(m.ok()))
                .map(|msg| {
                    let node = node.clone();
                    async move { keep_alive_reply(&node, msg.id).await }
                })
                .buffer_unordered(KEEPALIVE_CONCURRENCY);
            futures::pin_mut!(replies);
            while let Some(reply) = replies.next().await {
                let failed = reply.is_err();
                if tx.send(reply).await.is_err() || failed {
                    break;
                }
            }
        });
        Ok(GrpcResponse::new(Box::pin(ReceiverStream::new(rx))))
    }

    async fn lease_time_to_live(
        &self,
        request: GrpcRequest<PbLeaseTimeToLiveRequest>,
    ) -> Result<GrpcResponse<PbLeaseTimeToLiveResponse>, Status> {
        let req = request.into_inner();
        match self.node.time_to_live(req.id).await {
            Ok(t) => Ok(GrpcResponse::new(PbLeaseTimeToLiveResponse {
                header: Some(self.node.header_now()),
                id: req.id,
                ttl: t.remaining,
                granted_ttl: t.granted,
                keys: if req.keys { t.keys } else { Vec::new() },
            })),
            // etcd reports a missing lease as TTL -1 rather than an error.
            Err(e) if e.code == ErrorCode::LeaseNotFound => {
                Ok(GrpcResponse::new(PbLeaseTimeToLiveResponse {
                    header: Some(self.node.header_now()),
                    id: req.id,
                    ttl: -1,
                    granted_ttl: 0,
                    keys: Vec::new(),
                }))
            }
            Err(e) => Err(e.into()),
        }
    }

    async fn lease_leases(
        &self,
        _request: GrpcRequest<PbLeaseLeasesRequest>,
    ) -> Result<GrpcResponse<PbLeaseLeasesResponse>, Status> {
        self.node.linearizable_barrier().await?;
        let (leases, revision) = self.node.state.read(|s| {
            let leases = s
                .leases
                .seeds()
                .into_iter()
                .map(|(id, _, _)| PbLeaseStatus { id })
                .collect();
            (leases, s.keys.revision())
        });
        Ok(GrpcResponse::new(PbLeaseLeasesResponse {
            header: Some(self.node.header(revision)),
            leases,
        }))
    }
}
