//! etcd v3 `Lease`: the gRPC face of [`ops::lease`](crate::ops::lease)
//! (grant, revoke, time-to-live); the list passes through to the cell;
//! keep-alives are answered by the proxy from its session table
//! (DESIGN section 3), so 100 000 client leases cost the cell one refresh
//! batch per tick instead of a message per lease.

use super::request_metrics::record_keep_alive;
use super::{answer, forward};
use crate::metrics_catalog::KEEPALIVES;
use crate::ops;
use crate::session::{self, KeepAlive};
use crate::state::ProxyState;
use crate::upstream::{Kind, Route};
use futures::stream::FuturesUnordered;
use latchkey_shared::etcd_methods::lease::LEASES;
use latchkey_shared::etcdpb::{
    PbLeaseGrantRequest, PbLeaseGrantResponse, PbLeaseKeepAliveRequest, PbLeaseKeepAliveResponse,
    PbLeaseLeasesRequest, PbLeaseLeasesResponse, PbLeaseRevokeRequest, PbLeaseRevokeResponse,
    PbLeaseService, PbLeaseTimeToLiveRequest, PbLeaseTimeToLiveResponse,
};
use latchkey_shared::{ErrorCode, LeaseId};
use std::pin::Pin;
use std::sync::Arc;
use tokio::time::Instant;
use tokio_stream::wrappers::ReceiverStream;
use tokio_stream::{Stream, StreamExt};
use tonic::{Request, Response, Status, Streaming};

/// Answers queued per keep-alive stream before its task waits for the
/// client to read them.
const OUTBOUND_QUEUE: usize = 256;

/// Keep-alives of one stream waiting for the cell at once; past it the
/// stream's next requests are read only as answers go out.
const WAITING_PER_STREAM: usize = 100_000;

pub struct LeaseService {
    pub state: Arc<ProxyState>,
}

#[tonic::async_trait]
impl PbLeaseService for LeaseService {
    async fn lease_grant(
        &self,
        request: Request<PbLeaseGrantRequest>,
    ) -> Result<Response<PbLeaseGrantResponse>, Status> {
        let result = ops::lease::grant(&self.state, request.into_inner()).await;
        answer(result)
    }

    async fn lease_revoke(
        &self,
        request: Request<PbLeaseRevokeRequest>,
    ) -> Result<Response<PbLeaseRevokeResponse>, Status> {
        let id = LeaseId::from(request.get_ref().id);
        let result = ops::lease::revoke(&self.state, id).await;
        answer(result)
    }

    type LeaseKeepAliveStream =
        Pin<Box<dyn Stream<Item = Result<PbLeaseKeepAliveResponse, Status>> + Send + 'static>>;

    async fn lease_keep_alive(
        &self,
        request: Request<Streaming<PbLeaseKeepAliveRequest>>,
    ) -> Result<Response<Self::LeaseKeepAliveStream>, Status> {
        // Keep-alives go out in the proxy's refresh batches: the cell
        // first says this client is someone (all a keep-alive needs).
        crate::ops::auth::require_authenticated(self.state.upstream.home()).await?;
        let inbound = request.into_inner();
        let (tx, rx) = tokio::sync::mpsc::channel(OUTBOUND_QUEUE);
        let state = self.state.clone();
        self.state
            .lifecycle
            .spawn(serve_keep_alives(state, inbound, tx));
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }

    async fn lease_time_to_live(
        &self,
        request: Request<PbLeaseTimeToLiveRequest>,
    ) -> Result<Response<PbLeaseTimeToLiveResponse>, Status> {
        let result = ops::lease::time_to_live(&self.state, request.into_inner()).await;
        answer(result)
    }

    async fn lease_leases(
        &self,
        request: Request<PbLeaseLeasesRequest>,
    ) -> Result<Response<PbLeaseLeasesResponse>, Status> {
        let cell = self.state.upstream.home().clone();
        forward(&cell, Route::Leader, Kind::Read, LEASES, request).await
    }
}

/// One client's keep-alive stream: a keep-alive the session table answers
/// (nearly all of them) is answered at once; one that must wait for the
/// cell waits beside the others, and is answered when the cell has spoken,
/// in whatever order that is, as etcd's clients match answers by lease id.
async fn serve_keep_alives(
    state: Arc<ProxyState>,
    mut inbound: Streaming<PbLeaseKeepAliveRequest>,
    tx: tokio::sync::mpsc::Sender<Result<PbLeaseKeepAliveResponse, Status>>,
) {
    let mut waiting = FuturesUnordered::new();
    let mut open = true;
    while open || !waiting.is_empty() {
        let (id, ttl, started) = tokio::select! {
            request = inbound.next(), if open && waiting.len() < WAITING_PER_STREAM => match request {
                Some(Ok(request)) => {
                    let id = LeaseId::from(request.id);
                    let started = Instant::now();
                    metrics::counter!(KEEPALIVES.name, "api" => "grpc").increment(1);
                    match state.sessions.keep_alive(id, started) {
                        Ok(KeepAlive::Ttl(ttl)) => (id, Ok(ttl), started),
                        Ok(KeepAlive::Wait(answer)) => {
                            let timeout = state.request_timeout;
                            waiting.push(async move {
                                (id, session::wait_for_cell(id, answer, timeout).await, started)
                            });
                            continue;
                        }
                        Err(e) => (id, Err(e), started),
                    }
                }
                // The client closed its side, or the stream broke: answer
                // what is waiting, then end.
                _ => {
                    open = false;
                    continue;
                }
            },
            Some(done) = waiting.next() => done,
        };
        record_keep_alive(started, ttl.as_ref().err());
        let reply = match ttl {
            Ok(ttl) => keep_alive_response(&state, id, ttl),
            // etcd answers a keep-alive for a lease that is gone with a TTL
            // of 0 (clients read TTL <= 0 as "expired"), not an error.
            Err(e) if e.code == ErrorCode::SessionExpired || e.code == ErrorCode::LeaseNotFound => {
                keep_alive_response(&state, id, 0)
            }
            // The cell did not confirm in time: no answer for this one. An
            // error would end the stream and every other lease on it; the
            // client sends its next keep-alive as usual.
            Err(e) => {
                tracing::debug!(lease_id = %id, error = %e, "keep-alive not answered");
                continue;
            }
        };
        if tx.send(Ok(reply)).await.is_err() {
            return;
        }
    }
}

fn keep_alive_response(state: &ProxyState, id: LeaseId, ttl: i64) -> PbLeaseKeepAliveResponse {
    PbLeaseKeepAliveResponse {
        header: Some(state.upstream.home().last_header()),
        id: id.get(),
        ttl,
    }
}
