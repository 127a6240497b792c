//! [`CellIdentity`]: one task per cell that asks every second whether the
//! cell has authentication on (AuthStatus needs no token), and, with
//! `--cell-user`, authenticates as that user and keeps the token fresh
//! (again after half a token's life, and at once when authentication
//! comes on). Until the first answer the proxy treats authentication as
//! possibly on, so it never acts for a client with its own identity
//! before the cell has said the client may.

use super::cell_client::Cell;
use super::{Kind, Route};
use latchkey_shared::auth::token::TOKEN_TTL;
use latchkey_shared::auth_pb::{
    AuthStatusRequest, AuthStatusResponse, AuthenticateRequest, AuthenticateResponse,
};
use latchkey_shared::etcd_methods::auth::{AUTHENTICATE, AUTH_STATUS};
use std::time::Duration;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// How often the cell is asked whether authentication is on and for its
/// auth version: a proxy acts on a change within this (a revoked
/// permission ends the shared watches it allowed within this and one
/// check's round trip).
pub const STATUS_INTERVAL: Duration = Duration::from_millis(250);

/// The user and password the proxy authenticates as.
#[derive(Clone)]
pub struct Credentials {
    pub user: String,
    pub password: String,
}

pub struct CellIdentity {
    pub cell: Cell,
    pub credentials: Option<Credentials>,
}

impl CellIdentity {
    pub async fn run(self, shutdown: CancellationToken) {
        let mut tick = tokio::time::interval(STATUS_INTERVAL);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut issued: Option<Instant> = None;
        let mut warned: Option<Instant> = None;
        while shutdown.run_until_cancelled(tick.tick()).await.is_some() {
            let status: Result<AuthStatusResponse, _> = self
                .cell
                .call(Route::Any, Kind::Read, AUTH_STATUS, AuthStatusRequest {})
                .await;
            let on = match status {
                Ok(s) => {
                    self.cell.set_auth_status(s.enabled, s.auth_revision);
                    s.enabled
                }
                // No answer: what was known stays known.
                Err(_) => continue,
            };
            let Some(credentials) = &self.credentials else {
                self.cell.settle_identity();
                continue;
            };
            let stale = issued.is_none_or(|at| at.elapsed() >= TOKEN_TTL / 2);
            if !on || !stale {
                self.cell.settle_identity();
                continue;
            }
            let answer: Result<AuthenticateResponse, _> = self
                .cell
                .call(
                    Route::Leader,
                    Kind::Read,
                    AUTHENTICATE,
                    AuthenticateRequest {
                        name: credentials.user.clone(),
                        password: credentials.password.clone(),
                    },
                )
                .await;
            match answer {
                Ok(a) => {
                    self.cell.own_credentials.set(Some(&a.token));
                    self.cell.settle_identity();
                    issued = Some(Instant::now());
                }
                Err(e) => {
                    // The proxy's own calls go on without a token (and are
                    // refused) rather than wait for one that does not come.
                    self.cell.settle_identity();
                    // Once a minute: a wrong password is an operator's
                    // mistake, not a flood of lines.
                    if warned.is_none_or(|at| at.elapsed() >= Duration::from_secs(60)) {
                        tracing::warn!(user = %credentials.user, error = %e,
                            "cannot authenticate to the cell; its authentication is on, so the proxy's own calls are refused");
                        warned = Some(Instant::now());
                    }
                }
            }
        }
    }
}
