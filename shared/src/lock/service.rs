//! etcd's `v3lockpb.Lock` ([`LockService`]) and `v3electionpb.Election`
//! ([`ElectionService`]) over any [`LockBackend`]: the one gRPC front of
//! the recipes, for the cell and the proxy alike.
//!
//! A Lock or Campaign call waits up to its gRPC deadline (tonic ends the
//! call then, and the contender's queue key is removed), and never longer
//! than [`WAIT_LIMIT`].

use super::{election, mutex, Access, LockBackend};
use crate::idempotency::Guard;
use crate::v3electionpb::election_server::Election;
use crate::v3electionpb::{
    CampaignRequest, CampaignResponse, LeaderRequest, LeaderResponse, ProclaimRequest,
    ProclaimResponse, ResignRequest, ResignResponse,
};
use crate::v3lockpb::lock_server::Lock;
use crate::v3lockpb::{LockRequest, LockResponse, UnlockRequest, UnlockResponse};
use crate::{ApiError, KeyRange};
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;
use tokio_stream::{Stream, StreamExt};
use tonic::{Request, Response, Status};

/// The longest a Lock or Campaign call without a deadline waits.
pub const WAIT_LIMIT: Duration = Duration::from_secs(3600);

fn deadline() -> tokio::time::Instant {
    tokio::time::Instant::now() + WAIT_LIMIT
}

pub struct LockService<B> {
    backend: Arc<B>,
}

impl<B> LockService<B> {
    pub fn new(backend: Arc<B>) -> Self {
        LockService { backend }
    }
}

impl<B: LockBackend> LockService<B> {
    /// The guard of a request that names an idempotency key (none
    /// without).
    async fn guard(&self, key: &str, request: Vec<Vec<u8>>) -> Result<Option<Guard>, ApiError> {
        if key.is_empty() {
            return Ok(None);
        }
        self.backend.guard(key.to_string(), request).await.map(Some)
    }
}

#[tonic::async_trait]
impl<B: LockBackend> Lock for LockService<B> {
    async fn lock(&self, request: Request<LockRequest>) -> Result<Response<LockResponse>, Status> {
        let queue = KeyRange::prefix(&request.get_ref().name);
        self.backend
            .permit(request.metadata(), Access::ReadWrite, &queue)
            .await?;
        let req = request.into_inner();
        let guard = self
            .guard(
                &req.idempotency_key,
                vec![
                    b"Lock".to_vec(),
                    req.name.clone(),
                    req.lease.to_be_bytes().to_vec(),
                ],
            )
            .await?;
        let grant = mutex::acquire(
            self.backend.clone(),
            &req.name,
            req.lease,
            Duration::ZERO,
            deadline(),
            guard.as_ref(),
        )
        .await?;
        Ok(Response::new(LockResponse {
            header: Some(grant.header),
            key: grant.key,
        }))
    }

    async fn unlock(
        &self,
        request: Request<UnlockRequest>,
    ) -> Result<Response<UnlockResponse>, Status> {
        let held = KeyRange::single(request.get_ref().key.clone());
        self.backend
            .permit(request.metadata(), Access::ReadWrite, &held)
            .await?;
        let req = request.into_inner();
        let guard = self
            .guard(
                &req.idempotency_key,
                vec![b"Unlock".to_vec(), req.key.clone()],
            )
            .await?;
        let (header, _) = mutex::release(self.backend.as_ref(), req.key, guard.as_ref()).await?;
        Ok(Response::new(UnlockResponse {
            header: Some(header),
        }))
    }
}

pub struct ElectionService<B> {
    backend: Arc<B>,
}

impl<B> ElectionService<B> {
    pub fn new(backend: Arc<B>) -> Self {
        ElectionService { backend }
    }
}

/// The key a Proclaim or Resign says it holds (empty when it names none,
/// which the call then refuses).
fn held_key(leader: Option<&crate::v3electionpb::LeaderKey>) -> KeyRange {
    KeyRange::single(leader.map(|l| l.key.clone()).unwrap_or_default())
}

fn leader_key(
    leader: Option<crate::v3electionpb::LeaderKey>,
) -> Result<crate::v3electionpb::LeaderKey, ApiError> {
    leader.ok_or_else(|| ApiError::invalid("\"leader\" field must be provided"))
}

#[tonic::async_trait]
impl<B: LockBackend> Election for ElectionService<B> {
    async fn campaign(
        &self,
        request: Request<CampaignRequest>,
    ) -> Result<Response<CampaignResponse>, Status> {
        let queue = KeyRange::prefix(&request.get_ref().name);
        self.backend
            .permit(request.metadata(), Access::ReadWrite, &queue)
            .await?;
        let req = request.into_inner();
        let (leader, header) = election::campaign(
            self.backend.clone(),
            &req.name,
            req.lease,
            req.value,
            deadline(),
        )
        .await?;
        Ok(Response::new(CampaignResponse {
            header: Some(header),
            leader: Some(leader),
        }))
    }

    async fn proclaim(
        &self,
        request: Request<ProclaimRequest>,
    ) -> Result<Response<ProclaimResponse>, Status> {
        let held = held_key(request.get_ref().leader.as_ref());
        self.backend
            .permit(request.metadata(), Access::ReadWrite, &held)
            .await?;
        let req = request.into_inner();
        let leader = leader_key(req.leader)?;
        let header = election::proclaim(self.backend.as_ref(), &leader, req.value).await?;
        Ok(Response::new(ProclaimResponse {
            header: Some(header),
        }))
    }

    async fn leader(
        &self,
        request: Request<LeaderRequest>,
    ) -> Result<Response<LeaderResponse>, Status> {
        let queue = KeyRange::prefix(&request.get_ref().name);
        self.backend
            .permit(request.metadata(), Access::Read, &queue)
            .await?;
        let name = request.into_inner().name;
        match election::leader(self.backend.as_ref(), &name).await? {
            (Some(kv), header) => Ok(Response::new(LeaderResponse {
                header: Some(header),
                kv: Some(kv),
            })),
            (None, _) => Err(ApiError::election_no_leader(&name).into()),
        }
    }

    type ObserveStream = Pin<Box<dyn Stream<Item = Result<LeaderResponse, Status>> + Send>>;

    /// Every leader and every value it proclaims, as they happen; nothing
    /// while nobody leads. Ends when the client goes away.
    async fn observe(
        &self,
        request: Request<LeaderRequest>,
    ) -> Result<Response<Self::ObserveStream>, Status> {
        let queue = KeyRange::prefix(&request.get_ref().name);
        let revoked = self
            .backend
            .permit_stream(request.metadata(), &queue)
            .await?;
        let name = request.into_inner().name;
        if name.is_empty() {
            return Err(ApiError::invalid("an election needs a name").into());
        }
        let leaders = election::observe_until(self.backend.clone(), name, revoked);
        let answers = leaders.map(|observed| {
            observed
                .map(|(kv, header)| LeaderResponse {
                    header: Some(header),
                    kv: Some(kv),
                })
                .map_err(Status::from)
        });
        Ok(Response::new(Box::pin(answers)))
    }

    async fn resign(
        &self,
        request: Request<ResignRequest>,
    ) -> Result<Response<ResignResponse>, Status> {
        let held = held_key(request.get_ref().leader.as_ref());
        self.backend
            .permit(request.metadata(), Access::ReadWrite, &held)
            .await?;
        let leader = leader_key(request.into_inner().leader)?;
        let header = election::resign(self.backend.as_ref(), &leader).await?;
        Ok(Response::new(ResignResponse {
            header: Some(header),
        }))
    }
}
