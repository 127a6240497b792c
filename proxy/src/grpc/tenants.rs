//! latchkey's `Tenants`, passed through to the cell as the client: the
//! cell keeps the tenants' records, judges who may change them and
//! enforces their quotas on every write.

use super::service;
use crate::state::ProxyState;
use latchkey_shared::etcd_methods::tenants::*;
use latchkey_shared::tenants_pb::tenants_server::Tenants;
use latchkey_shared::tenants_pb::*;
use std::sync::Arc;

pub struct TenantsService {
    pub state: Arc<ProxyState>,
}

service! {
    impl Tenants for TenantsService {
        pass_through {
            put(TenantPutRequest) -> TenantPutResponse = Write, PUT;
            get(TenantGetRequest) -> TenantGetResponse = Read, GET;
            list(TenantListRequest) -> TenantListResponse = Read, LIST;
            delete(TenantDeleteRequest) -> TenantDeleteResponse = Write, DELETE;
        }
    }
}
