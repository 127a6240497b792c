//! Charging a client's request to the tenants whose keys it names
//! ([`TenantLimits`](crate::tenant_limits::TenantLimits)), before the proxy
//! acts on it: KV operations, watches, locks and elections.

use super::auth::client_token;
use crate::state::ProxyState;
use crate::tenant_limits::Requester;
use latchkey_shared::etcdpb::{PbTxnOpRequest, PbTxnRequest};
use latchkey_shared::{ApiError, KeyRange};
use tokio::time::Instant;

/// Charges this task's client for one request naming the key ranges
/// `ranges` gives (asked only while some tenant exists): refused with
/// `rate_limited` past a rate of any tenant they overlap, or its rate per
/// user (see [`Requester`] for which buckets).
pub fn charge(state: &ProxyState, ranges: impl FnOnce() -> Vec<KeyRange>) -> Result<(), ApiError> {
    if !state.tenant_limits.any() {
        return Ok(());
    }
    let ranges = ranges();
    let first = ranges.first().map(|r| r.start.clone()).unwrap_or_default();
    let requester = || {
        let cell = state.upstream.cell_for(&first);
        if !cell.auth_may_be_on() {
            return Requester::Anyone;
        }
        match client_token().and_then(|t| cell.accepted_tokens.user(&t)) {
            Some(user) => Requester::User(user),
            None => Requester::Unverified,
        }
    };
    state
        .tenant_limits
        .charge(&ranges, requester, Instant::now())
}

/// One key.
pub fn key(key: &[u8]) -> Vec<KeyRange> {
    vec![KeyRange::single(key.to_vec())]
}

/// An etcd `key` and `range_end`.
pub fn range(key: &[u8], range_end: &[u8]) -> Vec<KeyRange> {
    vec![KeyRange::new(key.to_vec(), range_end.to_vec())]
}

/// Every range a txn names: its compares' and every operation's of both
/// branches, nested txns included.
pub fn txn_ranges(txn: &PbTxnRequest) -> Vec<KeyRange> {
    let mut ranges: Vec<KeyRange> = txn
        .compare
        .iter()
        .map(|c| KeyRange::new(c.key.clone(), c.range_end.clone()))
        .collect();
    for op in txn.success.iter().chain(&txn.failure) {
        match &op.request {
            Some(PbTxnOpRequest::RequestRange(r)) => {
                ranges.push(KeyRange::new(r.key.clone(), r.range_end.clone()))
            }
            Some(PbTxnOpRequest::RequestPut(p)) => ranges.push(KeyRange::single(p.key.clone())),
            Some(PbTxnOpRequest::RequestDeleteRange(d)) => {
                ranges.push(KeyRange::new(d.key.clone(), d.range_end.clone()))
            }
            Some(PbTxnOpRequest::RequestTxn(t)) => ranges.extend(txn_ranges(t)),
            None => {}
        }
    }
    ranges
}
