//! Force-release with an audit record (DESIGN section 5): an operator
//! breaks a stuck lock by deleting its holder's key, and the SAME txn
//! writes a record of who did it, when, to which lock and holder, and why,
//! under [`PREFIX`]. The next waiter is then granted with a higher token,
//! so the old holder is fenced off. The records are ordinary keys: a watch
//! of the prefix from any revision replays every privileged operation.

use super::queue::{created_at, line, op};
use super::LockBackend;
use crate::etcdpb::{PbDeleteRequest, PbPutRequest, PbTxnOpRequest, PbTxnRequest};
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

/// Deletes the holder's key of the lock `name` and writes `record` (with
/// the holder filled in) in one txn; returns the record and the revision
/// it was committed at. A lock nobody holds is `precondition_failed`; a
/// holder that left meanwhile is retried against the new holder once.
pub async fn force_release<B: LockBackend>(
    backend: &B,
    name: &[u8],
    mut record: AuditRecord,
) -> Result<(AuditRecord, i64), ApiError> {
    if record.reason.trim().is_empty() {
        return Err(ApiError::invalid("a force-release needs a reason"));
    }
    for _ in 0..2 {
        let (first, _) = line(backend, name, 1).await?;
        let Some(holder) = first.first() else {
            return Err(ApiError::precondition_failed(format!(
                "the lock {:?} is not held",
                String::from_utf8_lossy(name)
            )));
        };
        record.holder_session = LeaseId(holder.lease).to_string();
        record.fencing_token = holder.create_revision;
        let key = [
            PREFIX,
            name,
            format!("/{}", holder.create_revision).as_bytes(),
        ]
        .concat();
        let value = serde_json::to_vec(&record)
            .map_err(|e| ApiError::internal(format!("an audit record: {e}")))?;
        let txn = PbTxnRequest {
            compare: vec![created_at(&holder.key, holder.create_revision)],
            success: vec![
                op(PbTxnOpRequest::RequestDeleteRange(PbDeleteRequest {
                    key: holder.key.clone(),
                    ..Default::default()
                })),
                op(PbTxnOpRequest::RequestPut(PbPutRequest {
                    key,
                    value,
                    ..Default::default()
                })),
            ],
            failure: Vec::new(),
        };
        let done = backend.txn(txn).await?;
        if done.succeeded {
            return Ok((record, done.header.map_or(0, |h| h.revision)));
        }
    }
    Err(ApiError::precondition_failed(
        "the holder changed twice while it was being released; try again",
    ))
}
