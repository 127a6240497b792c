//! [`LocalLocks`]: the shared lock and election recipes' backend in a cell
//! member. Its txns, ranges and deletes are the KV operations' (writes go
//! to the leader through this member; ranges are linearizable); its waits
//! for a change read this member's history and then its watch hub.

use super::auth_gate::AuthGate;
use super::kv::Kv;
use super::lease::Leases;
use crate::mvcc::history::History;
use crate::mvcc::keyspace::{Event, EventKind, KeyRange};
use crate::node::CellNode;
use crate::state_machine::watch_hub::Notice;
use futures::future::BoxFuture;
use latchkey_shared::auth::Need;
use latchkey_shared::etcdpb::{
    PbDeleteRequest, PbDeleteResponse, PbLeaseGrantRequest, PbRangeRequest, PbRangeResponse,
    PbTxnRequest, PbTxnResponse,
};
use latchkey_shared::idempotency::{Guard, RetentionLease};
use latchkey_shared::lock::Access;
use latchkey_shared::lock::LockBackend;
use latchkey_shared::ApiError;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::broadcast::error::RecvError;

pub struct LocalLocks {
    node: Arc<CellNode>,
    kv: Kv,
    leases: Leases,
    /// The lease idempotency records of Lock and Unlock are written with.
    retention: RetentionLease,
    /// Checks each gRPC caller of the lock and election services; none
    /// for the recipes' other users.
    gate: Option<Arc<AuthGate>>,
}

/// How long a Lock or Unlock idempotency key is remembered by a member.
const IDEMPOTENCY_RETENTION: Duration = Duration::from_secs(24 * 3600);

impl LocalLocks {
    pub fn new(node: Arc<CellNode>) -> LocalLocks {
        LocalLocks {
            kv: Kv::new(node.clone()),
            leases: Leases::new(node.clone()),
            node,
            retention: RetentionLease::new(IDEMPOTENCY_RETENTION),
            gate: None,
        }
    }

    /// The same backend checking every Lock and Election caller at `gate`.
    pub fn guarded_by(mut self, gate: Arc<AuthGate>) -> LocalLocks {
        self.gate = Some(gate);
        self
    }

    /// The revision of the first change in `range` in `from..` (only
    /// deletions if `deletes_only`) that this member's history holds,
    /// `Some(0)` if that history was compacted (the caller reads again),
    /// `None` if there is none yet; and the revision the history was read
    /// at.
    fn changed_in_history(
        &self,
        range: &KeyRange,
        from: i64,
        deletes_only: bool,
    ) -> (Option<i64>, i64) {
        let keys = self.node.state.read(|s| s.keys.clone());
        let now = keys.revision();
        if from > now {
            return (None, now);
        }
        if from < keys.compact_revision() {
            return (Some(0), now);
        }
        let changed = History::new(&keys, range, from, now, false)
            .find(|e| counts(e, deletes_only))
            .map(|e| e.revision());
        (changed, now)
    }
}

fn counts(event: &Event, deletes_only: bool) -> bool {
    !deletes_only || event.kind == EventKind::Delete
}

impl LockBackend for LocalLocks {
    fn permit<'a>(
        &'a self,
        metadata: &'a tonic::metadata::MetadataMap,
        access: Access,
        range: &'a KeyRange,
    ) -> BoxFuture<'a, Result<(), ApiError>> {
        Box::pin(async move {
            let Some(gate) = &self.gate else {
                return Ok(());
            };
            let caller = gate.caller(metadata)?;
            if access == Access::ReadWrite {
                caller.require(Need::Write, range)?;
            }
            caller.require(Need::Read, range)?;
            // A move's arriving keys are the proxies' until it commits, as
            // at the KV API: a lock taken here meanwhile would sit beside
            // the holder the move copies in.
            if !caller.writes_records() {
                self.kv.refuse_arriving(std::slice::from_ref(range))?;
            }
            Ok(())
        })
    }

    fn txn(&self, req: PbTxnRequest) -> BoxFuture<'_, Result<PbTxnResponse, ApiError>> {
        Box::pin(self.kv.txn(req, false))
    }

    fn range(&self, req: PbRangeRequest) -> BoxFuture<'_, Result<PbRangeResponse, ApiError>> {
        Box::pin(async move {
            let req = PbRangeRequest {
                serializable: false,
                ..req
            };
            self.kv.range(&req, false).await
        })
    }

    fn range_serializable(
        &self,
        req: PbRangeRequest,
    ) -> BoxFuture<'_, Result<PbRangeResponse, ApiError>> {
        // Waits here are woken from this member's own history, so it has
        // applied the revisions they read at.
        Box::pin(async move { self.kv.range(&req, false).await })
    }

    fn guard(&self, key: String, request: Vec<Vec<u8>>) -> BoxFuture<'_, Result<Guard, ApiError>> {
        Box::pin(async move {
            latchkey_shared::idempotency::check_key(&key)?;
            let lease = self
                .retention
                .lease(|ttl| async move {
                    let granted = self
                        .leases
                        .grant(PbLeaseGrantRequest { ttl, id: 0 })
                        .await?;
                    Ok(granted.id)
                })
                .await?;
            let parts: Vec<&[u8]> = request.iter().map(Vec::as_slice).collect();
            Guard::new(&key, &parts, lease)
        })
    }

    fn delete(&self, req: PbDeleteRequest) -> BoxFuture<'_, Result<PbDeleteResponse, ApiError>> {
        Box::pin(self.kv.delete_range(req))
    }

    fn wait_change(
        &self,
        range: KeyRange,
        after: i64,
        deletes_only: bool,
    ) -> BoxFuture<'_, Result<i64, ApiError>> {
        Box::pin(async move {
            loop {
                // Subscribe first, then read history: every revision after
                // the history read arrives on the hub.
                let mut notices = self.node.watch_hub.subscribe();
                let (changed, read_at) = self.changed_in_history(&range, after + 1, deletes_only);
                if let Some(revision) = changed {
                    return Ok(revision);
                }
                loop {
                    match notices.recv().await {
                        Ok(notice) => match notice.as_ref() {
                            Notice::Changes(changes) if changes.revision > read_at => {
                                let changed = changes
                                    .events
                                    .iter()
                                    .any(|e| counts(e, deletes_only) && range.contains(&e.kv.key));
                                if changed {
                                    return Ok(changes.revision);
                                }
                            }
                            Notice::Changes(_) => {}
                            // The state was replaced: read history again.
                            Notice::Reset => break,
                        },
                        // Fell behind the hub's ring: read history again.
                        Err(RecvError::Lagged(_)) => break,
                        Err(RecvError::Closed) => {
                            return Err(ApiError::unavailable("this member is shutting down"))
                        }
                    }
                }
            }
        })
    }
}
