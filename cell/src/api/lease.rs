//! etcd v3 `Lease` service: the gRPC face of [`ops::lease`](crate::ops::lease).

use crate::node::CellNode;
use crate::ops::auth_gate::AuthGate;
use crate::ops::lease::Leases;
use futures::{Stream, StreamExt};
use latchkey_shared::auth::Need;
use latchkey_shared::etcdpb::{
    PbLeaseGrantRequest, PbLeaseGrantResponse, PbLeaseKeepAliveRequest, PbLeaseKeepAliveResponse,
    PbLeaseLeasesRequest, PbLeaseLeasesResponse, PbLeaseRevokeRequest, PbLeaseRevokeResponse,
    PbLeaseService, PbLeaseTimeToLiveRequest, PbLeaseTimeToLiveResponse,
};
use latchkey_shared::KeyRange;
use std::pin::Pin;
use std::sync::Arc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request as GrpcRequest, Response as GrpcResponse, Status, Streaming};

pub struct LeaseService {
    pub leases: Leases,
    /// Runs each keep-alive stream's task under the member's lifecycle.
    pub node: Arc<CellNode>,
    /// Every lease call needs an authenticated caller once authentication
    /// is on; a revoke, write on every key the lease holds (etcd's rule).
    pub gate: Arc<AuthGate>,
}

/// Keep-alive replies buffered per stream. A client that stops reading its
/// replies stops being served (its requests wait) rather than growing memory.
const KEEPALIVE_BUFFER: usize = 64;

/// Keep-alives of one stream in flight at once.
const KEEPALIVE_CONCURRENCY: usize = 256;

#[tonic::async_trait]
impl PbLeaseService for LeaseService {
    async fn lease_grant(
        &self,
        request: GrpcRequest<PbLeaseGrantRequest>,
    ) -> Result<GrpcResponse<PbLeaseGrantResponse>, Status> {
        self.gate.caller(request.metadata())?;
        Ok(GrpcResponse::new(
            self.leases.grant(request.into_inner()).await?,
        ))
    }

    async fn lease_revoke(
        &self,
        request: GrpcRequest<PbLeaseRevokeRequest>,
    ) -> Result<GrpcResponse<PbLeaseRevokeResponse>, Status> {
        let caller = self.gate.caller(request.metadata())?;
        if !caller.is_admin() {
            let id = request.get_ref().id;
            let keys: Vec<Vec<u8>> = self.node.state.read(|s| {
                s.leases
                    .get(id)
                    .map(|l| l.keys.iter().cloned().collect())
                    .unwrap_or_default()
            });
            // A proxy's records of the cells this session spans go with it:
            // they are the system's, not keys the caller must be allowed to
            // write. Any other reserved key (a change lock's, an idempotency
            // record's) still needs the permission, which only an admin or
            // a proxy has.
            let spans = latchkey_shared::directory::session_cells_of(id);
            let own = keys.into_iter().filter(|k| !k.starts_with(&spans));
            for key in own {
                caller.require(Need::Write, &KeyRange::single(key))?;
            }
        }
        Ok(GrpcResponse::new(
            self.leases.revoke(request.get_ref().id).await?,
        ))
    }

    type LeaseKeepAliveStream =
        Pin<Box<dyn Stream<Item = Result<PbLeaseKeepAliveResponse, Status>> + Send + 'static>>;

    async fn lease_keep_alive(
        &self,
        request: GrpcRequest<Streaming<PbLeaseKeepAliveRequest>>,
    ) -> Result<GrpcResponse<Self::LeaseKeepAliveStream>, Status> {
        self.gate.caller(request.metadata())?;
        let inbound = request.into_inner();
        let (tx, rx) = tokio::sync::mpsc::channel(KEEPALIVE_BUFFER);
        let leases = self.leases.clone();
        self.node.lifecycle.spawn(async move {
            // Keep-alives of one stream are served concurrently: a proxy
            // refreshes thousands of leases on one stream, and each may need
            // a round trip to the leader. Replies carry their lease id, so
            // their order does not matter.
            let replies = inbound
                .take_while(|m| futures::future::ready(m.is_ok()))
                .filter_map(|m| futures::future::ready(m.ok()))
                .map(|msg| {
                    let leases = leases.clone();
                    async move { leases.keep_alive(msg.id).await.map_err(Status::from) }
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
        self.gate.caller(request.metadata())?;
        Ok(GrpcResponse::new(
            self.leases.time_to_live(request.into_inner()).await?,
        ))
    }

    async fn lease_leases(
        &self,
        request: GrpcRequest<PbLeaseLeasesRequest>,
    ) -> Result<GrpcResponse<PbLeaseLeasesResponse>, Status> {
        self.gate.caller(request.metadata())?;
        Ok(GrpcResponse::new(self.leases.leases().await?))
    }
}
