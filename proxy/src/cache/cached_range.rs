//! [`CachedRange`]: the live keys of one key range as of one revision,
//! moved forward by that range's watch events, answering Range requests
//! exactly as the cell would have at that revision.

use crate::watch::Revision;
use latchkey_shared::etcd_enums::EventType;
use latchkey_shared::etcdpb::{PbKeyValue, PbRangeRequest, PbRangeResponse};
use latchkey_shared::range_select::Selection;
use latchkey_shared::ApiError;
use std::collections::BTreeMap;

/// What a cached key costs beyond its key and value (map node, fields).
const PER_KEY_BYTES: usize = 96;

pub struct CachedRange {
    keys: BTreeMap<Vec<u8>, PbKeyValue>,
    /// Every revision up to this one is reflected.
    revision: i64,
    bytes: usize,
}

fn cost(kv: &PbKeyValue) -> usize {
    kv.key.len() * 2 + kv.value.len() + PER_KEY_BYTES
}

impl CachedRange {
    /// The range's live keys as read at `revision`.
    pub fn new(kvs: Vec<PbKeyValue>, revision: i64) -> CachedRange {
        let bytes = kvs.iter().map(cost).sum();
        CachedRange {
            keys: kvs.into_iter().map(|kv| (kv.key.clone(), kv)).collect(),
            revision,
            bytes,
        }
    }

    pub fn revision(&self) -> i64 {
        self.revision
    }

    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Applies the events of one revision (from the range's watch, in
    /// order); an older revision was already reflected and is ignored.
    pub fn apply(&mut self, revision: &Revision) {
        if revision.revision <= self.revision {
            return;
        }
        for event in revision.events.iter() {
            let Some(kv) = &event.kv else { continue };
            let old = if event.r#type == EventType::Delete as i32 {
                self.keys.remove(&kv.key)
            } else {
                self.bytes += cost(kv);
                self.keys.insert(kv.key.clone(), kv.clone())
            };
            if let Some(old) = old {
                self.bytes -= cost(&old);
            }
        }
        self.revision = revision.revision;
    }

    /// Nothing changed in the range up to `revision`.
    pub fn advance(&mut self, revision: i64) {
        self.revision = self.revision.max(revision);
    }

    /// The answer to `req` (a Range of exactly this range, at the current
    /// revision) as of [`CachedRange::revision`]; the header is the
    /// caller's.
    pub fn answer(&self, req: &PbRangeRequest) -> Result<PbRangeResponse, ApiError> {
        let mut selection = Selection::new(req)?;
        for kv in self.keys.values() {
            selection.offer(kv);
        }
        Ok(selection.finish())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use latchkey_shared::etcdpb::PbEvent;
    use std::sync::Arc;

    fn kv(key: &str, value: &str, revision: i64) -> PbKeyValue {
        PbKeyValue {
            key: key.as_bytes().to_vec(),
            value: value.as_bytes().to_vec(),
            create_revision: revision,
            mod_revision: revision,
            version: 1,
            lease: 0,
        }
    }

    fn revision(revision: i64, events: Vec<PbEvent>) -> Revision {
        Revision {
            revision,
            events: Arc::from(events),
            received: tokio::time::Instant::now(),
            herd: 1,
        }
    }

    fn put(kv: PbKeyValue) -> PbEvent {
        PbEvent {
            r#type: EventType::Put as i32,
            kv: Some(kv),
            prev_kv: None,
        }
    }

    fn delete(key: &str, revision: i64) -> PbEvent {
        PbEvent {
            r#type: EventType::Delete as i32,
            kv: Some(PbKeyValue {
                key: key.as_bytes().to_vec(),
                mod_revision: revision,
                ..Default::default()
            }),
            prev_kv: None,
        }
    }

    fn keys(resp: &PbRangeResponse) -> Vec<String> {
        resp.kvs
            .iter()
            .map(|kv| String::from_utf8_lossy(&kv.key).into_owned())
            .collect()
    }

    #[test]
    fn events_move_the_range_forward_and_bytes_follow() {
        let mut range = CachedRange::new(vec![kv("a/1", "x", 2), kv("a/2", "y", 3)], 5);
        let all = PbRangeRequest {
            key: b"a/".to_vec(),
            range_end: b"a0".to_vec(),
            ..Default::default()
        };
        let before = range.bytes();
        range.apply(&revision(
            6,
            vec![put(kv("a/3", "zz", 6)), delete("a/1", 6)],
        ));
        range.apply(&revision(4, vec![delete("a/2", 4)])); // already reflected
        assert_eq!(range.revision(), 6);
        let resp = range.answer(&all).expect("answer");
        assert_eq!(keys(&resp), vec!["a/2", "a/3"]);
        assert_eq!(resp.count, 2);
        assert_eq!(range.bytes(), before + 1, "one byte of value more");
        range.advance(9);
        assert_eq!(range.revision(), 9);
    }

    #[test]
    fn limits_sorts_and_count_only_answer_as_the_cell_does() {
        let range = CachedRange::new(
            vec![kv("k1", "c", 4), kv("k2", "a", 2), kv("k3", "b", 3)],
            9,
        );
        let req = |f: &dyn Fn(&mut PbRangeRequest)| {
            let mut r = PbRangeRequest {
                key: b"k".to_vec(),
                range_end: b"l".to_vec(),
                ..Default::default()
            };
            f(&mut r);
            range.answer(&r).expect("answer")
        };
        let limited = req(&|r| r.limit = 2);
        assert_eq!(keys(&limited), vec!["k1", "k2"]);
        assert!(limited.more);
        assert_eq!(limited.count, 3);
        let by_value = req(&|r| r.sort_target = 4);
        assert_eq!(keys(&by_value), vec!["k2", "k3", "k1"]);
        let counted = req(&|r| r.count_only = true);
        assert!(counted.kvs.is_empty() && counted.count == 3 && !counted.more);
        let recent = req(&|r| r.min_mod_revision = 3);
        assert_eq!(keys(&recent), vec!["k1", "k3"]);
        let keys_only = req(&|r| r.keys_only = true);
        assert!(keys_only.kvs.iter().all(|kv| kv.value.is_empty()));
        let mut bad = PbRangeRequest {
            key: b"k".to_vec(),
            ..Default::default()
        };
        bad.sort_order = 7;
        assert!(range.answer(&bad).is_err());
    }
}
