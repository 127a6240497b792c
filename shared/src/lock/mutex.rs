//! A fair FIFO lock, etcd's mutex recipe over the [`queue`](super::queue):
//! the first contender holds the lock; its key's create revision is its
//! fencing token, higher for every later holder.

use super::delay;
use super::queue::{self, join, sleep_within, wait_for_turn, Joined, Place, Turn};
use super::LockBackend;
use crate::etcd_enums::{CompareResult, CompareTarget};
use crate::etcdpb::{
    PbCompare, PbDeleteRequest, PbPutRequest, PbResponseHeader, PbTargetUnion, PbTxnOpRequest,
    PbTxnRequest,
};
use crate::idempotency::{Guard, Outcome};
use crate::metrics_catalog::LOCK_DELAYS;
use crate::ApiError;
use std::sync::Arc;
use std::time::Duration;
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

/// Waits until `lease` holds the lock `name`, or until `deadline`
/// (`lock_timeout`, its queue key removed). A lease that already holds or
/// waits for the lock keeps its place: a retry never makes a second
/// entry. With an idempotency `guard`, a retry under the same key waits
/// on the place the first attempt made (the same token), a different
/// request under it is refused, and the place stays when the caller goes
/// away (its retry comes back for it).
pub async fn acquire<B: LockBackend>(
    backend: Arc<B>,
    name: &[u8],
    lease: i64,
    lock_delay: Duration,
    deadline: Instant,
    guard: Option<&Guard>,
) -> Result<Grant, ApiError> {
    if lock_delay > delay::MAX_LOCK_DELAY {
        return Err(ApiError::invalid(format!(
            "a lock delay is at most {} ms",
            delay::MAX_LOCK_DELAY.as_millis()
        )));
    }
    let value = delay::encode(lock_delay);
    let joined = join(backend.as_ref(), name, lease, value, guard).await?;
    let mut place = Place::new(backend.clone(), &joined, guard.is_some());
    // First in line at once, after a holder that did not leave on purpose
    // while nobody waited: its lock-delay is owed from now.
    let owed = joined
        .delay_record
        .as_ref()
        .filter(|_| joined.first)
        .and_then(|record| delay::parse_record(&record.value))
        .filter(|(holder, owed)| *holder != joined.key.as_slice() && !owed.is_zero())
        .map(|(_, owed)| owed);
    let turn = match owed {
        // Nobody can come before a contender that was first as of a
        // committed revision: no read needed.
        None if joined.first => {
            place.armed = false;
            Turn {
                header: joined.header,
                honoured: None,
            }
        }
        _ => {
            if let Some(owed) = owed {
                metrics::counter!(LOCK_DELAYS.name).increment(1);
                if let Err(e) = sleep_within(deadline, owed).await {
                    place.leave_now().await;
                    return Err(e);
                }
                // Waited out: not owed again when it reads it is first.
                place.honoured = joined.delay_record.clone();
            }
            let mut turn = wait_for_turn(
                backend.as_ref(),
                name,
                lease,
                place,
                true,
                &joined,
                deadline,
            )
            .await?;
            if owed.is_some() {
                turn.honoured = turn.honoured.or_else(|| joined.delay_record.clone());
            }
            turn
        }
    };
    settle_delay_record(backend.as_ref(), name, lease, &joined, lock_delay, &turn).await?;
    Ok(Grant {
        key: joined.key,
        fencing_token: joined.revision,
        header: turn.header,
    })
}

/// A new holder's delay record: its own if it asked for a lock-delay (so
/// that its expiry is honoured), else the one it honoured goes (unless
/// replaced since), so nobody waits for that departure again.
async fn settle_delay_record<B: LockBackend>(
    backend: &B,
    name: &[u8],
    lease: i64,
    joined: &Joined,
    lock_delay: Duration,
    turn: &Turn,
) -> Result<(), ApiError> {
    let record = delay::record(name);
    if !lock_delay.is_zero() {
        let put = PbTxnOpRequest::RequestPut(PbPutRequest {
            key: record,
            value: delay::record_value(&joined.key, lock_delay),
            ..Default::default()
        });
        let written = backend
            .txn(queue::if_created_at(&joined.key, joined.revision, put))
            .await?;
        if !written.succeeded {
            // Its key went while it was being granted: not a holder.
            return Err(ApiError::session_expired(crate::LeaseId(lease)));
        }
        return Ok(());
    }
    if let Some(honoured) = &turn.honoured {
        let delete = PbTxnOpRequest::RequestDeleteRange(PbDeleteRequest {
            key: record.clone(),
            ..Default::default()
        });
        let unchanged = PbTxnRequest {
            compare: vec![PbCompare {
                result: CompareResult::Equal as i32,
                target: CompareTarget::Mod as i32,
                key: record,
                range_end: Vec::new(),
                target_union: Some(PbTargetUnion::ModRevision(honoured.mod_revision)),
            }],
            success: vec![queue::op(delete)],
            failure: Vec::new(),
        };
        if let Err(e) = backend.txn(unchanged).await {
            // Only costs a later newcomer one needless delay.
            tracing::debug!(error = %e, "a honoured lock-delay record was not removed");
        }
    }
    Ok(())
}

/// Releases a lock (or gives up a place in its queue): deletes the key an
/// acquire returned, marking the departure as one on purpose (no
/// lock-delay). Returns the header of the txn (or read) that did it and
/// whether the key was there; releasing a key that is gone is not an
/// error. With an idempotency `guard`, a retry under the same key answers
/// what the first release did.
pub async fn release<B: LockBackend>(
    backend: &B,
    key: Vec<u8>,
    guard: Option<&Guard>,
) -> Result<(PbResponseHeader, bool), ApiError> {
    if key.is_empty() {
        return Err(ApiError::key_not_provided());
    }
    // The txn's branch says whether the key was there; the guard's record
    // keeps that branch for a retry.
    let txn = queue::release(&key);
    let Some(guard) = guard else {
        let left = backend.txn(txn).await?;
        return Ok((left.header.unwrap_or_default(), left.succeeded));
    };
    match guard.outcome(backend.txn(guard.guard(txn)).await?)? {
        Outcome::Done(left) => Ok((left.header.unwrap_or_default(), left.succeeded)),
        Outcome::Replay(record, header) => Ok((header, record.succeeded)),
    }
}
