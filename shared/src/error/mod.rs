//! The one error model for every latchkey API.
//!
//! An [`ApiError`] is created where a failure happens, through the named
//! constructor of its code (`ApiError::lease_not_found(id)`), and carries
//! what the caller needs: a [`Detail`] such as the leader to go to or the
//! compact revision. [`ErrorCode`] (in `code.rs`) is the single table that
//! maps each code to an HTTP status, a gRPC code, etcd's error text and a
//! [`Retry`] class. `grpc.rs` turns an `ApiError` into a `tonic::Status`
//! and back, and classifies failed calls (did the request leave this
//! process?).
//! `http.rs` (feature `http`) answers an `ApiError` over HTTP with the
//! table's status and the JSON body.
//!
//! An `ApiError` also crosses the peer wire inside bincode payloads, so
//! codes and details are encoded by name, never by declaration order.

mod code;
mod grpc;
#[cfg(feature = "http")]
mod http;

pub use code::{ErrorCode, ErrorWire, Retry};
pub use grpc::{classify_call_failure, metadata_keys};

use crate::lease_id::LeaseId;
use crate::member_id::MemberId;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::fmt;

/// What a caller needs beyond the code.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Detail {
    /// Where to send the request instead, when this member knows.
    NotLeader { leader: Option<u64> },
    /// The oldest revision still readable.
    Compacted { compact_revision: i64 },
    /// How long to wait before trying again (a rate limit).
    RetryAfter { ms: u64 },
}

impl Detail {
    /// The stable name of the detail's kind (its wire encoding).
    pub fn kind(&self) -> &'static str {
        match self {
            Detail::NotLeader { .. } => "not_leader",
            Detail::Compacted { .. } => "compacted",
            Detail::RetryAfter { .. } => "retry_after",
        }
    }
}

/// Encoded as `(kind name, payload)`, so reordering or adding variants
/// never changes what an existing detail decodes to.
impl Serialize for Detail {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeTuple;
        let mut t = serializer.serialize_tuple(2)?;
        t.serialize_element(self.kind())?;
        match self {
            Detail::NotLeader { leader } => t.serialize_element(leader)?,
            Detail::Compacted { compact_revision } => t.serialize_element(compact_revision)?,
            Detail::RetryAfter { ms } => t.serialize_element(ms)?,
        }
        t.end()
    }
}

impl<'de> Deserialize<'de> for Detail {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        use serde::de::{Error, SeqAccess, Visitor};
        struct Tagged;
        impl<'de> Visitor<'de> for Tagged {
            type Value = Detail;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("an error detail as (kind, payload)")
            }

            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Detail, A::Error> {
                let kind: String = seq
                    .next_element()?
                    .ok_or_else(|| A::Error::invalid_length(0, &self))?;
                let missing = || A::Error::invalid_length(1, &Tagged);
                match kind.as_str() {
                    "not_leader" => Ok(Detail::NotLeader {
                        leader: seq.next_element()?.ok_or_else(missing)?,
                    }),
                    "compacted" => Ok(Detail::Compacted {
                        compact_revision: seq.next_element()?.ok_or_else(missing)?,
                    }),
                    "retry_after" => Ok(Detail::RetryAfter {
                        ms: seq.next_element()?.ok_or_else(missing)?,
                    }),
                    other => Err(A::Error::custom(format!("unknown error detail {other:?}"))),
                }
            }
        }
        deserializer.deserialize_tuple(2, Tagged)
    }
}

/// An error with its code, a human-readable message and, where the caller
/// needs more, a detail.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
pub struct ApiError {
    pub code: ErrorCode,
    pub message: String,
    pub detail: Option<Detail>,
}

impl fmt::Display for ApiError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.code.as_str(), self.message)
    }
}

/// etcd's watch API reports its mvcc errors without the `etcdserver: `
/// prefix its gRPC statuses carry (a watch cancel reason is not a status).
fn mvcc_text(code: ErrorCode) -> &'static str {
    let text = code.etcd_text().unwrap_or(code.as_str());
    text.strip_prefix("etcdserver: ").unwrap_or(text)
}

impl ApiError {
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        ApiError {
            code,
            message: message.into(),
            detail: None,
        }
    }

    /// An error whose message is etcd's own text for the code (the name,
    /// where etcd has none).
    pub fn etcd(code: ErrorCode) -> Self {
        ApiError::new(code, code.etcd_text().unwrap_or(code.as_str()))
    }

    /// The same error with a more specific message.
    pub fn with_message(mut self, message: impl Into<String>) -> Self {
        self.message = message.into();
        self
    }

    pub fn with_detail(mut self, detail: Detail) -> Self {
        self.detail = Some(detail);
        self
    }

    /// What the caller may do next; see [`Retry`].
    pub fn retry(&self) -> Retry {
        self.code.retry()
    }

    /// True when this member is broken and should be ejected.
    pub fn is_member_fault(&self) -> bool {
        self.code.is_member_fault()
    }

    /// The leader named by a `not_leader` error, when known.
    pub fn leader_hint(&self) -> Option<u64> {
        match self.detail {
            Some(Detail::NotLeader { leader }) => leader,
            _ => None,
        }
    }

    /// How long a `rate_limited` error asks the caller to wait.
    pub fn retry_after(&self) -> Option<std::time::Duration> {
        match self.detail {
            Some(Detail::RetryAfter { ms }) => Some(std::time::Duration::from_millis(ms)),
            _ => None,
        }
    }

    /// The compact revision named by a `compacted` error.
    pub fn compact_revision(&self) -> Option<i64> {
        match self.detail {
            Some(Detail::Compacted { compact_revision }) => Some(compact_revision),
            _ => None,
        }
    }

    /// The text a gRPC client sees: etcd's text where etcd has one, so
    /// etcd client libraries map it to their typed errors.
    pub fn grpc_message(&self) -> &str {
        self.code.etcd_text().unwrap_or(&self.message)
    }

    /// The JSON body of the HTTP API: `{"error", "message", "retry"}` plus
    /// the detail's fields (`leader`, `compact_revision`).
    pub fn json_body(&self) -> serde_json::Value {
        let mut body = serde_json::json!({
            "error": self.code.as_str(),
            "message": self.message,
            "retry": self.retry().as_str(),
        });
        match self.detail {
            Some(Detail::NotLeader { leader }) => body["leader"] = leader.into(),
            Some(Detail::Compacted { compact_revision }) => {
                body["compact_revision"] = compact_revision.into()
            }
            Some(Detail::RetryAfter { ms }) => body["retry_after_ms"] = ms.into(),
            None => {}
        }
        body
    }

    // --- one named constructor per code, in table order ---

    /// A session's lease has expired or was revoked.
    pub fn session_expired(id: LeaseId) -> Self {
        ApiError::new(
            ErrorCode::SessionExpired,
            format!("session {id} has expired"),
        )
    }

    pub fn lease_not_found(id: LeaseId) -> Self {
        ApiError::new(ErrorCode::LeaseNotFound, format!("lease {id} not found"))
    }

    pub fn lease_exists(id: LeaseId) -> Self {
        ApiError::new(ErrorCode::LeaseExists, format!("lease {id} already exists"))
    }

    pub fn lease_ttl_too_large() -> Self {
        ApiError::etcd(ErrorCode::LeaseTtlTooLarge)
    }

    /// This member does not lead; `leader` is the member that does, if
    /// known.
    pub fn not_leader(leader: Option<u64>) -> Self {
        let message = match leader {
            Some(id) => format!("not the leader; member {} leads", MemberId(id)),
            None => "not the leader; the leader is not known".to_string(),
        };
        ApiError::new(ErrorCode::NotLeader, message).with_detail(Detail::NotLeader { leader })
    }

    pub fn no_leader() -> Self {
        ApiError::etcd(ErrorCode::NoLeader)
    }

    /// Raft on this member has stopped (`why`).
    pub fn member_stopped(why: impl fmt::Display) -> Self {
        ApiError::new(
            ErrorCode::MemberStopped,
            format!("raft on this member has stopped: {why}"),
        )
    }

    /// A read or watch asked for history older than `compact_revision`.
    /// The message is the text etcd's watch API uses as a cancel reason.
    pub fn compacted(compact_revision: i64) -> Self {
        ApiError::new(
            ErrorCode::Compacted,
            format!(
                "{} (compact revision {compact_revision})",
                mvcc_text(ErrorCode::Compacted)
            ),
        )
        .with_detail(Detail::Compacted { compact_revision })
    }

    pub fn future_revision() -> Self {
        ApiError::etcd(ErrorCode::FutureRevision)
    }

    pub fn precondition_failed(message: impl Into<String>) -> Self {
        ApiError::new(ErrorCode::PreconditionFailed, message)
    }

    pub fn election_not_leader() -> Self {
        ApiError::new(
            ErrorCode::ElectionNotLeader,
            "this leader key no longer leads the election",
        )
    }

    pub fn election_no_leader(name: &[u8]) -> Self {
        ApiError::new(
            ErrorCode::ElectionNoLeader,
            format!(
                "nobody leads the election {:?}",
                String::from_utf8_lossy(name)
            ),
        )
    }

    pub fn lock_timeout(message: impl Into<String>) -> Self {
        ApiError::new(ErrorCode::LockTimeout, message)
    }

    /// Keys this cell does not own (the directory routes them elsewhere).
    pub fn wrong_cell(message: impl Into<String>) -> Self {
        ApiError::new(ErrorCode::WrongCell, message)
    }

    /// Keys of more than one cell in one request.
    pub fn cross_cell(message: impl Into<String>) -> Self {
        ApiError::new(ErrorCode::CrossCell, message)
    }

    pub fn quota_exceeded(message: impl Into<String>) -> Self {
        ApiError::new(ErrorCode::QuotaExceeded, message)
    }

    pub fn value_too_large(len: usize, limit: usize) -> Self {
        ApiError::new(
            ErrorCode::ValueTooLarge,
            format!("value of {len} bytes exceeds the limit of {limit} bytes"),
        )
    }

    pub fn request_too_large() -> Self {
        ApiError::etcd(ErrorCode::RequestTooLarge)
    }

    /// grpc-go's text for a message over the transport's limit.
    pub fn message_too_large(len: usize, max: usize) -> Self {
        ApiError::new(
            ErrorCode::MessageTooLarge,
            format!("grpc: received message larger than max ({len} vs. {max})"),
        )
    }

    pub fn key_not_found() -> Self {
        ApiError::etcd(ErrorCode::KeyNotFound)
    }

    pub fn key_not_provided() -> Self {
        ApiError::etcd(ErrorCode::KeyNotProvided)
    }

    pub fn value_provided() -> Self {
        ApiError::etcd(ErrorCode::ValueProvided)
    }

    pub fn lease_provided() -> Self {
        ApiError::etcd(ErrorCode::LeaseProvided)
    }

    pub fn too_many_txn_ops() -> Self {
        ApiError::etcd(ErrorCode::TooManyTxnOps)
    }

    pub fn duplicate_key() -> Self {
        ApiError::etcd(ErrorCode::DuplicateKey)
    }

    /// The message is etcd's watch cancel reason for the error.
    pub fn watch_id_exists() -> Self {
        ApiError::new(
            ErrorCode::WatchIdExists,
            mvcc_text(ErrorCode::WatchIdExists),
        )
    }

    pub fn invalid(message: impl Into<String>) -> Self {
        ApiError::new(ErrorCode::InvalidArgument, message)
    }

    pub fn auth_not_enabled() -> Self {
        ApiError::etcd(ErrorCode::AuthNotEnabled)
    }

    /// The same answer for an unknown user and a wrong password.
    pub fn auth_failed() -> Self {
        ApiError::etcd(ErrorCode::AuthFailed)
    }

    /// `why` is for logs and the HTTP body; gRPC clients see etcd's text.
    pub fn invalid_auth_token(why: impl Into<String>) -> Self {
        ApiError::new(ErrorCode::InvalidAuthToken, why)
    }

    pub fn user_empty() -> Self {
        ApiError::new(
            ErrorCode::UserEmpty,
            "authentication is on and the request carries no token: authenticate first",
        )
    }

    pub fn permission_denied(message: impl Into<String>) -> Self {
        ApiError::new(ErrorCode::PermissionDenied, message)
    }

    /// Too many attempts of `what`; try again after `wait`.
    pub fn rate_limited(what: &str, wait: std::time::Duration) -> Self {
        ApiError::new(
            ErrorCode::RateLimited,
            format!(
                "too many {what}; try again in {} ms",
                wait.as_millis().max(1)
            ),
        )
        .with_detail(Detail::RetryAfter {
            ms: wait.as_millis().max(1) as u64,
        })
    }

    pub fn user_exists(name: &str) -> Self {
        ApiError::new(
            ErrorCode::UserExists,
            format!("user {name:?} already exists"),
        )
    }

    pub fn tenant_not_found(name: &str) -> Self {
        ApiError::new(
            ErrorCode::TenantNotFound,
            format!("tenant {name:?} not found"),
        )
    }

    pub fn user_not_found(name: &str) -> Self {
        ApiError::new(ErrorCode::UserNotFound, format!("user {name:?} not found"))
    }

    pub fn role_exists(name: &str) -> Self {
        ApiError::new(
            ErrorCode::RoleExists,
            format!("role {name:?} already exists"),
        )
    }

    pub fn role_not_found(name: &str) -> Self {
        ApiError::new(ErrorCode::RoleNotFound, format!("role {name:?} not found"))
    }

    pub fn role_empty() -> Self {
        ApiError::etcd(ErrorCode::RoleEmpty)
    }

    pub fn role_not_granted(user: &str, role: &str) -> Self {
        ApiError::new(
            ErrorCode::RoleNotGranted,
            format!("role {role:?} is not granted to user {user:?}"),
        )
    }

    pub fn permission_not_granted(role: &str) -> Self {
        ApiError::new(
            ErrorCode::PermissionNotGranted,
            format!("role {role:?} has no such permission"),
        )
    }

    pub fn root_user_not_exist() -> Self {
        ApiError::etcd(ErrorCode::RootUserNotExist)
    }

    pub fn root_role_not_exist() -> Self {
        ApiError::etcd(ErrorCode::RootRoleNotExist)
    }

    pub fn invalid_auth_mgmt(why: impl Into<String>) -> Self {
        ApiError::new(ErrorCode::InvalidAuthMgmt, why)
    }

    pub fn member_not_found(id: MemberId) -> Self {
        ApiError::new(ErrorCode::MemberNotFound, format!("member {id} not found"))
    }

    pub fn member_exists(id: MemberId) -> Self {
        ApiError::new(
            ErrorCode::MemberExists,
            format!("member {id} already exists"),
        )
    }

    pub fn peer_url_exists(url: &str) -> Self {
        ApiError::new(
            ErrorCode::PeerUrlExists,
            format!("peer URL {url} is already in use"),
        )
    }

    pub fn member_bad_urls(why: impl Into<String>) -> Self {
        ApiError::new(ErrorCode::MemberBadUrls, why)
    }

    pub fn member_not_learner(id: MemberId) -> Self {
        ApiError::new(
            ErrorCode::MemberNotLearner,
            format!("member {id} is not a learner"),
        )
    }

    pub fn not_enough_started_members(why: impl Into<String>) -> Self {
        ApiError::new(ErrorCode::NotEnoughStartedMembers, why)
    }

    pub fn learner_not_ready(id: MemberId) -> Self {
        ApiError::new(
            ErrorCode::LearnerNotReady,
            format!("learner {id} has not caught up with the leader"),
        )
    }

    pub fn bad_leader_transferee() -> Self {
        ApiError::etcd(ErrorCode::BadLeaderTransferee)
    }

    pub fn leader_transfer_timeout() -> Self {
        ApiError::etcd(ErrorCode::LeaderTransferTimeout)
    }

    /// Not servable now; nothing was sent or proposed.
    pub fn unavailable(message: impl Into<String>) -> Self {
        ApiError::new(ErrorCode::Unavailable, message)
    }

    pub fn timeout() -> Self {
        ApiError::etcd(ErrorCode::Timeout)
    }

    /// A request was sent and the connection broke before its answer.
    pub fn write_outcome_unknown(why: impl fmt::Display) -> Self {
        ApiError::new(
            ErrorCode::WriteOutcomeUnknown,
            format!("the request may or may not have been applied: {why}"),
        )
    }

    /// An RPC or feature this latchkey version does not serve.
    pub fn unimplemented(what: &str) -> Self {
        ApiError::new(
            ErrorCode::Unimplemented,
            format!("{what} is not supported by this latchkey version"),
        )
    }

    /// A watcher dropped for falling behind; `resume_from` is the first
    /// revision it has not been sent.
    pub fn watch_too_slow(resume_from: i64) -> Self {
        ApiError::new(
            ErrorCode::WatchTooSlow,
            format!(
                "watcher too slow: it fell behind and was dropped; watch again from revision {resume_from}"
            ),
        )
    }

    /// A watch refused: `scope` already holds `limit` watches.
    pub fn too_many_watches(scope: &str, limit: usize) -> Self {
        ApiError::new(
            ErrorCode::TooManyWatches,
            format!("{TOO_MANY_WATCHES} {scope} (limit {limit}); cancel some, or open another"),
        )
    }

    /// Whether a watch's cancel reason (etcd carries no code there) is
    /// [`too_many_watches`](Self::too_many_watches)'s.
    pub fn is_too_many_watches(reason: &str) -> bool {
        reason.starts_with(TOO_MANY_WATCHES)
    }

    pub fn route_not_found(method: &str, path: &str) -> Self {
        ApiError::new(
            ErrorCode::RouteNotFound,
            format!("no route {method} {path}; the routes are listed at /v1/openapi.json"),
        )
    }

    pub fn method_not_allowed(method: &str, path: &str) -> Self {
        ApiError::new(
            ErrorCode::MethodNotAllowed,
            format!("{path} does not take {method}; see /v1/openapi.json"),
        )
    }

    pub fn internal(message: impl Into<String>) -> Self {
        ApiError::new(ErrorCode::Internal, message)
    }
}

/// How a refusal for too many watches begins.
const TOO_MANY_WATCHES: &str = "too many watches on";

#[cfg(test)]
mod tests {
    use super::*;

    /// One error per code, built by its named constructor (with a detail
    /// where the code has one).
    pub(crate) fn one_of_each() -> Vec<ApiError> {
        ErrorCode::ALL
            .iter()
            .map(|&code| match code {
                ErrorCode::SessionExpired => ApiError::session_expired(LeaseId(0x1f)),
                ErrorCode::LeaseNotFound => ApiError::lease_not_found(LeaseId(0x1f)),
                ErrorCode::LeaseExists => ApiError::lease_exists(LeaseId(0x1f)),
                ErrorCode::LeaseTtlTooLarge => ApiError::lease_ttl_too_large(),
                ErrorCode::NotLeader => ApiError::not_leader(Some(3)),
                ErrorCode::NoLeader => ApiError::no_leader(),
                ErrorCode::MemberStopped => ApiError::member_stopped("fatal"),
                ErrorCode::Compacted => ApiError::compacted(7),
                ErrorCode::FutureRevision => ApiError::future_revision(),
                ErrorCode::PreconditionFailed => ApiError::precondition_failed("version 2"),
                ErrorCode::LockTimeout => ApiError::lock_timeout("held by another"),
                ErrorCode::ElectionNotLeader => ApiError::election_not_leader(),
                ErrorCode::ElectionNoLeader => ApiError::election_no_leader(b"e"),
                ErrorCode::QuotaExceeded => ApiError::quota_exceeded("2 GiB"),
                ErrorCode::ValueTooLarge => ApiError::value_too_large(70_000, 65_536),
                ErrorCode::RequestTooLarge => ApiError::request_too_large(),
                ErrorCode::MessageTooLarge => ApiError::message_too_large(3_000_000, 2_097_152),
                ErrorCode::KeyNotFound => ApiError::key_not_found(),
                ErrorCode::KeyNotProvided => ApiError::key_not_provided(),
                ErrorCode::ValueProvided => ApiError::value_provided(),
                ErrorCode::LeaseProvided => ApiError::lease_provided(),
                ErrorCode::TooManyTxnOps => ApiError::too_many_txn_ops(),
                ErrorCode::DuplicateKey => ApiError::duplicate_key(),
                ErrorCode::WatchIdExists => ApiError::watch_id_exists(),
                ErrorCode::InvalidArgument => ApiError::invalid("limit must not be negative"),
                ErrorCode::WrongCell => ApiError::wrong_cell("keys of cell b"),
                ErrorCode::CrossCell => ApiError::cross_cell("keys of cells b and home"),
                ErrorCode::WatchTooSlow => ApiError::watch_too_slow(12),
                ErrorCode::TooManyWatches => ApiError::too_many_watches("one stream", 10),
                ErrorCode::AuthNotEnabled => ApiError::auth_not_enabled(),
                ErrorCode::AuthFailed => ApiError::auth_failed(),
                ErrorCode::InvalidAuthToken => ApiError::invalid_auth_token("expired"),
                ErrorCode::UserEmpty => ApiError::user_empty(),
                ErrorCode::PermissionDenied => ApiError::permission_denied("read config/"),
                ErrorCode::RateLimited => {
                    ApiError::rate_limited("attempts", std::time::Duration::from_millis(250))
                }
                ErrorCode::TenantNotFound => ApiError::tenant_not_found("acme"),
                ErrorCode::UserExists => ApiError::user_exists("alice"),
                ErrorCode::UserNotFound => ApiError::user_not_found("alice"),
                ErrorCode::RoleExists => ApiError::role_exists("ops"),
                ErrorCode::RoleNotFound => ApiError::role_not_found("ops"),
                ErrorCode::RoleEmpty => ApiError::role_empty(),
                ErrorCode::RoleNotGranted => ApiError::role_not_granted("alice", "ops"),
                ErrorCode::PermissionNotGranted => ApiError::permission_not_granted("ops"),
                ErrorCode::RootUserNotExist => ApiError::root_user_not_exist(),
                ErrorCode::RootRoleNotExist => ApiError::root_role_not_exist(),
                ErrorCode::InvalidAuthMgmt => ApiError::invalid_auth_mgmt("root stays"),
                ErrorCode::MemberNotFound => ApiError::member_not_found(MemberId(0xa)),
                ErrorCode::MemberExists => ApiError::member_exists(MemberId(0xa)),
                ErrorCode::PeerUrlExists => ApiError::peer_url_exists("http://a:7901"),
                ErrorCode::MemberBadUrls => ApiError::member_bad_urls("no port"),
                ErrorCode::MemberNotLearner => ApiError::member_not_learner(MemberId(0xa)),
                ErrorCode::LearnerNotReady => ApiError::learner_not_ready(MemberId(0xa)),
                ErrorCode::NotEnoughStartedMembers => {
                    ApiError::not_enough_started_members("1 of 3 voters up")
                }
                ErrorCode::BadLeaderTransferee => ApiError::bad_leader_transferee(),
                ErrorCode::LeaderTransferTimeout => ApiError::leader_transfer_timeout(),
                ErrorCode::Unavailable => ApiError::unavailable("membership change running"),
                ErrorCode::Timeout => ApiError::timeout(),
                ErrorCode::WriteOutcomeUnknown => ApiError::write_outcome_unknown("reset"),
                ErrorCode::Unimplemented => ApiError::unimplemented("HashKV"),
                ErrorCode::RouteNotFound => ApiError::route_not_found("GET", "/v1/nope"),
                ErrorCode::MethodNotAllowed => ApiError::method_not_allowed("PATCH", "/v1/txn"),
                ErrorCode::Internal => ApiError::internal("bug"),
            })
            .collect()
    }

    #[test]
    fn each_named_constructor_builds_its_code() {
        for (e, &code) in one_of_each().iter().zip(ErrorCode::ALL) {
            assert_eq!(e.code, code);
            assert!(!e.message.is_empty(), "{code}");
        }
    }

    #[test]
    fn lease_ids_are_hex_in_messages() {
        assert_eq!(
            ApiError::lease_not_found(LeaseId(0x694d5765fc71500b)).message,
            "lease 694d5765fc71500b not found"
        );
    }

    #[test]
    fn compacted_message_is_etcds_watch_cancel_reason() {
        let e = ApiError::compacted(7);
        assert_eq!(
            e.message,
            "mvcc: required revision has been compacted (compact revision 7)"
        );
        assert_eq!(e.compact_revision(), Some(7));
        assert_eq!(
            ApiError::watch_id_exists().message,
            "mvcc: duplicate watch ID provided"
        );
    }

    #[test]
    fn etcd_errors_keep_etcd_text_on_the_wire() {
        let e = ApiError::compacted(3);
        let status: tonic::Status = e.into();
        assert_eq!(status.code(), tonic::Code::OutOfRange);
        assert_eq!(
            status.message(),
            "etcdserver: mvcc: required revision has been compacted"
        );
    }

    #[test]
    fn errors_without_etcd_text_keep_their_message() {
        let e = ApiError::value_too_large(70_000, 65_536);
        let status: tonic::Status = e.clone().into();
        assert_eq!(status.code(), tonic::Code::InvalidArgument);
        assert_eq!(
            status.message(),
            "value of 70000 bytes exceeds the limit of 65536 bytes"
        );
        assert_eq!(e.json_body()["error"], "value_too_large");
    }

    #[test]
    fn json_body_carries_retry_and_detail() {
        let body = ApiError::not_leader(Some(3)).json_body();
        assert_eq!(body["error"], "not_leader");
        assert_eq!(body["retry"], "safe");
        assert_eq!(body["leader"], 3);
        let body = ApiError::not_leader(None).json_body();
        assert!(body["leader"].is_null());
        let body = ApiError::compacted(7).json_body();
        assert_eq!(body["compact_revision"], 7);
        assert_eq!(body["retry"], "never");
        let body = ApiError::timeout().json_body();
        assert_eq!(body["retry"], "outcome_unknown");
        assert!(body.get("leader").is_none());
    }

    #[test]
    fn bincode_round_trip_of_every_code_and_detail() {
        let mut errors = one_of_each();
        errors.push(ApiError::not_leader(None));
        errors.push(ApiError::new(ErrorCode::NotLeader, "no detail"));
        for e in errors {
            let bytes = bincode::serialize(&e).expect("encode");
            let back: ApiError = bincode::deserialize(&bytes).expect("decode");
            assert_eq!(back, e);
        }
    }

    /// Fails if codes or details are ever encoded by position: moving a
    /// variant in the table must not change what old bytes decode to.
    #[test]
    fn codes_and_details_are_encoded_by_name() {
        fn contains(hay: &[u8], needle: &[u8]) -> bool {
            hay.windows(needle.len()).any(|w| w == needle)
        }
        for &code in ErrorCode::ALL {
            let bytes = bincode::serialize(&code).expect("encode");
            assert!(contains(&bytes, code.as_str().as_bytes()), "{code}");
        }
        // A fixed encoding, written out by hand: length-prefixed name.
        let mut expected = (9u64).to_le_bytes().to_vec();
        expected.extend_from_slice(b"compacted");
        assert_eq!(
            bincode::serialize(&ErrorCode::Compacted).expect("encode"),
            expected
        );
        for detail in [
            Detail::NotLeader { leader: Some(3) },
            Detail::Compacted {
                compact_revision: 7,
            },
        ] {
            let bytes = bincode::serialize(&detail).expect("encode");
            assert!(contains(&bytes, detail.kind().as_bytes()), "{detail:?}");
        }
    }

    #[test]
    fn unknown_names_fail_to_decode() {
        let bytes = bincode::serialize("no_such_code").expect("encode");
        assert!(bincode::deserialize::<ErrorCode>(&bytes).is_err());
        let bytes = bincode::serialize(&("no_such_detail", 1i64)).expect("encode");
        assert!(bincode::deserialize::<Detail>(&bytes).is_err());
    }

    #[test]
    fn json_encoding_is_by_name_too() {
        let e = ApiError::compacted(7);
        let text = serde_json::to_string(&e).expect("encode");
        assert!(text.contains("\"compacted\""), "{text}");
        let back: ApiError = serde_json::from_str(&text).expect("decode");
        assert_eq!(back, e);
    }
}
