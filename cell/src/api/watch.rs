//! etcd v3 `Watch` service: each gRPC stream is served by one
//! [`WatchStream`] task on this member's own applied state, so followers
//! and learners serve watches too.

use crate::node::CellNode;
use crate::watch::stream::{WatchOptions, WatchStream};
use latchkey_shared::etcdpb::{PbWatchRequest, PbWatchResponse, PbWatchService};
use std::pin::Pin;
use std::sync::Arc;
use tokio_stream::Stream;
use tonic::{Request, Response, Status, Streaming};

/// Responses queued per stream before its task waits for the client.
const OUTBOUND_QUEUE: usize = 64;

pub struct WatchService {
    pub node: Arc<CellNode>,
    pub options: WatchOptions,
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
        let (tx, rx) = tokio::sync::mpsc::channel(OUTBOUND_QUEUE);
        let stream = WatchStream::new(self.node.clone(), self.options.clone(), tx);
        self.node.lifecycle.spawn(stream.run(inbound));
        Ok(Response::new(Box::pin(
            tokio_stream::wrappers::ReceiverStream::new(rx),
        )))
    }
}
