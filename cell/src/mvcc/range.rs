//! etcd's Range over the keyspace: read-only, deterministic, and checked
//! whole before it runs (a txn checks its ranges this way before its first
//! write).

use super::keyspace::{KeyRange, KeySpace, KeyValue};
use super::versions::KvRef;
use latchkey_shared::etcdpb::{PbKeyValue, PbRangeRequest, PbRangeResponse};
use latchkey_shared::range_select::Selection;
use latchkey_shared::ApiError;

/// A key-value as etcd's protocol carries it.
pub fn to_pb(kv: &KeyValue, keys_only: bool) -> PbKeyValue {
    view_to_pb(kv.view(), keys_only)
}

fn view_to_pb(kv: KvRef<'_>, keys_only: bool) -> PbKeyValue {
    PbKeyValue {
        key: kv.key.to_vec(),
        create_revision: kv.create_revision,
        mod_revision: kv.mod_revision,
        version: kv.version,
        value: if keys_only {
            Vec::new()
        } else {
            kv.value.to_vec()
        },
        lease: kv.lease,
    }
}

/// Everything that makes a Range request fail, checked before it runs: a
/// txn checks every range of its branch this way before its first write,
/// so no range can fail after a write of the same txn was made. Returns the
/// revision to read.
pub(crate) fn check_range(keys: &KeySpace, req: &PbRangeRequest) -> Result<i64, ApiError> {
    if req.key.is_empty() {
        return Err(ApiError::key_not_provided());
    }
    Selection::<KvRef>::new(req)?;
    keys.check_owned(&req.key, &req.range_end)?;
    if req.revision > 0 {
        let compacted = keys.compacted_for(&req.key, &req.range_end);
        if req.revision < compacted {
            return Err(ApiError::compacted(compacted));
        }
    }
    keys.check_readable(req.revision)
}

/// A Range request against the keyspace (read-only).
pub fn range(keys: &KeySpace, req: &PbRangeRequest) -> Result<PbRangeResponse, ApiError> {
    let rev = check_range(keys, req)?;
    let range = KeyRange::new(req.key.clone(), req.range_end.clone());
    let mut selection = Selection::new(req)?;
    keys.scan(&range, rev, |kv| {
        selection.offer(kv);
        true
    });
    Ok(selection.finish())
}

latchkey_shared::impl_range_item!(KvRef<'_>, |kv, keys_only| view_to_pb(*kv, keys_only));

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mvcc::lease_table::LeaseTable;
    use crate::mvcc::txn::tests::put_req;
    use crate::mvcc::txn::{put, Kv};
    use latchkey_shared::etcd_enums::{SortOrder, SortTarget};

    #[test]
    fn range_sorts_limits_and_counts() {
        let (mut keys, mut leases) = (KeySpace::default(), LeaseTable::default());
        let mut kv = Kv {
            keys: &mut keys,
            leases: &mut leases,
        };
        for (k, v) in [("k1", "c"), ("k2", "a"), ("k3", "b")] {
            put(&mut kv, &put_req(k, v)).expect("put");
        }
        let req = PbRangeRequest {
            key: b"k".to_vec(),
            range_end: b"l".to_vec(),
            limit: 2,
            sort_order: SortOrder::Descend as i32,
            sort_target: SortTarget::Value as i32,
            ..Default::default()
        };
        let resp = range(kv.keys, &req).expect("range");
        let got: Vec<_> = resp.kvs.iter().map(|k| k.key.clone()).collect();
        assert_eq!(got, vec![b"k1".to_vec(), b"k3".to_vec()]);
        assert_eq!(resp.count, 3);
        assert!(resp.more);
    }
}
