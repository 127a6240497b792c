//! [`LockBackend`]: what the lock recipe needs from whoever serves it.
//! The cell answers over its own node; the proxy over its upstream client
//! and its coalesced watches. Every operation is linearizable: the recipe
//! decides who holds a lock from what it reads.

use crate::etcdpb::{
    PbDeleteRequest, PbDeleteResponse, PbRangeRequest, PbRangeResponse, PbTxnRequest, PbTxnResponse,
};
use crate::{ApiError, KeyRange};
use futures::future::BoxFuture;

pub trait LockBackend: Send + Sync + 'static {
    /// A txn, committed through the cell's leader.
    fn txn(&self, req: PbTxnRequest) -> BoxFuture<'_, Result<PbTxnResponse, ApiError>>;

    /// A linearizable range.
    fn range(&self, req: PbRangeRequest) -> BoxFuture<'_, Result<PbRangeResponse, ApiError>>;

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
}
