//! etcd v3 `Auth`, passed through to the cell as the client: `etcdctl
//! user/role/auth` and etcd clients' user name and password work through
//! a proxy as against the cell, which keeps the auth records and judges
//! every call. Authenticate attempts are limited per client address here
//! (and per user at the cell).

use super::service;
use crate::state::ProxyState;
use latchkey_shared::auth_pb::auth_server::Auth;
use latchkey_shared::auth_pb::*;
use latchkey_shared::etcd_methods::auth::*;
use std::sync::Arc;

pub struct AuthService {
    pub state: Arc<ProxyState>,
}

service! {
    impl Auth for AuthService {
        pass_through {
            auth_enable(AuthEnableRequest) -> AuthEnableResponse = Write, AUTH_ENABLE;
            auth_disable(AuthDisableRequest) -> AuthDisableResponse = Write, AUTH_DISABLE;
            auth_status(AuthStatusRequest) -> AuthStatusResponse = Read, AUTH_STATUS;
            user_add(AuthUserAddRequest) -> AuthUserAddResponse = Write, USER_ADD;
            user_get(AuthUserGetRequest) -> AuthUserGetResponse = Read, USER_GET;
            user_list(AuthUserListRequest) -> AuthUserListResponse = Read, USER_LIST;
            user_delete(AuthUserDeleteRequest) -> AuthUserDeleteResponse = Write, USER_DELETE;
            user_change_password(AuthUserChangePasswordRequest) -> AuthUserChangePasswordResponse = Write, USER_CHANGE_PASSWORD;
            user_grant_role(AuthUserGrantRoleRequest) -> AuthUserGrantRoleResponse = Write, USER_GRANT_ROLE;
            user_revoke_role(AuthUserRevokeRoleRequest) -> AuthUserRevokeRoleResponse = Write, USER_REVOKE_ROLE;
            role_add(AuthRoleAddRequest) -> AuthRoleAddResponse = Write, ROLE_ADD;
            role_get(AuthRoleGetRequest) -> AuthRoleGetResponse = Read, ROLE_GET;
            role_list(AuthRoleListRequest) -> AuthRoleListResponse = Read, ROLE_LIST;
            role_delete(AuthRoleDeleteRequest) -> AuthRoleDeleteResponse = Write, ROLE_DELETE;
            role_grant_permission(AuthRoleGrantPermissionRequest) -> AuthRoleGrantPermissionResponse = Write, ROLE_GRANT_PERMISSION;
            role_revoke_permission(AuthRoleRevokePermissionRequest) -> AuthRoleRevokePermissionResponse = Write, ROLE_REVOKE_PERMISSION;
        }

        /// Passed through too, while the client's address has failed
        /// attempts left.
        async fn authenticate(
            &self,
            request: tonic::Request<AuthenticateRequest>,
        ) -> Result<tonic::Response<AuthenticateResponse>, tonic::Status> {
            let client = latchkey_shared::tls::RemotePeer::of(&request).map(|p| p.addr);
            let cell = self.state.upstream.home().clone();
            let token = crate::ops::auth::client_token();
            let asked = request.into_inner();
            let forwarded = cell.call_as(
                crate::upstream::Who::Client(token.as_deref()),
                crate::upstream::Route::Leader,
                crate::upstream::Kind::Read,
                AUTHENTICATE,
                asked.clone(),
            );
            let answer = match crate::ops::auth::limited_authenticate(&self.state, client, forwarded).await {
                Ok(home) => Ok(crate::ops::auth::for_every_cell(&self.state, &asked, home).await),
                Err(e) => Err(e),
            };
            super::answer(answer)
        }
    }
}
