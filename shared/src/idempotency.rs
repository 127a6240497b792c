//! Retry-safe writes. A client names a write with an idempotency key; the
//! write commits in ONE cell txn together with a record of that key under
//! the reserved prefix (so "every key" listings never show it). A retry
//! finds the record instead of writing again and is answered from it; the
//! same key with a different request is refused. The record is bound to a
//! lease (see the proxy's retention lease), so it expires with it.
//!
//! The record is written by whichever branch the guarded txn takes and
//! holds the request's fingerprint and that branch. What else an answer
//! needs is either known from the record (the write's revision is the
//! record's mod revision; a lock's token is its queue key's create
//! revision) or stored in the record after the commit
//! ([`Guard::remember`]).

use crate::etcd_enums::{CompareResult, CompareTarget};
use crate::etcdpb::{
    PbCompare, PbPutRequest, PbRangeRequest, PbResponseHeader, PbTargetUnion, PbTxnOpRequest,
    PbTxnOpResponse, PbTxnRequest, PbTxnRequestOp, PbTxnResponse,
};
use crate::txn_op::op;
use crate::ApiError;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// Where idempotency records live (inside the reserved prefix).
pub const PREFIX: &[u8] = b"\0latchkey/idempotency/";

/// Longest idempotency key accepted, in bytes.
pub const MAX_KEY_BYTES: usize = 255;

/// Whether `key` can be an idempotency key: 1 to 255 visible ASCII
/// characters.
pub fn check_key(key: &str) -> Result<(), ApiError> {
    if key.is_empty() || key.len() > MAX_KEY_BYTES {
        return Err(ApiError::invalid(format!(
            "an Idempotency-Key is 1 to {MAX_KEY_BYTES} characters, not {}",
            key.len()
        )));
    }
    if !key.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(ApiError::invalid(
            "an Idempotency-Key is visible ASCII characters only (no spaces)",
        ));
    }
    Ok(())
}

/// The lease idempotency records are written with: a plain lease that
/// nobody keeps alive, granted with 1.1 times the retention as its TTL
/// and used for the first tenth of the retention, so every record lives
/// between the retention and 1.1 times it, and the cell deletes the
/// records with their lease (no sweeper). One grant per holder per tenth
/// of the retention.
pub struct RetentionLease {
    retention: std::time::Duration,
    /// The lease in use and when it was granted.
    current: tokio::sync::Mutex<Option<(i64, tokio::time::Instant)>>,
}

impl RetentionLease {
    pub fn new(retention: std::time::Duration) -> Self {
        RetentionLease {
            retention,
            current: tokio::sync::Mutex::new(None),
        }
    }

    /// The lease for a record written now, granted by `grant(ttl_secs)`
    /// when the one in use is older than a tenth of the retention.
    pub async fn lease<F, Fut>(&self, grant: F) -> Result<i64, ApiError>
    where
        F: FnOnce(i64) -> Fut,
        Fut: std::future::Future<Output = Result<i64, ApiError>>,
    {
        let mut current = self.current.lock().await;
        let ttl = self.ttl_secs();
        if let Some((id, granted)) = *current {
            // A record written now must outlive the retention: the lease
            // (counted from before its grant was sent) has ttl - elapsed left.
            let left = std::time::Duration::from_secs(ttl as u64).saturating_sub(granted.elapsed());
            if left > self.retention {
                return Ok(id);
            }
        }
        let granted_at = tokio::time::Instant::now();
        let id = grant(ttl).await?;
        *current = Some((id, granted_at));
        Ok(id)
    }

    /// The lease's TTL: 1.1 times the retention, in whole seconds up.
    fn ttl_secs(&self) -> i64 {
        let ttl = (self.retention.as_secs_f64() * 1.1).ceil() as i64;
        ttl.clamp(1, crate::limits::MAX_TTL_SECS)
    }

    /// Forgets the lease in use, when the cell says it is gone (revoked by
    /// hand, or the cell was restored from an old backup).
    pub async fn forget(&self) {
        *self.current.lock().await = None;
    }
}

/// One request's idempotency: its record's key, its fingerprint and the
/// lease the record is written with.
#[derive(Debug, Clone)]
pub struct Guard {
    record: Vec<u8>,
    fingerprint: String,
    lease: i64,
}

/// What an idempotency record holds.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Record {
    /// SHA-256 of the request, hex.
    pub fingerprint: String,
    /// Which branch the guarded txn took.
    pub succeeded: bool,
    /// The answer, when it could not be rebuilt from the record alone and
    /// was stored after the commit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub answer: Option<serde_json::Value>,
    /// The revision the guarded write committed at (the record's mod
    /// revision when it was written by the txn; not stored).
    #[serde(skip)]
    pub revision: i64,
}

/// What a guarded txn came to.
#[derive(Debug)]
pub enum Outcome {
    /// It ran now: the guarded txn's own response (its header is the outer
    /// txn's).
    Done(PbTxnResponse),
    /// It ran before, under the same key and the same request: its record,
    /// and this txn's header with the revision the write committed at.
    Replay(Record, PbResponseHeader),
}

impl Guard {
    /// The guard of a request: `key` is the client's idempotency key (1 to
    /// 255 visible ASCII characters), `request` every part that makes the
    /// request what it is (method, path, body), `lease` the record's lease.
    pub fn new(key: &str, request: &[&[u8]], lease: i64) -> Result<Self, ApiError> {
        check_key(key)?;
        let mut hash = Sha256::new();
        for part in request {
            // Length-prefixed, so ("ab", "c") and ("a", "bc") differ.
            hash.update((part.len() as u64).to_be_bytes());
            hash.update(part);
        }
        let fingerprint = hash.finalize().iter().map(|b| format!("{b:02x}")).collect();
        Ok(Guard {
            record: [PREFIX, key.as_bytes()].concat(),
            fingerprint,
            lease,
        })
    }

    /// The record's key.
    pub fn record_key(&self) -> &[u8] {
        &self.record
    }

    fn put_record(&self, succeeded: bool) -> PbTxnRequestOp {
        self.put(&Record {
            fingerprint: self.fingerprint.clone(),
            succeeded,
            answer: None,
            revision: 0,
        })
    }

    fn put(&self, record: &Record) -> PbTxnRequestOp {
        op(PbTxnOpRequest::RequestPut(PbPutRequest {
            key: self.record.clone(),
            value: serde_json::to_vec(record).expect("a record encodes"),
            lease: self.lease,
            ..Default::default()
        }))
    }

    /// Whether the record was created at `revision` (0: there is none).
    fn created_at(&self, revision: i64) -> PbCompare {
        PbCompare {
            result: CompareResult::Equal as i32,
            target: CompareTarget::Create as i32,
            key: self.record.clone(),
            range_end: Vec::new(),
            target_union: Some(PbTargetUnion::CreateRevision(revision)),
        }
    }

    /// `txn` guarded: it runs only if this key has no record yet, and the
    /// branch it takes writes the record; otherwise the record is read.
    pub fn guard(&self, mut txn: PbTxnRequest) -> PbTxnRequest {
        txn.success.push(self.put_record(true));
        txn.failure.push(self.put_record(false));
        PbTxnRequest {
            compare: vec![self.created_at(0)],
            success: vec![op(PbTxnOpRequest::RequestTxn(txn))],
            failure: vec![op(PbTxnOpRequest::RequestRange(PbRangeRequest {
                key: self.record.clone(),
                ..Default::default()
            }))],
        }
    }

    /// What the answer to [`guard`](Self::guard)'s txn means: the guarded
    /// txn's response (its record's put removed), a replay of the same
    /// request, or `precondition_failed` for a different request under
    /// the same key.
    pub fn outcome(&self, resp: PbTxnResponse) -> Result<Outcome, ApiError> {
        let header = resp.header.unwrap_or_default();
        let first = resp.responses.into_iter().next().and_then(|r| r.response);
        match (resp.succeeded, first) {
            (true, Some(PbTxnOpResponse::ResponseTxn(mut inner))) => {
                inner.responses.pop();
                inner.header = Some(header);
                Ok(Outcome::Done(inner))
            }
            (false, Some(PbTxnOpResponse::ResponseRange(range))) => {
                let kv = range.kvs.into_iter().next().ok_or_else(|| {
                    ApiError::internal("an idempotency record vanished inside its txn")
                })?;
                let mut record: Record = serde_json::from_slice(&kv.value).map_err(|e| {
                    ApiError::internal(format!("an unreadable idempotency record: {e}"))
                })?;
                if record.fingerprint != self.fingerprint {
                    return Err(ApiError::precondition_failed(
                        "this Idempotency-Key was used for a different request; nothing was done",
                    ));
                }
                record.revision = kv.create_revision;
                let header = PbResponseHeader {
                    revision: kv.create_revision,
                    ..header
                };
                Ok(Outcome::Replay(record, header))
            }
            _ => Err(ApiError::internal(
                "a guarded txn answered neither its txn nor its record",
            )),
        }
    }

    /// A txn that stores `answer` in the record the guarded txn wrote at
    /// `revision` (if it is still that record), for answers the record
    /// alone cannot rebuild.
    pub fn remember(
        &self,
        revision: i64,
        succeeded: bool,
        answer: serde_json::Value,
    ) -> PbTxnRequest {
        let record = Record {
            fingerprint: self.fingerprint.clone(),
            succeeded,
            answer: Some(answer),
            revision: 0,
        };
        PbTxnRequest {
            compare: vec![self.created_at(revision)],
            success: vec![self.put(&record)],
            failure: Vec::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::etcdpb::{PbKeyValue, PbRangeResponse, PbResponseOp, PbTxnOpResponse};

    fn guard(body: &str) -> Guard {
        Guard::new(
            "order-7",
            &[b"POST", b"/v1/locks/a/acquire", body.as_bytes()],
            5,
        )
        .unwrap()
    }

    #[test]
    fn keys_are_visible_ascii_of_bounded_length_and_records_are_reserved() {
        assert!(Guard::new("", &[], 0).is_err());
        assert!(Guard::new("has space", &[], 0).is_err());
        assert!(Guard::new(&"k".repeat(256), &[], 0).is_err());
        let g = guard("{}");
        assert!(crate::key_range::is_reserved(g.record_key()));
        assert!(g.record_key().ends_with(b"order-7"));
    }

    /// Every record lives at least the retention: whenever a record is
    /// written, the lease it gets has at least the retention left.
    #[tokio::test(start_paused = true)]
    async fn a_record_written_at_any_time_outlives_the_retention() {
        use std::sync::Mutex;
        use std::time::Duration;
        let retention = Duration::from_secs(10);
        let leases = RetentionLease::new(retention);
        // Each grant: its id, its TTL and when it was asked for.
        let grants: Mutex<Vec<(i64, i64, tokio::time::Instant)>> = Mutex::new(Vec::new());
        let start = tokio::time::Instant::now();
        for step in 0..300u64 {
            tokio::time::advance(Duration::from_millis(50)).await;
            let id = leases
                .lease(|ttl| {
                    let mut g = grants.lock().unwrap();
                    let id = g.len() as i64 + 1;
                    g.push((id, ttl, tokio::time::Instant::now()));
                    async move { Ok(id) }
                })
                .await
                .unwrap();
            let g = grants.lock().unwrap();
            let (_, ttl, at) = g[id as usize - 1];
            let left = Duration::from_secs(ttl as u64).saturating_sub(at.elapsed());
            assert!(
                left >= retention,
                "a record written {:?} in lives {left:?}, under the {retention:?} retention",
                start.elapsed()
            );
            // ...and at most 1.1 times it (plus the second TTLs round to).
            assert!(
                left <= retention + retention / 10 + Duration::from_secs(1),
                "{step}"
            );
        }
        // One grant per tenth of the retention or so, not one per record.
        let n = grants.lock().unwrap().len();
        assert!((10..=20).contains(&n), "{n} grants in 15 s");
    }

    #[test]
    fn the_fingerprint_covers_every_part_and_their_boundaries() {
        let a = Guard::new("k", &[b"ab", b"c"], 0).unwrap();
        let b = Guard::new("k", &[b"a", b"bc"], 0).unwrap();
        let c = Guard::new("k", &[b"ab", b"c"], 9).unwrap();
        assert_ne!(a.fingerprint, b.fingerprint);
        assert_eq!(a.fingerprint, c.fingerprint);
    }

    /// The answer a cell gives when the record already exists.
    fn record_found(record: &Record, created: i64) -> PbTxnResponse {
        PbTxnResponse {
            succeeded: false,
            responses: vec![PbResponseOp {
                response: Some(PbTxnOpResponse::ResponseRange(PbRangeResponse {
                    kvs: vec![PbKeyValue {
                        create_revision: created,
                        value: serde_json::to_vec(record).unwrap(),
                        ..Default::default()
                    }],
                    count: 1,
                    ..Default::default()
                })),
            }],
            ..Default::default()
        }
    }

    #[test]
    fn a_retry_replays_and_a_different_request_is_refused() {
        let g = guard(r#"{"session_id":"1"}"#);
        let txn = g.guard(PbTxnRequest::default());
        assert_eq!(txn.success.len(), 1, "the guarded txn is nested");
        let stored = Record {
            fingerprint: g.fingerprint.clone(),
            succeeded: true,
            answer: None,
            revision: 0,
        };
        match g.outcome(record_found(&stored, 41)).unwrap() {
            Outcome::Replay(r, header) => {
                assert_eq!((r.succeeded, r.revision, header.revision), (true, 41, 41))
            }
            other => panic!("{other:?}"),
        }
        let other = guard(r#"{"session_id":"2"}"#);
        let err = other.outcome(record_found(&stored, 41)).unwrap_err();
        assert_eq!(err.code, crate::ErrorCode::PreconditionFailed);
    }
}
