//! etcd v3 `Watch`, passed through: each client stream gets its own
//! upstream stream to one member (any member serves watches from its
//! applied state), requests forwarded up and responses down as they are.
//! When the upstream stream fails the client's stream ends with the error,
//! and etcd clients resume from the last revision they saw. Coalescing
//! identical watches onto one upstream watch is the next step (DESIGN
//! section 4).

use crate::state::ProxyState;
use crate::upstream::Route;
use latchkey_shared::classify_call_failure;
use latchkey_shared::client::call;
use latchkey_shared::etcdpb::{PbWatchRequest, PbWatchResponse, PbWatchService};
use std::pin::Pin;
use std::sync::Arc;
use tokio_stream::{Stream, StreamExt};
use tonic::{Request, Response, Status, Streaming};

pub const WATCH: &str = "/etcdserverpb.Watch/Watch";

/// Responses queued per stream before its task waits for the client.
const OUTBOUND_QUEUE: usize = 64;

pub struct WatchService {
    pub state: Arc<ProxyState>,
}

#[tonic::async_trait]
impl PbWatchService for WatchService {
    type WatchStream =
        Pin<Box<dyn Stream<Item = Result<PbWatchResponse, Status>> + Send + 'static>>;

    async fn watch(
        &self,
        request: Request<Streaming<PbWatchRequest>>,
    ) -> Result<Response<Self::WatchStream>, Status> {
        let inbound = request.into_inner();
        let cell = self.state.upstream.home().clone();
        let member = cell.pick(Route::Any, 0);
        let channel = cell.members[member].channel.clone();
        // The client's requests go up until it closes its side or its
        // stream breaks.
        let up = inbound.map_while(Result::ok);
        let mut answers =
            call::streaming::<PbWatchRequest, PbWatchResponse, _>(channel, WATCH, up).await?;
        let (tx, rx) = tokio::sync::mpsc::channel(OUTBOUND_QUEUE);
        metrics::gauge!("latchkey_proxy_watch_streams").increment(1.0);
        self.state.lifecycle.spawn(async move {
            while let Some(answer) = answers.next().await {
                let answer = answer.map_err(|status| {
                    tracing::debug!(error = %status, "upstream watch stream failed");
                    Status::from(classify_call_failure(&status))
                });
                let failed = answer.is_err();
                if tx.send(answer).await.is_err() || failed {
                    break;
                }
            }
            metrics::gauge!("latchkey_proxy_watch_streams").decrement(1.0);
        });
        Ok(Response::new(Box::pin(
            tokio_stream::wrappers::ReceiverStream::new(rx),
        )))
    }
}
