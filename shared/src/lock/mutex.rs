//! A fair FIFO lock, etcd's mutex recipe over the [`queue`](super::queue):
//! the first contender holds the lock; its key's create revision is its
//! fencing token, higher for every later holder.

use super::delay;
use super::queue::{join, leave, wait_for_turn, Place};
use super::LockBackend;
use crate::etcdpb::{PbRangeRequest, PbResponseHeader};
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
/// entry.
pub async fn acquire<B: LockBackend>(
    backend: Arc<B>,
    name: &[u8],
    lease: i64,
    lock_delay: Duration,
    deadline: Instant,
) -> Result<Grant, ApiError> {
    if lock_delay > delay::MAX_LOCK_DELAY {
        return Err(ApiError::invalid(format!(
            "a lock delay is at most {} ms",
            delay::MAX_LOCK_DELAY.as_millis()
        )));
    }
    let value = delay::encode(lock_delay);
    let joined = join(backend.as_ref(), name, lease, value).await?;
    let place = Place {
        backend: backend.clone(),
        key: joined.key.clone(),
        revision: joined.revision,
        armed: true,
    };
    let header = wait_for_turn(backend.as_ref(), name, lease, place, true, deadline).await?;
    Ok(Grant {
        key: joined.key,
        fencing_token: joined.revision,
        header,
    })
}

/// Releases a lock (or gives up a place in its queue): deletes the key an
/// acquire returned, marking the departure as one on purpose (no
/// lock-delay). Returns whether the key was there; releasing a key that
/// is gone is not an error.
pub async fn release<B: LockBackend>(
    backend: &B,
    key: Vec<u8>,
) -> Result<(PbResponseHeader, bool), ApiError> {
    if key.is_empty() {
        return Err(ApiError::key_not_provided());
    }
    let current = backend
        .range(PbRangeRequest {
            key: key.clone(),
            ..Default::default()
        })
        .await?;
    let Some(revision) = current.kvs.first().map(|kv| kv.create_revision) else {
        return Ok((current.header.unwrap_or_default(), false));
    };
    let left = backend.txn(leave(&key, revision)).await?;
    Ok((left.header.unwrap_or_default(), left.succeeded))
}
