//! latchkey's `ProxyAuth` service (`proto/proxy_auth.proto`): a proxy asks
//! whether the clients of its shared watches may still read what they
//! watch, after the auth records changed. Only a proxy may ask: it learns
//! other users' permissions here.

use crate::node::CellNode;
use crate::ops::auth_gate::AuthGate;
use latchkey_shared::auth::token::now_unix_ms;
use latchkey_shared::auth::Caller;
use latchkey_shared::proxy_auth_pb::proxy_auth_server::ProxyAuth;
use latchkey_shared::proxy_auth_pb::{CheckReadsRequest, CheckReadsResponse, ReadAnswer};
use latchkey_shared::{ApiError, KeyRange};
use std::sync::Arc;
use tonic::{Request, Response, Status};

/// Most checks one request may carry (a proxy splits larger sets).
pub const MAX_CHECKS: usize = 10_000;

pub struct ProxyAuthService {
    pub node: Arc<CellNode>,
    pub gate: Arc<AuthGate>,
}

#[tonic::async_trait]
impl ProxyAuth for ProxyAuthService {
    async fn check_reads(
        &self,
        request: Request<CheckReadsRequest>,
    ) -> Result<Response<CheckReadsResponse>, Status> {
        if !self.gate.caller(request.metadata())?.writes_records() {
            return Err(ApiError::permission_denied(
                "only a proxy (role latchkey-proxy, or the proxies' key) checks other users' permissions",
            )
            .into());
        }
        let checks = request.into_inner().checks;
        if checks.len() > MAX_CHECKS {
            return Err(ApiError::invalid(format!(
                "{} checks in one request is over the limit of {MAX_CHECKS}; split them",
                checks.len()
            ))
            .into());
        }
        // The header first: the view below is at least as new as it.
        let header = self.node.header_now();
        let view = self.gate.view();
        let now = now_unix_ms();
        let answers = checks
            .into_iter()
            .map(|c| {
                let range = KeyRange::new(c.key, c.range_end);
                // A token is verified now; its user is the one checked.
                let user = match c.token.as_str() {
                    "" => Ok(c.user),
                    token => {
                        let at = match c.at_unix_ms {
                            0 => now,
                            at => at.min(now),
                        };
                        view.caller(Some(token), at).map(|caller| match caller {
                            Caller::User { name, .. } => name,
                            Caller::Anyone | Caller::Proxy => String::new(),
                        })
                    }
                };
                let verdict = user
                    .and_then(|user| view.may_still_read(&user, &range, c.admin).map(|()| user));
                match verdict {
                    Ok(user) => ReadAnswer {
                        user,
                        ..ReadAnswer::default()
                    },
                    Err(e) => ReadAnswer {
                        code: e.code.as_str().to_string(),
                        message: e.message,
                        user: String::new(),
                    },
                }
            })
            .collect();
        Ok(Response::new(CheckReadsResponse {
            header: Some(header),
            answers,
            auth_revision: view.version.max(0) as u64,
        }))
    }
}
