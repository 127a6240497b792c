//! `ApiError` ⇄ `tonic::Status`.
//!
//! Outbound, a status carries etcd's text as its message (etcd clients
//! match on it) and latchkey's code, detail and own message in trailing
//! metadata, which etcd clients ignore. Inbound, [`ApiError::from_status`]
//! reads that metadata back; a status from another etcd-compatible server
//! maps by its etcd text, and anything else by its gRPC code alone.

use super::{ApiError, Detail, ErrorCode};
use tonic::metadata::{AsciiMetadataValue, BinaryMetadataValue, MetadataMap};
use tonic::{Code, Status};

/// The trailing metadata keys latchkey adds to an error status.
pub mod metadata_keys {
    /// The error code's name (`not_leader`).
    pub const ERROR: &str = "latchkey-error";
    /// The detail's kind (`not_leader`, `compacted`), present with a
    /// detail even when its fields are empty.
    pub const DETAIL: &str = "latchkey-detail";
    /// `Detail::NotLeader`'s leader, decimal; absent when unknown.
    pub const LEADER: &str = "latchkey-leader";
    /// `Detail::Compacted`'s compact revision, decimal.
    pub const COMPACT_REVISION: &str = "latchkey-compact-revision";
    /// latchkey's own message, UTF-8, when the status message is etcd's
    /// text instead.
    pub const MESSAGE: &str = "latchkey-message-bin";
}

use metadata_keys as keys;

impl From<ApiError> for Status {
    fn from(e: ApiError) -> Self {
        e.to_status()
    }
}

impl ApiError {
    /// The status a gRPC server answers with.
    pub fn to_status(&self) -> Status {
        let mut md = MetadataMap::new();
        // Names and kinds are ASCII snake_case (the table's tests check
        // it), so these conversions do not fail; nothing panics if one did.
        if let Ok(name) = AsciiMetadataValue::try_from(self.code.as_str()) {
            md.insert(keys::ERROR, name);
        }
        if let Some(detail) = self.detail {
            if let Ok(kind) = AsciiMetadataValue::try_from(detail.kind()) {
                md.insert(keys::DETAIL, kind);
            }
            match detail {
                Detail::NotLeader { leader: Some(id) } => {
                    md.insert(keys::LEADER, AsciiMetadataValue::from(id));
                }
                Detail::NotLeader { leader: None } => {}
                Detail::Compacted { compact_revision } => {
                    md.insert(
                        keys::COMPACT_REVISION,
                        AsciiMetadataValue::from(compact_revision),
                    );
                }
            }
        }
        let message = self.grpc_message();
        if message != self.message {
            md.insert_bin(
                keys::MESSAGE,
                BinaryMetadataValue::from_bytes(self.message.as_bytes()),
            );
        }
        Status::with_metadata(self.code.grpc_code(), message, md)
    }

    /// The error a status stands for. Latchkey's metadata decides when
    /// present; else etcd's text; else the gRPC code alone, where a status
    /// that may stand for a lost connection is never taken to mean that
    /// nothing happened.
    pub fn from_status(status: &Status) -> ApiError {
        let md = status.metadata();
        let code = md
            .get(keys::ERROR)
            .and_then(|v| v.to_str().ok())
            .and_then(ErrorCode::from_name)
            .or_else(|| ErrorCode::from_etcd_text(status.message()))
            .unwrap_or_else(|| code_alone(status.code()));
        let message = md
            .get_bin(keys::MESSAGE)
            .and_then(|v| v.to_bytes().ok())
            .and_then(|b| String::from_utf8(b.to_vec()).ok())
            .unwrap_or_else(|| status.message().to_string());
        ApiError {
            code,
            message,
            detail: detail_from(md),
        }
    }
}

/// A Status from a server that is not latchkey and sent no etcd text.
fn code_alone(code: Code) -> ErrorCode {
    match code {
        Code::InvalidArgument
        | Code::OutOfRange
        | Code::NotFound
        | Code::AlreadyExists
        | Code::PermissionDenied
        | Code::Unauthenticated => ErrorCode::InvalidArgument,
        Code::FailedPrecondition | Code::Aborted => ErrorCode::PreconditionFailed,
        Code::ResourceExhausted => ErrorCode::QuotaExceeded,
        Code::DeadlineExceeded | Code::Cancelled => ErrorCode::Timeout,
        // gRPC's Unavailable covers both "never reached the service" and
        // "the connection broke mid-call"; from the code alone the second
        // cannot be ruled out.
        Code::Unavailable => ErrorCode::WriteOutcomeUnknown,
        Code::Unimplemented => ErrorCode::Unimplemented,
        Code::Ok | Code::Unknown | Code::Internal | Code::DataLoss => ErrorCode::Internal,
    }
}

fn detail_from(md: &MetadataMap) -> Option<Detail> {
    let text = |key| md.get(key).and_then(|v| v.to_str().ok());
    match text(keys::DETAIL)? {
        "not_leader" => Some(Detail::NotLeader {
            leader: text(keys::LEADER).and_then(|v| v.parse().ok()),
        }),
        "compacted" => Some(Detail::Compacted {
            compact_revision: text(keys::COMPACT_REVISION)?.parse().ok()?,
        }),
        _ => None,
    }
}

#[cfg(test)]
mod tests;
