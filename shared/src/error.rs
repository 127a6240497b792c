//! The one error model for every latchkey API.
//!
//! An [`ApiError`] is created where a failure happens and carries what the
//! caller needs. [`ErrorCode`] is the single table that maps each kind of
//! error to an HTTP status, a gRPC code and, where etcd has one, the exact
//! etcd error text: etcd client libraries recognise errors by that text, so
//! it must match etcd's byte for byte.

use serde::{Deserialize, Serialize};
use std::fmt;

/// Stable, documented error codes. The `snake_case` name is the `error`
/// field of the JSON body `{"error": code, "message": ...}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorCode {
    SessionExpired,
    LeaseNotFound,
    LeaseExists,
    NotLeader,
    NoLeader,
    Compacted,
    FutureRevision,
    PreconditionFailed,
    LockTimeout,
    QuotaExceeded,
    ValueTooLarge,
    RequestTooLarge,
    KeyNotFound,
    MemberNotFound,
    MemberExists,
    PeerUrlExists,
    MemberBadUrls,
    MemberNotLearner,
    LearnerNotReady,
    InvalidArgument,
    Unavailable,
    Timeout,
    Unimplemented,
    Internal,
}

/// gRPC status codes as numbers, so this crate does not tie the table to
/// one tonic version (`tonic::Code::from_i32` converts them).
pub mod grpc_code {
    pub const INVALID_ARGUMENT: i32 = 3;
    pub const NOT_FOUND: i32 = 5;
    pub const RESOURCE_EXHAUSTED: i32 = 8;
    pub const FAILED_PRECONDITION: i32 = 9;
    pub const OUT_OF_RANGE: i32 = 11;
    pub const UNIMPLEMENTED: i32 = 12;
    pub const INTERNAL: i32 = 13;
    pub const UNAVAILABLE: i32 = 14;
    pub const DEADLINE_EXCEEDED: i32 = 4;
}

/// One row of the error table.
#[derive(Debug, Clone, Copy)]
pub struct ErrorWire {
    pub http_status: u16,
    pub grpc_code: i32,
    /// etcd's own error text; `None` where etcd has no such error.
    pub etcd_text: Option<&'static str>,
}

impl ErrorCode {
    /// THE table: error code -> HTTP status, gRPC code, etcd text.
    pub const fn wire(self) -> ErrorWire {
        use grpc_code::*;
        let (http_status, grpc_code, etcd_text) = match self {
            ErrorCode::SessionExpired => (
                404,
                NOT_FOUND,
                Some("etcdserver: requested lease not found"),
            ),
            ErrorCode::LeaseNotFound => (
                404,
                NOT_FOUND,
                Some("etcdserver: requested lease not found"),
            ),
            ErrorCode::LeaseExists => (
                409,
                FAILED_PRECONDITION,
                Some("etcdserver: lease already exists"),
            ),
            ErrorCode::NotLeader => (503, UNAVAILABLE, Some("etcdserver: not leader")),
            ErrorCode::NoLeader => (503, UNAVAILABLE, Some("etcdserver: no leader")),
            ErrorCode::Compacted => (
                410,
                OUT_OF_RANGE,
                Some("etcdserver: mvcc: required revision has been compacted"),
            ),
            ErrorCode::FutureRevision => (
                400,
                OUT_OF_RANGE,
                Some("etcdserver: mvcc: required revision is a future revision"),
            ),
            ErrorCode::PreconditionFailed => (412, FAILED_PRECONDITION, None),
            ErrorCode::LockTimeout => (408, DEADLINE_EXCEEDED, None),
            ErrorCode::QuotaExceeded => (
                507,
                RESOURCE_EXHAUSTED,
                Some("etcdserver: mvcc: database space exceeded"),
            ),
            ErrorCode::ValueTooLarge => (413, INVALID_ARGUMENT, None),
            ErrorCode::RequestTooLarge => (
                413,
                INVALID_ARGUMENT,
                Some("etcdserver: request is too large"),
            ),
            ErrorCode::KeyNotFound => (404, INVALID_ARGUMENT, Some("etcdserver: key not found")),
            ErrorCode::MemberNotFound => (404, NOT_FOUND, Some("etcdserver: member not found")),
            ErrorCode::MemberExists => (
                409,
                FAILED_PRECONDITION,
                Some("etcdserver: member ID already exist"),
            ),
            ErrorCode::PeerUrlExists => (
                409,
                FAILED_PRECONDITION,
                Some("etcdserver: Peer URLs already exists"),
            ),
            ErrorCode::MemberBadUrls => (
                400,
                INVALID_ARGUMENT,
                Some("etcdserver: given member URLs are invalid"),
            ),
            ErrorCode::MemberNotLearner => (
                409,
                FAILED_PRECONDITION,
                Some("etcdserver: can only promote a learner member"),
            ),
            ErrorCode::LearnerNotReady => (
                409,
                FAILED_PRECONDITION,
                Some("etcdserver: can only promote a learner member which is in sync with leader"),
            ),
            ErrorCode::InvalidArgument => (400, INVALID_ARGUMENT, None),
            ErrorCode::Unavailable => (503, UNAVAILABLE, None),
            ErrorCode::Timeout => (504, UNAVAILABLE, Some("etcdserver: request timed out")),
            ErrorCode::Unimplemented => (501, UNIMPLEMENTED, None),
            ErrorCode::Internal => (500, INTERNAL, None),
        };
        ErrorWire {
            http_status,
            grpc_code,
            etcd_text,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            ErrorCode::SessionExpired => "session_expired",
            ErrorCode::LeaseNotFound => "lease_not_found",
            ErrorCode::LeaseExists => "lease_exists",
            ErrorCode::NotLeader => "not_leader",
            ErrorCode::NoLeader => "no_leader",
            ErrorCode::Compacted => "compacted",
            ErrorCode::FutureRevision => "future_revision",
            ErrorCode::PreconditionFailed => "precondition_failed",
            ErrorCode::LockTimeout => "lock_timeout",
            ErrorCode::QuotaExceeded => "quota_exceeded",
            ErrorCode::ValueTooLarge => "value_too_large",
            ErrorCode::RequestTooLarge => "request_too_large",
            ErrorCode::KeyNotFound => "key_not_found",
            ErrorCode::MemberNotFound => "member_not_found",
            ErrorCode::MemberExists => "member_exists",
            ErrorCode::PeerUrlExists => "peer_url_exists",
            ErrorCode::MemberBadUrls => "member_bad_urls",
            ErrorCode::MemberNotLearner => "member_not_learner",
            ErrorCode::LearnerNotReady => "learner_not_ready",
            ErrorCode::InvalidArgument => "invalid_argument",
            ErrorCode::Unavailable => "unavailable",
            ErrorCode::Timeout => "timeout",
            ErrorCode::Unimplemented => "unimplemented",
            ErrorCode::Internal => "internal",
        }
    }

    /// "Not servable here" (retry elsewhere or later) as opposed to a
    /// verdict on the request itself.
    pub fn is_retryable(self) -> bool {
        matches!(
            self,
            ErrorCode::NotLeader
                | ErrorCode::NoLeader
                | ErrorCode::Unavailable
                | ErrorCode::Timeout
        )
    }
}

/// An error with its code and a human-readable message.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
pub struct ApiError {
    pub code: ErrorCode,
    pub message: String,
}

impl fmt::Display for ApiError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.code.as_str(), self.message)
    }
}

impl ApiError {
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        ApiError {
            code,
            message: message.into(),
        }
    }

    /// An error whose message is etcd's own text for the code.
    pub fn etcd(code: ErrorCode) -> Self {
        let message = code.wire().etcd_text.unwrap_or(code.as_str());
        ApiError::new(code, message)
    }

    pub fn invalid(message: impl Into<String>) -> Self {
        ApiError::new(ErrorCode::InvalidArgument, message)
    }

    pub fn internal(message: impl Into<String>) -> Self {
        ApiError::new(ErrorCode::Internal, message)
    }

    pub fn unavailable(message: impl Into<String>) -> Self {
        ApiError::new(ErrorCode::Unavailable, message)
    }

    /// The text a gRPC client sees: etcd's text where etcd has one, so
    /// etcd client libraries map it to their typed errors.
    pub fn grpc_message(&self) -> &str {
        self.code.wire().etcd_text.unwrap_or(&self.message)
    }

    /// The JSON body of the HTTP API.
    pub fn json_body(&self) -> serde_json::Value {
        serde_json::json!({ "error": self.code.as_str(), "message": self.message })
    }
}

impl From<ApiError> for tonic::Status {
    fn from(e: ApiError) -> Self {
        let code = tonic::Code::from_i32(e.code.wire().grpc_code);
        tonic::Status::new(code, e.grpc_message().to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn etcd_errors_keep_etcd_text_on_the_wire() {
        let e = ApiError::new(ErrorCode::Compacted, "revision 3 compacted at 7");
        let status: tonic::Status = e.into();
        assert_eq!(status.code(), tonic::Code::OutOfRange);
        assert_eq!(
            status.message(),
            "etcdserver: mvcc: required revision has been compacted"
        );
    }

    #[test]
    fn errors_without_etcd_text_keep_their_message() {
        let e = ApiError::new(
            ErrorCode::ValueTooLarge,
            "value of 70000 bytes exceeds 65536",
        );
        let status: tonic::Status = e.clone().into();
        assert_eq!(status.code(), tonic::Code::InvalidArgument);
        assert_eq!(status.message(), "value of 70000 bytes exceeds 65536");
        assert_eq!(e.json_body()["error"], "value_too_large");
    }
}
