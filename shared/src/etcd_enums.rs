//! etcd's protocol enums, named once.
//!
//! The etcd messages carry these as bare `i32` fields. The types are the
//! ones prost generated in `etcd-client` from etcd's own protos,
//! re-exported under etcd's names; [`EtcdEnum::decode`] turns a field into
//! one, refusing unknown values as `invalid_argument`. Code then matches on
//! names, never on numbers.
//!
//! Sort targets and compare targets share names but not numbers
//! (`SortTarget::Value` is 4, `CompareTarget::Value` is 3). They are
//! distinct types, so one cannot be used where the other is meant.

use crate::error::ApiError;
use std::cmp::Ordering;

/// `Compare.target`: which field of a key-value a txn compare reads.
pub use etcd_client::proto::PbCompareTarget as CompareTarget;
/// `Compare.result`: the relation a txn compare asks for.
pub use etcd_client::CompareOp as CompareResult;
/// `Event.type` of a watch event.
pub use etcd_client::EventType;
/// `WatchCreateRequest.filters`: the events a watch does not want.
pub use etcd_client::WatchFilterType as FilterType;
/// `RangeRequest.sort_order` and `RangeRequest.sort_target`.
pub use etcd_client::{SortOrder, SortTarget};

/// An etcd enum carried as an `i32` field.
pub trait EtcdEnum: Sized + Copy + TryFrom<i32> {
    /// What the field is called in error messages.
    const FIELD: &'static str;

    /// The enum value of a request field, or `invalid_argument` for a
    /// value etcd does not define.
    fn decode(value: i32) -> Result<Self, ApiError> {
        Self::try_from(value)
            .map_err(|_| ApiError::invalid(format!("unknown {} {value}", Self::FIELD)))
    }
}

impl EtcdEnum for SortOrder {
    const FIELD: &'static str = "sort order";
}

impl EtcdEnum for SortTarget {
    const FIELD: &'static str = "sort target";
}

impl EtcdEnum for CompareTarget {
    const FIELD: &'static str = "compare target";
}

impl EtcdEnum for CompareResult {
    const FIELD: &'static str = "compare result";
}

impl EtcdEnum for FilterType {
    const FIELD: &'static str = "watch filter";
}

impl EtcdEnum for EventType {
    const FIELD: &'static str = "event type";
}

/// Whether a compare holds, given how the key-value's field orders against
/// the compare's value (`actual.cmp(&wanted)`): etcd reads
/// `Greater` as "the stored value is greater than the given one".
pub fn compare_holds(result: CompareResult, actual_vs_wanted: Ordering) -> bool {
    match result {
        CompareResult::Equal => actual_vs_wanted == Ordering::Equal,
        CompareResult::Greater => actual_vs_wanted == Ordering::Greater,
        CompareResult::Less => actual_vs_wanted == Ordering::Less,
        CompareResult::NotEqual => actual_vs_wanted != Ordering::Equal,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::ErrorCode;

    /// The numbers are etcd's wire format (rpc.proto, kv.proto); a change
    /// here would be a protocol break.
    #[test]
    fn values_are_etcds() {
        assert_eq!(SortOrder::None as i32, 0);
        assert_eq!(SortOrder::Ascend as i32, 1);
        assert_eq!(SortOrder::Descend as i32, 2);
        assert_eq!(SortTarget::Key as i32, 0);
        assert_eq!(SortTarget::Version as i32, 1);
        assert_eq!(SortTarget::Create as i32, 2);
        assert_eq!(SortTarget::Mod as i32, 3);
        assert_eq!(SortTarget::Value as i32, 4);
        assert_eq!(CompareTarget::Version as i32, 0);
        assert_eq!(CompareTarget::Create as i32, 1);
        assert_eq!(CompareTarget::Mod as i32, 2);
        assert_eq!(CompareTarget::Value as i32, 3);
        assert_eq!(CompareTarget::Lease as i32, 4);
        assert_eq!(CompareResult::Equal as i32, 0);
        assert_eq!(CompareResult::Greater as i32, 1);
        assert_eq!(CompareResult::Less as i32, 2);
        assert_eq!(CompareResult::NotEqual as i32, 3);
        assert_eq!(FilterType::NoPut as i32, 0);
        assert_eq!(FilterType::NoDelete as i32, 1);
        assert_eq!(EventType::Put as i32, 0);
        assert_eq!(EventType::Delete as i32, 1);
    }

    #[test]
    fn decodes_known_values() {
        assert_eq!(SortTarget::decode(4).ok(), Some(SortTarget::Value));
        assert_eq!(CompareTarget::decode(3).ok(), Some(CompareTarget::Value));
        assert_eq!(SortOrder::decode(2).ok(), Some(SortOrder::Descend));
        assert_eq!(CompareResult::decode(3).ok(), Some(CompareResult::NotEqual));
        assert_eq!(FilterType::decode(1).ok(), Some(FilterType::NoDelete));
        assert_eq!(EventType::decode(1).ok(), Some(EventType::Delete));
    }

    #[test]
    fn refuses_unknown_values_as_invalid_argument() {
        let e = SortTarget::decode(5).expect_err("5 is no sort target");
        assert_eq!(e.code, ErrorCode::InvalidArgument);
        assert_eq!(e.message, "unknown sort target 5");
        let e = CompareTarget::decode(-1).expect_err("-1 is no compare target");
        assert_eq!(e.message, "unknown compare target -1");
        assert!(SortOrder::decode(3).is_err());
        assert!(CompareResult::decode(4).is_err());
        assert!(FilterType::decode(2).is_err());
        assert!(EventType::decode(2).is_err());
    }

    #[test]
    fn compare_results_read_actual_against_wanted() {
        use Ordering::*;
        let table = [
            (CompareResult::Equal, [false, true, false]),
            (CompareResult::Greater, [false, false, true]),
            (CompareResult::Less, [true, false, false]),
            (CompareResult::NotEqual, [true, false, true]),
        ];
        for (result, expected) in table {
            let got = [Less, Equal, Greater].map(|o| compare_holds(result, o));
            assert_eq!(got, expected, "{result:?}");
        }
        // The stored version 5 is greater than 3.
        assert!(compare_holds(CompareResult::Greater, 5.cmp(&3)));
    }
}
