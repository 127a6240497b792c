//! latchkey's `Tenants` service: the gRPC face of
//! [`ops::tenants`](crate::ops::tenants).

use crate::mvcc::tenants::Usage;
use crate::ops::auth_gate::AuthGate;
use crate::ops::tenants::TenantOps;
use latchkey_shared::tenant::TenantRecord;
use latchkey_shared::tenants_pb::tenants_server::Tenants;
use latchkey_shared::tenants_pb::*;
use latchkey_shared::ApiError;
use std::sync::Arc;
use tonic::{Request, Response, Status};

pub struct TenantsService {
    pub ops: TenantOps,
    pub gate: Arc<AuthGate>,
}

type Answer<T> = Result<Response<T>, Status>;

fn info(record: &TenantRecord, usage: Usage) -> TenantInfo {
    TenantInfo {
        tenant: Some(record.to_pb()),
        usage: Some(TenantUsage {
            keys: usage.keys,
            bytes: usage.bytes,
        }),
    }
}

#[tonic::async_trait]
impl Tenants for TenantsService {
    async fn put(&self, request: Request<TenantPutRequest>) -> Answer<TenantPutResponse> {
        let caller = self.gate.caller(request.metadata())?;
        let tenant = request
            .into_inner()
            .tenant
            .ok_or_else(|| ApiError::invalid("give the tenant's settings"))?;
        let header = self.ops.put(&caller, TenantRecord::from_pb(tenant)).await?;
        Ok(Response::new(TenantPutResponse {
            header: Some(header),
        }))
    }

    async fn get(&self, request: Request<TenantGetRequest>) -> Answer<TenantGetResponse> {
        let caller = self.gate.caller(request.metadata())?;
        let (header, record, usage) = self.ops.get(&caller, &request.get_ref().name)?;
        Ok(Response::new(TenantGetResponse {
            header: Some(header),
            info: Some(info(&record, usage)),
        }))
    }

    async fn list(&self, request: Request<TenantListRequest>) -> Answer<TenantListResponse> {
        let caller = self.gate.caller(request.metadata())?;
        let (header, all) = self.ops.list(&caller)?;
        Ok(Response::new(TenantListResponse {
            header: Some(header),
            tenants: all.iter().map(|(r, u)| info(r, *u)).collect(),
        }))
    }

    async fn delete(&self, request: Request<TenantDeleteRequest>) -> Answer<TenantDeleteResponse> {
        let caller = self.gate.caller(request.metadata())?;
        let header = self.ops.delete(&caller, &request.get_ref().name).await?;
        Ok(Response::new(TenantDeleteResponse {
            header: Some(header),
        }))
    }
}
