//! Changes to the directory of cells ([`latchkey_shared::directory`]),
//! made by an operator through any proxy: add a cell, assign a prefix to a
//! cell. Root only once authentication is on.
//!
//! A change runs under the directory's change lock (a key on a lease in
//! the home cell, so a proxy that dies mid-change frees it within the
//! lease's TTL) and within [`CHANGE_TIMEOUT`], shorter than that TTL. It
//! rewrites every cell's ownership record from the new directory, cells
//! that lose keys first and the cell that gains them last, then commits
//! the directory only if neither it nor the lock changed meanwhile. So at
//! any moment a key is owned by at most one cell, and a change that fails
//! half-way leaves keys owned by no cell (refused, `wrong_cell`) until the
//! next change, which rewrites every record again.
//!
//! An assignment moves no keys: a prefix that holds keys in the cell that
//! owns it now is refused (the online move of DESIGN section 9 copies them;
//! it is not built yet).

use crate::ops::auth::require_admin;
use crate::state::ProxyState;
use crate::upstream::{Cell, Kind, Route};
use latchkey_shared::directory::{
    Directory, Ownership, CHANGE_KEY, DIRECTORY_KEY, HOME, OWNERSHIP_KEY,
};
use latchkey_shared::etcd_enums::{CompareResult, CompareTarget};
use latchkey_shared::etcd_methods::kv::{RANGE, TXN};
use latchkey_shared::etcd_methods::lease::{GRANT, REVOKE};
use latchkey_shared::etcd_methods::maintenance::STATUS;
use latchkey_shared::etcdpb::*;
use latchkey_shared::key_range::KeyRange;
use latchkey_shared::txn_op::op;
use latchkey_shared::ApiError;
use std::collections::BTreeMap;
use std::time::Duration;

/// How long one change may take, all steps together.
pub const CHANGE_TIMEOUT: Duration = Duration::from_secs(20);
/// The change lock's lease: longer than a change may take.
const LOCK_TTL_SECONDS: i64 = 30;

/// The directory as the home cell holds it now.
pub async fn show(state: &ProxyState) -> Result<Directory, ApiError> {
    require_admin(state.upstream.home()).await?;
    Ok(crate::upstream::directory::read(state.upstream.home())
        .await?
        .unwrap_or_default())
}

/// Adds cell `name` at `endpoints` (its members' client addresses). The
/// cell must answer: it is told it owns no key yet.
pub async fn add_cell(
    state: &ProxyState,
    name: &str,
    endpoints: Vec<String>,
) -> Result<Directory, ApiError> {
    require_admin(state.upstream.home()).await?;
    latchkey_shared::directory::check_cell_name(name)?;
    let cluster = cluster_id_at(state, &endpoints).await?;
    let mut known = vec![(HOME.to_string(), state.upstream.home().clone())];
    let current = crate::upstream::directory::read(state.upstream.home())
        .await?
        .unwrap_or_default();
    for (other, at) in current.cells.iter().filter(|(n, _)| n.as_str() != name) {
        known.push((other.clone(), state.upstream.client(at)?));
    }
    for (other, cell) in known {
        let status: PbStatusResponse = cell
            .call(Route::Any, Kind::Read, STATUS, PbStatusRequest {})
            .await?;
        if status.header.is_some_and(|h| h.cluster_id == cluster) {
            return Err(ApiError::invalid(format!(
                "the members at {} are cell {other:?} (cluster id {cluster:x}): a cell is in \
                 the directory once",
                endpoints.join(",")
            )));
        }
    }
    change(state, |current| {
        let next = current.with_cell(name, endpoints.clone())?;
        Ok((next.version != current.version).then_some(next))
    })
    .await
}

/// How long a cell being added has to answer.
const PROBE_TIMEOUT: Duration = Duration::from_secs(2);

/// The cluster id of the cell whose members answer at `endpoints`, asked
/// with a client of its own that starts no tasks (nothing is kept of a
/// cell that is not added); `precondition_failed` when none answers.
async fn cluster_id_at(state: &ProxyState, endpoints: &[String]) -> Result<u64, ApiError> {
    if endpoints.is_empty() {
        return Err(ApiError::invalid(
            "give the cell's members' client addresses",
        ));
    }
    let probe = state.upstream.probe(endpoints, PROBE_TIMEOUT)?;
    let status: PbStatusResponse = probe
        .call(Route::Any, Kind::Read, STATUS, PbStatusRequest {})
        .await
        .map_err(|e| {
            ApiError::precondition_failed(format!(
                "no member of the cell answers at {}: {e}",
                endpoints.join(",")
            ))
        })?;
    match status.header.map(|h| h.cluster_id) {
        Some(id) if id != 0 => Ok(id),
        _ => Err(ApiError::precondition_failed(format!(
            "the server at {} did not name its cluster",
            endpoints.join(",")
        ))),
    }
}

/// Makes `cell` the owner of every key under `prefix` (home: no cell of
/// its own). Refused while the prefix holds keys in its current owner.
pub async fn assign(state: &ProxyState, prefix: &[u8], cell: &str) -> Result<Directory, ApiError> {
    require_admin(state.upstream.home()).await?;
    change(state, |current| current.with_assignment(prefix, cell)).await
}

/// How long a move may take, all steps together.
pub const MOVE_TIMEOUT: Duration = Duration::from_secs(120);

/// Moves `prefix`, with its keys, sessions, locks and elections, to cell
/// `to` online ([`super::prefix_move`]).
pub async fn move_prefix(
    state: &ProxyState,
    prefix: &[u8],
    to: &str,
) -> Result<super::prefix_move::Moved, ApiError> {
    require_admin(state.upstream.home()).await?;
    let home = state.upstream.home();
    // The lock outlives the move and its clean-up (each bounded).
    let lock = ChangeLock::take(home, MOVE_TIMEOUT.as_secs() as i64 * 2 + 30).await?;
    let result = async {
        let (current, seen) = crate::upstream::directory::read_with_revision(home)
            .await?
            .unwrap_or_default();
        let Some(next) = current.with_assignment(prefix, to)? else {
            return Err(ApiError::precondition_failed(format!(
                "prefix {:?} is cell {to}'s already",
                prefix.escape_ascii().to_string()
            )));
        };
        let lock = &lock;
        let commit_it = |d: Directory| async move { commit(home, lock, seen, &d).await };
        super::prefix_move::run(state, prefix, &current, &next, seen, commit_it).await
    }
    .await;
    lock.release(home).await;
    if result.is_ok() {
        state.upstream.refresh().await?;
    }
    result
}

/// Runs one change: `next` gives the new directory from the current one
/// (`None`: nothing to change).
async fn change<F>(state: &ProxyState, next: F) -> Result<Directory, ApiError>
where
    F: FnOnce(&Directory) -> Result<Option<Directory>, ApiError>,
{
    let home = state.upstream.home();
    let lock = ChangeLock::take(home, LOCK_TTL_SECONDS).await?;
    let result = tokio::time::timeout(CHANGE_TIMEOUT, async {
        let (current, seen) = crate::upstream::directory::read_with_revision(home)
            .await?
            .unwrap_or_default();
        let Some(next) = next(&current)? else {
            return Ok(current);
        };
        apply(state, &current, &next).await?;
        commit(home, &lock, seen, &next).await?;
        Ok(next)
    })
    .await
    .unwrap_or_else(|_| {
        Err(ApiError::timeout().with_message(format!(
            "the directory change took longer than {CHANGE_TIMEOUT:?}; run it again (each \
             change rewrites every cell's ownership record)"
        )))
    });
    lock.release(home).await;
    if result.is_ok() {
        state.upstream.refresh().await?;
    }
    result
}

/// Tells every cell what it owns under `next`: the cells losing a prefix
/// stop taking writes for it; once it is known to hold no keys there, every
/// cell but the gaining ones gets its new record, then the gaining ones.
async fn apply(state: &ProxyState, current: &Directory, next: &Directory) -> Result<(), ApiError> {
    let cell_of = |name: &str| cell_of(state, next, name);
    let names: Vec<&str> = std::iter::once(HOME)
        .chain(next.cells.keys().map(String::as_str))
        .collect();
    // What changes owner: each assignment of `next` that `current` gave
    // another cell, and each of `current` that `next` gives another.
    let moved: Vec<(Vec<u8>, String, String)> = next
        .prefixes
        .iter()
        .map(|a| {
            (
                a.prefix.clone(),
                current.owner_of(&a.prefix).to_string(),
                a.cell.clone(),
            )
        })
        .chain(current.prefixes.iter().map(|a| {
            (
                a.prefix.clone(),
                a.cell.clone(),
                next.owner_of(&a.prefix).to_string(),
            )
        }))
        .filter(|(_, from, to)| from != to)
        .collect();
    let gaining: Vec<&str> = moved.iter().map(|(_, _, to)| to.as_str()).collect();
    let mut losing: BTreeMap<&str, Vec<Vec<u8>>> = BTreeMap::new();
    for (prefix, from, _) in &moved {
        losing
            .entry(from.as_str())
            .or_default()
            .push(prefix.clone());
    }
    // The losing cells take no more writes for what they lose, but still
    // answer reads of it: what it holds is counted there.
    for (name, prefixes) in &losing {
        let fenced = current.ownership_of(name).with_leaving(prefixes.clone());
        write_ownership(&cell_of(name)?, fenced, name).await?;
    }
    for (prefix, from, _) in &moved {
        let (keys, _) = count_keys(&cell_of(from)?, prefix).await?;
        if keys > 0 {
            for name in losing.keys() {
                write_ownership(&cell_of(name)?, current.ownership_of(name), name).await?;
            }
            return Err(ApiError::precondition_failed(format!(
                "prefix {:?} holds {keys} keys in cell {from}: an assignment moves no keys \
                 (moving them online is not built yet); delete them or assign an empty prefix",
                prefix.escape_ascii().to_string()
            )));
        }
    }
    // Every cell but the gaining ones first: then nothing is owned twice.
    for name in names.iter().filter(|n| !gaining.contains(n)) {
        write_ownership(&cell_of(name)?, next.ownership_of(name), name).await?;
    }
    for name in names.iter().filter(|n| gaining.contains(n)) {
        write_ownership(&cell_of(name)?, next.ownership_of(name), name).await?;
    }
    Ok(())
}

/// The client of cell `name` of `directory`.
pub(super) fn cell_of(
    state: &ProxyState,
    directory: &Directory,
    name: &str,
) -> Result<Cell, ApiError> {
    match name {
        HOME => Ok(state.upstream.home().clone()),
        _ => {
            let endpoints = directory
                .cells
                .get(name)
                .ok_or_else(|| ApiError::internal(format!("no endpoints for cell {name:?}")))?;
            state.upstream.client(endpoints)
        }
    }
}

/// Writes `record` into cell `name`'s ownership record.
pub(super) async fn write_ownership(
    cell: &Cell,
    record: Ownership,
    name: &str,
) -> Result<(), ApiError> {
    let put = PbPutRequest {
        key: OWNERSHIP_KEY.to_vec(),
        value: record.encode(),
        ..Default::default()
    };
    let _: PbPutResponse = resending(|| {
        cell.call(
            Route::Leader,
            Kind::Write,
            latchkey_shared::etcd_methods::kv::PUT,
            put.clone(),
        )
    })
    .await
    .map_err(|e| unreachable_cell(name, e))?;
    Ok(())
}

/// How long [`resending`] goes on sending.
const RESEND_WITHIN: Duration = Duration::from_secs(10);
/// Its wait between sends.
const RESEND_PAUSE: Duration = Duration::from_millis(100);

/// `call` sent again while it fails saying nothing happened (no leader
/// yet, a member that could not take it), for [`RESEND_WITHIN`], so that a
/// move rides out an election in either cell. Never after an unknown
/// outcome: a first attempt that lands late could then land after the
/// steps that followed (an old import over a newer one, an ownership record
/// over the undo's); the move fails instead and is undone, and a late
/// write then meets a cell that no longer takes it.
pub(super) async fn resending<T, F, Fut>(mut call: F) -> Result<T, ApiError>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, ApiError>>,
{
    let deadline = tokio::time::Instant::now() + RESEND_WITHIN;
    loop {
        match call().await {
            Err(e)
                if e.retry() == latchkey_shared::error::Retry::Safe
                    && tokio::time::Instant::now() + RESEND_PAUSE < deadline =>
            {
                tokio::time::sleep(RESEND_PAUSE).await;
            }
            other => return other,
        }
    }
}

/// A cell that cannot be told what it owns stops the change, as a
/// precondition (the operator brings the cell up and runs it again), not
/// as a failure of this proxy.
fn unreachable_cell(name: &str, e: ApiError) -> ApiError {
    if e.retry() == latchkey_shared::error::Retry::Never {
        return e;
    }
    ApiError::precondition_failed(format!(
        "cell {name:?} did not take its ownership record: {e}; nothing was committed"
    ))
}

/// How many live keys `cell` holds under `prefix`, and its revision then
/// (a linearizable read).
pub(super) async fn count_keys(cell: &Cell, prefix: &[u8]) -> Result<(i64, i64), ApiError> {
    let range = KeyRange::prefix(prefix);
    let resp: PbRangeResponse = cell
        .call(
            Route::Leader,
            Kind::Read,
            RANGE,
            PbRangeRequest {
                key: range.start,
                range_end: range.end,
                count_only: true,
                ..Default::default()
            },
        )
        .await?;
    Ok((resp.count, resp.header.map_or(0, |h| h.revision)))
}

/// Writes `next` if the directory is still as read (`seen`) and the lock
/// still ours.
async fn commit(
    home: &Cell,
    lock: &ChangeLock,
    seen: i64,
    next: &Directory,
) -> Result<(), ApiError> {
    let compare = |key: &[u8], target: CompareTarget, union: PbTargetUnion| PbCompare {
        result: CompareResult::Equal as i32,
        target: target as i32,
        key: key.to_vec(),
        range_end: Vec::new(),
        target_union: Some(union),
    };
    let resp: PbTxnResponse = home
        .call(
            Route::Leader,
            Kind::Write,
            TXN,
            PbTxnRequest {
                compare: vec![
                    compare(
                        DIRECTORY_KEY,
                        CompareTarget::Mod,
                        PbTargetUnion::ModRevision(seen),
                    ),
                    compare(
                        CHANGE_KEY,
                        CompareTarget::Create,
                        PbTargetUnion::CreateRevision(lock.revision),
                    ),
                ],
                success: vec![op(PbTxnOpRequest::RequestPut(PbPutRequest {
                    key: DIRECTORY_KEY.to_vec(),
                    value: next.encode(),
                    ..Default::default()
                }))],
                failure: vec![],
            },
        )
        .await?;
    if resp.succeeded {
        Ok(())
    } else {
        Err(ApiError::precondition_failed(
            "the directory changed, or this change outlived its lock, while it ran; run it \
             again (it rewrites every cell's ownership record)",
        ))
    }
}

/// The directory's change lock, held by one change at a time.
struct ChangeLock {
    lease: i64,
    /// The lock key's create revision: this holder's.
    revision: i64,
}

impl ChangeLock {
    async fn take(home: &Cell, ttl: i64) -> Result<ChangeLock, ApiError> {
        let granted: PbLeaseGrantResponse = home
            .call(
                Route::Leader,
                Kind::Write,
                GRANT,
                PbLeaseGrantRequest { ttl, id: 0 },
            )
            .await?;
        if !granted.error.is_empty() {
            return Err(ApiError::internal(format!(
                "the directory change lock's lease was refused: {}",
                granted.error
            )));
        }
        let resp: Result<PbTxnResponse, ApiError> = home
            .call(
                Route::Leader,
                Kind::Write,
                TXN,
                PbTxnRequest {
                    compare: vec![PbCompare {
                        result: CompareResult::Equal as i32,
                        target: CompareTarget::Create as i32,
                        key: CHANGE_KEY.to_vec(),
                        range_end: Vec::new(),
                        target_union: Some(PbTargetUnion::CreateRevision(0)),
                    }],
                    success: vec![op(PbTxnOpRequest::RequestPut(PbPutRequest {
                        key: CHANGE_KEY.to_vec(),
                        lease: granted.id,
                        ..Default::default()
                    }))],
                    failure: vec![],
                },
            )
            .await;
        let lock = ChangeLock {
            lease: granted.id,
            revision: 0,
        };
        match resp {
            Ok(resp) if resp.succeeded => Ok(ChangeLock {
                revision: resp.header.map_or(0, |h| h.revision),
                ..lock
            }),
            Ok(_) => {
                lock.release(home).await;
                Err(ApiError::precondition_failed(
                    "another directory change is running; try again when it is done",
                ))
            }
            Err(e) => {
                lock.release(home).await;
                Err(e)
            }
        }
    }

    /// Revokes the lease, which deletes the lock key. Best effort: if the
    /// cell cannot be reached, the lease runs out.
    async fn release(&self, home: &Cell) {
        let done: Result<PbLeaseRevokeResponse, ApiError> = home
            .call(
                Route::Leader,
                Kind::Write,
                REVOKE,
                PbLeaseRevokeRequest { id: self.lease },
            )
            .await;
        if let Err(e) = done {
            tracing::warn!(error = %e, "releasing the directory change lock; its lease will run out");
        }
    }
}
