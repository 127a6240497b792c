//! latchkey's session extension (`proto/sessions.proto`): batched lease
//! refresh. One request refreshes every lease a proxy holds; a follower
//! forwards each batch to the leader in one peer call.

use crate::node::CellNode;
use crate::ops::auth_gate::AuthGate;
use latchkey_shared::sessions_pb::sessions_server::Sessions;
use latchkey_shared::sessions_pb::{RefreshRequest, RefreshResponse};
use latchkey_shared::ApiError;
use std::pin::Pin;
use std::sync::Arc;
use tokio_stream::{Stream, StreamExt};
use tonic::{Request, Response, Status, Streaming};

/// The leader as this member knows it, with the client URL it published:
/// a hint for the client to refresh at the leader directly.
fn leader_client_url(node: &CellNode) -> Option<(u64, String)> {
    let leader = node.raft.metrics().borrow().current_leader?;
    node.state.read(|s| {
        let url = s.members.get(&leader)?.client_urls.first()?.clone();
        Some((leader, url))
    })
}

/// Batches answered per stream before its task waits for the client.
const OUTBOUND_QUEUE: usize = 16;

pub struct SessionsService {
    pub node: Arc<CellNode>,
    /// Most lease ids one batch may name.
    pub max_batch: usize,
    /// A proxy's path: admin only once authentication is on.
    pub gate: Arc<AuthGate>,
}

#[tonic::async_trait]
impl Sessions for SessionsService {
    type RefreshStream =
        Pin<Box<dyn Stream<Item = Result<RefreshResponse, Status>> + Send + 'static>>;

    async fn refresh(
        &self,
        request: Request<Streaming<RefreshRequest>>,
    ) -> Result<Response<Self::RefreshStream>, Status> {
        self.gate
            .caller(request.metadata())?
            .require_admin("batched lease refresh")?;
        let mut inbound = request.into_inner();
        let (tx, rx) = tokio::sync::mpsc::channel(OUTBOUND_QUEUE);
        let node = self.node.clone();
        let max_batch = self.max_batch;
        self.node.lifecycle.spawn(async move {
            while let Some(Ok(req)) = inbound.next().await {
                let answer = if req.ids.len() > max_batch {
                    Err(ApiError::invalid(format!(
                        "a refresh batch of {} leases is over the limit of {max_batch}; split it",
                        req.ids.len()
                    ))
                    .into())
                } else {
                    node.refresh_batch(req.ids)
                        .await
                        .map(|ttls| {
                            let header = node.header(0);
                            let (leader_id, leader_client_url) =
                                leader_client_url(&node).unwrap_or_default();
                            RefreshResponse {
                                batch: req.batch,
                                ttls,
                                member_id: node.id,
                                raft_term: header.raft_term,
                                cluster_id: node.cluster_id,
                                leader_id,
                                leader_client_url,
                            }
                        })
                        .map_err(Into::into)
                };
                // An error ends the stream (gRPC semantics); the client
                // reconnects, possibly to another member.
                let failed = answer.is_err();
                if tx.send(answer).await.is_err() || failed {
                    return;
                }
            }
        });
        Ok(Response::new(Box::pin(
            tokio_stream::wrappers::ReceiverStream::new(rx),
        )))
    }
}
