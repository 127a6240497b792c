//! etcd v3 `Watch` service: each gRPC stream is served by one
//! [`WatchStream`] task on this member's own applied state, so followers
//! and learners serve watches too.

use crate::metrics_catalog::WATCH_STREAMS_ENDED_NO_LEADER;
use crate::node::CellNode;
use crate::ops::auth_gate::AuthGate;
use crate::watch::outbound;
use crate::watch::stream::{WatchOptions, WatchStream};
use latchkey_shared::etcd_methods::REQUIRE_LEADER;
use latchkey_shared::etcdpb::{PbWatchRequest, PbWatchService};
use latchkey_shared::ApiError;
use std::sync::Arc;
use tonic::{Request, Response, Status, Streaming};

pub struct WatchService {
    pub node: Arc<CellNode>,
    pub options: WatchOptions,
    /// Each watch needs read on its range; the stream checks again every
    /// second, so a revoked permission ends the watches it allowed.
    pub gate: Arc<AuthGate>,
}

#[tonic::async_trait]
impl PbWatchService for WatchService {
    type WatchStream = outbound::Responses;

    async fn watch(
        &self,
        request: Request<Streaming<PbWatchRequest>>,
    ) -> Result<Response<Self::WatchStream>, Status> {
        // etcd's require-leader (`clientv3.WithRequireLeader`, its
        // grpc-proxy): refused, and later ended, while this member has no
        // leader.
        let require_leader = request
            .metadata()
            .get(REQUIRE_LEADER)
            .is_some_and(|v| v.as_bytes() == b"true");
        if require_leader && self.node.leader_lost() {
            metrics::counter!(WATCH_STREAMS_ENDED_NO_LEADER.name).increment(1);
            return Err(ApiError::no_leader().into());
        }
        let caller = self.gate.caller(request.metadata())?;
        let inbound = request.into_inner();
        let (out, responses) = outbound::channel();
        let stream = WatchStream::new(
            self.node.clone(),
            self.options.clone(),
            out,
            require_leader,
            (self.gate.clone(), caller),
        );
        self.node.lifecycle.spawn(stream.run(inbound));
        Ok(Response::new(responses))
    }
}
