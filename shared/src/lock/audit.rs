//! Force-release with an audit record (DESIGN section 5): an operator
//! breaks a stuck lock by deleting its holder's key, and the SAME txn
//! writes a record of who did it, when, to which lock and holder, and why,
//! under [`PREFIX`]. The next waiter is then granted with a higher token,
//! so the old holder is fenced off. The request names the holder it breaks
//! (its fencing token) and never breaks another, so a retry, or a request
//! that arrives after the holder left, breaks nobody. The records are
//! ordinary keys: a watch
//! of the prefix from any revision replays every privileged operation.

use super::queue::{created_at, line, op};
use super::LockBackend;
use crate::etcd_enums::{CompareResult, CompareTarget};
use crate::etcdpb::{
    PbCompare, PbDeleteRequest, PbPutRequest, PbRangeRequest, PbTargetUnion, PbTxnOpRequest,
    PbTxnRequest,
};
use crate::idempotency::{Guard, Outcome};
use crate::{ApiError, KeyRange, LeaseId};
use serde::{Deserialize, Serialize};

/// Where audit records live.
pub const PREFIX: &[u8] = b"\0latchkey/audit/";

/// Every audit record.
pub fn range() -> KeyRange {
    KeyRange::prefix(PREFIX)
}

/// One privileged operation, as its audit record stores it (JSON).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AuditRecord {
    /// `force_release`.
    pub action: String,
    pub lock: String,
    /// The session that held the lock (hex).
    pub holder_session: String,
    /// The holder's fencing token.
    pub fencing_token: i64,
    pub reason: String,
    /// Who asked: the operator named in the request, else its address.
    pub operator: String,
    /// When, in milliseconds since the Unix epoch (the proxy's clock).
    pub at_unix_ms: u64,
}

/// The audit record of breaking the holder of `name` whose fencing token
/// is `token`.
fn record_key(name: &[u8], token: i64) -> Vec<u8> {
    [PREFIX, name, format!("/{token}").as_bytes()].concat()
}

/// Deletes the key of the holder of the lock `name` whose fencing token is
/// `expected_token` and writes `record` (with the holder filled in) in one
/// txn; returns the record and the revision it was committed at.
///
/// Only the named holder is ever released: a lock nobody holds, or one
/// held under another token (the named holder released it meanwhile, or
/// this is a retry of a release that went through), is
/// `precondition_failed` and nothing is written. With an idempotency
/// `guard`, a retry under the same key answers what the first request did
/// and writes nothing.
pub async fn force_release<B: LockBackend>(
    backend: &B,
    name: &[u8],
    expected_token: i64,
    mut record: AuditRecord,
    guard: Option<&Guard>,
) -> Result<(AuditRecord, i64), ApiError> {
    if record.reason.trim().is_empty() {
        return Err(ApiError::invalid("a force-release needs a reason"));
    }
    if expected_token <= 0 {
        return Err(ApiError::invalid(
            "a force-release names the fencing token of the holder it breaks",
        ));
    }
    let lock = String::from_utf8_lossy(name).into_owned();
    let not_held = || {
        ApiError::precondition_failed(format!(
            "the lock {lock:?} is not held under fencing token {expected_token}; nothing was released"
        ))
    };
    let (first, _) = line(backend, name, 1).await?;
    let (txn, refused) = match first.first() {
        Some(holder) if holder.create_revision == expected_token => {
            record.holder_session = LeaseId(holder.lease).to_string();
            record.fencing_token = holder.create_revision;
            let value = serde_json::to_vec(&record)
                .map_err(|e| ApiError::internal(format!("an audit record: {e}")))?;
            // Guarded by the holder's create revision: a key that still
            // has it is still first (later contenders join behind it), so
            // this deletes the named holder or nothing.
            let txn = PbTxnRequest {
                compare: vec![created_at(&holder.key, holder.create_revision)],
                success: vec![
                    op(PbTxnOpRequest::RequestDeleteRange(PbDeleteRequest {
                        key: holder.key.clone(),
                        ..Default::default()
                    })),
                    op(PbTxnOpRequest::RequestPut(PbPutRequest {
                        key: record_key(name, expected_token),
                        value,
                        ..Default::default()
                    })),
                ],
                failure: Vec::new(),
            };
            (txn, not_held())
        }
        other => {
            let refused = match other {
                Some(holder) => ApiError::precondition_failed(format!(
                    "the lock {lock:?} is held under fencing token {}, not {expected_token}; \
                     nothing was released",
                    holder.create_revision
                )),
                None => not_held(),
            };
            // Without a key, refused now. Under a key it may be the retry
            // of a release that went through: the guard answers that; a
            // first request is refused, and so are its retries.
            if guard.is_none() {
                return Err(refused);
            }
            (nothing_to_release(name, expected_token), refused)
        }
    };
    let Some(guard) = guard else {
        let done = backend.txn(txn).await?;
        return match done.succeeded {
            true => Ok((record, done.header.map_or(0, |h| h.revision))),
            false => Err(refused),
        };
    };
    match guard.outcome(backend.txn(guard.guard(txn)).await?)? {
        Outcome::Done(done) if done.succeeded => {
            Ok((record, done.header.map_or(0, |h| h.revision)))
        }
        Outcome::Done(_) => Err(refused),
        Outcome::Replay(first, header) if first.succeeded => {
            // The first request's audit record says whom it broke.
            let stored = backend
                .range(PbRangeRequest {
                    key: record_key(name, expected_token),
                    ..Default::default()
                })
                .await?;
            let kv =
                stored.kvs.into_iter().next().ok_or_else(|| {
                    ApiError::internal("the audit record of a force-release is gone")
                })?;
            let record = serde_json::from_slice(&kv.value)
                .map_err(|e| ApiError::internal(format!("an unreadable audit record: {e}")))?;
            Ok((record, header.revision))
        }
        Outcome::Replay(..) => Err(not_held()),
    }
}

/// A txn that releases nothing: its compare (the audit record's version
/// below 0) never holds, and it has no operations.
fn nothing_to_release(name: &[u8], token: i64) -> PbTxnRequest {
    PbTxnRequest {
        compare: vec![PbCompare {
            result: CompareResult::Less as i32,
            target: CompareTarget::Version as i32,
            key: record_key(name, token),
            range_end: Vec::new(),
            target_union: Some(PbTargetUnion::Version(0)),
        }],
        success: Vec::new(),
        failure: Vec::new(),
    }
}
