//! [`LockBackend`]: what the lock recipe needs from whoever serves it.
//! The cell answers over its own node; the proxy over its upstream client
//! and its coalesced watches. Every read is linearizable, or a snapshot as
//! of a revision the recipe knows is committed: the recipe decides who
//! holds a lock from what it reads.

use crate::etcdpb::{
    PbDeleteRequest, PbDeleteResponse, PbRangeRequest, PbRangeResponse, PbTxnRequest, PbTxnResponse,
};
use crate::{ApiError, ErrorCode, KeyRange};
use futures::future::BoxFuture;

/// What a Lock or Election call needs of its caller on the keys it names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// Leader, Observe: read the election's queue.
    Read,
    /// Lock, Campaign (the name's queue); Unlock, Proclaim, Resign (the
    /// held key).
    ReadWrite,
}

/// Resolves, with why, when a stream's caller may read no longer.
pub type Revoked = BoxFuture<'static, ApiError>;

pub trait LockBackend: Send + Sync + 'static {
    /// As [`permit`](Self::permit) with [`Access::Read`], for a stream that
    /// reads `range` as long as it lives (Observe), and what ends it when
    /// the caller's permission goes. The default checks `permit` and never
    /// ends it.
    fn permit_stream<'a>(
        &'a self,
        metadata: &'a tonic::metadata::MetadataMap,
        range: &'a KeyRange,
    ) -> BoxFuture<'a, Result<Revoked, ApiError>> {
        Box::pin(async move {
            self.permit(metadata, Access::Read, range).await?;
            Ok(Box::pin(std::future::pending()) as Revoked)
        })
    }

    /// Whether the caller of a Lock or Election call (its gRPC `metadata`)
    /// may `access` every key of `range`, checked before the call does
    /// anything. The default lets everyone through.
    fn permit<'a>(
        &'a self,
        _metadata: &'a tonic::metadata::MetadataMap,
        _access: Access,
        _range: &'a KeyRange,
    ) -> BoxFuture<'a, Result<(), ApiError>> {
        Box::pin(async { Ok(()) })
    }

    /// A txn, committed through the cell's leader.
    fn txn(&self, req: PbTxnRequest) -> BoxFuture<'_, Result<PbTxnResponse, ApiError>>;

    /// A linearizable range.
    fn range(&self, req: PbRangeRequest) -> BoxFuture<'_, Result<PbRangeResponse, ApiError>>;

    /// A serializable range: one member answers from what it has applied,
    /// without a leadership round (the leader when it can).
    fn range_serializable(
        &self,
        req: PbRangeRequest,
    ) -> BoxFuture<'_, Result<PbRangeResponse, ApiError>>;

    /// A range as of `revision`, one the caller knows is committed (it was
    /// answered or woken at it): a snapshot that misses nothing committed
    /// up to it, so a member that has applied it answers without a
    /// leadership round. A member that has not, or a compacted revision,
    /// falls back to [`range`](Self::range); so does `revision` 0.
    fn range_at(
        &self,
        req: PbRangeRequest,
        revision: i64,
    ) -> BoxFuture<'_, Result<PbRangeResponse, ApiError>> {
        Box::pin(async move {
            if revision == 0 {
                return self.range(req).await;
            }
            let at = PbRangeRequest {
                revision,
                serializable: true,
                ..req.clone()
            };
            match self.range_serializable(at).await {
                Err(e) if matches!(e.code, ErrorCode::FutureRevision | ErrorCode::Compacted) => {
                    self.range(req).await
                }
                answered => answered,
            }
        })
    }

    /// The guard of a write under the idempotency key `key`, `request`
    /// being what makes the request what it is; its record is written with
    /// this backend's retention lease.
    fn guard(
        &self,
        key: String,
        request: Vec<Vec<u8>>,
    ) -> BoxFuture<'_, Result<crate::idempotency::Guard, ApiError>>;

    /// A delete, committed through the cell's leader.
    fn delete(&self, req: PbDeleteRequest) -> BoxFuture<'_, Result<PbDeleteResponse, ApiError>>;

    /// Resolves with the revision of the first change in `range` after
    /// revision `after` (only deletions if `deletes_only`), once it has
    /// happened. It may also resolve early (the watch under it was cut
    /// short): the caller reads again to see what changed.
    fn wait_change(
        &self,
        range: KeyRange,
        after: i64,
        deletes_only: bool,
    ) -> BoxFuture<'_, Result<i64, ApiError>>;

    /// Resolves with the revision of the first deletion of one of `keys`
    /// (keys of the queue `queue`) after revision `after`; like
    /// [`wait_change`](Self::wait_change), it may resolve early. By
    /// default one [`wait_change`](Self::wait_change) per key; a backend
    /// whose watches cost a round trip to make (the proxy's) watches the
    /// queue once for every waiter of the lock.
    fn wait_departure(
        &self,
        _queue: KeyRange,
        keys: Vec<Vec<u8>>,
        after: i64,
    ) -> BoxFuture<'_, Result<i64, ApiError>> {
        let waits: Vec<_> = keys
            .into_iter()
            .map(|key| self.wait_change(KeyRange::single(key), after, true))
            .collect();
        Box::pin(async move {
            if waits.is_empty() {
                return Err(ApiError::internal("a wait for a departure of no key"));
            }
            futures::future::select_all(waits).await.0
        })
    }
}
