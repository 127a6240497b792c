//! [`KeyRange`]: the keys an etcd request names with `key` and
//! `range_end`, with etcd's exact rules. The cell's keyspace, the proxy's
//! watch coalescing and its read cache must agree on them, so they live
//! here once.

use std::ops::Bound;

/// A key range as etcd encodes it:
/// - `end` empty: the single key `start`;
/// - `end == [0]`: every key `>= start`;
/// - otherwise `[start, end)`, and empty when `end <= start`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct KeyRange {
    pub start: Vec<u8>,
    pub end: Vec<u8>,
}

/// etcd's `range_end` for "every key from `start` on".
const TO_THE_END: &[u8] = &[0];

/// The keys latchkey keeps for itself (lock-delay records, audit records,
/// idempotency records) start with this. A range that starts outside it
/// never selects them, so `etcdctl get "" --prefix`, a delete of every key
/// or a watch of everything neither shows nor touches them; a range that
/// starts inside it (what the lock, audit and idempotency code asks for)
/// sees them as any other key.
pub const RESERVED_PREFIX: &[u8] = b"\0latchkey/";

/// Whether `key` is one latchkey keeps for itself.
pub fn is_reserved(key: &[u8]) -> bool {
    key.starts_with(RESERVED_PREFIX)
}

impl KeyRange {
    /// The range of an etcd request's `key` and `range_end`.
    pub fn new(start: Vec<u8>, end: Vec<u8>) -> Self {
        KeyRange { start, end }
    }

    /// Exactly one key.
    pub fn single(key: Vec<u8>) -> Self {
        KeyRange {
            start: key,
            end: Vec::new(),
        }
    }

    /// Every key that starts with `prefix`, as etcd clients encode it
    /// (`clientv3.WithPrefix`): the end is the prefix with its last byte
    /// below 0xff incremented and the 0xff bytes after it dropped. A prefix
    /// of only 0xff bytes has no such end, so the range runs to the last
    /// key; the empty prefix is every key (etcd sends it as `[0]`, `[0]`,
    /// since an empty `key` is refused).
    pub fn prefix(prefix: &[u8]) -> Self {
        if prefix.is_empty() {
            return KeyRange::new(TO_THE_END.to_vec(), TO_THE_END.to_vec());
        }
        KeyRange {
            start: prefix.to_vec(),
            end: prefix_end(prefix),
        }
    }

    /// Whether `key` lies in this range.
    pub fn contains(&self, key: &[u8]) -> bool {
        if !self.admits(key) {
            false
        } else if self.end.is_empty() {
            key == self.start.as_slice()
        } else if self.end == TO_THE_END {
            key >= self.start.as_slice()
        } else {
            key >= self.start.as_slice() && key < self.end.as_slice()
        }
    }

    /// Whether a key between this range's [`bounds`](Self::bounds) is in
    /// it: every key, except reserved ones when the range does not start
    /// inside the reserved prefix. Whoever scans by `bounds` filters by this.
    pub fn admits(&self, key: &[u8]) -> bool {
        !is_reserved(key) || is_reserved(&self.start)
    }

    /// An inverted range (`end <= start`) selects nothing, as in etcd.
    pub fn is_empty(&self) -> bool {
        !self.end.is_empty() && self.end != TO_THE_END && self.end <= self.start
    }

    /// Whether some key lies in both ranges (reserved keys aside).
    pub fn overlaps(&self, other: &KeyRange) -> bool {
        if self.is_empty() || other.is_empty() {
            return false;
        }
        let starts_before = |start: &[u8], end: Bound<&[u8]>| match end {
            Bound::Unbounded => true,
            Bound::Included(e) => start <= e,
            Bound::Excluded(e) => start < e,
        };
        starts_before(&self.start, other.bounds().1) && starts_before(&other.start, self.bounds().1)
    }

    /// The range as bounds for `BTreeMap::range` and friends. An empty
    /// range gives `[start, start)`, which selects nothing and, unlike an
    /// inverted pair, does not make `BTreeMap::range` panic.
    pub fn bounds(&self) -> (Bound<&[u8]>, Bound<&[u8]>) {
        let start = Bound::Included(&self.start[..]);
        if self.end.is_empty() {
            (start, Bound::Included(&self.start[..]))
        } else if self.end == TO_THE_END {
            (start, Bound::Unbounded)
        } else if self.is_empty() {
            (start, Bound::Excluded(&self.start[..]))
        } else {
            (start, Bound::Excluded(&self.end[..]))
        }
    }
}

/// The smallest key greater than every key starting with `prefix`, or
/// `[0]` ("no end") when there is none.
pub fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    match prefix.iter().rposition(|&b| b < 0xff) {
        Some(i) => {
            let mut end = prefix[..=i].to_vec();
            end[i] += 1;
            end
        }
        None => TO_THE_END.to_vec(),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn ranges_overlap_when_some_key_is_in_both() {
        let r = |a: &[u8], b: &[u8]| KeyRange::new(a.to_vec(), b.to_vec());
        let acme = KeyRange::prefix(b"acme/");
        assert!(acme.overlaps(&r(b"acme/x", b"")));
        assert!(!acme.overlaps(&r(b"acme", b"")));
        assert!(acme.overlaps(&r(b"acme", b"acme0")), "a range around it");
        assert!(acme.overlaps(&r(b"a", TO_THE_END)), "to the end");
        assert!(acme.overlaps(&KeyRange::prefix(b"")), "every key");
        assert!(!acme.overlaps(&r(b"acme0", b"b")), "just after");
        assert!(!acme.overlaps(&r(b"a", b"acme/")), "ends where it starts");
        assert!(!acme.overlaps(&r(b"z", b"a")), "inverted");
        assert!(r(b"k", b"").overlaps(&r(b"k", b"")));
    }

    use super::*;
    use std::collections::BTreeMap;

    fn r(start: &[u8], end: &[u8]) -> KeyRange {
        KeyRange::new(start.to_vec(), end.to_vec())
    }

    /// The keys of `keys` that `range` selects through `bounds()`.
    fn scan(range: &KeyRange, keys: &[&[u8]]) -> Vec<Vec<u8>> {
        let map: BTreeMap<Vec<u8>, ()> = keys.iter().map(|k| (k.to_vec(), ())).collect();
        let (lo, hi) = range.bounds();
        map.range::<[u8], _>((lo, hi))
            .filter(|(k, _)| range.admits(k))
            .map(|(k, _)| k.clone())
            .collect()
    }

    const KEYS: &[&[u8]] = &[
        b"",
        b"\x00",
        b"\x00latchkey/audit/1",
        b"\x00latchkey/lock-delay/a",
        b"a",
        b"a\x00",
        b"ab",
        b"abc",
        b"abd",
        b"ac",
        b"b",
        b"\xff",
        b"\xff\xff",
    ];

    /// `contains` and `bounds` must select the same keys.
    fn agree(range: &KeyRange) -> Vec<Vec<u8>> {
        let by_contains: Vec<Vec<u8>> = KEYS
            .iter()
            .filter(|k| range.contains(k))
            .map(|k| k.to_vec())
            .collect();
        assert_eq!(scan(range, KEYS), by_contains, "{range:?}");
        by_contains
    }

    #[test]
    fn empty_end_is_a_single_key() {
        let range = KeyRange::single(b"ab".to_vec());
        assert_eq!(agree(&range), [b"ab".to_vec()]);
        assert!(!range.is_empty());
        assert!(!range.contains(b"abc"));
    }

    #[test]
    fn zero_end_is_every_key_from_start() {
        let range = r(b"ab", &[0]);
        assert_eq!(agree(&range).len(), 7);
        assert!(range.contains(b"\xff\xff\xff"));
        assert!(!range.contains(b"a"));
        assert!(!range.is_empty());
        // From the smallest key: everything but the two reserved keys.
        assert_eq!(agree(&r(&[0], &[0])).len(), KEYS.len() - 3);
        assert_eq!(agree(&r(b"", &[0])).len(), KEYS.len() - 2);
    }

    #[test]
    fn other_ends_are_half_open() {
        let range = r(b"ab", b"ac");
        assert_eq!(
            agree(&range),
            [b"ab".to_vec(), b"abc".to_vec(), b"abd".to_vec()]
        );
        assert!(!range.contains(b"ac"));
    }

    #[test]
    fn inverted_and_equal_ranges_are_empty() {
        for range in [r(b"b", b"a"), r(b"ab", b"ab"), r(b"b", b"\x00\x00")] {
            assert!(range.is_empty(), "{range:?}");
            assert!(agree(&range).is_empty(), "{range:?}");
        }
        // [0] is "to the end", not an end below every key.
        assert!(!r(b"b", &[0]).is_empty());
    }

    #[test]
    fn prefix_ends_like_etcd_clients() {
        assert_eq!(KeyRange::prefix(b"ab").end, b"ac");
        assert_eq!(KeyRange::prefix(b"a\xff").end, b"b");
        assert_eq!(KeyRange::prefix(b"a\xff\xff").end, b"b");
        assert_eq!(KeyRange::prefix(b"\x00").end, b"\x01");
        assert_eq!(KeyRange::prefix(b"a\xfe\xff").end, b"a\xff");
        assert_eq!(KeyRange::prefix(b"\xff").end, [0]);
        assert_eq!(KeyRange::prefix(b"\xff\xff").end, [0]);
        assert_eq!(KeyRange::prefix(b""), r(&[0], &[0]));
    }

    #[test]
    fn prefix_selects_exactly_the_keys_with_the_prefix() {
        for prefix in [&b"a"[..], b"ab", b"\xff", b"\x00", b""] {
            let range = KeyRange::prefix(prefix);
            let expected: Vec<Vec<u8>> = KEYS
                .iter()
                .filter(|k| k.starts_with(prefix) && !(prefix.is_empty() && k.is_empty()))
                .filter(|k| !is_reserved(k))
                .map(|k| k.to_vec())
                .collect();
            assert_eq!(agree(&range), expected, "{prefix:?}");
        }
    }

    #[test]
    fn reserved_keys_are_seen_only_by_ranges_that_start_inside_the_reserved_prefix() {
        let audit = b"\x00latchkey/audit/1".to_vec();
        let record = b"\x00latchkey/lock-delay/a".to_vec();
        // Every key, every key from "\0", the "\0" prefix: none of them.
        for range in [r(b"", &[0]), r(&[0], &[0]), KeyRange::prefix(b"\x00")] {
            let keys = agree(&range);
            assert!(
                !keys.contains(&audit) && !keys.contains(&record),
                "{range:?}"
            );
        }
        assert!(!r(b"", &[0]).contains(&audit));
        // Asked for by name or by a prefix inside the reserved one: seen.
        assert_eq!(
            agree(&KeyRange::single(audit.clone())),
            std::slice::from_ref(&audit)
        );
        assert_eq!(
            agree(&KeyRange::prefix(RESERVED_PREFIX)),
            [audit.clone(), record.clone()]
        );
        assert_eq!(agree(&KeyRange::prefix(b"\x00latchkey/audit/")), [audit]);
        // latchkey's own records are reserved keys.
        assert!(is_reserved(crate::lock::audit::PREFIX));
        assert!(is_reserved(&crate::lock::delay::record(b"a")));
    }
}
