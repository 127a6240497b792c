//! etcd v3 `Watch` service: each gRPC stream is served by one
//! [`WatchStream`] task on this member's own applied state, so followers
//! and learners serve watches too.

use crate::node::CellNode;
use crate::watch::outbound;
use crate::watch::stream::{WatchOptions, WatchStream};
use latchkey_shared::etcdpb::{PbWatchRequest, PbWatchService};
use std::sync::Arc;
use tonic::{Request, Response, Status, Streaming};

pub struct WatchService {
    pub node: Arc<CellNode>,
    pub options: WatchOptions,
}

#[tonic::async_trait]
impl PbWatchService for WatchService {
    type WatchStream = outbound::Responses;

    async fn watch(
        &self,
        request: Request<Streaming<PbWatchRequest>>,
    ) -> Result<Response<Self::WatchStream>, Status> {
        let inbound = request.into_inner();
        let (out, responses) = outbound::channel();
        let stream = WatchStream::new(self.node.clone(), self.options.clone(), out);
        self.node.lifecycle.spawn(stream.run(inbound));
        Ok(Response::new(responses))
    }
}
