//! `ApiError` ⇄ `tonic::Status`, and the classification of failed calls.
//!
//! Outbound, a status carries etcd's text as its message (etcd clients
//! match on it) and latchkey's code, detail and own message in trailing
//! metadata, which etcd clients ignore. Inbound, [`ApiError::from_status`]
//! reads that metadata back; a status from another etcd-compatible server
//! maps by its etcd text, and anything else by its gRPC code alone.
//!
//! [`classify_call_failure`] answers the question a proxy and a forwarding
//! member must ask before they retry: did the request leave this process?
//! It reads the error's `source()` chain, never its message text.

use super::{ApiError, Detail, ErrorCode};
use std::error::Error as StdError;
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
    /// `Detail::RetryAfter`'s wait in milliseconds, decimal.
    pub const RETRY_AFTER_MS: &str = "latchkey-retry-after-ms";
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
                Detail::RetryAfter { ms } => {
                    md.insert(keys::RETRY_AFTER_MS, AsciiMetadataValue::from(ms));
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
        "retry_after" => Some(Detail::RetryAfter {
            ms: text(keys::RETRY_AFTER_MS)?.parse().ok()?,
        }),
        _ => None,
    }
}

/// What the error chain of a failed call proves.
#[derive(Debug, PartialEq, Eq)]
enum Evidence {
    /// The request never left this process (or, for REFUSED_STREAM, the
    /// server guarantees it did not process it).
    NeverSent,
    /// The client's own deadline fired.
    DeadlinePassed,
    /// Nothing proves the request was not sent.
    MaybeSent,
}

/// Classifies the status a tonic client returned for a failed call.
///
/// - A status carrying latchkey metadata or an etcd text is the server's
///   answer: [`ApiError::from_status`].
/// - A status the client made itself (it has a `source()`) is a transport
///   failure. It is `Unavailable` ([`Retry::Safe`](super::Retry::Safe))
///   only when the chain proves the request never left: the connection
///   could not be made, or hyper never handed the request to a
///   connection, or the server refused the stream (HTTP/2 REFUSED_STREAM
///   means it was not processed). A client deadline is a `Timeout`. Any
///   other break is `WriteOutcomeUnknown`: the request may have been sent
///   and applied.
/// - A status without a source came from the server: `from_status`.
pub fn classify_call_failure(status: &Status) -> ApiError {
    let servers_answer = status.metadata().contains_key(keys::ERROR)
        || ErrorCode::from_etcd_text(status.message()).is_some();
    let source = match status.source() {
        Some(source) if !servers_answer => source,
        _ => return ApiError::from_status(status),
    };
    let what = describe(status, source);
    match evidence(source) {
        Evidence::NeverSent => ApiError::unavailable(format!("the request was not sent: {what}")),
        Evidence::DeadlinePassed => ApiError::timeout()
            .with_message(format!("the deadline passed before an answer: {what}")),
        Evidence::MaybeSent => match status.code() {
            Code::DeadlineExceeded | Code::Cancelled => {
                ApiError::timeout().with_message(format!("the call ended before an answer: {what}"))
            }
            _ => ApiError::write_outcome_unknown(format!("the connection failed: {what}")),
        },
    }
}

/// The status message and the innermost cause (the message alone is often
/// just "transport error").
fn describe(status: &Status, source: &(dyn StdError + 'static)) -> String {
    let mut root = source;
    while let Some(next) = root.source() {
        root = next;
    }
    format!("{}: {root}", status.message())
}

fn evidence(first: &(dyn StdError + 'static)) -> Evidence {
    let mut deadline = false;
    let mut link = Some(first);
    while let Some(err) = link {
        if never_sent(err) {
            return Evidence::NeverSent;
        }
        deadline |= err.is::<tonic::TimeoutExpired>();
        link = err.source();
    }
    if deadline {
        Evidence::DeadlinePassed
    } else {
        Evidence::MaybeSent
    }
}

/// One link of an error chain that proves the request was not sent.
fn never_sent(err: &(dyn StdError + 'static)) -> bool {
    // tonic wraps every failure of its connector (TCP connect, connect
    // timeout, TLS) in ConnectError; the request is written only to a
    // connection that exists.
    if err.is::<tonic::ConnectError>() {
        return true;
    }
    // Refused and address-not-available only happen while connecting.
    // Unreachable host or network can also end an established TCP
    // connection, so they count only under a ConnectError (above).
    if let Some(io) = err.downcast_ref::<std::io::Error>() {
        return matches!(
            io.kind(),
            std::io::ErrorKind::ConnectionRefused | std::io::ErrorKind::AddrNotAvailable
        );
    }
    // hyper's "canceled": the request was dropped before it was handed to
    // the connection (the connection closed or was not ready).
    if let Some(hyper) = err.downcast_ref::<hyper::Error>() {
        return hyper.is_canceled();
    }
    // RFC 9113 §8.7: a stream the server resets with REFUSED_STREAM was not
    // processed. (A GOAWAY does not prove it for streams at or below its
    // last stream id, and h2 reports later connection errors as GOAWAY
    // too, so GOAWAY is not taken as proof.)
    if let Some(h2) = err.downcast_ref::<h2::Error>() {
        return h2.is_reset() && h2.is_remote() && h2.reason() == Some(h2::Reason::REFUSED_STREAM);
    }
    false
}

#[cfg(test)]
mod tests;
