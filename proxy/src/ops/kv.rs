//! etcd's KV operations through the proxy, for both faces: [`range`] is
//! THE Range path (linearizable reads go to the leader; serializable ones
//! are answered from the read cache when it holds the range at or above
//! the client's floor in the cell and the leader's recent revision, and
//! otherwise by any member, or by the leader, linearizably, when that
//! member is behind either); writes go to the
//! leader of the cell that holds the key, never resent once their outcome
//! is unknown, and never to a reserved key ([`latchkey_shared::reserved`]).

use crate::cache::client_floor::cell_key;
use crate::chaos::{broken, Defect};
use crate::metrics_catalog::{CACHE_HITS, CACHE_MISSES};
use crate::ops::auth::client_token;
use crate::state::ProxyState;
use crate::upstream::cell_client::HasHeader;
use crate::upstream::{Cell, Kind, Route, Who};
use latchkey_shared::etcd_methods::kv::RANGE;
use latchkey_shared::etcd_methods::kv::{COMPACT, DELETE_RANGE, PUT, TXN};
use latchkey_shared::etcdpb::PbTxnOpRequest;
use latchkey_shared::etcdpb::{
    PbCompactionRequest, PbCompactionResponse, PbDeleteRequest, PbDeleteResponse, PbPutRequest,
    PbPutResponse, PbRangeRequest, PbRangeResponse, PbTxnRequest, PbTxnResponse,
};
use latchkey_shared::key_range::KeyRange;
use latchkey_shared::{reserved, ApiError};
use std::net::SocketAddr;
use std::sync::Arc;

pub fn revision_of(resp: &PbRangeResponse) -> i64 {
    resp.header.as_ref().map_or(0, |h| h.revision)
}

/// A Range request from `client` (its connection's address, if known).
pub async fn range(
    state: &ProxyState,
    client: Option<SocketAddr>,
    req: PbRangeRequest,
) -> Result<PbRangeResponse, ApiError> {
    // Named once: routed by them, and charged by them when tenants have rates.
    let ranges = super::rates::range(&req.key, &req.range_end);
    super::rates::charge(state, || ranges.clone()).await?;
    state
        .upstream
        .routed(&ranges, |cell| range_in(state, client, cell, req.clone()))
        .await
}

/// [`range`] in `cell`. A serializable answer is never below the
/// client's floor in that cell, nor below the revision a prefix of the
/// range moved into the cell above (its keys were still on their way in
/// below it); the read cache holds the home cell's keys only.
async fn range_in(
    state: &ProxyState,
    client: Option<SocketAddr>,
    cell: Cell,
    req: PbRangeRequest,
) -> Result<PbRangeResponse, ApiError> {
    let token = client_token();
    let who = Who::Client(token.as_deref());
    let key = cell_key(&cell);
    if !req.serializable {
        let resp: PbRangeResponse = cell
            .call_as(who, Route::Leader, Kind::Read, RANGE, req)
            .await?;
        state.floors.raise(client, key, revision_of(&resp));
        return Ok(resp);
    }
    let floor = state
        .floors
        .floor(client, key)
        .max(
            state
                .upstream
                .moved_in_above(&cell, &req.key, &req.range_end),
        );
    // With authentication on, a read goes to the cell as the client, which
    // checks it: the cache holds what the proxy may read, not the client.
    let cached = Arc::ptr_eq(&cell, state.upstream.home()) && !cell.auth_may_be_on();
    if cached {
        if let Some(resp) = state.cache.answer(&req, floor) {
            metrics::counter!(CACHE_HITS.name).increment(1);
            state.floors.raise(client, key, revision_of(&resp));
            return Ok(resp);
        }
        if req.revision == 0 {
            metrics::counter!(CACHE_MISSES.name).increment(1);
        }
    }
    let mut resp: PbRangeResponse = cell
        .call_as(who, Route::Any, Kind::Read, RANGE, req.clone())
        .await?;
    // A member behind what this client has seen, or behind the cell (cut
    // off from its peers: review P2): ask the leader, whose linearizable
    // answer is at least as new as anything answered before.
    let behind = if cached {
        floor.max(state.cache.vouched())
    } else {
        floor
    };
    if req.revision == 0 && revision_of(&resp) < behind {
        let linearizable = PbRangeRequest {
            serializable: false,
            ..req.clone()
        };
        resp = cell
            .call_as(who, Route::Leader, Kind::Read, RANGE, linearizable)
            .await?;
    }
    if cached {
        state.cache.missed(&req, &resp);
    }
    state.floors.raise(client, key, revision_of(&resp));
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
    let ranges = super::rates::key(&req.key);
    super::rates::charge(state, || ranges.clone()).await?;
    let leases = [req.lease];
    write(state, client, &ranges, &leases, PUT, req).await
}

pub async fn delete_range(
    state: &ProxyState,
    client: Option<SocketAddr>,
    req: PbDeleteRequest,
) -> Result<PbDeleteResponse, ApiError> {
    reserved::check_delete(&req)?;
    // Named once: routed by them, and charged by them when tenants have rates.
    let ranges = super::rates::range(&req.key, &req.range_end);
    super::rates::charge(state, || ranges.clone()).await?;
    write(state, client, &ranges, &[], DELETE_RANGE, req).await
}

/// A client's write of `ranges` to the leader of the one cell that owns
/// them (`cross_cell` when they span cells), as the client, once the
/// sessions it binds keys to (`leases`) exist in that cell; a home-cell
/// answer's revision becomes the client's floor there (read-your-writes).
async fn write<Req, Resp>(
    state: &ProxyState,
    client: Option<SocketAddr>,
    ranges: &[KeyRange],
    leases: &[i64],
    path: &'static str,
    req: Req,
) -> Result<Resp, ApiError>
where
    Req: prost::Message + Clone + Send + Sync + 'static,
    Resp: prost::Message + Default + Send + Sync + HasHeader + 'static,
{
    let token = client_token();
    let who = Who::Client(token.as_deref());
    let (cell, resp) = state
        .upstream
        .routed(ranges, |cell| {
            let req = req.clone();
            async move {
                state
                    .extensions
                    .ensure_all(&state.upstream, &cell, leases)
                    .await?;
                let resp: Resp = cell
                    .call_as(who, Route::Leader, Kind::Write, path, req)
                    .await?;
                Ok((cell, resp))
            }
        })
        .await?;
    wrote(
        state,
        client,
        &cell,
        resp.header().map_or(0, |h| h.revision),
    );
    Ok(resp)
}

/// The leases a txn's puts bind keys to, nested txns included.
pub fn txn_leases(txn: &PbTxnRequest) -> Vec<i64> {
    let mut leases = Vec::new();
    for op in txn.success.iter().chain(&txn.failure) {
        match &op.request {
            Some(PbTxnOpRequest::RequestPut(p)) if p.lease != 0 => leases.push(p.lease),
            Some(PbTxnOpRequest::RequestTxn(t)) => leases.extend(txn_leases(t)),
            _ => {}
        }
    }
    leases.sort_unstable();
    leases.dedup();
    leases
}

/// A txn goes to the one cell that owns every key it names.
pub async fn txn(
    state: &ProxyState,
    client: Option<SocketAddr>,
    req: PbTxnRequest,
) -> Result<PbTxnResponse, ApiError> {
    reserved::check_txn(&req)?;
    let ranges = super::rates::txn_ranges(&req);
    super::rates::charge(state, || ranges.clone()).await?;
    let leases = txn_leases(&req);
    write(state, client, &ranges, &leases, TXN, req).await
}

/// `client` was answered a write (or a txn) at `revision` in `cell`: its
/// later serializable reads there are answered at that revision or later.
pub fn wrote(state: &ProxyState, client: Option<SocketAddr>, cell: &Cell, revision: i64) {
    if broken(Defect::ForgetWriteFloors) {
        return;
    }
    state.floors.raise(client, cell_key(cell), revision);
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
