//! [`UpstreamLocks`]: the lock and election recipes' [`LockBackend`] in the proxy. Its
//! txns, ranges and deletes go to the cell's leader through the one call
//! path; its waits for a change are watches on the coalescer, so
//! every waiter behind the same key shares one upstream watch.

use crate::ops::idempotency::Keyed;
use crate::state::ProxyState;
use crate::upstream::{Kind, Route};
use crate::watch::{Cancel, Item, WatchKey};
use futures::future::BoxFuture;
use latchkey_shared::etcd_enums::{EventType, FilterType};
use latchkey_shared::etcd_methods::kv::{DELETE_RANGE, RANGE, TXN};
use latchkey_shared::etcdpb::{
    PbDeleteRequest, PbDeleteResponse, PbEvent, PbRangeRequest, PbRangeResponse, PbTxnRequest,
    PbTxnResponse,
};
use latchkey_shared::idempotency::Guard;
use latchkey_shared::lock::Access;
use latchkey_shared::lock::{LockBackend, Revoked};
use latchkey_shared::{ApiError, KeyRange};
use std::sync::Arc;

pub struct UpstreamLocks {
    pub state: Arc<ProxyState>,
}

/// Whether this task's client may have `access` to a lock's or an
/// election's `range`, which the proxy then uses with its own identity:
/// charged to the range's tenant, then asked of the range's cell.
pub async fn permit(state: &ProxyState, access: Access, range: &KeyRange) -> Result<(), ApiError> {
    super::rates::charge(state, || vec![range.clone()]).await?;
    // Asked of the cell that holds the range (held through a move's pause).
    state
        .upstream
        .routed(std::slice::from_ref(range), |cell| async move {
            match access {
                Access::Read => super::auth::require_read(&cell, range).await,
                Access::ReadWrite => super::auth::require_read_write(&cell, range).await,
            }
        })
        .await
}

impl LockBackend for UpstreamLocks {
    /// The recipes write with the proxy's identity: the cell first says
    /// the client (whose token the face put on this task) may.
    fn permit<'a>(
        &'a self,
        _metadata: &'a tonic::metadata::MetadataMap,
        access: Access,
        range: &'a KeyRange,
    ) -> BoxFuture<'a, Result<(), ApiError>> {
        Box::pin(permit(&self.state, access, range))
    }

    /// A client's Observe stands on a read permit, as its watches do:
    /// checked again when the cell's auth records change, and counted in
    /// its tenants' watch quotas.
    fn permit_stream<'a>(
        &'a self,
        _metadata: &'a tonic::metadata::MetadataMap,
        range: &'a KeyRange,
    ) -> BoxFuture<'a, Result<Revoked, ApiError>> {
        Box::pin(async move {
            let mut permit = super::auth::read_permit(&self.state, range).await?;
            Ok(Box::pin(async move { permit.revoked().await }) as Revoked)
        })
    }

    /// In the cell of the lock's or election's keys, once the session
    /// whose keys it writes exists there.
    fn txn(&self, req: PbTxnRequest) -> BoxFuture<'_, Result<PbTxnResponse, ApiError>> {
        Box::pin(async move {
            let ranges = super::rates::txn_ranges(&req);
            let leases = super::kv::txn_leases(&req);
            let state = &self.state;
            state
                .upstream
                .routed(&ranges, |cell| {
                    let req = req.clone();
                    let leases = &leases;
                    async move {
                        state
                            .extensions
                            .ensure_all(&state.upstream, &cell, leases)
                            .await?;
                        cell.call(Route::Leader, Kind::Write, TXN, req).await
                    }
                })
                .await
        })
    }

    fn range(&self, req: PbRangeRequest) -> BoxFuture<'_, Result<PbRangeResponse, ApiError>> {
        Box::pin(async move {
            let req = PbRangeRequest {
                serializable: false,
                ..req
            };
            self.routed(&req.key, &req.range_end, Kind::Read, RANGE, req.clone())
                .await
        })
    }

    fn range_serializable(
        &self,
        req: PbRangeRequest,
    ) -> BoxFuture<'_, Result<PbRangeResponse, ApiError>> {
        Box::pin(async move {
            // The leader has applied what it committed, short of a leader
            // change; a member that has not says so.
            self.routed(&req.key, &req.range_end, Kind::Read, RANGE, req.clone())
                .await
        })
    }

    fn guard(&self, key: String, request: Vec<Vec<u8>>) -> BoxFuture<'_, Result<Guard, ApiError>> {
        Box::pin(async move {
            let keyed = Keyed { key, request };
            crate::ops::idempotency::guard(&self.state, Some(&keyed))
                .await?
                .ok_or_else(|| ApiError::internal("a named idempotency key gave no guard"))
        })
    }

    fn delete(&self, req: PbDeleteRequest) -> BoxFuture<'_, Result<PbDeleteResponse, ApiError>> {
        Box::pin(async move {
            self.routed(
                &req.key,
                &req.range_end,
                Kind::Write,
                DELETE_RANGE,
                req.clone(),
            )
            .await
        })
    }

    fn wait_change(
        &self,
        range: KeyRange,
        after: i64,
        deletes_only: bool,
    ) -> BoxFuture<'_, Result<i64, ApiError>> {
        Box::pin(async move {
            let filters: &[i32] = if deletes_only {
                &[FilterType::NoPut as i32]
            } else {
                &[]
            };
            let watched = WatchKey::new(range.start, range.end, filters, false)?.on_the_leader();
            // The watch is the range itself: every event in it counts.
            self.first_change(watched, after, |events| {
                events
                    .iter()
                    .any(|e| !deletes_only || e.r#type == EventType::Delete as i32)
            })
            .await
        })
    }

    /// One watch of the whole queue, shared by every waiter of the lock on
    /// this proxy (deletions only), each waiter looking for its own keys:
    /// a wait adds no upstream watch while another waiter of the lock has
    /// one, and a departure still wakes only the waiter behind it.
    fn wait_departure(
        &self,
        queue: KeyRange,
        keys: Vec<Vec<u8>>,
        after: i64,
    ) -> BoxFuture<'_, Result<i64, ApiError>> {
        Box::pin(async move {
            let filters = [FilterType::NoPut as i32];
            let watched = WatchKey::new(queue.start, queue.end, &filters, false)?.on_the_leader();
            self.first_change(watched, after, |events| {
                events.iter().any(|e| {
                    e.r#type == EventType::Delete as i32
                        && e.kv.as_ref().is_some_and(|kv| keys.contains(&kv.key))
                })
            })
            .await
        })
    }
}

impl UpstreamLocks {
    /// `request` to the leader of the cell that owns `key`..`end`, held
    /// through a move's pause as clients' requests are.
    async fn routed<Req, Resp>(
        &self,
        key: &[u8],
        end: &[u8],
        kind: Kind,
        path: &'static str,
        request: Req,
    ) -> Result<Resp, ApiError>
    where
        Req: prost::Message + Clone + Send + Sync + 'static,
        Resp: prost::Message
            + Default
            + Send
            + Sync
            + crate::upstream::cell_client::HasHeader
            + 'static,
    {
        let ranges = [KeyRange::new(key.to_vec(), end.to_vec())];
        self.state
            .upstream
            .routed(&ranges, |cell| {
                let request = request.clone();
                async move { cell.call(Route::Leader, kind, path, request).await }
            })
            .await
    }

    /// The first revision after `after` on the coalesced watch `watched`
    /// whose events `counts`; 0 when the watch was cut short (history gone,
    /// it fell behind, or a move took the keys to another cell): the caller
    /// reads again and waits from there.
    async fn first_change(
        &self,
        watched: WatchKey,
        after: i64,
        counts: impl Fn(&[PbEvent]) -> bool,
    ) -> Result<i64, ApiError> {
        let coalescer = self
            .state
            .coalescers
            .for_range(&self.state.upstream, &watched.range)?;
        let mut changes = coalescer.subscribe(watched, after + 1).await?;
        loop {
            match changes.recv().await {
                Some(Item::Events(revision)) => {
                    if counts(&revision.events) {
                        return Ok(revision.revision);
                    }
                }
                Some(Item::Progress(_)) => {}
                Some(Item::Cancelled(Cancel::Compacted { .. })) | None => return Ok(0),
                // A move took the queue to another cell: the read again
                // goes there (held through the move's pause), and so does
                // the next wait.
                Some(Item::Cancelled(Cancel::Ended { reason }))
                    if latchkey_shared::directory::moved_away(&reason) =>
                {
                    return Ok(0)
                }
                Some(Item::Cancelled(Cancel::Ended { reason })) => {
                    return Err(ApiError::unavailable(format!(
                        "the watch behind a lock or election wait ended: {reason}"
                    )))
                }
                Some(Item::Cancelled(Cancel::Revoked(refused))) => return Err(refused),
            }
        }
    }
}
