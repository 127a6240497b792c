//! A fair FIFO lock, etcd's mutex recipe over the [`queue`](super::queue):
//! the first contender holds the lock; its key's create revision is its
//! fencing token, higher for every later holder.

use super::delay;
use super::queue::{self, join, wait_for_turn, Place};
use super::LockBackend;
use crate::etcdpb::PbResponseHeader;
use crate::idempotency::{Guard, Outcome};
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
    let place = Place::new(backend.clone(), &joined, guard.is_some());
    let header = wait_for_turn(
        backend.as_ref(),
        name,
        lease,
        place,
        true,
        joined.read_at,
        deadline,
    )
    .await?;
    Ok(Grant {
        key: joined.key,
        fencing_token: joined.revision,
        header,
    })
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
