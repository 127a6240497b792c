//! The serializable read cache (DESIGN section 4; issue 12).
//!
//! - [`read_cache`]: [`ReadCache`], ranges kept current by the proxy's own
//!   watches, bounded by `--cache-bytes`, least recently used out first.
//! - [`cached_range`]: [`cached_range::CachedRange`], one range's live
//!   keys as of one revision, answering Range requests as the cell would.
//! - [`client_floor`]: [`ClientFloors`], the revision each client was last
//!   answered at, so its reads through this proxy never go backwards.
//!
//! [`range`] is THE Range path of both APIs: linearizable reads go to the
//! leader; serializable ones are answered from the cache when it holds
//! the range at or above the client's floor, and otherwise by any member
//! (by the leader, linearizably, when that member is behind the floor).

pub mod cached_range;
pub mod client_floor;
pub mod read_cache;

pub use client_floor::ClientFloors;
pub use read_cache::ReadCache;

use crate::grpc::kv::RANGE;
use crate::state::ProxyState;
use crate::upstream::{Kind, Route};
use latchkey_shared::etcdpb::{PbRangeRequest, PbRangeResponse};
use latchkey_shared::ApiError;
use std::net::SocketAddr;

fn revision_of(resp: &PbRangeResponse) -> i64 {
    resp.header.as_ref().map_or(0, |h| h.revision)
}

/// A Range request from `client` (its connection's address, if known).
pub async fn range(
    state: &ProxyState,
    client: Option<SocketAddr>,
    req: PbRangeRequest,
) -> Result<PbRangeResponse, ApiError> {
    let cell = state.upstream.cell_for(&req.key);
    if !req.serializable {
        let resp: PbRangeResponse = cell.call(Route::Leader, Kind::Read, RANGE, req).await?;
        state.floors.raise(client, revision_of(&resp));
        return Ok(resp);
    }
    let floor = state.floors.floor(client);
    if let Some(resp) = state.cache.answer(&req, floor) {
        metrics::counter!("latchkey_proxy_cache_hits_total").increment(1);
        state.floors.raise(client, revision_of(&resp));
        return Ok(resp);
    }
    if req.revision == 0 {
        metrics::counter!("latchkey_proxy_cache_misses_total").increment(1);
    }
    let mut resp: PbRangeResponse = cell
        .call(Route::Any, Kind::Read, RANGE, req.clone())
        .await?;
    // A member behind what this client has seen: ask the leader, whose
    // linearizable answer is at least as new as anything answered before.
    if req.revision == 0 && revision_of(&resp) < floor {
        let linearizable = PbRangeRequest {
            serializable: false,
            ..req.clone()
        };
        resp = cell
            .call(Route::Leader, Kind::Read, RANGE, linearizable)
            .await?;
    }
    state.cache.missed(&req);
    state.floors.raise(client, revision_of(&resp));
    Ok(resp)
}
