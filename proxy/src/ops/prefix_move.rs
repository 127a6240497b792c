//! An online move of a key prefix from the cell that owns it to another
//! (DESIGN section 9), run by an operator through any proxy under the
//! directory's change lock ([`super::directory`]):
//!
//! 1. **Arriving.** The target is told it owns the prefix for the move
//!    only: it answers and takes writes under it from the proxies alone. It
//!    must hold no keys there.
//! 2. **Copy.** The source's keys under the prefix are read at one
//!    revision `r0` (page by page) and imported into the target with the
//!    create revision and version each had (a lock or election queue keeps
//!    its order, a holder its fencing token) and its session (each
//!    session's lease is extended to the target first).
//! 3. **Follow.** A watch of the source from `r0 + 1` applies every later
//!    change to the target, while clients go on writing to the source.
//! 4. **Fence.** The source stops taking writes under the prefix
//!    (`leaving`); the pause begins. Its revision then, `rf`, is the last
//!    any write of the prefix got there; the follower applies through it.
//! 5. **Raise.** The target's revision becomes at least `rf`: every
//!    revision it issues from now on, and so every fencing token, is above
//!    those the source issued.
//! 6. **Switch.** The source's record stops owning the prefix, then the
//!    target's owns it (for proxies only), then the directory commits; the
//!    pause ends. Only then does the target serve every client and is the
//!    source told to drop the prefix's keys. Proxies learn it within
//!    `--directory-interval`, or at once when the source refuses a request;
//!    a proxy holds a refused request and sends it again until its timeout,
//!    so a short pause is a slow answer, not an error. Steps 4 to 6 and the
//!    commit must end within [`PAUSE_TIMEOUT`], or the move is undone.
//!
//! What clients see: writes under the prefix wait during the pause (the
//! move reports how long it was); other prefixes never pause. Locks,
//! elections and sessions on the prefix keep their keys and leases; a
//! holder's token stays what it was, the next holder's is above it. A
//! watch of the prefix on the source is cancelled when the source stops
//! owning it: its client reads the prefix again and watches from that
//! read's revision. Revisions of the prefix up to the fence's are the
//! source's: the directory keeps a floor for the prefix in the target
//! ([`latchkey_shared::directory::Floor`]), and the target refuses a read or
//! watch of it at such a revision as compacted, which etcd clients answer by
//! reading again.
//!
//! A move that fails or times out before the directory commits is undone:
//! the source owns the prefix again with its keys (never dropped before the
//! commit), and the target drops what it copied. The source drops the
//! prefix's keys only after the commit.

use super::directory::{cell_of, count_keys, resending, write_ownership};
use crate::chaos::{broken, Defect};
use crate::state::ProxyState;
use crate::upstream::{Cell, Kind, Route};
use crate::watch::{Cancel, Item, WatchKey};
use futures::FutureExt;
use latchkey_shared::directory::Directory;
use latchkey_shared::etcd_enums::EventType;
use latchkey_shared::etcd_methods::kv::TXN;
use latchkey_shared::etcd_methods::moves::IMPORT;
use latchkey_shared::etcd_methods::moves::RAISE_REVISION;
use latchkey_shared::etcdpb::*;
use latchkey_shared::key_range::KeyRange;
use latchkey_shared::limits::MAX_TXN_OPS;
use latchkey_shared::moves_pb::{
    ImportRequest, ImportResponse, RaiseRevisionRequest, RaiseRevisionResponse,
};
use latchkey_shared::txn_op::op;
use latchkey_shared::ApiError;
use std::collections::BTreeMap;
use std::time::Duration;
use tokio::time::Instant;

/// How long the fenced follower may take to reach the source's revision.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(10);

/// What a move did.
#[derive(Debug, Clone)]
pub struct Moved {
    pub directory: Directory,
    pub from: String,
    /// Keys copied at the start revision.
    pub copied: usize,
    /// Source revisions the follower applied after the copy.
    pub followed: usize,
    /// From the fence to the directory's commit: writes under the prefix
    /// waited at most this long.
    pub pause: Duration,
}

/// Moves `prefix` from its cell to `to` (see the module doc); `current`
/// and `next` are the directory before and after, read under the change
/// lock, and `commit` writes `next`.
///
/// The source keeps its keys until the directory has committed: a move
/// that fails or times out before that gives the source back what it owned,
/// its keys intact, and drops the target's copies (the target never owned
/// them). Only once the commit is known is the source told to drop the
/// prefix's keys. A commit whose outcome is unknown is read back; if that
/// fails too, nothing is undone (the source stays fenced, the target owns
/// the prefix) and the error says so.
pub async fn run<C, F>(
    state: &ProxyState,
    prefix: &[u8],
    current: &Directory,
    next: &Directory,
    seen: i64,
    commit: C,
) -> Result<Moved, ApiError>
where
    C: Fn(Directory) -> F,
    F: std::future::Future<Output = Result<(), ApiError>>,
{
    let from = current.owner_of(prefix).to_string();
    let to = next.owner_of(prefix).to_string();
    let source = cell_of(state, next, &from)?;
    let target = cell_of(state, next, &to)?;
    let range = KeyRange::prefix(prefix);
    let switched = tokio::time::timeout(MOVE_TIMEOUT, async {
        // 1. Arriving: the target owns it for the move only.
        let arriving = next.ownership_of(&to).with_arriving(vec![prefix.to_vec()]);
        write_ownership(&target, arriving, &to).await?;
        let (stale, _) = count_keys(&target, prefix).await?;
        if stale > 0 {
            return Err(ApiError::precondition_failed(format!(
                "cell {to} held {stale} keys under {:?} it did not own (left by a move that \
                 failed?); they are dropped now: run the move again",
                prefix.escape_ascii().to_string()
            )));
        }
        let (follower, copied) = copy_and_follow(state, prefix, &range, &source, &target).await?;
        // 4-6 and the commit: the pause, bounded on its own.
        let fenced = Instant::now();
        let switch = async {
            let (followed, next) =
                fence_and_switch(state, prefix, current, next, follower, &source, &target).await?;
            commit(next.clone()).await?;
            Ok((followed, next))
        };
        let (followed, next) = tokio::time::timeout(PAUSE_TIMEOUT, switch)
            .await
            .unwrap_or_else(|_| {
                Err(ApiError::timeout().with_message(format!(
                    "the move's fenced step (fence, drain, raise, switch, commit) took longer \
                     than {PAUSE_TIMEOUT:?}; it was undone"
                )))
            })?;
        Ok((copied, followed, fenced.elapsed(), next))
    })
    .await
    .unwrap_or_else(|_| {
        Err(ApiError::timeout().with_message(format!(
            "the move took longer than {MOVE_TIMEOUT:?}; it was undone"
        )))
    });
    let (copied, followed, pause, next) = match switched {
        Ok(moved) => moved,
        Err(e) => {
            match settle_commit(state, current, seen, next.version, prefix, &to).await {
                Some(Some(now)) => {
                    // The commit took effect after all.
                    tracing::warn!(error = %e, "a move's last step answered an error but committed");
                    (0, 0, Duration::ZERO, now)
                }
                Some(None) => {
                    undo(prefix, current, &from, &to, &source, &target).await;
                    return Err(e);
                }
                None => {
                    return Err(e.with_message(
                        "the move's commit has an unknown outcome and the directory cannot be \
                         read: nothing was undone (the source is fenced, the target serves the \
                         prefix to proxies only); read the directory and run the move again or \
                         back",
                    ))
                }
            }
        }
    };
    // Committed: the target serves the prefix to every client, not only
    // to proxies (before the commit a client straight to a member could
    // have written there what an undo would drop).
    if let Err(e) = write_ownership(&target, next.ownership_of(&to), &to).await {
        tracing::warn!(error = %e, cell = %to, "opening a moved prefix to every client of its new cell; until the next change only proxies are served");
    }
    // Committed: the source drops what it gave away (best effort: left
    // over, its keys are unreachable, and a move back drops them first).
    let mut dropping = next.ownership_of(&from);
    dropping.dropped = vec![prefix.to_vec()];
    if let Err(e) = write_ownership(&source, dropping, &from).await {
        tracing::warn!(error = %e, cell = %from, "dropping a moved prefix's keys in its old cell");
    }
    Ok(Moved {
        directory: next.clone(),
        from,
        copied,
        followed,
        pause,
    })
}

/// How long a move may take before its clean-up.
const MOVE_TIMEOUT: Duration = super::directory::MOVE_TIMEOUT;

/// How long writes under the prefix may be fenced: from the fence to the
/// directory's commit. Past it the move is undone and the source takes
/// writes again, so a fault in either cell during the pause is a longer
/// pause of one prefix, never an outage of it.
pub const PAUSE_TIMEOUT: Duration = Duration::from_secs(5);

/// Whether the move's commit took effect, made final first: a commit
/// still on its way (its answer was lost, or it timed out while a member
/// held it) must not land after an undo. The directory is put again as it
/// was read (`current`), if it is still at revision `seen`; the commit
/// compares that revision, so once this succeeds it can never succeed.
/// `Some(None)`: not committed, and it never will be; `Some(Some(d))`:
/// committed (`d`, version `version`, `prefix` owned by `to`); `None`: not
/// known (home did not answer).
async fn settle_commit(
    state: &ProxyState,
    current: &Directory,
    seen: i64,
    version: u64,
    prefix: &[u8],
    to: &str,
) -> Option<Option<Directory>> {
    let home = state.upstream.home();
    let again = PbTxnRequest {
        compare: vec![PbCompare {
            result: latchkey_shared::etcd_enums::CompareResult::Equal as i32,
            target: latchkey_shared::etcd_enums::CompareTarget::Mod as i32,
            key: latchkey_shared::directory::DIRECTORY_KEY.to_vec(),
            range_end: Vec::new(),
            target_union: Some(PbTargetUnion::ModRevision(seen)),
        }],
        success: vec![op(PbTxnOpRequest::RequestPut(PbPutRequest {
            key: latchkey_shared::directory::DIRECTORY_KEY.to_vec(),
            value: current.encode(),
            ..Default::default()
        }))],
        failure: vec![],
    };
    let settled: PbTxnResponse =
        resending(|| home.call(Route::Leader, Kind::Write, TXN, again.clone()))
            .await
            .ok()?;
    if settled.succeeded {
        return Some(None);
    }
    // The directory moved on from `seen`: under the change lock, only by
    // this move's commit.
    let now = crate::upstream::directory::read(home).await.ok()??;
    (now.version == version && now.owner_of(prefix) == to).then_some(Some(now))
}

/// Back as before the move: the source owns the prefix again with its keys
/// (never dropped before a commit); the target answers nothing under it and
/// drops what it copied.
async fn undo(
    prefix: &[u8],
    current: &Directory,
    from: &str,
    to: &str,
    source: &Cell,
    target: &Cell,
) {
    if let Err(e) = write_ownership(source, current.ownership_of(from), from).await {
        tracing::warn!(error = %e, cell = %from, "giving a prefix back to its cell after a failed move; the next change rewrites it");
    }
    let mut cleared = current.ownership_of(to);
    cleared.dropped = vec![prefix.to_vec()];
    if let Err(e) = write_ownership(target, cleared, to).await {
        tracing::warn!(error = %e, cell = %to, "dropping a failed move's copies");
    }
}

/// Steps 2 and 3: the copy and the follower, close behind the source.
/// Returns the follower and how many keys were copied.
async fn copy_and_follow(
    state: &ProxyState,
    prefix: &[u8],
    range: &KeyRange,
    source: &Cell,
    target: &Cell,
) -> Result<(Follower, usize), ApiError> {
    // 2. Copy at one revision, each key with its create revision and
    // version (a lock queue keeps its order, a holder its token).
    // Page by page: a proxy holds one page of the prefix, not all of it.
    let mut pages = source.pages(range);
    let mut copied = 0;
    while let Some(page) = pages.next().await? {
        copied += page.len();
        import(state, source, target, page).await?;
    }
    let r0 = pages.revision();

    // 3. Follow from r0 + 1, in rounds, until a round has little left
    // to apply: then the fence's pause holds only that little.
    let coalescer = state.coalescers.of(&state.upstream, source);
    let key = WatchKey::new(range.start.clone(), range.end.clone(), &[], false)?.on_the_leader();
    let mut follower = Follower {
        changes: coalescer.subscribe(key.clone(), r0 + 1).await?,
        coalescer,
        key,
        applied: r0,
        followed: 0,
    };
    for _ in 0..FOLLOW_ROUNDS {
        let now = count_keys(source, prefix).await?.1;
        let behind = now - follower.applied;
        follower.follow(state, source, target, now).await?;
        if behind <= CLOSE_ENOUGH {
            break;
        }
    }
    Ok((follower, copied))
}

/// Steps 4 to 6, the pause; the directory is committed right after.
/// Returns the source revisions followed and the directory to commit.
async fn fence_and_switch(
    state: &ProxyState,
    prefix: &[u8],
    current: &Directory,
    next: &Directory,
    mut follower: Follower,
    source: &Cell,
    target: &Cell,
) -> Result<(usize, Directory), ApiError> {
    let from = current.owner_of(prefix);
    let to = next.owner_of(prefix);
    // 4. Fence the source. Its revision then is the last any write of the
    // prefix got there.
    let leaving = current
        .ownership_of(from)
        .with_leaving(vec![prefix.to_vec()]);
    if !broken(Defect::UnfencedMoves) {
        write_ownership(source, leaving, from).await?;
    }
    let rf = count_keys(source, prefix).await?.1;
    follower.follow(state, source, target, rf).await?;
    if broken(Defect::UnfencedMoves) {
        // The source goes on taking writes past rf for a moment.
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let followed = follower.followed;
    drop(follower);
    move_lock_delays(state, prefix, source, target).await?;

    // 5. The target's revisions continue above the source's.
    let raised: RaiseRevisionResponse = resending(|| {
        target.call(
            Route::Leader,
            Kind::Write,
            RAISE_REVISION,
            RaiseRevisionRequest { above: rf },
        )
    })
    .await?;
    // Every revision of the target up to here is the source's history or
    // the copy's (imports at the target's own revisions): a read or watch
    // of the prefix below it would see the copy half made.
    let floor = raised.header.map_or(rf, |h| h.revision).max(rf);

    // 6. The source stops owning the prefix (its keys stay until the
    // commit), then the target owns it, still for proxies only until the
    // commit: proxies route by the directory, so none sends it a client's
    // request before then, and an undo loses nothing a client was told.
    // Revisions of the prefix up to the floor are the source's or the
    // copy's: refused as compacted in the target from now on.
    let next = next.clone().with_floor(prefix, to, floor);
    write_ownership(source, next.ownership_of(from), from).await?;
    let owning = next.ownership_of(to).with_arriving(vec![prefix.to_vec()]);
    write_ownership(target, owning, to).await?;
    Ok((followed, next))
}

/// The lock-delay records of the prefix's locks
/// ([`latchkey_shared::lock::delay`]) go with them, read after the fence:
/// a record is written and deleted in txns that name its holder's key,
/// which the fence holds. The target's records under the prefix (left
/// from an earlier stay there) are replaced. A record the source deletes
/// after this (a new holder clearing the one it honoured) stays in the
/// target: a newcomer may then wait one delay it did not owe, slower, never
/// unsafe.
async fn move_lock_delays(
    state: &ProxyState,
    prefix: &[u8],
    source: &Cell,
    target: &Cell,
) -> Result<(), ApiError> {
    let records = KeyRange::prefix(&latchkey_shared::lock::delay::record(prefix));
    let clear = op(PbTxnOpRequest::RequestDeleteRange(PbDeleteRequest {
        key: records.start.clone(),
        range_end: records.end.clone(),
        ..Default::default()
    }));
    delete(target, vec![clear]).await?;
    let mut pages = source.pages(&records);
    while let Some(page) = pages.next().await? {
        import(state, source, target, page).await?;
    }
    Ok(())
}

/// Rounds of following before the fence, at most.
const FOLLOW_ROUNDS: usize = 20;
/// A round that started this many revisions behind, or fewer, is the last.
const CLOSE_ENOUGH: i64 = 32;
/// Revisions merged into one application to the target, at most.
const MERGE: usize = 512;

/// The source's changes under the prefix, applied to the target.
struct Follower {
    coalescer: std::sync::Arc<crate::watch::coalescer::Coalescer>,
    /// The prefix, as the shared watch's key.
    key: WatchKey,
    changes: crate::watch::coalescer::Subscription,
    /// Every source revision through this one is in the target.
    applied: i64,
    /// Source revisions with changes applied.
    followed: usize,
}

impl Follower {
    /// Applies changes until every revision through `through` is applied.
    /// The revisions waiting are merged (each key's last change wins:
    /// the target serves none of them until the switch, so only the end
    /// state matters), then applied as one delete txn and one import.
    async fn follow(
        &mut self,
        state: &ProxyState,
        source: &Cell,
        target: &Cell,
        through: i64,
    ) -> Result<(), ApiError> {
        let deadline = Instant::now() + DRAIN_TIMEOUT;
        while self.applied < through {
            let first =
                match tokio::time::timeout(Duration::from_millis(20), self.changes.recv()).await {
                    Ok(item) => item,
                    Err(_) => {
                        // Quiet: ask where upstream is.
                        if Instant::now() > deadline {
                            return Err(ApiError::timeout().with_message(format!(
                                "the move's follower reached revision {} of {through} in \
                             {DRAIN_TIMEOUT:?}; nothing was switched",
                                self.applied
                            )));
                        }
                        self.coalescer.request_progress().await;
                        continue;
                    }
                };
            let mut last: BTreeMap<Vec<u8>, Option<PbKeyValue>> = BTreeMap::new();
            let mut item = first;
            let mut merged = 0;
            // The subscription closed without a cancel: it fell behind the
            // shared watch's queue (under heavy writes, while it applied).
            let mut closed = false;
            loop {
                match item {
                    Some(Item::Events(revision)) => {
                        for e in revision.events.iter() {
                            let Some(kv) = &e.kv else { continue };
                            let put = (e.r#type != EventType::Delete as i32).then(|| kv.clone());
                            last.insert(kv.key.clone(), put);
                        }
                        self.applied = revision.revision;
                        self.followed += 1;
                    }
                    Some(Item::Progress(revision)) => self.applied = self.applied.max(revision),
                    Some(Item::Cancelled(Cancel::Compacted { compact_revision })) => {
                        return Err(ApiError::compacted(compact_revision).with_message(format!(
                            "the source compacted past revision {} while the move followed \
                             it; nothing was switched",
                            self.applied
                        )))
                    }
                    Some(Item::Cancelled(Cancel::Ended { reason })) => {
                        return Err(ApiError::unavailable(format!(
                            "the move's watch of the source ended: {reason}; nothing was switched"
                        )))
                    }
                    Some(Item::Cancelled(Cancel::Revoked(e))) => return Err(e),
                    None => {
                        closed = true;
                        break;
                    }
                }
                merged += 1;
                if merged >= MERGE {
                    break;
                }
                // What is already here joins this application.
                match self.changes.recv().now_or_never() {
                    Some(next) => item = next,
                    None => break,
                }
            }
            let (deletes, puts): (Vec<_>, Vec<_>) =
                last.into_iter().partition(|(_, kv)| kv.is_none());
            // Deletions go as imports too: the only writes a cell takes
            // under a prefix still arriving.
            let deletes: Vec<Vec<u8>> = deletes.into_iter().map(|(key, _)| key).collect();
            for chunk in deletes.chunks(MAX_TXN_OPS) {
                let import = ImportRequest {
                    kvs: Vec::new(),
                    deletes: chunk.to_vec(),
                };
                let _: ImportResponse =
                    resending(|| target.call(Route::Leader, Kind::Write, IMPORT, import.clone()))
                        .await?;
            }
            import(
                state,
                source,
                target,
                puts.into_iter().filter_map(|(_, kv)| kv).collect(),
            )
            .await?;
            if closed {
                // Everything through `applied` is in the target: go on
                // from the next revision (caught up by a watch of its own
                // if the shared one has moved past it).
                self.changes = self
                    .coalescer
                    .subscribe(self.key.clone(), self.applied + 1)
                    .await?;
            }
        }
        Ok(())
    }
}

/// Most bytes of keys and values in one import.
const IMPORT_BYTES: usize = 1 << 20;

/// Writes `kvs` into `target` with their create revisions, versions and
/// leases (each session extended there first), in imports of at most
/// `MAX_TXN_OPS` keys and about `IMPORT_BYTES`.
async fn import(
    state: &ProxyState,
    source: &Cell,
    target: &Cell,
    kvs: Vec<PbKeyValue>,
) -> Result<(), ApiError> {
    let mut batch: Vec<PbKeyValue> = Vec::new();
    let mut bytes = 0;
    let mut kvs = kvs.into_iter().peekable();
    while let Some(kv) = kvs.next() {
        bytes += kv.key.len() + kv.value.len();
        batch.push(kv);
        let full = batch.len() == MAX_TXN_OPS || bytes >= IMPORT_BYTES;
        if full || kvs.peek().is_none() {
            let mut leases: Vec<i64> = batch
                .iter()
                .map(|kv| kv.lease)
                .filter(|l| *l != 0)
                .collect();
            leases.sort_unstable();
            leases.dedup();
            // A session that ended since its keys were read is not carried
            // (the follower brings their deletion); a lease that is not a
            // session of home (a client of the source's own) cannot be.
            let mut ended = Vec::new();
            for lease in leases {
                match state
                    .extensions
                    .ensure(&state.upstream, target, lease)
                    .await
                {
                    Ok(()) => {}
                    Err(e) if e.code == latchkey_shared::ErrorCode::LeaseNotFound => {
                        if lives_in(source, lease).await? {
                            return Err(ApiError::precondition_failed(format!(
                                "keys under the prefix are bound to lease {:x}, which is the \
                                 source cell's own, not a session of the home cell: a move \
                                 cannot carry them",
                                lease
                            )));
                        }
                        ended.push(lease);
                    }
                    Err(e) => return Err(e),
                }
            }
            batch.retain(|kv| !ended.contains(&kv.lease));
            let import = ImportRequest {
                kvs: std::mem::take(&mut batch),
                deletes: Vec::new(),
            };
            let _: ImportResponse =
                resending(|| target.call(Route::Leader, Kind::Write, IMPORT, import.clone()))
                    .await?;
            bytes = 0;
        }
    }
    Ok(())
}

/// Whether lease `id` lives in `cell`.
async fn lives_in(cell: &Cell, id: i64) -> Result<bool, ApiError> {
    let resp: latchkey_shared::etcdpb::PbLeaseTimeToLiveResponse = cell
        .call(
            Route::Leader,
            Kind::Read,
            latchkey_shared::etcd_methods::lease::TIME_TO_LIVE,
            latchkey_shared::etcdpb::PbLeaseTimeToLiveRequest { id, keys: false },
        )
        .await?;
    Ok(resp.ttl > 0)
}

/// Deletes in `target`, as the proxy, in txns of at most `MAX_TXN_OPS`.
async fn delete(target: &Cell, ops: Vec<PbTxnRequestOp>) -> Result<(), ApiError> {
    for chunk in ops.chunks(MAX_TXN_OPS) {
        let txn = PbTxnRequest {
            compare: vec![],
            success: chunk.to_vec(),
            failure: vec![],
        };
        let _: PbTxnResponse =
            resending(|| target.call(Route::Leader, Kind::Write, TXN, txn.clone())).await?;
    }
    Ok(())
}
