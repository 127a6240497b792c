//! Leader election, etcd's election recipe over the
//! [`queue`](super::queue): a campaign joins the queue `name/` with its
//! value and waits to be first; the first key is the leader, and its value
//! is what the leader proclaims. A leader key (name, key, create revision,
//! lease) is what Proclaim and Resign take: they act only while that key,
//! with that create revision, is still there.

use super::queue::{if_created_at, join, line, queue_range, wait_for_turn, within, Place};
use super::LockBackend;
use crate::etcdpb::{PbDeleteRequest, PbKeyValue, PbPutRequest, PbResponseHeader, PbTxnOpRequest};
use crate::v3electionpb::LeaderKey;
use crate::ApiError;
use std::sync::Arc;
use tokio::time::Instant;

/// Waits until `lease` leads the election `name` with `value` (a lease
/// already campaigning keeps its place and proclaims `value`), or until
/// `deadline` (`lock_timeout`, its place given up).
pub async fn campaign<B: LockBackend>(
    backend: Arc<B>,
    name: &[u8],
    lease: i64,
    value: Vec<u8>,
    deadline: Instant,
) -> Result<(LeaderKey, PbResponseHeader), ApiError> {
    let joined = join(backend.as_ref(), name, lease, value.clone(), None).await?;
    let leader = LeaderKey {
        name: name.to_vec(),
        key: joined.key.clone(),
        rev: joined.revision,
        lease,
    };
    let place = Place::new(backend.clone(), &joined, false);
    if joined.existing_value.is_some_and(|v| v != value) {
        within(deadline, proclaim(backend.as_ref(), &leader, value)).await?;
    }
    let header = wait_for_turn(
        backend.as_ref(),
        name,
        lease,
        place,
        false,
        joined.read_at,
        deadline,
    )
    .await?;
    Ok((leader, header))
}

fn check(leader: &LeaderKey) -> Result<(), ApiError> {
    if leader.key.is_empty() {
        return Err(ApiError::invalid("\"leader\" field must be provided"));
    }
    Ok(())
}

/// The leader `leader` publishes `value`, keeping its place.
pub async fn proclaim<B: LockBackend>(
    backend: &B,
    leader: &LeaderKey,
    value: Vec<u8>,
) -> Result<PbResponseHeader, ApiError> {
    check(leader)?;
    let put = PbTxnOpRequest::RequestPut(PbPutRequest {
        key: leader.key.clone(),
        value,
        lease: leader.lease,
        ..Default::default()
    });
    let resp = backend
        .txn(if_created_at(&leader.key, leader.rev, put))
        .await?;
    if !resp.succeeded {
        return Err(ApiError::election_not_leader());
    }
    Ok(resp.header.unwrap_or_default())
}

/// `leader` gives up leadership (or its place in the queue). Resigning a
/// key that is no longer there does nothing, as in etcd.
pub async fn resign<B: LockBackend>(
    backend: &B,
    leader: &LeaderKey,
) -> Result<PbResponseHeader, ApiError> {
    check(leader)?;
    let delete = PbTxnOpRequest::RequestDeleteRange(PbDeleteRequest {
        key: leader.key.clone(),
        ..Default::default()
    });
    let resp = backend
        .txn(if_created_at(&leader.key, leader.rev, delete))
        .await?;
    Ok(resp.header.unwrap_or_default())
}

/// The leader's key-value, if anyone leads, with the header of the read.
pub async fn leader<B: LockBackend>(
    backend: &B,
    name: &[u8],
) -> Result<(Option<PbKeyValue>, PbResponseHeader), ApiError> {
    if name.is_empty() {
        return Err(ApiError::invalid("an election needs a name"));
    }
    let (first, header) = line(backend, name, 1).await?;
    Ok((first.into_iter().next(), header))
}

/// Waits for the next change of the election `name` after revision
/// `after` (a new leader, a proclamation, a departure).
pub async fn changed<B: LockBackend>(
    backend: &B,
    name: &[u8],
    after: i64,
) -> Result<i64, ApiError> {
    backend.wait_change(queue_range(name), after, false).await
}
