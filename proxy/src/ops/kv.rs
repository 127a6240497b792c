//! etcd's KV operations through the proxy, for both faces: [`range`] is
//! THE Range path (linearizable reads go to the leader; serializable ones
//! are answered from the read cache when it holds the range at or above
//! the client's floor and the leader's recent revision, and otherwise by any
//! member, or by the leader, linearizably, when that member is behind
//! either); writes go to the
//! leader of the cell that holds the key, never resent once their outcome
//! is unknown, and never to a reserved key ([`latchkey_shared::reserved`]).

use crate::chaos::{broken, Defect};
use crate::metrics_catalog::{CACHE_HITS, CACHE_MISSES};
use crate::ops::auth::client_token;
use crate::state::ProxyState;
use crate::upstream::{Kind, Route, Who};
use latchkey_shared::etcd_methods::kv::RANGE;
use latchkey_shared::etcd_methods::kv::{COMPACT, DELETE_RANGE, PUT, TXN};
use latchkey_shared::etcdpb::{
    PbCompactionRequest, PbCompactionResponse, PbDeleteRequest, PbDeleteResponse, PbPutRequest,
    PbPutResponse, PbRangeRequest, PbRangeResponse, PbTxnRequest, PbTxnResponse,
};
use latchkey_shared::{reserved, ApiError};
use std::net::SocketAddr;

pub fn revision_of(resp: &PbRangeResponse) -> i64 {
    resp.header.as_ref().map_or(0, |h| h.revision)
}

/// A Range request from `client` (its connection's address, if known).
pub async fn range(
    state: &ProxyState,
    client: Option<SocketAddr>,
    req: PbRangeRequest,
) -> Result<PbRangeResponse, ApiError> {
    super::rates::charge(state, || super::rates::range(&req.key, &req.range_end)).await?;
    let cell = state.upstream.cell_for(&req.key);
    let token = client_token();
    let who = Who::Client(token.as_deref());
    // With authentication on, a read goes to the cell as the client, which
    // checks it: the cache holds what the proxy may read, not the client.
    if !req.serializable || cell.auth_may_be_on() {
        let route = if req.serializable {
            Route::Any
        } else {
            Route::Leader
        };
        let resp: PbRangeResponse = cell.call_as(who, route, Kind::Read, RANGE, req).await?;
        state.floors.raise(client, revision_of(&resp));
        return Ok(resp);
    }
    let floor = state.floors.floor(client);
    if let Some(resp) = state.cache.answer(&req, floor) {
        metrics::counter!(CACHE_HITS.name).increment(1);
        state.floors.raise(client, revision_of(&resp));
        return Ok(resp);
    }
    if req.revision == 0 {
        metrics::counter!(CACHE_MISSES.name).increment(1);
    }
    let mut resp: PbRangeResponse = cell
        .call_as(who, Route::Any, Kind::Read, RANGE, req.clone())
        .await?;
    // A member behind what this client has seen, or behind the cell (cut
    // off from its peers: review P2): ask the leader, whose linearizable
    // answer is at least as new as anything answered before.
    if req.revision == 0 && revision_of(&resp) < floor.max(state.cache.vouched()) {
        let linearizable = PbRangeRequest {
            serializable: false,
            ..req.clone()
        };
        resp = cell
            .call_as(who, Route::Leader, Kind::Read, RANGE, linearizable)
            .await?;
    }
    state.cache.missed(&req, &resp);
    state.floors.raise(client, revision_of(&resp));
    Ok(resp)
}

/// A put from `client`: its revision becomes the client's floor, so the
/// client's serializable reads see its own write (read-your-writes).
pub async fn put(
    state: &ProxyState,
    client: Option<SocketAddr>,
    req: PbPutRequest,
) -> Result<PbPutResponse, ApiError> {
    reserved::check_put(&req)?;
    super::rates::charge(state, || super::rates::key(&req.key)).await?;
    let cell = state.upstream.cell_for(&req.key);
    let token = client_token();
    let who = Who::Client(token.as_deref());
    let resp: PbPutResponse = cell
        .call_as(who, Route::Leader, Kind::Write, PUT, req)
        .await?;
    wrote(
        state,
        client,
        resp.header.as_ref().map_or(0, |h| h.revision),
    );
    Ok(resp)
}

pub async fn delete_range(
    state: &ProxyState,
    client: Option<SocketAddr>,
    req: PbDeleteRequest,
) -> Result<PbDeleteResponse, ApiError> {
    reserved::check_delete(&req)?;
    super::rates::charge(state, || super::rates::range(&req.key, &req.range_end)).await?;
    let cell = state.upstream.cell_for(&req.key);
    let token = client_token();
    let who = Who::Client(token.as_deref());
    let resp: PbDeleteResponse = cell
        .call_as(who, Route::Leader, Kind::Write, DELETE_RANGE, req)
        .await?;
    wrote(
        state,
        client,
        resp.header.as_ref().map_or(0, |h| h.revision),
    );
    Ok(resp)
}

/// A txn goes to the cell of its first compare's key.
pub async fn txn(
    state: &ProxyState,
    client: Option<SocketAddr>,
    req: PbTxnRequest,
) -> Result<PbTxnResponse, ApiError> {
    reserved::check_txn(&req)?;
    super::rates::charge(state, || super::rates::txn_ranges(&req)).await?;
    let key = req
        .compare
        .first()
        .map(|c| c.key.clone())
        .unwrap_or_default();
    let cell = state.upstream.cell_for(&key);
    let token = client_token();
    let who = Who::Client(token.as_deref());
    let resp: PbTxnResponse = cell
        .call_as(who, Route::Leader, Kind::Write, TXN, req)
        .await?;
    wrote(
        state,
        client,
        resp.header.as_ref().map_or(0, |h| h.revision),
    );
    Ok(resp)
}

/// `client` was answered a write (or a txn) at `revision`: its later
/// serializable reads are answered at that revision or later.
pub fn wrote(state: &ProxyState, client: Option<SocketAddr>, revision: i64) {
    if broken(Defect::ForgetWriteFloors) {
        return;
    }
    state.floors.raise(client, revision);
}

pub async fn compact(
    state: &ProxyState,
    req: PbCompactionRequest,
) -> Result<PbCompactionResponse, ApiError> {
    let cell = state.upstream.home();
    let token = client_token();
    let who = Who::Client(token.as_deref());
    cell.call_as(who, Route::Leader, Kind::Write, COMPACT, req)
        .await
}
