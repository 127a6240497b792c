//! [`Selection`]: which key-values one etcd Range request returns, given
//! the live keys of its range in key order: the revision filters, the
//! sort, the limit, `count`, `more`, `keys_only` and `count_only`, as etcd
//! answers them. One implementation for the cell's keyspace and the
//! proxy's read cache, so a cached answer cannot differ from the cell's.

use crate::etcd_enums::{EtcdEnum, SortOrder, SortTarget};
use crate::etcdpb::{PbKeyValue, PbRangeRequest, PbRangeResponse};
use crate::ApiError;

/// What a Range selects on. The cell's key-values and etcd's protocol
/// key-values both are one.
pub trait RangeItem {
    fn key(&self) -> &[u8];
    fn value(&self) -> &[u8];
    fn create_revision(&self) -> i64;
    fn mod_revision(&self) -> i64;
    fn version(&self) -> i64;
    /// As etcd's protocol carries it, without the value for `keys_only`.
    fn to_pb(&self, keys_only: bool) -> PbKeyValue;
}

/// Implements [`RangeItem`] for a key-value type with etcd's field names
/// (`key`, `value`, `create_revision`, `mod_revision`, `version`), given
/// how it becomes a `PbKeyValue`.
#[macro_export]
macro_rules! impl_range_item {
    ($ty:ty, $to_pb:expr) => {
        impl $crate::range_select::RangeItem for $ty {
            fn key(&self) -> &[u8] {
                &self.key
            }
            fn value(&self) -> &[u8] {
                &self.value
            }
            fn create_revision(&self) -> i64 {
                self.create_revision
            }
            fn mod_revision(&self) -> i64 {
                self.mod_revision
            }
            fn version(&self) -> i64 {
                self.version
            }
            fn to_pb(&self, keys_only: bool) -> $crate::etcdpb::PbKeyValue {
                let to_pb: fn(&$ty, bool) -> $crate::etcdpb::PbKeyValue = $to_pb;
                to_pb(self, keys_only)
            }
        }
    };
}

impl_range_item!(PbKeyValue, |kv, keys_only| PbKeyValue {
    value: if keys_only {
        Vec::new()
    } else {
        kv.value.clone()
    },
    ..kv.clone()
});

/// A borrowed key-value selects as the key-value does.
impl<T: RangeItem + ?Sized> RangeItem for &T {
    fn key(&self) -> &[u8] {
        (**self).key()
    }
    fn value(&self) -> &[u8] {
        (**self).value()
    }
    fn create_revision(&self) -> i64 {
        (**self).create_revision()
    }
    fn mod_revision(&self) -> i64 {
        (**self).mod_revision()
    }
    fn version(&self) -> i64 {
        (**self).version()
    }
    fn to_pb(&self, keys_only: bool) -> PbKeyValue {
        (**self).to_pb(keys_only)
    }
}

/// One Range request's answer, built by [`Selection::offer`]ing every live
/// key of the range in key order, then [`Selection::finish`].
pub struct Selection<'a, T> {
    req: &'a PbRangeRequest,
    sort_order: SortOrder,
    sort_target: SortTarget,
    /// Key order is the order offered, so an ascending key sort (or none)
    /// can stop at the limit; any other sort needs every match first.
    key_ordered: bool,
    limit: usize,
    count: i64,
    matched: Vec<T>,
}

impl<'a, T: RangeItem> Selection<'a, T> {
    /// Refuses a request whose sort fields are not etcd values.
    pub fn new(req: &'a PbRangeRequest) -> Result<Selection<'a, T>, ApiError> {
        let sort_order = SortOrder::decode(req.sort_order)?;
        let sort_target = SortTarget::decode(req.sort_target)?;
        Ok(Selection {
            req,
            sort_order,
            sort_target,
            key_ordered: sort_target == SortTarget::Key && sort_order != SortOrder::Descend,
            // A limit of 0 or less is no limit (etcd reads a negative one so too).
            limit: if req.limit > 0 {
                req.limit as usize
            } else {
                usize::MAX
            },
            count: 0,
            matched: Vec::new(),
        })
    }

    /// The next live key of the range, in key order.
    pub fn offer(&mut self, kv: T) {
        let req = self.req;
        let kept = (req.min_mod_revision == 0 || kv.mod_revision() >= req.min_mod_revision)
            && (req.max_mod_revision == 0 || kv.mod_revision() <= req.max_mod_revision)
            && (req.min_create_revision == 0 || kv.create_revision() >= req.min_create_revision)
            && (req.max_create_revision == 0 || kv.create_revision() <= req.max_create_revision);
        if kept {
            self.count += 1;
            if !req.count_only && (!self.key_ordered || self.matched.len() < self.limit) {
                self.matched.push(kv);
            }
        }
    }

    /// The answer (without a header: the caller knows its revision).
    pub fn finish(mut self) -> PbRangeResponse {
        if !self.key_ordered {
            let (target, order) = (self.sort_target, self.sort_order);
            self.matched.sort_by(|a, b| {
                let ord = match target {
                    SortTarget::Key => a.key().cmp(b.key()),
                    SortTarget::Version => a.version().cmp(&b.version()),
                    SortTarget::Create => a.create_revision().cmp(&b.create_revision()),
                    SortTarget::Mod => a.mod_revision().cmp(&b.mod_revision()),
                    SortTarget::Value => a.value().cmp(b.value()),
                };
                // No order given sorts ascending, as in etcd.
                if order == SortOrder::Descend {
                    ord.reverse()
                } else {
                    ord
                }
            });
            self.matched.truncate(self.limit);
        }
        let kvs: Vec<PbKeyValue> = self
            .matched
            .iter()
            .map(|kv| kv.to_pb(self.req.keys_only))
            .collect();
        PbRangeResponse {
            header: None,
            more: !self.req.count_only && (kvs.len() as i64) < self.count,
            count: self.count,
            kvs,
        }
    }
}
