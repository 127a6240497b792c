//! etcd v3 `Lock` (`v3lockpb.Lock`): Lock and Unlock through the shared
//! lock recipe over [`UpstreamLocks`]. A Lock call waits for the lock up to
//! its gRPC deadline (tonic ends the call then, and the contender's queue
//! key is removed), and never longer than [`LOCK_WAIT_LIMIT`].

use crate::lock_backend::UpstreamLocks;
use crate::state::ProxyState;
use latchkey_shared::lock;
use latchkey_shared::v3lockpb::lock_server::Lock;
use latchkey_shared::v3lockpb::{LockRequest, LockResponse, UnlockRequest, UnlockResponse};
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;
use tonic::{Request, Response, Status};

pub const LOCK: &str = "/v3lockpb.Lock/Lock";
pub const UNLOCK: &str = "/v3lockpb.Lock/Unlock";

/// The longest a Lock call without a deadline waits.
pub const LOCK_WAIT_LIMIT: Duration = Duration::from_secs(3600);

pub struct LockService {
    pub state: Arc<ProxyState>,
}

impl LockService {
    fn backend(&self) -> Arc<UpstreamLocks> {
        Arc::new(UpstreamLocks {
            state: self.state.clone(),
        })
    }
}

#[tonic::async_trait]
impl Lock for LockService {
    async fn lock(&self, request: Request<LockRequest>) -> Result<Response<LockResponse>, Status> {
        let started = Instant::now();
        let req = request.into_inner();
        let deadline = started + LOCK_WAIT_LIMIT;
        let result = lock::acquire(self.backend(), &req.name, req.lease, deadline)
            .await
            .map(|grant| LockResponse {
                header: Some(grant.header),
                key: grant.key,
            });
        super::record("grpc", LOCK, started, result.as_ref().err());
        result.map(Response::new).map_err(Into::into)
    }

    async fn unlock(
        &self,
        request: Request<UnlockRequest>,
    ) -> Result<Response<UnlockResponse>, Status> {
        let started = Instant::now();
        let result = lock::release(self.backend().as_ref(), request.into_inner().key)
            .await
            .map(|header| UnlockResponse {
                header: Some(header),
            });
        super::record("grpc", UNLOCK, started, result.as_ref().err());
        result.map(Response::new).map_err(Into::into)
    }
}
