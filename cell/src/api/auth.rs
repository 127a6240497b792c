//! etcd v3 `Auth` service: the gRPC face of [`ops::auth`](crate::ops::auth).

use crate::ops::auth::{perm_record, AuthOps, NewPassword};
use latchkey_shared::auth::Caller;
use latchkey_shared::auth_pb::auth_server::Auth;
use latchkey_shared::auth_pb::*;
use latchkey_shared::authpb::Permission;
use latchkey_shared::ApiError;
use std::sync::Arc;
use tonic::{Request, Response, Status};

pub struct AuthService {
    pub ops: Arc<AuthOps>,
}

impl AuthService {
    fn caller<T>(&self, request: &Request<T>) -> Result<Caller, ApiError> {
        self.ops.gate().caller(request.metadata())
    }
}

type Answer<T> = Result<Response<T>, Status>;

#[tonic::async_trait]
impl Auth for AuthService {
    async fn auth_enable(&self, request: Request<AuthEnableRequest>) -> Answer<AuthEnableResponse> {
        let caller = self.caller(&request)?;
        let header = self.ops.enable(&caller).await?;
        Ok(Response::new(AuthEnableResponse {
            header: Some(header),
        }))
    }

    async fn auth_disable(
        &self,
        request: Request<AuthDisableRequest>,
    ) -> Answer<AuthDisableResponse> {
        let caller = self.caller(&request)?;
        let header = self.ops.disable(&caller).await?;
        Ok(Response::new(AuthDisableResponse {
            header: Some(header),
        }))
    }

    async fn auth_status(
        &self,
        _request: Request<AuthStatusRequest>,
    ) -> Answer<AuthStatusResponse> {
        let (header, enabled, auth_revision) = self.ops.status();
        Ok(Response::new(AuthStatusResponse {
            header: Some(header),
            enabled,
            auth_revision,
        }))
    }

    async fn authenticate(
        &self,
        request: Request<AuthenticateRequest>,
    ) -> Answer<AuthenticateResponse> {
        let source = latchkey_shared::tls::RemotePeer::of(&request).map(|p| p.addr.ip());
        let req = request.into_inner();
        let (header, token) = self
            .ops
            .authenticate(&req.name, &req.password, source)
            .await?;
        Ok(Response::new(AuthenticateResponse {
            header: Some(header),
            token,
        }))
    }

    async fn user_add(&self, request: Request<AuthUserAddRequest>) -> Answer<AuthUserAddResponse> {
        let caller = self.caller(&request)?;
        let req = request.into_inner();
        let new = NewPassword {
            password: &req.password,
            hashed_password: &req.hashed_password,
            no_password: req.options.is_some_and(|o| o.no_password),
        };
        let header = self.ops.user_add(&caller, &req.name, new).await?;
        Ok(Response::new(AuthUserAddResponse {
            header: Some(header),
        }))
    }

    async fn user_get(&self, request: Request<AuthUserGetRequest>) -> Answer<AuthUserGetResponse> {
        let caller = self.caller(&request)?;
        let (header, roles) = self.ops.user_get(&caller, &request.get_ref().name)?;
        Ok(Response::new(AuthUserGetResponse {
            header: Some(header),
            roles,
        }))
    }

    async fn user_list(
        &self,
        request: Request<AuthUserListRequest>,
    ) -> Answer<AuthUserListResponse> {
        let caller = self.caller(&request)?;
        let (header, users) = self.ops.user_list(&caller)?;
        Ok(Response::new(AuthUserListResponse {
            header: Some(header),
            users,
        }))
    }

    async fn user_delete(
        &self,
        request: Request<AuthUserDeleteRequest>,
    ) -> Answer<AuthUserDeleteResponse> {
        let caller = self.caller(&request)?;
        let header = self
            .ops
            .user_delete(&caller, &request.get_ref().name)
            .await?;
        Ok(Response::new(AuthUserDeleteResponse {
            header: Some(header),
        }))
    }

    async fn user_change_password(
        &self,
        request: Request<AuthUserChangePasswordRequest>,
    ) -> Answer<AuthUserChangePasswordResponse> {
        let caller = self.caller(&request)?;
        let req = request.into_inner();
        let new = NewPassword {
            password: &req.password,
            hashed_password: &req.hashed_password,
            no_password: false,
        };
        let header = self
            .ops
            .user_change_password(&caller, &req.name, new)
            .await?;
        Ok(Response::new(AuthUserChangePasswordResponse {
            header: Some(header),
        }))
    }

    async fn user_grant_role(
        &self,
        request: Request<AuthUserGrantRoleRequest>,
    ) -> Answer<AuthUserGrantRoleResponse> {
        let caller = self.caller(&request)?;
        let req = request.get_ref();
        let header = self
            .ops
            .user_grant_role(&caller, &req.user, &req.role)
            .await?;
        Ok(Response::new(AuthUserGrantRoleResponse {
            header: Some(header),
        }))
    }

    async fn user_revoke_role(
        &self,
        request: Request<AuthUserRevokeRoleRequest>,
    ) -> Answer<AuthUserRevokeRoleResponse> {
        let caller = self.caller(&request)?;
        let req = request.get_ref();
        let header = self
            .ops
            .user_revoke_role(&caller, &req.name, &req.role)
            .await?;
        Ok(Response::new(AuthUserRevokeRoleResponse {
            header: Some(header),
        }))
    }

    async fn role_add(&self, request: Request<AuthRoleAddRequest>) -> Answer<AuthRoleAddResponse> {
        let caller = self.caller(&request)?;
        let header = self.ops.role_add(&caller, &request.get_ref().name).await?;
        Ok(Response::new(AuthRoleAddResponse {
            header: Some(header),
        }))
    }

    async fn role_get(&self, request: Request<AuthRoleGetRequest>) -> Answer<AuthRoleGetResponse> {
        let caller = self.caller(&request)?;
        let (header, perms) = self.ops.role_get(&caller, &request.get_ref().role)?;
        Ok(Response::new(AuthRoleGetResponse {
            header: Some(header),
            perm: perms
                .into_iter()
                .map(|p| Permission {
                    perm_type: p.kind.etcd(),
                    key: p.key,
                    range_end: p.range_end,
                })
                .collect(),
        }))
    }

    async fn role_list(
        &self,
        request: Request<AuthRoleListRequest>,
    ) -> Answer<AuthRoleListResponse> {
        let caller = self.caller(&request)?;
        let (header, roles) = self.ops.role_list(&caller)?;
        Ok(Response::new(AuthRoleListResponse {
            header: Some(header),
            roles,
        }))
    }

    async fn role_delete(
        &self,
        request: Request<AuthRoleDeleteRequest>,
    ) -> Answer<AuthRoleDeleteResponse> {
        let caller = self.caller(&request)?;
        let header = self
            .ops
            .role_delete(&caller, &request.get_ref().role)
            .await?;
        Ok(Response::new(AuthRoleDeleteResponse {
            header: Some(header),
        }))
    }

    async fn role_grant_permission(
        &self,
        request: Request<AuthRoleGrantPermissionRequest>,
    ) -> Answer<AuthRoleGrantPermissionResponse> {
        let caller = self.caller(&request)?;
        let req = request.into_inner();
        let perm = req
            .perm
            .ok_or_else(|| ApiError::invalid("no permission given"))?;
        let perm = perm_record(perm.perm_type, perm.key, perm.range_end)?;
        let header = self
            .ops
            .role_grant_permission(&caller, &req.name, perm)
            .await?;
        Ok(Response::new(AuthRoleGrantPermissionResponse {
            header: Some(header),
        }))
    }

    async fn role_revoke_permission(
        &self,
        request: Request<AuthRoleRevokePermissionRequest>,
    ) -> Answer<AuthRoleRevokePermissionResponse> {
        let caller = self.caller(&request)?;
        let req = request.get_ref();
        let header = self
            .ops
            .role_revoke_permission(&caller, &req.role, &req.key, &req.range_end)
            .await?;
        Ok(Response::new(AuthRoleRevokePermissionResponse {
            header: Some(header),
        }))
    }
}
