//! The queue both recipes stand in (etcd's mutex and election recipes):
//! under a prefix `name/`, each contender's key `name/<lease hex>` bound to
//! its lease; the key with the lowest create revision is first; every other
//! contender waits for the deletion of the key just before its own (its
//! predecessor), so a departure wakes exactly one waiter. A contender that
//! gives up removes its own key, and only its own (the txn compares the
//! create revision); one whose lease expires loses its key with it.

use super::{delay, LockBackend};
use crate::etcd_enums::{CompareResult, CompareTarget, SortOrder, SortTarget};
use crate::etcdpb::{
    PbCompare, PbDeleteRequest, PbKeyValue, PbPutRequest, PbRangeRequest, PbRangeResponse,
    PbResponseHeader, PbTargetUnion, PbTxnOpRequest, PbTxnOpResponse, PbTxnRequest, PbTxnRequestOp,
};
use crate::idempotency::{Guard, Outcome};
use crate::metrics_catalog::{LOCK_DELAYS, LOCK_WAKEUPS};
pub(super) use crate::txn_op::op;
use crate::{ApiError, KeyRange, LeaseId};
use std::sync::Arc;
use tokio::time::Instant;

/// The queue key of `lease` under `name`, as etcd writes it.
pub fn queue_key(name: &[u8], lease: i64) -> Vec<u8> {
    let mut key = name.to_vec();
    key.push(b'/');
    key.extend_from_slice(format!("{lease:x}").as_bytes());
    key
}

/// Every key of the queue `name`.
pub fn queue_range(name: &[u8]) -> KeyRange {
    KeyRange::prefix(&[name, b"/"].concat())
}

/// The queue `name` in line order (the first holds the lock, or leads),
/// at most `limit` keys (0: all), and the header of the read.
pub async fn line<B: LockBackend>(
    backend: &B,
    name: &[u8],
    limit: i64,
) -> Result<(Vec<PbKeyValue>, PbResponseHeader), ApiError> {
    line_at(backend, name, limit, 0).await
}

/// [`line`] as of the committed revision `as_of` (0: linearizable, the
/// latest), as [`LockBackend::range_at`] reads.
pub async fn line_at<B: LockBackend>(
    backend: &B,
    name: &[u8],
    limit: i64,
    as_of: i64,
) -> Result<(Vec<PbKeyValue>, PbResponseHeader), ApiError> {
    let queue = queue_range(name);
    let resp = backend
        .range_at(
            PbRangeRequest {
                key: queue.start,
                range_end: queue.end,
                sort_order: SortOrder::Ascend as i32,
                sort_target: SortTarget::Create as i32,
                limit,
                ..Default::default()
            },
            as_of,
        )
        .await?;
    Ok((resp.kvs, resp.header.unwrap_or_default()))
}

/// Compares the create revision of `key` with `revision` (0: absent).
pub(super) fn created_at(key: &[u8], revision: i64) -> PbCompare {
    PbCompare {
        result: CompareResult::Equal as i32,
        target: CompareTarget::Create as i32,
        key: key.to_vec(),
        range_end: Vec::new(),
        target_union: Some(PbTargetUnion::CreateRevision(revision)),
    }
}

/// `then` if `key` still has the create revision `revision`, else nothing:
/// how a contender acts on its own key only, never on a successor's.
pub(super) fn if_created_at(key: &[u8], revision: i64, then: PbTxnOpRequest) -> PbTxnRequest {
    PbTxnRequest {
        compare: vec![created_at(key, revision)],
        success: vec![op(then)],
        failure: Vec::new(),
    }
}

/// A contender leaving the queue on purpose (give-up): its key goes, if it
/// is still the one created at `revision`, and with it the lock's delay
/// record if that names it (see [`delay`]).
pub(super) fn leave(key: &[u8], revision: i64) -> PbTxnRequest {
    leave_if(key, created_at(key, revision))
}

/// A holder releasing its lock: its key goes, whatever revision it was
/// created at, with the delay record if that names it. One txn, no read
/// first.
pub(super) fn release(key: &[u8]) -> PbTxnRequest {
    leave_if(
        key,
        PbCompare {
            result: CompareResult::Greater as i32,
            target: CompareTarget::Create as i32,
            key: key.to_vec(),
            range_end: Vec::new(),
            target_union: Some(PbTargetUnion::CreateRevision(0)),
        },
    )
}

fn leave_if(key: &[u8], compare: PbCompare) -> PbTxnRequest {
    let mut success = vec![op(PbTxnOpRequest::RequestDeleteRange(PbDeleteRequest {
        key: key.to_vec(),
        ..Default::default()
    }))];
    if let Some(name) = delay::name_of(key) {
        success.push(op(PbTxnOpRequest::RequestTxn(PbTxnRequest {
            compare: delay::names(name, key).to_vec(),
            success: vec![op(PbTxnOpRequest::RequestDeleteRange(PbDeleteRequest {
                key: delay::record(name),
                ..Default::default()
            }))],
            failure: Vec::new(),
        })));
    }
    PbTxnRequest {
        compare: vec![compare],
        success,
        failure: Vec::new(),
    }
}

/// This contender's key (created at `revision`, or the newest key when
/// read in the txn that creates it) and the one just before it, in one
/// read.
fn line_behind(queue: &KeyRange, revision: i64) -> PbRangeRequest {
    PbRangeRequest {
        key: queue.start.clone(),
        range_end: queue.end.clone(),
        max_create_revision: revision,
        sort_order: SortOrder::Descend as i32,
        sort_target: SortTarget::Create as i32,
        limit: 2,
        ..Default::default()
    }
}

/// The reads a join (or a rejoin) makes beside its key when the key was
/// there already: the first key in line and the lock's delay record.
fn lineup(name: &[u8]) -> [PbTxnRequestOp; 2] {
    let queue = queue_range(name);
    [
        op(PbTxnOpRequest::RequestRange(PbRangeRequest {
            key: queue.start,
            range_end: queue.end,
            sort_order: SortOrder::Ascend as i32,
            sort_target: SortTarget::Create as i32,
            limit: 1,
            ..Default::default()
        })),
        op(PbTxnOpRequest::RequestRange(PbRangeRequest {
            key: delay::record(name),
            ..Default::default()
        })),
    ]
}

/// The range answers of a txn's responses, in order.
fn ranges(responses: Vec<crate::etcdpb::PbResponseOp>) -> Vec<Vec<PbKeyValue>> {
    responses
        .into_iter()
        .filter_map(|r| match r.response {
            Some(PbTxnOpResponse::ResponseRange(range)) => Some(range.kvs),
            _ => None,
        })
        .collect()
}

/// A contender's place: its key and the key's create revision.
pub(super) struct Joined {
    pub key: Vec<u8>,
    pub revision: i64,
    /// The header the join was answered with: its revision is where
    /// waiting reads from.
    pub header: PbResponseHeader,
    /// The key's value when it was already there (a retry, or a second
    /// campaign of the same lease).
    pub existing_value: Option<Vec<u8>>,
    /// Whether this contender was first in line when it joined: it holds
    /// (and nobody before it can appear later).
    pub first: bool,
    /// The lock's delay record when it joined.
    pub delay_record: Option<PbKeyValue>,
    /// When the join made the key: the key and the one just before it, as
    /// of the join's revision (what waiting would read first).
    pub line: Option<Vec<PbKeyValue>>,
}

/// Puts `lease`'s key in the queue `name` with `value`, unless it is
/// there already (then it keeps its place). Only waiting for a turn is
/// bounded by a caller's deadline, never joining.
///
/// With an idempotency `guard`, the join and its record commit in one txn;
/// a retry under the same key finds the record and returns the place that
/// join made, if it is still there.
pub(super) async fn join<B: LockBackend>(
    backend: &B,
    name: &[u8],
    lease: i64,
    value: Vec<u8>,
    guard: Option<&Guard>,
) -> Result<Joined, ApiError> {
    if name.is_empty() {
        return Err(ApiError::invalid("a lock or election needs a name"));
    }
    if lease == 0 {
        return Err(ApiError::invalid(
            "a lock or campaign is held by a lease (session): lease must not be 0",
        ));
    }
    let key = queue_key(name, lease);
    crate::reserved::check_recipe_key(&key)?;
    let [first, record] = lineup(name);
    let join = PbTxnRequest {
        compare: vec![created_at(&key, 0)],
        success: vec![
            op(PbTxnOpRequest::RequestPut(PbPutRequest {
                key: key.clone(),
                value,
                lease,
                ..Default::default()
            })),
            record.clone(),
            // After the put, so the new key is the newest in it: the
            // contender is first when nobody is before it, and one that
            // has to wait knows whom for without reading.
            op(PbTxnOpRequest::RequestRange(line_behind(
                &queue_range(name),
                0,
            ))),
        ],
        failure: vec![
            op(PbTxnOpRequest::RequestRange(PbRangeRequest {
                key: key.clone(),
                ..Default::default()
            })),
            first,
            record,
        ],
    };
    // Not cut short by the caller's deadline: a join whose outcome is
    // unknown may have queued the key, and an entry nobody waits for would
    // hold the lock until its session ends. The backend bounds the call.
    let joined = match guard {
        None => backend.txn(join).await?,
        Some(guard) => match guard.outcome(backend.txn(guard.guard(join)).await?)? {
            Outcome::Done(joined) => joined,
            Outcome::Replay(..) => return rejoin(backend, name, key).await,
        },
    };
    let header = joined.header.unwrap_or_default();
    let mut reads = ranges(joined.responses).into_iter();
    if joined.succeeded {
        // The delay record, then the line: the new key and the one before it.
        let delay_record = reads.next().and_then(|kvs| kvs.into_iter().next());
        let line = reads.next().unwrap_or_default();
        return Ok(Joined {
            first: line.len() == 1 && line[0].key == key,
            key,
            revision: header.revision,
            header,
            existing_value: None,
            delay_record,
            line: Some(line),
        });
    }
    // Gone between the compare and the read cannot happen in one txn; a
    // lease that expired before it is gone for good.
    let mine = reads
        .next()
        .and_then(|kvs| kvs.into_iter().next())
        .ok_or_else(|| ApiError::session_expired(LeaseId(lease)))?;
    let first_in_line = reads.next().and_then(|kvs| kvs.into_iter().next());
    let delay_record = reads.next().and_then(|kvs| kvs.into_iter().next());
    Ok(Joined {
        first: first_in_line
            .is_some_and(|kv| kv.key == key && kv.create_revision == mine.create_revision),
        key,
        revision: mine.create_revision,
        header,
        existing_value: Some(mine.value),
        delay_record,
        line: None,
    })
}

/// The place an earlier join under the same idempotency key made, if it is
/// still there.
async fn rejoin<B: LockBackend>(
    backend: &B,
    name: &[u8],
    key: Vec<u8>,
) -> Result<Joined, ApiError> {
    let [first, record] = lineup(name);
    let read = backend
        .txn(PbTxnRequest {
            compare: Vec::new(),
            success: vec![
                op(PbTxnOpRequest::RequestRange(PbRangeRequest {
                    key: key.clone(),
                    ..Default::default()
                })),
                first,
                record,
            ],
            failure: Vec::new(),
        })
        .await?;
    let header = read.header.unwrap_or_default();
    let mut reads = ranges(read.responses).into_iter();
    let kv = reads
        .next()
        .and_then(|kvs| kvs.into_iter().next())
        .ok_or_else(|| {
            ApiError::precondition_failed(
            "the queue entry this Idempotency-Key made is gone (released, or its session ended); \
             acquire again under a new key",
        )
        })?;
    let first_in_line = reads.next().and_then(|kvs| kvs.into_iter().next());
    Ok(Joined {
        first: first_in_line
            .is_some_and(|f| f.key == key && f.create_revision == kv.create_revision),
        key,
        revision: kv.create_revision,
        header,
        existing_value: Some(kv.value),
        delay_record: reads.next().and_then(|kvs| kvs.into_iter().next()),
        line: None,
    })
}

/// Removes a contender's key when it gives up, unless disarmed (it got
/// its turn). The removal runs on its own task: it must happen even when
/// the waiting future is dropped (its caller went away).
pub(super) struct Place<B: LockBackend> {
    pub backend: Arc<B>,
    pub key: Vec<u8>,
    pub revision: i64,
    pub armed: bool,
    /// Whether the place stays when its caller goes away (the waiting
    /// future is dropped): an acquire under an idempotency key, whose
    /// retry comes back for this place. A deadline or an error still
    /// gives it up.
    pub kept_if_abandoned: bool,
    /// The delay record of a departed holder whose lock-delay this
    /// contender waited out.
    pub honoured: Option<PbKeyValue>,
}

impl<B: LockBackend> Place<B> {
    pub fn new(backend: Arc<B>, joined: &Joined, kept_if_abandoned: bool) -> Self {
        Place {
            backend,
            key: joined.key.clone(),
            revision: joined.revision,
            armed: true,
            kept_if_abandoned,
            honoured: None,
        }
    }

    /// Removes the key before returning (its caller is still there, and
    /// may acquire again with the same session, so the same key: a
    /// removal still in flight would then delete the new place), once.
    /// On an error the key goes with its lease at the latest.
    pub(super) async fn leave_now(&mut self) {
        if !self.armed {
            return;
        }
        self.armed = false;
        let remove = leave(&self.key, self.revision);
        if let Err(e) = self.backend.txn(remove).await {
            tracing::debug!(error = %e, "a contender's queue key was not removed");
        }
    }

    /// Removes the key now (on its own task: the caller went away), once.
    pub(super) fn give_up(&mut self) {
        if !self.armed {
            return;
        }
        self.armed = false;
        let (backend, key, revision) = (self.backend.clone(), self.key.clone(), self.revision);
        let remove = leave(&key, revision);
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                if let Err(e) = backend.txn(remove).await {
                    // The key goes with its lease at the latest.
                    tracing::debug!(error = %e, "a contender's queue key was not removed");
                }
            });
        }
    }
}

impl<B: LockBackend> Drop for Place<B> {
    fn drop(&mut self) {
        if !self.kept_if_abandoned {
            self.give_up();
        }
    }
}

/// Waits until `place` is first in the queue `name`, or `deadline`
/// (`lock_timeout`; the place is then given up), reading the queue first
/// as of the revision its join was answered at, unless the join made that
/// read itself ([`Joined::line`]). Returns the header of the read that saw
/// it first.
///
/// Reads are as of the revision the contender was answered or woken at,
/// not linearizable: a key created later has a higher create revision and
/// can never stand before this one, so "first as of a committed revision"
/// stays true until this key itself goes (which a linearizable read could
/// not rule out either). That saves a leadership round per wake-up.
pub(super) async fn wait_for_turn<B: LockBackend>(
    backend: &B,
    name: &[u8],
    lease: i64,
    mut place: Place<B>,
    honour_lock_delay: bool,
    joined: &Joined,
    deadline: Instant,
) -> Result<Turn, ApiError> {
    let waited = wait(
        backend,
        name,
        lease,
        &mut place,
        honour_lock_delay,
        joined,
        deadline,
    )
    .await;
    if waited.is_err() {
        place.leave_now().await;
    }
    Ok(Turn {
        header: waited?,
        honoured: place.honoured.take(),
    })
}

/// A contender's turn.
pub(super) struct Turn {
    /// The header of the read that saw it first in line.
    pub header: PbResponseHeader,
    /// The delay record of a departed holder whose lock-delay it waited
    /// out: the new holder replaces or removes it.
    pub honoured: Option<PbKeyValue>,
}

async fn wait<B: LockBackend>(
    backend: &B,
    name: &[u8],
    lease: i64,
    place: &mut Place<B>,
    honour_lock_delay: bool,
    joined: &Joined,
    deadline: Instant,
) -> Result<PbResponseHeader, ApiError> {
    let queue = queue_range(name);
    let mut as_of = joined.header.revision;
    // Only a line with someone before this contender: one that finds it
    // first is read again, so a turn is always answered with a read's
    // header (one after the join's revision).
    let mut known = joined
        .line
        .clone()
        .filter(|kvs| kvs.len() == 2)
        .map(|kvs| PbRangeResponse {
            header: Some(joined.header.clone()),
            kvs,
            ..Default::default()
        });
    // Whether the last wait ended with a wake-up: the read after it most
    // likely finds this contender first.
    let mut woken = false;
    loop {
        // This contender's key and the one just before it, in one read
        // (the join's own, the first time, when it made the key).
        let line_read = async {
            match known.take() {
                Some(line) => Ok(line),
                None => {
                    backend
                        .range_at(line_behind(&queue, place.revision), as_of)
                        .await
                }
            }
        };
        // After a wake-up at a known revision, the delay record a first
        // contender must look at is read beside the line, as of the same
        // revision: one round trip to the cell instead of two per handoff
        // (through a proxy, each is a network hop). Without a wake-up it is
        // read only once the line says it is needed.
        let record_read = async {
            if honour_lock_delay && woken && as_of != 0 {
                delay_record(backend, name, as_of).await.map(Some)
            } else {
                Ok(None)
            }
        };
        let (line, record_at_wake) =
            within(deadline, async { tokio::try_join!(line_read, record_read) }).await?;
        let read_at = read_at(as_of, line.header.as_ref().map_or(0, |h| h.revision));
        let mut keys = line.kvs.iter();
        // Still queued? Its lease may have expired while it waited.
        if keys.next().map(|kv| (&kv.key, kv.create_revision)) != Some((&place.key, place.revision))
        {
            place.armed = false;
            return Err(ApiError::session_expired(LeaseId(lease)));
        }
        let Some(predecessor) = keys.next() else {
            // First in line. A delay record that names another holder is
            // a holder that left without releasing (a release removes
            // it): its lock-delay is owed by whoever is first now, also
            // when the waiter that owed it gave up or expired meanwhile.
            if honour_lock_delay {
                let record = match record_at_wake {
                    Some(record) => record,
                    None => within(deadline, delay_record(backend, name, read_at)).await?,
                };
                let owed = owed_as_first(record, &place.key);
                let honoured = place.honoured.as_ref().map(|r| r.mod_revision);
                if let Some((lock_delay, record)) =
                    owed.filter(|(_, r)| Some(r.mod_revision) != honoured)
                {
                    metrics::counter!(LOCK_DELAYS.name).increment(1);
                    sleep_within(deadline, lock_delay).await?;
                    place.honoured = Some(record);
                    // Then the line as it is now.
                    as_of = 0;
                    woken = false;
                    continue;
                }
            }
            place.armed = false;
            return Ok(line.header.unwrap_or_default());
        };
        let (predecessor_key, predecessor_revision, predecessor_value) = (
            predecessor.key.clone(),
            predecessor.create_revision,
            predecessor.value.clone(),
        );
        // Woken by the predecessor's deletion, or by this contender's own
        // (its lease expired): either way, read again.
        let departure = backend.wait_departure(
            queue.clone(),
            vec![place.key.clone(), predecessor.key.clone()],
            read_at,
        );
        // The revision woken at (0: the wait was cut short, read the
        // latest).
        as_of = within(deadline, departure).await?;
        woken = true;
        // One waiter woken by one departure: the count a test compares
        // with the departures.
        metrics::counter!(LOCK_WAKEUPS.name).increment(1);
        // A predecessor that asked for a lock-delay: if it held the lock
        // and did not leave on purpose, the delay is owed from now.
        if honour_lock_delay && !delay::decode(&predecessor_value).is_zero() {
            let owed = within(
                deadline,
                owed_after(backend, name, &predecessor_key, predecessor_revision, as_of),
            )
            .await?;
            if let Some((lock_delay, record)) = owed {
                metrics::counter!(LOCK_DELAYS.name).increment(1);
                sleep_within(deadline, lock_delay).await?;
                place.honoured = Some(record);
            }
        }
    }
}

/// Sleeps `delay`, or `lock_timeout` at `deadline`.
pub(super) async fn sleep_within(
    deadline: Instant,
    delay: std::time::Duration,
) -> Result<(), ApiError> {
    within(deadline, async {
        tokio::time::sleep(delay).await;
        Ok(())
    })
    .await
}

/// The delay owed for the holder `key` (created at `revision`) of the lock
/// `name`, as of the committed revision `as_of` (0: the latest): owed if
/// its key is gone and the lock's delay record still names it (it did not
/// release on purpose). With the record, for the next holder to clear.
async fn owed_after<B: LockBackend>(
    backend: &B,
    name: &[u8],
    key: &[u8],
    revision: i64,
    as_of: i64,
) -> Result<Option<(std::time::Duration, PbKeyValue)>, ApiError> {
    let Some(record) = delay_record(backend, name, as_of).await? else {
        return Ok(None);
    };
    let Some(lock_delay) = delay::owed_for(Some(&record), key) else {
        return Ok(None);
    };
    let still = backend
        .range_at(
            PbRangeRequest {
                key: key.to_vec(),
                ..Default::default()
            },
            as_of,
        )
        .await?;
    let gone = !still.kvs.iter().any(|kv| kv.create_revision == revision);
    Ok(gone.then_some((lock_delay, record)))
}

/// For a contender first in line (its key `own`), given the lock's delay
/// `record` as of the same revision: the delay the record asks for when it
/// names another holder, with the record, for the next holder to clear.
fn owed_as_first(
    record: Option<PbKeyValue>,
    own: &[u8],
) -> Option<(std::time::Duration, PbKeyValue)> {
    let record = record?;
    let owed = delay::parse_record(&record.value)
        .filter(|(holder, owed)| *holder != own && !owed.is_zero())
        .map(|(_, owed)| owed);
    owed.map(|owed| (owed, record))
}

/// The delay record of the lock `name` as of `as_of` (0: the latest).
async fn delay_record<B: LockBackend>(
    backend: &B,
    name: &[u8],
    as_of: i64,
) -> Result<Option<PbKeyValue>, ApiError> {
    let record = backend
        .range_at(
            PbRangeRequest {
                key: delay::record(name),
                ..Default::default()
            },
            as_of,
        )
        .await?;
    Ok(record.kvs.into_iter().next())
}

/// The revision a read as of `as_of` reflects, answered with the header
/// revision `latest`: changes after it are what to wait for. A read that
/// fell back to the latest state (or asked for it) reflects `latest`.
pub(super) fn read_at(as_of: i64, latest: i64) -> i64 {
    if as_of == 0 || as_of > latest {
        latest
    } else {
        as_of
    }
}

/// `work`, or `lock_timeout` at `deadline`.
pub(super) async fn within<T>(
    deadline: Instant,
    work: impl std::future::Future<Output = Result<T, ApiError>>,
) -> Result<T, ApiError> {
    tokio::time::timeout_at(deadline, work)
        .await
        .unwrap_or_else(|_| {
            Err(ApiError::lock_timeout(
                "not granted before the deadline; the place in the queue was given up",
            ))
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_queue_key_is_the_name_a_slash_and_the_lease_in_hex_as_etcd_writes_it() {
        assert_eq!(queue_key(b"jobs", 0x694d_5765), b"jobs/694d5765".to_vec());
        let range = queue_range(b"jobs");
        assert!(range.contains(b"jobs/694d5765"));
        assert!(!range.contains(b"jobs2/1"));
    }
}
