//! Lock-delay (Chubby's; etcd and ZooKeeper lack it): a holder may ask
//! that, if its session EXPIRES while it holds the lock (it did not
//! release it), the lock is not granted again for a while, so that a
//! resource that cannot check tokens sees the old holder's last writes
//! settle first. A release, or a waiter giving up, hands the lock on at
//! once.
//!
//! The delay a contender asks for rides in its queue key's value. A
//! holder that asked for one writes the lock's delay record when it is
//! granted (its key and delay); its release deletes the record in the same
//! txn as its key, and nothing else does. So a record that names a holder
//! whose key is gone says the holder did NOT leave on purpose: its lease
//! expired (or an operator force-released it), and the delay is owed:
//! - to the waiter its departure wakes, from the moment it wakes;
//! - to a newcomer that finds the queue empty (the holder left while
//!   nobody waited), from the moment it joins. It cannot tell how long ago
//!   that was, so it may wait up to one delay longer than needed: slower,
//!   never unsafe.
//!
//! The next holder replaces the record with its own, or deletes it.

use crate::etcd_enums::{CompareResult, CompareTarget};
use crate::etcdpb::{PbCompare, PbKeyValue, PbTargetUnion};
use std::time::Duration;

/// What a contender's queue key holds for a delay.
const PREFIX: &[u8] = b"lock-delay-ms=";
/// Where a lock's delay record is: this, then the lock's name. It lives in
/// the cell that owns the name (the directory routes it by the name).
pub const RECORD_PREFIX: &[u8] = b"\0latchkey/lock-delay/";

/// The longest delay a holder may ask for.
pub const MAX_LOCK_DELAY: Duration = Duration::from_secs(60);

/// The queue key value of a contender asking for `delay` (none: empty, as
/// etcd's own recipe writes it).
pub fn encode(delay: Duration) -> Vec<u8> {
    if delay.is_zero() {
        return Vec::new();
    }
    [PREFIX, delay.as_millis().to_string().as_bytes()].concat()
}

/// The delay a queue key value asks for (zero for anything else).
pub fn decode(value: &[u8]) -> Duration {
    value
        .strip_prefix(PREFIX)
        .and_then(|ms| std::str::from_utf8(ms).ok()?.parse::<u64>().ok())
        .map_or(Duration::ZERO, Duration::from_millis)
        .min(MAX_LOCK_DELAY)
}

/// The key of the lock `name`'s delay record.
pub fn record(name: &[u8]) -> Vec<u8> {
    [RECORD_PREFIX, name].concat()
}

/// A delay record's value: the holder's key, a newline, the delay in ms.
pub fn record_value(holder: &[u8], delay: Duration) -> Vec<u8> {
    [holder, b"\n", delay.as_millis().to_string().as_bytes()].concat()
}

/// The holder and delay a record names (none for anything else).
pub fn parse_record(value: &[u8]) -> Option<(&[u8], Duration)> {
    let newline = value.iter().rposition(|b| *b == b'\n')?;
    let ms = std::str::from_utf8(&value[newline + 1..])
        .ok()?
        .parse::<u64>()
        .ok()?;
    Some((
        &value[..newline],
        Duration::from_millis(ms).min(MAX_LOCK_DELAY),
    ))
}

/// The delay `record` (a read delay record, if there is one) owes for the
/// departed holder `holder`: the delay, if it names that holder.
pub fn owed_for(record: Option<&PbKeyValue>, holder: &[u8]) -> Option<Duration> {
    let (named, delay) = parse_record(&record?.value)?;
    (named == holder && !delay.is_zero()).then_some(delay)
}

/// Compares that hold when the record of the lock `name` names `holder`:
/// its value lies strictly between `holder\n` and `holder\x0b` (the byte
/// after the newline), which is exactly "starts with `holder\n`" for a
/// value with digits after the newline. A release deletes the record under
/// these.
pub fn names(name: &[u8], holder: &[u8]) -> [PbCompare; 2] {
    let bound = |result: CompareResult, last: u8| PbCompare {
        result: result as i32,
        target: CompareTarget::Value as i32,
        key: record(name),
        range_end: Vec::new(),
        target_union: Some(PbTargetUnion::Value([holder, &[last]].concat())),
    };
    [
        bound(CompareResult::Greater, b'\n'),
        bound(CompareResult::Less, b'\n' + 1),
    ]
}

/// The lock name of a queue key (`name/<lease hex>`).
pub fn name_of(key: &[u8]) -> Option<&[u8]> {
    let slash = key.iter().rposition(|b| *b == b'/')?;
    Some(&key[..slash])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delays_round_trip_and_anything_else_is_no_delay() {
        assert_eq!(
            decode(&encode(Duration::from_millis(1500))),
            Duration::from_millis(1500)
        );
        assert!(encode(Duration::ZERO).is_empty());
        assert_eq!(decode(b""), Duration::ZERO);
        assert_eq!(decode(b"a campaign value"), Duration::ZERO);
        assert_eq!(decode(b"lock-delay-ms=99999999"), MAX_LOCK_DELAY);
        assert_eq!(name_of(b"jobs/a/694d"), Some(b"jobs/a".as_slice()));
        assert_eq!(name_of(b"nokey"), None);
    }

    #[test]
    fn records_name_a_holder_and_its_delay() {
        let value = record_value(b"jobs/694d", Duration::from_millis(1500));
        assert_eq!(
            parse_record(&value),
            Some((b"jobs/694d".as_slice(), Duration::from_millis(1500)))
        );
        assert_eq!(parse_record(b"jobs/694d"), None);
        let kv = PbKeyValue {
            value,
            ..Default::default()
        };
        assert_eq!(
            owed_for(Some(&kv), b"jobs/694d"),
            Some(Duration::from_millis(1500))
        );
        assert_eq!(owed_for(Some(&kv), b"jobs/694"), None);
        assert_eq!(owed_for(None, b"jobs/694d"), None);
        // The compares bracket exactly the values that name the holder.
        let [above, below] = names(b"jobs", b"jobs/694d");
        let between = |v: &[u8]| {
            let (Some(PbTargetUnion::Value(lo)), Some(PbTargetUnion::Value(hi))) =
                (&above.target_union, &below.target_union)
            else {
                unreachable!()
            };
            v > lo.as_slice() && v < hi.as_slice()
        };
        assert!(between(&kv.value));
        assert!(!between(&record_value(
            b"jobs/694",
            Duration::from_millis(5)
        )));
        assert!(!between(&record_value(
            b"jobs/694d0",
            Duration::from_millis(5)
        )));
        assert_eq!(record(b"jobs"), b"\0latchkey/lock-delay/jobs");
    }
}
