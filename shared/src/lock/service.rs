//! [`LockService`]: etcd's `v3lockpb.Lock` over any [`LockBackend`], the
//! one gRPC front of the lock recipe for the cell and the proxy alike.
//!
//! A Lock call waits for the lock up to its gRPC deadline (tonic ends the
//! call then, and the contender's queue key is removed), and never longer
//! than [`LOCK_WAIT_LIMIT`].

use super::{acquire, release, LockBackend};
use crate::v3lockpb::lock_server::Lock;
use crate::v3lockpb::{LockRequest, LockResponse, UnlockRequest, UnlockResponse};
use std::sync::Arc;
use std::time::Duration;
use tonic::{Request, Response, Status};

/// The longest a Lock call without a deadline waits.
pub const LOCK_WAIT_LIMIT: Duration = Duration::from_secs(3600);

pub struct LockService<B> {
    backend: Arc<B>,
}

impl<B> LockService<B> {
    pub fn new(backend: Arc<B>) -> Self {
        LockService { backend }
    }
}

#[tonic::async_trait]
impl<B: LockBackend> Lock for LockService<B> {
    async fn lock(&self, request: Request<LockRequest>) -> Result<Response<LockResponse>, Status> {
        let req = request.into_inner();
        let deadline = tokio::time::Instant::now() + LOCK_WAIT_LIMIT;
        let grant = acquire(self.backend.clone(), &req.name, req.lease, deadline).await?;
        Ok(Response::new(LockResponse {
            header: Some(grant.header),
            key: grant.key,
        }))
    }

    async fn unlock(
        &self,
        request: Request<UnlockRequest>,
    ) -> Result<Response<UnlockResponse>, Status> {
        let header = release(self.backend.as_ref(), request.into_inner().key).await?;
        Ok(Response::new(UnlockResponse {
            header: Some(header),
        }))
    }
}
