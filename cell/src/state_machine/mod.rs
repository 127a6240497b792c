//! The replicated state machine.
//!
//! - `crate::raft::command`: what the Raft log carries and what applying
//!   returns.
//! - [`CellState`] (here): the pure state and its deterministic apply; it
//!   reads no clock and no randomness, so it is tested without tokio or disk.
//! - [`store`]: openraft's `RaftStateMachine` over a shared `CellState`, with
//!   snapshots written to a file in the data directory ([`snapshot_file`]).
//! - [`watch_hub`]: where apply publishes each batch's changes for watches.
//! - [`backup`]: the portable state file (Maintenance.Snapshot, `--restore`).

pub mod backup;
pub mod snapshot_file;
pub mod store;
pub mod watch_hub;

use crate::mvcc::image::KeySpaceImage;
use crate::mvcc::keyspace::KeySpace;
use crate::mvcc::lease_table::{LeaseImage, LeaseTable};
use crate::mvcc::txn::{self, Kv};
use crate::raft::command::{Reply, Request, Response};
use crate::raft::{LogId, StoredMembership};
use imbl::OrdMap;
use latchkey_shared::{ApiError, ErrorCode, LeaseId};
use serde::{Deserialize, Serialize};

/// Attributes a member publishes about itself.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemberAttrs {
    pub name: String,
    pub client_urls: Vec<String>,
}

/// Everything the log has built: keyspace, leases, member attributes and
/// how far the log has been applied.
#[derive(Debug, Clone, Default)]
pub struct CellState {
    pub keys: KeySpace,
    pub leases: LeaseTable,
    pub members: OrdMap<u64, MemberAttrs>,
    pub last_applied: Option<LogId>,
    pub last_membership: StoredMembership,
    /// Client writes applied since this member started or installed a
    /// snapshot (not replicated, not in snapshots): what
    /// `crate::jobs::snapshot_trigger` counts.
    pub writes_applied: u64,
}

/// The serialised form of a [`CellState`]: the snapshot format.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct StateImage {
    pub keys: KeySpaceImage,
    pub leases: Vec<LeaseImage>,
    pub members: Vec<(u64, MemberAttrs)>,
    pub last_applied: Option<LogId>,
    pub last_membership: StoredMembership,
}

/// A stateless mix of the log index into a well-spread positive id, so
/// server-assigned lease ids look like etcd's and do not collide with small
/// client-chosen ones (splitmix64's finaliser).
fn lease_id_candidate(seed: u64) -> i64 {
    let mut z = seed.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    ((z ^ (z >> 31)) & (i64::MAX as u64)) as i64
}

impl CellState {
    /// Applies one client request committed at log `index`.
    pub fn apply(&mut self, index: u64, req: &Request) -> Response {
        let result = self.apply_inner(index, req);
        Response {
            revision: self.keys.revision(),
            result,
        }
    }

    fn kv(&mut self) -> Kv<'_> {
        Kv {
            keys: &mut self.keys,
            leases: &mut self.leases,
        }
    }

    fn apply_inner(&mut self, index: u64, req: &Request) -> Result<Reply, ApiError> {
        match req {
            Request::Put(p) => txn::put(&mut self.kv(), p).map(Reply::Put),
            Request::DeleteRange(d) => txn::delete_range(&mut self.kv(), d).map(Reply::DeleteRange),
            Request::Txn(t) => txn::txn(&mut self.kv(), t).map(Reply::Txn),
            Request::Compact { revision } => self.keys.compact(*revision).map(|_| Reply::Compacted),
            Request::LeaseGrant { id, ttl } => {
                let id = if *id == 0 {
                    let mut candidate = lease_id_candidate(index);
                    while candidate == 0 || self.leases.contains(candidate) {
                        candidate = lease_id_candidate(candidate as u64);
                    }
                    candidate
                } else {
                    *id
                };
                if id < 0 {
                    return Err(ApiError::invalid("lease id must be positive"));
                }
                if self.leases.contains(id) {
                    return Err(ApiError::etcd(ErrorCode::LeaseExists));
                }
                self.leases.insert(id, *ttl);
                Ok(Reply::LeaseGranted { id, ttl: *ttl })
            }
            Request::LeaseRevoke { id } => {
                if !self.leases.contains(*id) {
                    return Err(ApiError::lease_not_found(LeaseId(*id)));
                }
                self.remove_lease(*id);
                Ok(Reply::LeaseRevoked)
            }
            Request::LeaseExpire { ids } => {
                let mut expired = Vec::new();
                for id in ids {
                    if self.leases.contains(*id) {
                        self.remove_lease(*id);
                        expired.push(*id);
                    }
                }
                Ok(Reply::LeasesExpired { expired })
            }
            Request::LeaseCheckpoint { entries } => {
                self.leases.checkpoint(entries);
                Ok(Reply::Checkpointed)
            }
            Request::PublishMember {
                id,
                name,
                client_urls,
            } => {
                self.members.insert(
                    *id,
                    MemberAttrs {
                        name: name.clone(),
                        client_urls: client_urls.clone(),
                    },
                );
                Ok(Reply::Published)
            }
            Request::Batch(reqs) => Ok(Reply::Batch(
                reqs.iter()
                    .map(|r| match r {
                        Request::Batch(_) => Response {
                            revision: self.keys.revision(),
                            result: Err(ApiError::invalid("a batch cannot hold a batch")),
                        },
                        r => self.apply(index, r),
                    })
                    .collect(),
            )),
            Request::Import(keys) => txn::import(&mut self.kv(), keys).map(|()| Reply::Imported),
            Request::RaiseRevision { above } => {
                self.keys.raise_revision(*above);
                Ok(Reply::RevisionRaised)
            }
        }
    }

    /// Removes a lease and deletes all its keys in ONE revision.
    fn remove_lease(&mut self, id: i64) {
        if let Some(lease) = self.leases.remove(id) {
            let keys: Vec<Vec<u8>> = lease.keys.iter().cloned().collect();
            txn::delete_keys(&mut self.kv(), keys);
        }
    }

    pub fn image(&self) -> StateImage {
        StateImage {
            keys: self.keys.image(),
            leases: self.leases.image(),
            members: self.members.iter().map(|(k, v)| (*k, v.clone())).collect(),
            last_applied: self.last_applied,
            last_membership: self.last_membership.clone(),
        }
    }

    pub fn from_image(image: StateImage) -> Self {
        CellState {
            keys: KeySpace::from_image(image.keys),
            leases: LeaseTable::from_image(image.leases),
            members: image.members.into_iter().collect(),
            last_applied: image.last_applied,
            last_membership: image.last_membership,
            writes_applied: 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use latchkey_shared::etcdpb::PbPutRequest;

    fn put(key: &str, lease: i64) -> Request {
        Request::Put(PbPutRequest {
            key: key.into(),
            value: b"v".to_vec(),
            lease,
            ..Default::default()
        })
    }

    #[test]
    fn revoking_a_lease_deletes_all_its_keys_in_one_revision() {
        let mut s = CellState::default();
        let granted = s.apply(1, &Request::LeaseGrant { id: 0, ttl: 10 });
        let Ok(Reply::LeaseGranted { id, .. }) = granted.result else {
            panic!("grant failed: {granted:?}")
        };
        assert!(id > 0);
        for (i, k) in ["a", "b", "c"].iter().enumerate() {
            assert!(s.apply(2 + i as u64, &put(k, id)).result.is_ok());
        }
        assert!(s.apply(5, &put("other", 0)).result.is_ok());
        let before = s.keys.revision();
        let resp = s.apply(
            6,
            &Request::LeaseExpire {
                ids: vec![id, 12345],
            },
        );
        assert!(
            matches!(resp.result, Ok(Reply::LeasesExpired { ref expired }) if expired == &vec![id])
        );
        assert_eq!(s.keys.revision(), before + 1);
        assert_eq!(s.keys.live_keys(), 1);
        assert!(!s.leases.contains(id));
    }

    #[test]
    fn lease_errors_are_the_etcd_ones() {
        let mut s = CellState::default();
        assert!(s
            .apply(1, &Request::LeaseGrant { id: 7, ttl: 10 })
            .result
            .is_ok());
        let dup = s
            .apply(2, &Request::LeaseGrant { id: 7, ttl: 10 })
            .result
            .unwrap_err();
        assert_eq!(dup.code, ErrorCode::LeaseExists);
        let missing = s
            .apply(3, &Request::LeaseRevoke { id: 8 })
            .result
            .unwrap_err();
        assert_eq!(missing.code, ErrorCode::LeaseNotFound);
        let orphan = s.apply(4, &put("k", 8)).result.unwrap_err();
        assert_eq!(orphan.code, ErrorCode::LeaseNotFound);
    }

    /// A log that touches every kind of state: leases chosen by the cell,
    /// keys bound to them, a compaction, an expiry and a checkpoint.
    fn a_log() -> Vec<Request> {
        vec![
            Request::LeaseGrant { id: 0, ttl: 5 },
            Request::LeaseGrant { id: 0, ttl: 5 },
            put("x", 0),
            put("y", 0),
            Request::Compact { revision: 2 },
            Request::LeaseCheckpoint {
                entries: vec![(1, 1500)],
            },
            put("x", 0),
        ]
    }

    fn apply_all(s: &mut CellState, log: &[Request], first_index: u64) -> Vec<String> {
        log.iter()
            .enumerate()
            .map(|(i, r)| format!("{:?}", s.apply(first_index + i as u64, r)))
            .collect()
    }

    fn image_bytes(s: &CellState) -> Vec<u8> {
        crate::storage::codec::encode(&s.image()).expect("image encodes")
    }

    #[test]
    fn a_state_rebuilt_from_a_snapshot_image_applies_the_rest_of_the_log_alike() {
        // One member applies the whole log; another starts from a snapshot
        // image of the first half, as a lagging follower or a restart does.
        let log = a_log();
        let (first, second) = log.split_at(3);
        let mut straight = CellState::default();
        let answers = apply_all(&mut straight, &log, 1);

        let mut half = CellState::default();
        apply_all(&mut half, first, 1);
        let image = crate::storage::codec::decode(&image_bytes(&half)).expect("image decodes");
        let mut restored = CellState::from_image(image);
        let rest = apply_all(&mut restored, second, 1 + first.len() as u64);

        assert_eq!(rest, answers[first.len()..]);
        assert_eq!(image_bytes(&restored), image_bytes(&straight));
    }

    /// Group commit changes nothing a client sees: writes batched into one
    /// entry get the revisions, results and state they would have had in
    /// entries of their own, a failing write among them included.
    #[test]
    fn a_batch_applies_its_writes_as_if_each_had_its_own_entry() {
        let writes = vec![
            Request::LeaseGrant { id: 0, ttl: 5 },
            Request::LeaseGrant { id: 0, ttl: 5 },
            put("x", 0),
            put("orphan", 999),
            put("y", 0),
            Request::Batch(vec![put("nested", 0)]),
            Request::Compact { revision: 2 },
            put("x", 0),
        ];
        let mut single = CellState::default();
        let mut one_by_one: Vec<Response> = writes
            .iter()
            .filter(|w| !matches!(w, Request::Batch(_)))
            .map(|w| single.apply(1, w))
            .collect();
        let mut batched = CellState::default();
        let resp = batched.apply(1, &Request::Batch(writes.clone()));
        let Ok(Reply::Batch(mut results)) = resp.result else {
            panic!("batch failed: {resp:?}")
        };
        assert_eq!(results.len(), writes.len());
        let nested = results.remove(5);
        assert!(nested.result.is_err(), "a nested batch is refused");
        let orphan = one_by_one.remove(3);
        assert_eq!(format!("{:?}", results.remove(3)), format!("{orphan:?}"));
        assert!(orphan.result.is_err());
        assert_eq!(format!("{results:?}"), format!("{one_by_one:?}"));
        assert_eq!(resp.revision, single.keys.revision());
        assert_eq!(image_bytes(&batched), image_bytes(&single));
    }

    #[test]
    fn lease_ids_the_cell_chooses_depend_on_the_log_alone() {
        // Pinned values: an id derived from a clock, a random source or a
        // per-process hash seed would differ from these.
        let mut s = CellState::default();
        let ids: Vec<i64> = [1, 2]
            .map(|index| {
                match s
                    .apply(index, &Request::LeaseGrant { id: 0, ttl: 5 })
                    .result
                {
                    Ok(Reply::LeaseGranted { id, .. }) => id,
                    other => panic!("grant failed: {other:?}"),
                }
            })
            .to_vec();
        assert_eq!(ids, PINNED_LEASE_IDS);
    }

    const PINNED_LEASE_IDS: [i64; 2] = [1_227_844_342_346_046_657, 1_682_153_688_901_572_302];
}
