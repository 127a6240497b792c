//! `POST /v1/auth/token`: a user name and password for a token (etcd's
//! Authenticate, answered by the cell). Every other route takes the token
//! as `Authorization: Bearer <token>` and runs as its user; without one,
//! a cell with authentication on answers 401 (`user_empty`).

use super::extract::{Client, Json};
use super::model::ErrorBody;
use super::{answer, Answer};
use crate::state::ProxyState;
use crate::upstream::{Kind, Route, Who};
use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::Response;
use latchkey_shared::auth::token::TOKEN_TTL;
use latchkey_shared::auth_pb::{AuthenticateRequest, AuthenticateResponse};
use latchkey_shared::etcd_methods::auth::AUTHENTICATE;
use serde::{Deserialize, Serialize};
use std::sync::Arc;
use utoipa::ToSchema;

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct TokenRequest {
    pub name: String,
    pub password: String,
}

#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct TokenAnswer {
    /// Send it as `Authorization: Bearer <token>`.
    pub token: String,
    /// How long it is good for; ask for a new one before then (a changed
    /// password or a deleted user ends it sooner: 401 invalid_auth_token).
    pub ttl_seconds: u64,
}

/// A token for a user name and password.
#[utoipa::path(post, path = "/v1/auth/token", tag = "auth",
    request_body = TokenRequest,
    responses((status = 200, body = TokenAnswer),
        (status = 401, body = ErrorBody, description = "auth_failed: the user or the password is wrong (the same answer for both)"),
        (status = 409, body = ErrorBody, description = "auth_not_enabled"),
        (status = 429, body = ErrorBody, description = "rate_limited: too many attempts from this address or for this user; Retry-After says when"),
        (status = "4XX", body = ErrorBody), (status = "5XX", body = ErrorBody)))]
pub async fn token(
    State(state): State<Arc<ProxyState>>,
    Client(client): Client,
    Json(req): Json<TokenRequest>,
) -> Answer<TokenAnswer> {
    let asked = AuthenticateRequest {
        name: req.name,
        password: req.password,
    };
    let forwarded = state.upstream.home().call_as(
        Who::Client(None),
        Route::Leader,
        Kind::Read,
        AUTHENTICATE,
        asked.clone(),
    );
    let answered: AuthenticateResponse =
        crate::ops::auth::limited_authenticate(&state, client, forwarded).await?;
    let answered = crate::ops::auth::for_every_cell(&state, &asked, answered).await;
    answer(TokenAnswer {
        token: answered.token,
        ttl_seconds: TOKEN_TTL.as_secs(),
    })
}

/// Runs the request as the client its `Authorization` header names.
pub async fn as_caller(request: Request, next: Next) -> Response {
    let token = request
        .headers()
        .get(axum::http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(crate::ops::auth::token_from_header);
    crate::ops::auth::as_client(token, next.run(request)).await
}
