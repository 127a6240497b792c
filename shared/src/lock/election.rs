//! Leader election, etcd's election recipe over the
//! [`queue`](super::queue): a campaign joins the queue `name/` with its
//! value and waits to be first; the first key is the leader, and its value
//! is what the leader proclaims. A leader key (name, key, create revision,
//! lease) is what Proclaim and Resign take: they act only while that key,
//! with that create revision, is still there.

use super::queue::{
    if_created_at, join, line, line_at, queue_range, read_at, wait_for_turn, within, Place,
};
use super::{LockBackend, Revoked};
use crate::etcdpb::{PbDeleteRequest, PbKeyValue, PbPutRequest, PbResponseHeader, PbTxnOpRequest};
use crate::v3electionpb::LeaderKey;
use crate::ApiError;
use std::sync::Arc;
use tokio::sync::mpsc;
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
    if joined.existing_value.as_ref().is_some_and(|v| *v != value) {
        within(deadline, proclaim(backend.as_ref(), &leader, value)).await?;
    }
    let turn = wait_for_turn(
        backend.as_ref(),
        name,
        lease,
        place,
        false,
        &joined,
        deadline,
    )
    .await?;
    Ok((leader, turn.header))
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

/// A leader as an observer sees it: its key-value and the header of the
/// read that saw it.
pub type Observed = Result<(PbKeyValue, PbResponseHeader), ApiError>;

/// How many leaders an observer may have unread before the observing task
/// waits for it.
const OBSERVE_QUEUE: usize = 16;

/// Every leader of the election `name` and every value it proclaims, as
/// they happen (nothing while nobody leads), from a task that ends when
/// the receiver is dropped or after sending an error. Each change is read
/// as of its own revision, so values proclaimed in quick succession are
/// each seen, in order.
/// The leaders [`observe`] sends, until `revoked` resolves: then its
/// error, and the end.
pub fn observe_until<B: LockBackend>(
    backend: Arc<B>,
    name: Vec<u8>,
    revoked: Revoked,
) -> impl futures::Stream<Item = Observed> + Send + 'static {
    let leaders = observe(backend, name);
    futures::stream::unfold(
        (leaders, Some(revoked)),
        |(mut leaders, revoked)| async move {
            let mut revoked = revoked?;
            tokio::select! {
                biased;
                why = &mut revoked => Some((Err(why), (leaders, None))),
                next = leaders.recv() => next.map(|observed| (observed, (leaders, Some(revoked)))),
            }
        },
    )
}

pub fn observe<B: LockBackend>(backend: Arc<B>, name: Vec<u8>) -> mpsc::Receiver<Observed> {
    let (tx, rx) = mpsc::channel(OBSERVE_QUEUE);
    tokio::spawn(async move {
        // The leader's key and mod revision last sent.
        let mut sent: Option<(Vec<u8>, i64)> = None;
        // The revision of the change to read (0: the latest).
        let mut as_of = 0;
        loop {
            let (kv, header) = match line_at(backend.as_ref(), &name, 1, as_of).await {
                Ok((first, header)) => (first.into_iter().next(), header),
                Err(e) => {
                    let _ = tx.send(Err(e)).await;
                    return;
                }
            };
            let read_at = read_at(as_of, header.revision);
            if let Some(kv) = kv {
                let now = (kv.key.clone(), kv.mod_revision);
                if sent.as_ref() != Some(&now) {
                    sent = Some(now);
                    if tx.send(Ok((kv, header))).await.is_err() {
                        return;
                    }
                }
            }
            tokio::select! {
                _ = tx.closed() => return,
                changed = changed(backend.as_ref(), &name, read_at) => match changed {
                    Ok(revision) => as_of = revision,
                    Err(e) => {
                        let _ = tx.send(Err(e)).await;
                        return;
                    }
                },
            }
        }
    });
    rx
}
