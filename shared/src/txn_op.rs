//! [`op`]: one operation of an etcd txn, as every builder of one (the lock
//! recipe, the idempotency guard, the auth and tenant records) writes it.

use crate::etcdpb::{PbTxnOpRequest, PbTxnRequestOp};

pub fn op(request: PbTxnOpRequest) -> PbTxnRequestOp {
    PbTxnRequestOp {
        request: Some(request),
    }
}
