//! [`UpstreamLocks`]: the lock recipe's [`LockBackend`] in the proxy. Its
//! txns, ranges and deletes go to the cell's leader through the one call
//! path; its waits for a key's deletion are watches on the coalescer, so
//! every waiter behind the same key shares one upstream watch.

use crate::grpc::kv::{DELETE_RANGE, RANGE, TXN};
use crate::state::ProxyState;
use crate::upstream::{Kind, Route};
use crate::watch::{Cancel, Item, WatchKey};
use futures::future::BoxFuture;
use latchkey_shared::etcd_enums::{EventType, FilterType};
use latchkey_shared::etcdpb::{
    PbDeleteRequest, PbDeleteResponse, PbRangeRequest, PbRangeResponse, PbTxnRequest, PbTxnResponse,
};
use latchkey_shared::lock::LockBackend;
use latchkey_shared::ApiError;
use std::sync::Arc;

pub struct UpstreamLocks {
    pub state: Arc<ProxyState>,
}

impl LockBackend for UpstreamLocks {
    fn txn(&self, req: PbTxnRequest) -> BoxFuture<'_, Result<PbTxnResponse, ApiError>> {
        Box::pin(async move {
            let key = req
                .compare
                .first()
                .map(|c| c.key.clone())
                .unwrap_or_default();
            let cell = self.state.upstream.cell_for(&key);
            cell.call(Route::Leader, Kind::Write, TXN, req).await
        })
    }

    fn range(&self, req: PbRangeRequest) -> BoxFuture<'_, Result<PbRangeResponse, ApiError>> {
        Box::pin(async move {
            let cell = self.state.upstream.cell_for(&req.key);
            let req = PbRangeRequest {
                serializable: false,
                ..req
            };
            cell.call(Route::Leader, Kind::Read, RANGE, req).await
        })
    }

    fn delete(&self, req: PbDeleteRequest) -> BoxFuture<'_, Result<PbDeleteResponse, ApiError>> {
        Box::pin(async move {
            let cell = self.state.upstream.cell_for(&req.key);
            cell.call(Route::Leader, Kind::Write, DELETE_RANGE, req)
                .await
        })
    }

    fn wait_deleted(&self, key: Vec<u8>, after: i64) -> BoxFuture<'_, Result<i64, ApiError>> {
        Box::pin(async move {
            let deletes_only = WatchKey::new(key, Vec::new(), &[FilterType::NoPut as i32], false)?;
            let mut deletes = self
                .state
                .coalescer
                .subscribe(deletes_only, after + 1)
                .await?;
            loop {
                match deletes.recv().await {
                    Some(Item::Events(revision)) => {
                        let deleted = revision
                            .events
                            .iter()
                            .any(|e| e.r#type == EventType::Delete as i32);
                        if deleted {
                            return Ok(revision.revision);
                        }
                    }
                    Some(Item::Progress(_)) => {}
                    // History gone or the watch dropped behind: the
                    // caller reads again and waits from there.
                    Some(Item::Cancelled(Cancel::Compacted { .. })) | None => return Ok(0),
                    Some(Item::Cancelled(Cancel::Ended { reason })) => {
                        return Err(ApiError::unavailable(format!(
                            "the watch behind a lock wait ended: {reason}"
                        )))
                    }
                }
            }
        })
    }
}
