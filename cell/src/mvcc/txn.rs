//! etcd's write operations (Put, DeleteRange, Txn, whose branches may
//! also read with Range, see [`super::range`]) over the keyspace and the
//! lease table.
//!
//! Everything here is deterministic: no clock, no randomness. A write
//! transaction takes one revision, whatever number of keys it changes, and
//! is validated completely before it changes anything, so a failing request
//! leaves no partial write behind. That includes the tenants' quotas: what
//! a write would add to each tenant's use is summed first
//! ([`super::tenants::Deltas`]) and the write refused whole if it takes one
//! past a quota.

use super::keyspace::{KeyRange, KeySpace};
use super::range::{check_range, range, to_pb};
use super::tenants::Deltas;
use super::versions::KvRef;
use crate::mvcc::lease_table::LeaseTable;
use crate::raft::command::Imported;
use latchkey_shared::directory::OWNERSHIP_KEY;
use latchkey_shared::etcd_enums::{compare_holds, CompareResult, CompareTarget, EtcdEnum};
use latchkey_shared::etcdpb::{
    PbCompare, PbDeleteRequest, PbDeleteResponse, PbPutRequest, PbPutResponse, PbResponseOp,
    PbTargetUnion, PbTxnOpRequest, PbTxnOpResponse, PbTxnRequest, PbTxnRequestOp, PbTxnResponse,
};
use latchkey_shared::limits::MAX_TXN_OPS;
use latchkey_shared::{ApiError, ErrorCode, LeaseId};
use std::collections::BTreeSet;

/// The state a KV operation reads and writes.
pub struct Kv<'a> {
    pub keys: &'a mut KeySpace,
    pub leases: &'a mut LeaseTable,
}

/// Checks a put against the current state without changing anything.
fn check_put(kv: &Kv<'_>, req: &PbPutRequest) -> Result<(), ApiError> {
    if req.key.is_empty() {
        return Err(ApiError::key_not_provided());
    }
    if req.ignore_value && !req.value.is_empty() {
        return Err(ApiError::value_provided());
    }
    if req.ignore_lease && req.lease != 0 {
        return Err(ApiError::lease_provided());
    }
    if (req.ignore_value || req.ignore_lease) && kv.keys.get(&req.key).is_none() {
        return Err(ApiError::etcd(ErrorCode::KeyNotFound));
    }
    kv.keys.check_owned_write(&req.key, &[])?;
    if req.lease != 0 && !kv.leases.contains(req.lease) {
        return Err(ApiError::lease_not_found(LeaseId(req.lease)));
    }
    Ok(())
}

fn check_delete(kv: &Kv<'_>, req: &PbDeleteRequest) -> Result<(), ApiError> {
    if req.key.is_empty() {
        return Err(ApiError::key_not_provided());
    }
    kv.keys.check_owned_write(&req.key, &req.range_end)
}

/// `wrong_cell` unless this cell owns every key a txn names: its compares
/// and every operation of both branches, nested ones too, whichever runs.
fn check_txn_owned(keys: &KeySpace, req: &PbTxnRequest) -> Result<(), ApiError> {
    if keys.ownership().is_none() {
        return Ok(());
    }
    for c in &req.compare {
        keys.check_owned(&c.key, &c.range_end)?;
    }
    for op in req.success.iter().chain(&req.failure) {
        match &op.request {
            Some(PbTxnOpRequest::RequestPut(p)) => keys.check_owned_write(&p.key, &[])?,
            Some(PbTxnOpRequest::RequestDeleteRange(d)) => {
                keys.check_owned_write(&d.key, &d.range_end)?
            }
            Some(PbTxnOpRequest::RequestRange(r)) => keys.check_owned(&r.key, &r.range_end)?,
            Some(PbTxnOpRequest::RequestTxn(t)) => check_txn_owned(keys, t)?,
            None => {}
        }
    }
    Ok(())
}

fn do_put(kv: &mut Kv<'_>, rev: i64, req: &PbPutRequest) -> PbPutResponse {
    // Borrowed: only what the put keeps of the current value is copied.
    let current = kv.keys.get(&req.key);
    let value = match (current, req.ignore_value) {
        (Some(c), true) => c.value.to_vec(),
        _ => req.value.clone(),
    };
    let lease = match (current, req.ignore_lease) {
        (Some(c), true) => c.lease,
        _ => req.lease,
    };
    let prev = kv.keys.put(rev, &req.key, value, lease);
    if let Some(p) = &prev {
        if p.lease != 0 && p.lease != lease {
            kv.leases.detach(p.lease, &req.key);
        }
    }
    if lease != 0 {
        kv.leases.attach(lease, &req.key);
    }
    if req.key == OWNERSHIP_KEY {
        drop_given_away(kv, rev);
    }
    PbPutResponse {
        header: None,
        prev_kv: if req.prev_kv {
            prev.as_ref().map(|p| to_pb(p, false))
        } else {
            None
        },
    }
}

fn do_delete(kv: &mut Kv<'_>, rev: i64, req: &PbDeleteRequest) -> PbDeleteResponse {
    let range = KeyRange::new(req.key.clone(), req.range_end.clone());
    let victims = kv.keys.live_keys_in(&range);
    let mut prev_kvs = Vec::new();
    for victim in &victims {
        kv.keys.delete(rev, &victim.key);
        if victim.lease != 0 {
            kv.leases.detach(victim.lease, &victim.key);
        }
        if req.prev_kv {
            prev_kvs.push(to_pb(victim, false));
        }
    }
    PbDeleteResponse {
        header: None,
        deleted: victims.len() as i64,
        prev_kvs,
    }
}

/// Writes keys a move brings in (`Request::Import`) at one new revision,
/// each with the create revision and version it had in its cell, or
/// deletes those it says were deleted there: refused whole if one is not
/// this cell's (arriving keys are) or names a lease it does not have.
pub fn import(kv: &mut Kv<'_>, keys: &[Imported]) -> Result<(), ApiError> {
    for k in keys {
        if k.key.is_empty() {
            return Err(ApiError::key_not_provided());
        }
        kv.keys.check_owned_import(&k.key)?;
        if !k.deleted && k.lease != 0 && !kv.leases.contains(k.lease) {
            return Err(ApiError::lease_not_found(LeaseId(k.lease)));
        }
    }
    let rev = kv.keys.next_revision();
    for k in keys {
        if k.deleted {
            if let Some(gone) = kv.keys.delete(rev, &k.key).filter(|g| g.lease != 0) {
                kv.leases.detach(gone.lease, &k.key);
            }
            continue;
        }
        let prev = kv.keys.import(
            rev,
            &k.key,
            k.value.clone(),
            k.lease,
            (k.create_revision, k.version),
        );
        if let Some(p) = prev.filter(|p| p.lease != 0 && p.lease != k.lease) {
            kv.leases.detach(p.lease, &k.key);
        }
        if k.lease != 0 {
            kv.leases.attach(k.lease, &k.key);
        }
    }
    Ok(())
}

/// Deletes, at `rev` and telling no watcher, every key under the prefixes
/// the cell's new ownership record says it gave away (a move's source,
/// once the target holds them): watchers of those prefixes here are
/// cancelled as the cell stops owning them, and must not read the keys'
/// departure as deletes.
fn drop_given_away(kv: &mut Kv<'_>, rev: i64) {
    let dropped = kv
        .keys
        .ownership()
        .map(|o| o.dropped.clone())
        .unwrap_or_default();
    for prefix in dropped {
        for victim in kv.keys.drop_prefix(rev, &prefix) {
            if victim.lease != 0 {
                kv.leases.detach(victim.lease, &victim.key);
            }
        }
    }
}

/// Deletes every key in `keys` at one new revision (lease revoke and
/// expiry). Returns whether anything was deleted.
pub fn delete_keys(kv: &mut Kv<'_>, keys: impl IntoIterator<Item = Vec<u8>>) -> bool {
    let rev = kv.keys.next_revision();
    let mut any = false;
    for key in keys {
        any |= kv.keys.delete(rev, &key).is_some();
    }
    any
}

/// What a put changes in its tenant's use.
fn put_deltas(keys: &KeySpace, req: &PbPutRequest, deltas: &mut Deltas) {
    let old_len = keys.get(&req.key).map(|kv| kv.value.len());
    let new_len = if req.ignore_value {
        old_len.unwrap_or(0)
    } else {
        req.value.len()
    };
    deltas.put(keys.tenants(), &req.key, old_len, new_len);
}

/// What a delete changes in its tenants' use.
fn delete_deltas(keys: &KeySpace, req: &PbDeleteRequest, deltas: &mut Deltas) {
    let range = KeyRange::new(req.key.clone(), req.range_end.clone());
    keys.scan(&range, keys.revision(), |kv| {
        deltas.delete(keys.tenants(), kv.key, kv.value.len());
        true
    });
}

/// What the chosen path of a txn changes in tenants' use. No key is
/// written twice on one path (`branch_writes`), so each write is counted
/// against the state before the txn.
fn path_deltas(keys: &KeySpace, req: &PbTxnRequest, path: &TxnPath, deltas: &mut Deltas) {
    let branch = if path.succeeded {
        &req.success
    } else {
        &req.failure
    };
    let mut nested = path.nested.iter();
    for op in branch {
        match &op.request {
            Some(PbTxnOpRequest::RequestPut(p)) => put_deltas(keys, p, deltas),
            Some(PbTxnOpRequest::RequestDeleteRange(d)) => delete_deltas(keys, d, deltas),
            Some(PbTxnOpRequest::RequestTxn(t)) => {
                if let Some(p) = nested.next() {
                    path_deltas(keys, t, p, deltas);
                }
            }
            Some(PbTxnOpRequest::RequestRange(_)) | None => {}
        }
    }
}

pub fn put(kv: &mut Kv<'_>, req: &PbPutRequest) -> Result<PbPutResponse, ApiError> {
    check_put(kv, req)?;
    if !kv.keys.tenants().is_empty() {
        let mut deltas = Deltas::default();
        put_deltas(kv.keys, req, &mut deltas);
        kv.keys.tenants().check(&deltas)?;
    }
    let rev = kv.keys.next_revision();
    Ok(do_put(kv, rev, req))
}

pub fn delete_range(kv: &mut Kv<'_>, req: &PbDeleteRequest) -> Result<PbDeleteResponse, ApiError> {
    check_delete(kv, req)?;
    let rev = kv.keys.next_revision();
    Ok(do_delete(kv, rev, req))
}

/// Evaluates one compare against the current state, with etcd's rules: a
/// compare over a range holds only if it holds for every key in it, and a
/// value compare on a missing key always fails.
fn compare(keys: &KeySpace, c: &PbCompare) -> bool {
    let range = KeyRange::new(c.key.clone(), c.range_end.clone());
    // Borrowed, not cloned, and the scan stops at the first key that fails
    // (cell review P4: every value of the range was copied before).
    let (mut any, mut holds) = (false, true);
    keys.scan(&range, keys.revision(), |kv| {
        any = true;
        holds = compare_kv(c, kv);
        holds
    });
    if any {
        return holds;
    }
    if matches!(c.target_union, Some(PbTargetUnion::Value(_))) {
        return false;
    }
    let absent = KvRef {
        key: &c.key,
        value: &[],
        create_revision: 0,
        mod_revision: 0,
        version: 0,
        lease: 0,
    };
    compare_kv(c, absent)
}

fn compare_kv(c: &PbCompare, kv: KvRef<'_>) -> bool {
    use std::cmp::Ordering;
    let ord: Ordering = match &c.target_union {
        Some(PbTargetUnion::Version(v)) => kv.version.cmp(v),
        Some(PbTargetUnion::CreateRevision(v)) => kv.create_revision.cmp(v),
        Some(PbTargetUnion::ModRevision(v)) => kv.mod_revision.cmp(v),
        Some(PbTargetUnion::Value(v)) => kv.value.cmp(v.as_slice()),
        Some(PbTargetUnion::Lease(v)) => kv.lease.cmp(v),
        None => return false,
    };
    // The shape check refused unknown results before any compare runs.
    CompareResult::decode(c.result).is_ok_and(|result| compare_holds(result, ord))
}

/// The branch taken at every level of a (nested) txn, decided against the
/// state before the txn, as etcd does.
struct TxnPath {
    succeeded: bool,
    nested: Vec<TxnPath>,
}

fn decide(keys: &KeySpace, req: &PbTxnRequest) -> TxnPath {
    let succeeded = req.compare.iter().all(|c| compare(keys, c));
    let branch = if succeeded {
        &req.success
    } else {
        &req.failure
    };
    let nested = branch
        .iter()
        .filter_map(|op| match &op.request {
            Some(PbTxnOpRequest::RequestTxn(t)) => Some(decide(keys, t)),
            _ => None,
        })
        .collect();
    TxnPath { succeeded, nested }
}

/// Static checks of a txn: sizes, compares, and no key written twice on
/// one branch (etcd's "duplicate key given in txn request").
fn check_txn_shape(req: &PbTxnRequest) -> Result<(), ApiError> {
    if req.compare.len() > MAX_TXN_OPS
        || req.success.len() > MAX_TXN_OPS
        || req.failure.len() > MAX_TXN_OPS
    {
        return Err(ApiError::too_many_txn_ops());
    }
    for c in &req.compare {
        if c.key.is_empty() {
            return Err(ApiError::key_not_provided());
        }
        CompareResult::decode(c.result)?;
        CompareTarget::decode(c.target)?;
        if c.target_union.is_none() {
            return Err(ApiError::invalid("compare has no target value"));
        }
    }
    for branch in [&req.success, &req.failure] {
        for op in branch {
            match &op.request {
                Some(PbTxnOpRequest::RequestTxn(t)) => check_txn_shape(t)?,
                None => return Err(ApiError::invalid("txn operation without a request")),
                Some(_) => {}
            }
        }
        branch_writes(branch)?;
    }
    Ok(())
}

/// The keys a branch puts and the ranges it deletes, nested txns included,
/// or `duplicate_key` if running it could write one key twice at one
/// revision (two puts of a key, or a put of a key a delete covers), which
/// etcd refuses too. The two branches of a nested txn exclude each other,
/// so they may put the same key.
fn branch_writes(ops: &[PbTxnRequestOp]) -> Result<(BTreeSet<Vec<u8>>, Vec<KeyRange>), ApiError> {
    let mut deletes: Vec<KeyRange> = ops
        .iter()
        .filter_map(|op| match &op.request {
            Some(PbTxnOpRequest::RequestDeleteRange(d)) => {
                Some(KeyRange::new(d.key.clone(), d.range_end.clone()))
            }
            _ => None,
        })
        .collect();
    let mut puts = BTreeSet::new();
    let deleted = |deletes: &[KeyRange], key: &[u8]| deletes.iter().any(|d| d.contains(key));
    for op in ops {
        let Some(PbTxnOpRequest::RequestTxn(t)) = &op.request else {
            continue;
        };
        let (then_puts, then_deletes) = branch_writes(&t.success)?;
        let (else_puts, else_deletes) = branch_writes(&t.failure)?;
        for key in &then_puts {
            if puts.contains(key) || deleted(&deletes, key) {
                return Err(ApiError::duplicate_key());
            }
        }
        for key in &else_puts {
            if (puts.contains(key) && !then_puts.contains(key)) || deleted(&deletes, key) {
                return Err(ApiError::duplicate_key());
            }
        }
        puts.extend(then_puts);
        puts.extend(else_puts);
        deletes.extend(then_deletes);
        deletes.extend(else_deletes);
    }
    for op in ops {
        if let Some(PbTxnOpRequest::RequestPut(p)) = &op.request {
            if deleted(&deletes, &p.key) || !puts.insert(p.key.clone()) {
                return Err(ApiError::duplicate_key());
            }
        }
    }
    Ok((puts, deletes))
}

/// Checks every operation on the chosen path against the current state.
fn check_path(kv: &Kv<'_>, req: &PbTxnRequest, path: &TxnPath) -> Result<(), ApiError> {
    let branch = if path.succeeded {
        &req.success
    } else {
        &req.failure
    };
    let mut nested = path.nested.iter();
    for op in branch {
        match &op.request {
            Some(PbTxnOpRequest::RequestPut(p)) => check_put(kv, p)?,
            Some(PbTxnOpRequest::RequestDeleteRange(d)) => check_delete(kv, d)?,
            Some(PbTxnOpRequest::RequestRange(r)) => {
                check_range(kv.keys, r)?;
            }
            Some(PbTxnOpRequest::RequestTxn(t)) => {
                let p = nested
                    .next()
                    .ok_or_else(|| ApiError::internal("txn path out of step"))?;
                check_path(kv, t, p)?;
            }
            None => return Err(ApiError::invalid("txn operation without a request")),
        }
    }
    Ok(())
}

fn run_path(
    kv: &mut Kv<'_>,
    rev: i64,
    req: &PbTxnRequest,
    path: &TxnPath,
) -> Result<PbTxnResponse, ApiError> {
    let branch = if path.succeeded {
        &req.success
    } else {
        &req.failure
    };
    let mut nested = path.nested.iter();
    let mut responses = Vec::with_capacity(branch.len());
    for op in branch {
        let response = match &op.request {
            Some(PbTxnOpRequest::RequestRange(r)) => {
                PbTxnOpResponse::ResponseRange(range(kv.keys, r)?)
            }
            Some(PbTxnOpRequest::RequestPut(p)) => PbTxnOpResponse::ResponsePut(do_put(kv, rev, p)),
            Some(PbTxnOpRequest::RequestDeleteRange(d)) => {
                PbTxnOpResponse::ResponseDeleteRange(do_delete(kv, rev, d))
            }
            Some(PbTxnOpRequest::RequestTxn(t)) => {
                let p = nested
                    .next()
                    .ok_or_else(|| ApiError::internal("txn path out of step"))?;
                PbTxnOpResponse::ResponseTxn(run_path(kv, rev, t, p)?)
            }
            None => return Err(ApiError::invalid("txn operation without a request")),
        };
        responses.push(PbResponseOp {
            response: Some(response),
        });
    }
    Ok(PbTxnResponse {
        header: None,
        succeeded: path.succeeded,
        responses,
    })
}

/// A Txn: compares decide the branch, then the branch runs at one revision.
pub fn txn(kv: &mut Kv<'_>, req: &PbTxnRequest) -> Result<PbTxnResponse, ApiError> {
    check_txn_shape(req)?;
    let path = decide(kv.keys, req);
    run_decided(kv, req, &path)
}

/// [`txn`], when the branches it takes write nothing (`None` otherwise):
/// decided once, so a read-only answer costs one pass over the compares.
pub fn txn_if_read_only(
    kv: &mut Kv<'_>,
    req: &PbTxnRequest,
) -> Result<Option<PbTxnResponse>, ApiError> {
    let path = decide(kv.keys, req);
    if path_writes(req, &path) {
        return Ok(None);
    }
    check_txn_shape(req)?;
    run_decided(kv, req, &path).map(Some)
}

/// Checks the chosen branches, then runs them at one new revision.
fn run_decided(
    kv: &mut Kv<'_>,
    req: &PbTxnRequest,
    path: &TxnPath,
) -> Result<PbTxnResponse, ApiError> {
    check_txn_owned(kv.keys, req)?;
    check_path(kv, req, path)?;
    if !kv.keys.tenants().is_empty() {
        let mut deltas = Deltas::default();
        path_deltas(kv.keys, req, path, &mut deltas);
        kv.keys.tenants().check(&deltas)?;
    }
    let rev = kv.keys.next_revision();
    run_path(kv, rev, req, path)
}

/// Whether a txn request can write (then it must go through Raft).
pub fn txn_writes(req: &PbTxnRequest) -> bool {
    req.success
        .iter()
        .chain(req.failure.iter())
        .any(|op| match &op.request {
            Some(PbTxnOpRequest::RequestPut(_)) | Some(PbTxnOpRequest::RequestDeleteRange(_)) => {
                true
            }
            Some(PbTxnOpRequest::RequestTxn(t)) => txn_writes(t),
            _ => false,
        })
}

/// Whether the branches `req` takes on `keys`, at every level, write. A
/// txn that can write but takes only reading branches (a compare-and-swap
/// that lost) changes nothing: it can be answered as a read.
pub fn txn_path_writes(keys: &KeySpace, req: &PbTxnRequest) -> bool {
    path_writes(req, &decide(keys, req))
}

fn path_writes(req: &PbTxnRequest, path: &TxnPath) -> bool {
    let branch = if path.succeeded {
        &req.success
    } else {
        &req.failure
    };
    let mut nested = path.nested.iter();
    branch.iter().any(|op| match &op.request {
        Some(PbTxnOpRequest::RequestPut(_)) | Some(PbTxnOpRequest::RequestDeleteRange(_)) => true,
        Some(PbTxnOpRequest::RequestTxn(t)) => nested.next().is_some_and(|p| path_writes(t, p)),
        _ => false,
    })
}

/// Bytes a txn may add to the keyspace, for the quota check.
pub fn txn_put_bytes(req: &PbTxnRequest) -> u64 {
    req.success
        .iter()
        .chain(req.failure.iter())
        .map(|op| match &op.request {
            Some(PbTxnOpRequest::RequestPut(p)) => (p.key.len() + p.value.len()) as u64,
            Some(PbTxnOpRequest::RequestTxn(t)) => txn_put_bytes(t),
            _ => 0,
        })
        .sum()
}

/// Largest value a txn puts, for the value size limit.
pub fn txn_max_value(req: &PbTxnRequest) -> usize {
    req.success
        .iter()
        .chain(req.failure.iter())
        .map(|op| match &op.request {
            Some(PbTxnOpRequest::RequestPut(p)) => p.value.len(),
            Some(PbTxnOpRequest::RequestTxn(t)) => txn_max_value(t),
            _ => 0,
        })
        .max()
        .unwrap_or(0)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use latchkey_shared::etcdpb::PbRangeRequest;
    use latchkey_shared::etcdpb::PbTxnRequestOp;

    pub(crate) fn put_req(key: &str, value: &str) -> PbPutRequest {
        PbPutRequest {
            key: key.into(),
            value: value.into(),
            ..Default::default()
        }
    }

    fn op_put(key: &str, value: &str) -> PbTxnRequestOp {
        PbTxnRequestOp {
            request: Some(PbTxnOpRequest::RequestPut(put_req(key, value))),
        }
    }

    fn cmp_value(key: &str, value: &str) -> PbCompare {
        PbCompare {
            result: CompareResult::Equal as i32,
            target: CompareTarget::Value as i32,
            key: key.into(),
            range_end: vec![],
            target_union: Some(PbTargetUnion::Value(value.into())),
        }
    }

    #[test]
    fn txn_takes_one_revision_and_the_else_branch_when_compare_fails() {
        let (mut keys, mut leases) = (KeySpace::default(), LeaseTable::default());
        let mut kv = Kv {
            keys: &mut keys,
            leases: &mut leases,
        };
        put(&mut kv, &put_req("a", "1")).expect("put");
        let req = PbTxnRequest {
            compare: vec![cmp_value("a", "2")],
            success: vec![op_put("b", "then")],
            failure: vec![op_put("b", "else"), op_put("c", "else")],
        };
        let resp = txn(&mut kv, &req).expect("txn");
        assert!(!resp.succeeded);
        // An empty keyspace is at revision 1; the put made 2, the txn 3.
        assert_eq!(kv.keys.revision(), 3);
        assert_eq!(
            kv.keys.get(b"b").map(|k| k.value.to_vec()),
            Some(b"else".to_vec())
        );
        assert_eq!(kv.keys.get(b"c").map(|k| k.mod_revision), Some(3));
    }

    /// latchkey's own records (audit, lock-delay markers, idempotency) are
    /// invisible to a client's "every key" range, delete and watch, and
    /// seen by a range that names them.
    #[test]
    fn reserved_keys_are_not_listed_deleted_or_watched_by_ranges_over_everything() {
        use latchkey_shared::etcdpb::PbRangeRequest;
        let (mut keys, mut leases) = (KeySpace::default(), LeaseTable::default());
        let mut kv = Kv {
            keys: &mut keys,
            leases: &mut leases,
        };
        let audit = "\0latchkey/audit/1";
        put(&mut kv, &put_req(audit, "who and why")).expect("put");
        put(&mut kv, &put_req("a", "1")).expect("put");
        let everything = |key: &str| PbRangeRequest {
            key: key.into(),
            range_end: vec![0],
            ..Default::default()
        };
        let listed = crate::mvcc::range::range(kv.keys, &everything("\0")).expect("range");
        assert_eq!(listed.count, 1);
        assert_eq!(listed.kvs[0].key, b"a");
        let deleted = delete_range(
            &mut kv,
            &PbDeleteRequest {
                key: vec![0],
                range_end: vec![0],
                ..Default::default()
            },
        )
        .expect("delete");
        assert_eq!(deleted.deleted, 1);
        let watched = kv.keys.history(&KeyRange::new(vec![0], vec![0]), 1, 10);
        assert!(watched.iter().all(|e| e.kv.key == b"a"), "{watched:?}");
        let named = crate::mvcc::range::range(kv.keys, &everything(audit)).expect("range");
        assert_eq!(named.kvs.len(), 1);
        assert_eq!(named.kvs[0].value, b"who and why");
    }

    /// A lost compare-and-swap is answered as a read (no log entry) only
    /// when every branch it takes, nested ones included, only reads.
    #[test]
    fn a_txn_writes_only_on_the_branches_it_takes() {
        let (mut keys, mut leases) = (KeySpace::default(), LeaseTable::default());
        let mut kv = Kv {
            keys: &mut keys,
            leases: &mut leases,
        };
        put(&mut kv, &put_req("a", "1")).expect("put");
        let get_a = PbTxnRequestOp {
            request: Some(PbTxnOpRequest::RequestRange(PbRangeRequest {
                key: b"a".to_vec(),
                ..Default::default()
            })),
        };
        let cas = |expect: &str, failure: Vec<PbTxnRequestOp>| PbTxnRequest {
            compare: vec![cmp_value("a", expect)],
            success: vec![op_put("a", "2")],
            failure,
        };
        let nested = |req: PbTxnRequest| PbTxnRequestOp {
            request: Some(PbTxnOpRequest::RequestTxn(req)),
        };
        assert!(txn_path_writes(kv.keys, &cas("1", vec![get_a.clone()])));
        assert!(!txn_path_writes(kv.keys, &cas("0", vec![get_a.clone()])));
        assert!(!txn_path_writes(kv.keys, &cas("0", vec![])));
        // A nested txn on the taken branch: what it takes decides.
        let inner_writes = cas("1", vec![]);
        let inner_reads = cas("0", vec![get_a.clone()]);
        assert!(txn_path_writes(
            kv.keys,
            &cas("0", vec![get_a.clone(), nested(inner_writes)])
        ));
        assert!(!txn_path_writes(
            kv.keys,
            &cas("0", vec![nested(inner_reads), get_a])
        ));
        assert!(txn_path_writes(kv.keys, &cas("0", vec![op_put("b", "x")])));
    }

    #[test]
    fn a_failing_txn_writes_nothing() {
        let (mut keys, mut leases) = (KeySpace::default(), LeaseTable::default());
        let mut kv = Kv {
            keys: &mut keys,
            leases: &mut leases,
        };
        let mut leased = put_req("b", "x");
        leased.lease = 42;
        let req = PbTxnRequest {
            compare: vec![],
            success: vec![
                op_put("a", "1"),
                PbTxnRequestOp {
                    request: Some(PbTxnOpRequest::RequestPut(leased)),
                },
            ],
            failure: vec![],
        };
        let revision = kv.keys.revision();
        let err = txn(&mut kv, &req).unwrap_err();
        assert_eq!(err.code, ErrorCode::LeaseNotFound);
        assert_eq!(kv.keys.revision(), revision);
        assert!(kv.keys.get(b"a").is_none());
    }

    #[test]
    fn duplicate_keys_in_one_branch_are_rejected() {
        let (mut keys, mut leases) = (KeySpace::default(), LeaseTable::default());
        let mut kv = Kv {
            keys: &mut keys,
            leases: &mut leases,
        };
        let req = PbTxnRequest {
            compare: vec![],
            success: vec![op_put("a", "1"), op_put("a", "2")],
            failure: vec![],
        };
        assert_eq!(txn(&mut kv, &req).unwrap_err(), ApiError::duplicate_key());
    }

    #[test]
    fn value_compare_on_a_missing_key_fails_but_version_zero_holds() {
        let keys = KeySpace::default();
        assert!(!compare(&keys, &cmp_value("nope", "")));
        let version_zero = PbCompare {
            result: CompareResult::Equal as i32,
            target: CompareTarget::Version as i32,
            key: b"nope".to_vec(),
            range_end: vec![],
            target_union: Some(PbTargetUnion::Version(0)),
        };
        assert!(compare(&keys, &version_zero));
    }

    fn op_range(req: PbRangeRequest) -> PbTxnRequestOp {
        PbTxnRequestOp {
            request: Some(PbTxnOpRequest::RequestRange(req)),
        }
    }

    /// S3 (cell review): a txn whose range fails after a put of the same
    /// txn used to commit the put and answer an error.
    #[test]
    fn s3_a_txn_whose_range_is_invalid_writes_nothing() {
        let (mut keys, mut leases) = (KeySpace::default(), LeaseTable::default());
        let mut kv = Kv {
            keys: &mut keys,
            leases: &mut leases,
        };
        let revision = kv.keys.revision();
        let bad_sort = PbTxnRequest {
            compare: vec![],
            success: vec![
                op_put("k", "v"),
                op_range(PbRangeRequest {
                    key: b"a".to_vec(),
                    sort_target: 99,
                    ..Default::default()
                }),
            ],
            failure: vec![],
        };
        assert_eq!(
            txn(&mut kv, &bad_sort).unwrap_err().code,
            ErrorCode::InvalidArgument
        );
        assert!(kv.keys.get(b"k").is_none(), "the put was not made");
        assert_eq!(kv.keys.revision(), revision);
        assert!(kv.keys.take_changes().is_empty(), "nothing to publish");

        // etcd reads a negative limit as no limit: the same txn with one
        // succeeds whole.
        let negative_limit = PbTxnRequest {
            compare: vec![],
            success: vec![
                op_put("k", "v"),
                op_range(PbRangeRequest {
                    key: b"k".to_vec(),
                    limit: -1,
                    ..Default::default()
                }),
            ],
            failure: vec![],
        };
        txn(&mut kv, &negative_limit).expect("a negative limit is no limit");
        assert!(kv.keys.get(b"k").is_some());
        assert_eq!(kv.keys.revision(), revision + 1);
    }

    fn op_txn(success: Vec<PbTxnRequestOp>, failure: Vec<PbTxnRequestOp>) -> PbTxnRequestOp {
        PbTxnRequestOp {
            request: Some(PbTxnOpRequest::RequestTxn(PbTxnRequest {
                compare: vec![],
                success,
                failure,
            })),
        }
    }

    /// M2 (cell review): a key put at the top and again in a nested txn,
    /// or in two nested txns, was written twice at one revision; etcd
    /// refuses both. The two branches of one nested txn may share a key.
    #[test]
    fn m2_nested_txns_may_not_put_one_key_twice() {
        let (mut keys, mut leases) = (KeySpace::default(), LeaseTable::default());
        let mut kv = Kv {
            keys: &mut keys,
            leases: &mut leases,
        };
        let refused = [
            vec![op_put("k", "1"), op_txn(vec![op_put("k", "2")], vec![])],
            vec![
                op_txn(vec![op_put("k", "1")], vec![]),
                op_txn(vec![], vec![op_put("k", "2")]),
            ],
        ];
        for success in refused {
            let req = PbTxnRequest {
                compare: vec![],
                success,
                failure: vec![],
            };
            assert_eq!(txn(&mut kv, &req).unwrap_err(), ApiError::duplicate_key());
        }
        assert!(kv.keys.get(b"k").is_none());
        let either_branch = PbTxnRequest {
            compare: vec![],
            success: vec![op_txn(vec![op_put("k", "then")], vec![op_put("k", "else")])],
            failure: vec![],
        };
        txn(&mut kv, &either_branch).expect("then and else exclude each other");
        assert_eq!(
            kv.keys.get(b"k").map(|v| v.value.to_vec()),
            Some(b"then".to_vec())
        );
    }

    /// A tenant's quota refuses the write that would pass it, whole (no
    /// revision taken, nothing written), counts what a txn deletes against
    /// what it adds, and what the keyspace counts survives a snapshot.
    #[test]
    fn a_tenants_quota_refuses_the_whole_write_that_would_pass_it() {
        use latchkey_shared::tenant::{record_key, TenantRecord};
        use latchkey_shared::ErrorCode;
        let (mut keys, mut leases) = (KeySpace::default(), LeaseTable::default());
        let mut kv = Kv {
            keys: &mut keys,
            leases: &mut leases,
        };
        put(&mut kv, &put_req("a/1", "x")).expect("a key before the tenant");
        let acme = TenantRecord {
            name: "acme".into(),
            prefixes: vec![b"a/".to_vec()],
            max_keys: 2,
            max_bytes: 0,
            ..TenantRecord::default()
        };
        let record = String::from_utf8(record_key("acme")).unwrap();
        let value = String::from_utf8(acme.encode()).unwrap();
        put(&mut kv, &put_req(&record, &value)).expect("the record");
        let usage = |kv: &Kv<'_>| kv.keys.tenants().get("acme").map(|o| o.usage.keys);
        assert_eq!(usage(&kv), Some(1), "counted when the record came");
        put(&mut kv, &put_req("a/2", "x")).expect("the second key");
        put(&mut kv, &put_req("a/2", "y")).expect("replacing one");
        put(&mut kv, &put_req("b/1", "x")).expect("no one's key");
        let revision = kv.keys.revision();
        let e = put(&mut kv, &put_req("a/3", "x")).expect_err("a third key");
        assert_eq!(e.code, ErrorCode::QuotaExceeded);
        let three = PbTxnRequest {
            compare: vec![],
            success: vec![op_put("c", "1"), op_put("a/3", "x")],
            failure: vec![],
        };
        let e = txn(&mut kv, &three).expect_err("a txn adding a third key");
        assert_eq!(e.code, ErrorCode::QuotaExceeded);
        assert_eq!(kv.keys.revision(), revision, "nothing written");
        assert!(kv.keys.get(b"c").is_none());
        let swap = PbTxnRequest {
            compare: vec![],
            success: vec![
                PbTxnRequestOp {
                    request: Some(PbTxnOpRequest::RequestDeleteRange(PbDeleteRequest {
                        key: b"a/1".to_vec(),
                        ..Default::default()
                    })),
                },
                op_put("a/3", "x"),
            ],
            failure: vec![],
        };
        txn(&mut kv, &swap).expect("one out, one in");
        assert_eq!(usage(&kv), Some(2));
        let restored = KeySpace::from_image(kv.keys.image());
        assert_eq!(
            restored.tenants().get("acme").map(|o| o.usage),
            kv.keys.tenants().get("acme").map(|o| o.usage)
        );
        // Without its record the tenant is gone, and so is its quota.
        delete_range(
            &mut kv,
            &PbDeleteRequest {
                key: record_key("acme"),
                ..Default::default()
            },
        )
        .expect("delete the record");
        assert!(kv.keys.tenants().is_empty());
        put(&mut kv, &put_req("a/4", "x")).expect("no quota now");
    }

    /// Puts `record` as the cell's ownership record.
    fn write_record(kv: &mut Kv<'_>, record: &latchkey_shared::directory::Ownership) {
        use latchkey_shared::directory::OWNERSHIP_KEY;
        let record_key = String::from_utf8(OWNERSHIP_KEY.to_vec()).unwrap();
        put(
            kv,
            &put_req(&record_key, std::str::from_utf8(&record.encode()).unwrap()),
        )
        .expect("the record");
    }

    /// A cell with an ownership record refuses every write, read and txn
    /// that names a key it does not own, whole and before any revision is
    /// taken, and owns everything again once the record is deleted.
    #[test]
    fn a_cell_refuses_keys_its_ownership_record_does_not_give_it() {
        use latchkey_shared::directory::{Ownership, OWNERSHIP_KEY};
        use latchkey_shared::ErrorCode;
        let (mut keys, mut leases) = (KeySpace::default(), LeaseTable::default());
        let mut kv = Kv {
            keys: &mut keys,
            leases: &mut leases,
        };
        let record = Ownership {
            version: 2,
            rest: false,
            prefixes: vec![b"jobs/".to_vec(), b"queue/".to_vec()],
            leaving: vec![b"queue/".to_vec()],
            arriving: vec![],
            dropped: vec![],
            floors: vec![(b"jobs/".to_vec(), 1)],
        };
        write_record(&mut kv, &record);
        put(&mut kv, &put_req("jobs/1", "x")).expect("an owned key");
        let revision = kv.keys.revision();
        let wrong = |r: Result<(), ApiError>, what: &str| {
            assert_eq!(r.unwrap_err().code, ErrorCode::WrongCell, "{what}");
        };
        wrong(put(&mut kv, &put_req("config", "x")).map(drop), "put");
        let delete = PbDeleteRequest {
            key: b"jobs/".to_vec(),
            range_end: b"k".to_vec(),
            ..Default::default()
        };
        wrong(
            delete_range(&mut kv, &delete).map(drop),
            "delete past the prefix",
        );
        let read = PbRangeRequest {
            key: b"a".to_vec(),
            range_end: b"z".to_vec(),
            ..Default::default()
        };
        wrong(crate::mvcc::range::range(kv.keys, &read).map(drop), "range");
        let compare_elsewhere = PbTxnRequest {
            compare: vec![cmp_value("config", "x")],
            success: vec![op_put("jobs/2", "x")],
            failure: vec![],
        };
        wrong(txn(&mut kv, &compare_elsewhere).map(drop), "txn compare");
        let other_branch = PbTxnRequest {
            compare: vec![],
            success: vec![op_put("jobs/2", "x")],
            failure: vec![op_put("config", "x")],
        };
        wrong(
            txn(&mut kv, &other_branch).map(drop),
            "txn branch not taken",
        );
        let nested = PbTxnRequest {
            compare: vec![],
            success: vec![op_txn(vec![op_range(read.clone())], vec![])],
            failure: vec![],
        };
        wrong(txn(&mut kv, &nested).map(drop), "nested range");
        wrong(
            put(&mut kv, &put_req("queue/1", "x")).map(drop),
            "a leaving prefix",
        );
        let leaving = PbRangeRequest {
            key: b"queue/".to_vec(),
            range_end: b"queue0".to_vec(),
            ..Default::default()
        };
        crate::mvcc::range::range(kv.keys, &leaving).expect("a leaving prefix is read");
        let before_the_move = PbRangeRequest {
            key: b"jobs/".to_vec(),
            range_end: b"jobs0".to_vec(),
            revision: 1,
            ..Default::default()
        };
        let e = crate::mvcc::range::range(kv.keys, &before_the_move).unwrap_err();
        assert_eq!(e.code, ErrorCode::Compacted, "a revision of the old cell");
        assert_eq!(kv.keys.revision(), revision, "nothing was applied");
        assert!(kv.keys.get(b"config").is_none());
        delete_range(
            &mut kv,
            &PbDeleteRequest {
                key: OWNERSHIP_KEY.to_vec(),
                ..Default::default()
            },
        )
        .expect("delete the record");
        put(&mut kv, &put_req("config", "x")).expect("every key is owned again");
    }

    /// A move's target: while the prefix is arriving, the cell takes writes
    /// under it as imports only (keys with their origin, and deletions);
    /// any other write is refused where it is applied, whoever sent it.
    #[test]
    fn an_arriving_prefix_takes_imports_and_no_other_write() {
        use crate::raft::command::Imported;
        use latchkey_shared::directory::Ownership;
        use latchkey_shared::ErrorCode;
        let (mut keys, mut leases) = (KeySpace::default(), LeaseTable::default());
        let mut kv = Kv {
            keys: &mut keys,
            leases: &mut leases,
        };
        let record = Ownership {
            version: 4,
            rest: false,
            prefixes: vec![b"jobs/".to_vec()],
            leaving: vec![],
            arriving: vec![b"jobs/".to_vec()],
            dropped: vec![],
            floors: vec![],
        };
        write_record(&mut kv, &record);
        let e = put(&mut kv, &put_req("jobs/1", "x")).unwrap_err();
        assert_eq!(
            e.code,
            ErrorCode::WrongCell,
            "a put under an arriving prefix"
        );
        let imported = |key: &str, deleted: bool| Imported {
            key: key.as_bytes().to_vec(),
            value: b"copied".to_vec(),
            lease: 0,
            create_revision: 1,
            version: 3,
            deleted,
        };
        import(
            &mut kv,
            &[imported("jobs/1", false), imported("jobs/2", false)],
        )
        .expect("imports are taken");
        let got = kv.keys.get(b"jobs/1").expect("imported");
        assert_eq!((got.create_revision, got.version), (1, 3));
        import(&mut kv, &[imported("jobs/2", true)]).expect("a deletion imported");
        assert!(kv.keys.get(b"jobs/2").is_none());
        let e = import(&mut kv, &[imported("config", false)]).unwrap_err();
        assert_eq!(e.code, ErrorCode::WrongCell, "an import of a key not owned");
    }

    /// A move's source: the record that gives a prefix away deletes its
    /// keys, in the record's revision, with no change for watchers; a
    /// raised revision makes the next write's higher than any before.
    #[test]
    fn a_record_that_drops_a_prefix_deletes_its_keys_telling_no_watcher() {
        use latchkey_shared::directory::Ownership;
        let (mut keys, mut leases) = (KeySpace::default(), LeaseTable::default());
        leases.insert(7, 60);
        let mut kv = Kv {
            keys: &mut keys,
            leases: &mut leases,
        };
        put(&mut kv, &put_req("jobs/1", "x")).expect("put");
        let mut leased = put_req("jobs/2", "y");
        leased.lease = 7;
        put(&mut kv, &leased).expect("put with a lease");
        put(&mut kv, &put_req("config", "z")).expect("put");
        kv.keys.take_changes();
        let record = Ownership {
            version: 3,
            rest: true,
            prefixes: vec![b"jobs/".to_vec()],
            leaving: vec![],
            arriving: vec![],
            dropped: vec![b"jobs/".to_vec()],
            floors: vec![],
        };
        write_record(&mut kv, &record);
        let changes = kv.keys.take_changes();
        assert_eq!(changes.len(), 1, "the record alone: {changes:?}");
        assert!(kv.keys.get(b"jobs/1").is_none() && kv.keys.get(b"jobs/2").is_none());
        assert!(kv.keys.get(b"config").is_some());
        assert!(
            kv.leases.get(7).is_some_and(|l| l.keys.is_empty()),
            "detached from its lease"
        );
        kv.keys.raise_revision(100);
        put(&mut kv, &put_req("config", "w")).expect("put");
        assert_eq!(kv.keys.revision(), 101);
    }
}
