//! etcd's Range over the keyspace: read-only, deterministic, and checked
//! whole before it runs (a txn checks its ranges this way before its first
//! write).

use super::keyspace::{KeyRange, KeySpace, KeyValue};
use latchkey_shared::etcd_enums::{EtcdEnum, SortOrder, SortTarget};
use latchkey_shared::etcdpb::{PbKeyValue, PbRangeRequest, PbRangeResponse};
use latchkey_shared::ApiError;

/// A key-value as etcd's protocol carries it.
pub fn to_pb(kv: &KeyValue, keys_only: bool) -> PbKeyValue {
    PbKeyValue {
        key: kv.key.clone(),
        create_revision: kv.create_revision,
        mod_revision: kv.mod_revision,
        version: kv.version,
        value: if keys_only {
            Vec::new()
        } else {
            kv.value.clone()
        },
        lease: kv.lease,
    }
}

/// Everything that makes a Range request fail, checked before it runs: a
/// txn checks every range of its branch this way before its first write,
/// so no range can fail after a write of the same txn was made. Returns the
/// revision to read and the sort.
pub(crate) fn check_range(
    keys: &KeySpace,
    req: &PbRangeRequest,
) -> Result<(i64, SortOrder, SortTarget), ApiError> {
    if req.key.is_empty() {
        return Err(ApiError::key_not_provided());
    }
    let sort_order = SortOrder::decode(req.sort_order)?;
    let sort_target = SortTarget::decode(req.sort_target)?;
    let rev = keys.check_readable(req.revision)?;
    Ok((rev, sort_order, sort_target))
}

/// A Range request against the keyspace (read-only).
pub fn range(keys: &KeySpace, req: &PbRangeRequest) -> Result<PbRangeResponse, ApiError> {
    let (rev, sort_order, sort_target) = check_range(keys, req)?;
    let range = KeyRange::new(req.key.clone(), req.range_end.clone());
    let filtered = |kv: &KeyValue| {
        (req.min_mod_revision == 0 || kv.mod_revision >= req.min_mod_revision)
            && (req.max_mod_revision == 0 || kv.mod_revision <= req.max_mod_revision)
            && (req.min_create_revision == 0 || kv.create_revision >= req.min_create_revision)
            && (req.max_create_revision == 0 || kv.create_revision <= req.max_create_revision)
    };
    // Key order is the store's order, so an ascending key sort (or none)
    // can stop at the limit; any other sort needs every match first.
    let key_ordered = sort_target == SortTarget::Key && sort_order != SortOrder::Descend;
    // A limit of 0 or less is no limit (etcd reads a negative one so too).
    let limit = if req.limit > 0 {
        req.limit as usize
    } else {
        usize::MAX
    };
    let mut count: i64 = 0;
    let mut matched: Vec<&KeyValue> = Vec::new();
    keys.scan(&range, rev, |kv| {
        if filtered(kv) {
            count += 1;
            if !req.count_only && (!key_ordered || matched.len() < limit) {
                matched.push(kv);
            }
        }
        true
    });
    if !key_ordered {
        matched.sort_by(|a, b| {
            let ord = match sort_target {
                SortTarget::Key => a.key.cmp(&b.key),
                SortTarget::Version => a.version.cmp(&b.version),
                SortTarget::Create => a.create_revision.cmp(&b.create_revision),
                SortTarget::Mod => a.mod_revision.cmp(&b.mod_revision),
                SortTarget::Value => a.value.cmp(&b.value),
            };
            // No order given sorts ascending, as in etcd.
            if sort_order == SortOrder::Descend {
                ord.reverse()
            } else {
                ord
            }
        });
        matched.truncate(limit);
    }
    let kvs: Vec<PbKeyValue> = matched.iter().map(|kv| to_pb(kv, req.keys_only)).collect();
    Ok(PbRangeResponse {
        header: None,
        more: !req.count_only && (kvs.len() as i64) < count,
        count,
        kvs,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mvcc::lease_table::LeaseTable;
    use crate::mvcc::txn::tests::put_req;
    use crate::mvcc::txn::{put, Kv};

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
