//! `v3lockpb.Lock` and `v3electionpb.Election` behind the caller's
//! permissions: the shared recipes' services, each call checked first
//! against the keys it touches (a lock or election `name` is the prefix of
//! its queue keys, which the recipe reads and writes; a held key is
//! written when released, proclaimed or resigned).

use crate::ops::auth_gate::AuthGate;
use crate::ops::locks::LocalLocks;
use latchkey_shared::auth::{Caller, Need};
use latchkey_shared::lock::{ElectionService, LockService};
use latchkey_shared::v3electionpb::election_server::Election;
use latchkey_shared::v3electionpb::{
    CampaignRequest, CampaignResponse, LeaderKey, LeaderRequest, LeaderResponse, ProclaimRequest,
    ProclaimResponse, ResignRequest, ResignResponse,
};
use latchkey_shared::v3lockpb::lock_server::Lock;
use latchkey_shared::v3lockpb::{LockRequest, LockResponse, UnlockRequest, UnlockResponse};
use latchkey_shared::{ApiError, KeyRange};
use std::sync::Arc;
use tonic::{Request, Response, Status};

/// Read and write on every key of the recipe `name`.
fn require_recipe(caller: &Caller, name: &[u8]) -> Result<(), ApiError> {
    let queue = KeyRange::prefix(name);
    caller.require(Need::Write, &queue)?;
    caller.require(Need::Read, &queue)
}

fn require_held(caller: &Caller, leader: Option<&LeaderKey>) -> Result<(), ApiError> {
    let key = leader.map(|l| l.key.clone()).unwrap_or_default();
    caller.require(Need::Write, &KeyRange::single(key))
}

pub struct GuardedLocks {
    pub inner: LockService<LocalLocks>,
    pub gate: Arc<AuthGate>,
}

#[tonic::async_trait]
impl Lock for GuardedLocks {
    async fn lock(&self, request: Request<LockRequest>) -> Result<Response<LockResponse>, Status> {
        let caller = self.gate.caller(request.metadata())?;
        require_recipe(&caller, &request.get_ref().name)?;
        self.inner.lock(request).await
    }

    async fn unlock(
        &self,
        request: Request<UnlockRequest>,
    ) -> Result<Response<UnlockResponse>, Status> {
        let caller = self.gate.caller(request.metadata())?;
        caller.require(
            Need::Write,
            &KeyRange::single(request.get_ref().key.clone()),
        )?;
        self.inner.unlock(request).await
    }
}

pub struct GuardedElections {
    pub inner: ElectionService<LocalLocks>,
    pub gate: Arc<AuthGate>,
}

#[tonic::async_trait]
impl Election for GuardedElections {
    async fn campaign(
        &self,
        request: Request<CampaignRequest>,
    ) -> Result<Response<CampaignResponse>, Status> {
        let caller = self.gate.caller(request.metadata())?;
        require_recipe(&caller, &request.get_ref().name)?;
        self.inner.campaign(request).await
    }

    async fn proclaim(
        &self,
        request: Request<ProclaimRequest>,
    ) -> Result<Response<ProclaimResponse>, Status> {
        let caller = self.gate.caller(request.metadata())?;
        require_held(&caller, request.get_ref().leader.as_ref())?;
        self.inner.proclaim(request).await
    }

    async fn leader(
        &self,
        request: Request<LeaderRequest>,
    ) -> Result<Response<LeaderResponse>, Status> {
        let caller = self.gate.caller(request.metadata())?;
        caller.require(Need::Read, &KeyRange::prefix(&request.get_ref().name))?;
        self.inner.leader(request).await
    }

    type ObserveStream = <ElectionService<LocalLocks> as Election>::ObserveStream;

    async fn observe(
        &self,
        request: Request<LeaderRequest>,
    ) -> Result<Response<Self::ObserveStream>, Status> {
        let caller = self.gate.caller(request.metadata())?;
        caller.require(Need::Read, &KeyRange::prefix(&request.get_ref().name))?;
        self.inner.observe(request).await
    }

    async fn resign(
        &self,
        request: Request<ResignRequest>,
    ) -> Result<Response<ResignResponse>, Status> {
        let caller = self.gate.caller(request.metadata())?;
        require_held(&caller, request.get_ref().leader.as_ref())?;
        self.inner.resign(request).await
    }
}
