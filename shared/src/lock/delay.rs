//! Lock-delay (Chubby's; etcd and ZooKeeper lack it): a holder may ask
//! that, if its session EXPIRES while it holds the lock (it did not
//! release it), the lock is not granted again for a while, so that a
//! resource that cannot check tokens sees the old holder's last writes
//! settle first. A release, or a waiter giving up, wakes the next at once.
//!
//! The delay rides in the contender's queue key value. Telling a release
//! from an expiry: whoever leaves the queue on purpose (release, give-up)
//! deletes its key and, in the same txn, writes the key into the lock's
//! marker key, whose mod revision is then the departure's. A key that
//! vanished while the marker does not name it with a later mod revision
//! went with its lease (or by a force-release), and the delay applies.
//! A later departure overwrites the marker; a waiter that reads it late
//! then takes a release for an expiry and waits the delay: slower, never
//! unsafe.

use std::time::Duration;

/// What a contender's queue key holds for a delay.
const PREFIX: &[u8] = b"lock-delay-ms=";

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

/// The key naming the last contender that left the lock `name` on
/// purpose.
pub fn marker(name: &[u8]) -> Vec<u8> {
    [b"\0latchkey/lock-left/".as_slice(), name].concat()
}

/// Whether the contender `key`, created at `revision` and now gone, left
/// on purpose, by the lock's `marker` (its value and mod revision, if it
/// exists). A lease cannot outlive its own key's expiry, so the same key
/// created again later (a higher revision) was created by a live lease.
pub fn left_on_purpose(marker: Option<(&[u8], i64)>, key: &[u8], revision: i64) -> bool {
    marker.is_some_and(|(named, mod_revision)| named == key && mod_revision > revision)
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
    fn a_departure_on_purpose_is_one_the_marker_names_after_the_key_was_created() {
        let key = b"jobs/694d".as_slice();
        assert!(left_on_purpose(Some((key, 12)), key, 10));
        // No marker, another key, or a marker from before this key: expired.
        assert!(!left_on_purpose(None, key, 10));
        assert!(!left_on_purpose(Some((b"jobs/1", 12)), key, 10));
        assert!(!left_on_purpose(Some((key, 8)), key, 10));
    }
}
