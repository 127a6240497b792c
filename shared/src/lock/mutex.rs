//! A fair FIFO lock over the keyspace, etcd's mutex recipe: a contender
//! puts `name/<lease hex>` bound to its lease (if its lease has no key
//! there yet); the key with the lowest create revision holds the lock;
//! every other contender waits for the deletion of the key just before its
//! own (its predecessor), so a release wakes exactly one waiter. The
//! holder's create revision is its fencing token: every later holder's is
//! higher.
//!
//! A contender that gives up (its deadline passes, or its caller goes
//! away) removes its own key, and only its own (the txn compares the
//! create revision). A contender whose lease expires loses its key with
//! it, holder or waiter.

use super::LockBackend;
use crate::etcd_enums::{CompareResult, CompareTarget, SortOrder, SortTarget};
use crate::etcdpb::{
    PbCompare, PbDeleteRequest, PbPutRequest, PbRangeRequest, PbResponseHeader, PbTargetUnion,
    PbTxnOpRequest, PbTxnOpResponse, PbTxnRequest, PbTxnRequestOp,
};
use crate::{ApiError, KeyRange, LeaseId};
use std::sync::Arc;
use tokio::time::Instant;

/// A lock held.
#[derive(Debug, Clone)]
pub struct Grant {
    /// The holder's key, `name/<lease hex>`: what Unlock takes.
    pub key: Vec<u8>,
    /// The key's create revision: higher for every later holder.
    pub fencing_token: i64,
    /// The header of the read that saw the lock held.
    pub header: PbResponseHeader,
}

/// The queue key of `lease` on the lock `name`.
pub fn queue_key(name: &[u8], lease: i64) -> Vec<u8> {
    let mut key = name.to_vec();
    key.push(b'/');
    key.extend_from_slice(format!("{lease:x}").as_bytes());
    key
}

fn op(request: PbTxnOpRequest) -> PbTxnRequestOp {
    PbTxnRequestOp {
        request: Some(request),
    }
}

/// Compares the create revision of `key` with `revision` (0: absent).
fn created_at(key: &[u8], revision: i64) -> PbCompare {
    PbCompare {
        result: CompareResult::Equal as i32,
        target: CompareTarget::Create as i32,
        key: key.to_vec(),
        range_end: Vec::new(),
        target_union: Some(PbTargetUnion::CreateRevision(revision)),
    }
}

/// Removes a contender's queue key when it gives up, unless disarmed
/// (granted). The removal runs on its own task: it must happen even when
/// the acquiring future is dropped.
struct QueueEntry<B: LockBackend> {
    backend: Arc<B>,
    key: Vec<u8>,
    revision: i64,
    armed: bool,
}

impl<B: LockBackend> Drop for QueueEntry<B> {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let (backend, key, revision) = (self.backend.clone(), self.key.clone(), self.revision);
        let remove = PbTxnRequest {
            compare: vec![created_at(&key, revision)],
            success: vec![op(PbTxnOpRequest::RequestDeleteRange(PbDeleteRequest {
                key: key.clone(),
                ..Default::default()
            }))],
            failure: Vec::new(),
        };
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                if let Err(e) = backend.txn(remove).await {
                    // The key goes with its lease at the latest.
                    tracing::debug!(error = %e, "a lock contender's key was not removed");
                }
            });
        }
    }
}

/// Waits until `lease` holds the lock `name`, or until `deadline`
/// (`lock_timeout`, its queue key removed). A lease that already holds or
/// waits for the lock keeps its place: a retry never makes a second
/// entry.
pub async fn acquire<B: LockBackend>(
    backend: Arc<B>,
    name: &[u8],
    lease: i64,
    deadline: Instant,
) -> Result<Grant, ApiError> {
    if name.is_empty() {
        return Err(ApiError::invalid("a lock needs a name"));
    }
    if lease == 0 {
        return Err(ApiError::invalid(
            "a lock is held by a lease (session): lease must not be 0",
        ));
    }
    let key = queue_key(name, lease);
    let join = PbTxnRequest {
        compare: vec![created_at(&key, 0)],
        success: vec![op(PbTxnOpRequest::RequestPut(PbPutRequest {
            key: key.clone(),
            lease,
            ..Default::default()
        }))],
        failure: vec![op(PbTxnOpRequest::RequestRange(PbRangeRequest {
            key: key.clone(),
            ..Default::default()
        }))],
    };
    let joined = within(deadline, backend.txn(join)).await?;
    let header = joined.header.unwrap_or_default();
    let revision = if joined.succeeded {
        header.revision
    } else {
        match joined.responses.first().and_then(|r| r.response.as_ref()) {
            Some(PbTxnOpResponse::ResponseRange(range)) => range
                .kvs
                .first()
                .map(|kv| kv.create_revision)
                .ok_or_else(|| ApiError::session_expired(LeaseId(lease)))?,
            _ => return Err(ApiError::internal("a lock's txn answered no range")),
        }
    };
    let mut entry = QueueEntry {
        backend: backend.clone(),
        key: key.clone(),
        revision,
        armed: true,
    };
    let queue = KeyRange::prefix(&[name, b"/"].concat());
    loop {
        // The contender just before this one, if any.
        let before = within(
            deadline,
            backend.range(PbRangeRequest {
                key: queue.start.clone(),
                range_end: queue.end.clone(),
                max_create_revision: revision - 1,
                sort_order: SortOrder::Descend as i32,
                sort_target: SortTarget::Create as i32,
                limit: 1,
                ..Default::default()
            }),
        )
        .await?;
        let read_at = before.header.as_ref().map_or(0, |h| h.revision);
        let Some(predecessor) = before.kvs.first() else {
            break;
        };
        // Woken by the predecessor's deletion, or by this contender's own
        // (its lease expired): either way, read again.
        let mine = backend.wait_deleted(key.clone(), read_at);
        let theirs = backend.wait_deleted(predecessor.key.clone(), read_at);
        within(deadline, async {
            tokio::select! {
                r = mine => r,
                r = theirs => r,
            }
        })
        .await?;
    }
    // Still queued (its lease may have expired while it waited)?
    let own = within(
        deadline,
        backend.range(PbRangeRequest {
            key: key.clone(),
            ..Default::default()
        }),
    )
    .await?;
    if own.kvs.first().map(|kv| kv.create_revision) != Some(revision) {
        entry.armed = false;
        return Err(ApiError::session_expired(LeaseId(lease)));
    }
    entry.armed = false;
    Ok(Grant {
        key,
        fencing_token: revision,
        header: own.header.unwrap_or(header),
    })
}

/// Releases a lock (or gives up a place in its queue): deletes the key an
/// acquire returned. Releasing a key that is gone is not an error.
pub async fn release<B: LockBackend>(
    backend: &B,
    key: Vec<u8>,
) -> Result<PbResponseHeader, ApiError> {
    if key.is_empty() {
        return Err(ApiError::key_not_provided());
    }
    let deleted = backend
        .delete(PbDeleteRequest {
            key,
            ..Default::default()
        })
        .await?;
    Ok(deleted.header.unwrap_or_default())
}

/// `work`, or `lock_timeout` at `deadline`.
async fn within<T>(
    deadline: Instant,
    work: impl std::future::Future<Output = Result<T, ApiError>>,
) -> Result<T, ApiError> {
    tokio::time::timeout_at(deadline, work)
        .await
        .unwrap_or_else(|_| {
            Err(ApiError::lock_timeout(
                "the lock was not granted before the deadline",
            ))
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_queue_key_is_the_name_a_slash_and_the_lease_in_hex_as_etcd_writes_it() {
        assert_eq!(queue_key(b"jobs", 0x694d_5765), b"jobs/694d5765".to_vec());
    }
}
