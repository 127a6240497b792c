//! Charging a client's request to the tenants whose keys it names
//! ([`TenantLimits`](crate::tenant_limits::TenantLimits)), before the proxy
//! acts on it: KV operations, watches, locks and elections.
//!
//! Who the client is decides the buckets ([`Requester`]). With
//! authentication on, a token the cell has not vouched for yet is asked
//! about once, uncharged: `UserGet` of the user it names, with the token
//! (the cell answers only a valid token of that user, or root's). Those
//! questions are themselves limited per proxy ([`token_checks`]); past
//! the limit, or for a token the cell refuses, the request is charged as
//! unverified. A request without a token is refused as the cell would
//! refuse it (`user_empty`), charged to no one.

use super::auth::client_token;
use crate::state::ProxyState;
use crate::tenant_limits::Requester;
use crate::upstream::{Cell, Kind, Route, Who};
use latchkey_shared::auth::limiter::AttemptLimiter;
use latchkey_shared::auth::token::claims_of_accepted;
use latchkey_shared::auth_pb::{AuthUserGetRequest, AuthUserGetResponse};
use latchkey_shared::etcd_methods::auth::USER_GET;
use latchkey_shared::{ApiError, KeyRange};
use std::sync::Arc;
use tokio::time::Instant;

/// Unknown tokens one proxy asks the cell about: 200 a second, 400 at
/// once (a flood of made-up tokens costs the cell no more than that).
pub fn token_checks() -> AttemptLimiter {
    AttemptLimiter::new("token checks", 200.0, 400)
}

/// Charges this task's client for one request naming the key ranges
/// `ranges` gives (asked only while some tenant exists): refused with
/// `rate_limited` past a rate of any tenant they overlap, or its rate per
/// user.
pub async fn charge(
    state: &ProxyState,
    ranges: impl FnOnce() -> Vec<KeyRange>,
) -> Result<(), ApiError> {
    if !state.tenant_limits.any() {
        return Ok(());
    }
    let ranges = ranges();
    let Some(rated) = state.tenant_limits.rated(&ranges) else {
        return Ok(());
    };
    let first = ranges.first().map(|r| r.start.clone()).unwrap_or_default();
    let requester = requester(state, &state.upstream.cell_for(&first)).await?;
    state
        .tenant_limits
        .charge_rated(&rated, requester, Instant::now())
}

/// Who this task's client is, as far as the cell has vouched.
async fn requester(state: &ProxyState, cell: &Cell) -> Result<Requester<Arc<str>>, ApiError> {
    if !cell.auth_may_be_on() {
        return Ok(Requester::Anyone);
    }
    let Some(token) = client_token() else {
        if cell.auth_known_on() {
            return Err(ApiError::user_empty());
        }
        return Ok(Requester::Unverified);
    };
    // Of a token joined for several cells, this cell's part.
    let token: Arc<str> = crate::upstream::cell_tokens::for_cell(&token, cell.cell_id()).into();
    if let Some(user) = cell.accepted_tokens.user(&token) {
        return Ok(Requester::User(user));
    }
    let Some(claims) = claims_of_accepted(&token) else {
        return Ok(Requester::Unverified);
    };
    if state.token_checks.take("tokens", Instant::now()).is_err() {
        return Ok(Requester::Unverified);
    }
    // A success vouches for the token (`CellClient::call_as` remembers it).
    let asked: Result<AuthUserGetResponse, ApiError> = cell
        .call_as(
            Who::Client(Some(&token)),
            Route::Leader,
            Kind::Read,
            USER_GET,
            AuthUserGetRequest {
                name: claims.user.clone(),
            },
        )
        .await;
    Ok(match (asked, cell.accepted_tokens.user(&token)) {
        (Ok(_), Some(user)) => Requester::User(user),
        _ => Requester::Unverified,
    })
}

/// One key.
pub fn key(key: &[u8]) -> Vec<KeyRange> {
    vec![KeyRange::single(key.to_vec())]
}

/// An etcd `key` and `range_end`.
pub fn range(key: &[u8], range_end: &[u8]) -> Vec<KeyRange> {
    vec![KeyRange::new(key.to_vec(), range_end.to_vec())]
}

/// Every range a txn names: its compares' and every operation's of both
/// branches, nested txns included.
pub use latchkey_shared::txn_op::ranges as txn_ranges;
