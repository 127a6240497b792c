//! [`op`]: one operation of an etcd txn, as every builder of one (the lock
//! recipe, the idempotency guard, the auth and tenant records) writes it;
//! [`ranges`]: every range a txn names.

use crate::etcdpb::{PbTxnOpRequest, PbTxnRequest, PbTxnRequestOp};
use crate::key_range::KeyRange;

/// Every range a txn names: its compares' and every operation's of both
/// branches, nested txns included.
pub fn ranges(txn: &PbTxnRequest) -> Vec<KeyRange> {
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
            Some(PbTxnOpRequest::RequestTxn(t)) => ranges.extend(self::ranges(t)),
            None => {}
        }
    }
    ranges
}

pub fn op(request: PbTxnOpRequest) -> PbTxnRequestOp {
    PbTxnRequestOp {
        request: Some(request),
    }
}
