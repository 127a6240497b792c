//! What a member does for a client, in etcd's words, whichever face asked
//! (etcd's `v3_server.go` under its `v3rpc`): the gRPC services in
//! [`api`](crate::api) translate to and from these calls, and the lock and
//! election recipes' backend ([`locks::LocalLocks`]) calls them directly,
//! with no gRPC request or status in between.
//!
//! Each operation validates its input, hands the request to the
//! [`CellNode`] (which decides where it is served) and fills the response
//! header; failures are [`ApiError`]s.

pub mod auth;
pub mod auth_gate;
pub mod kv;
pub mod lease;
pub mod locks;
pub mod tenants;

use crate::node::CellNode;
use latchkey_shared::ApiError;

/// Takes the reply out of an applied [`Response`](crate::raft::command::Response),
/// or its error.
macro_rules! expect_reply {
    ($resp:expr, $pat:pat => $val:expr) => {
        match $resp.result {
            Ok($pat) => Ok($val),
            Ok(other) => Err(latchkey_shared::ApiError::internal(format!(
                "unexpected apply result {other:?}"
            ))),
            Err(e) => Err(e),
        }
    };
}
pub(crate) use expect_reply;

/// What the transport accepts beyond the request limit (etcd's own
/// allowance for gRPC framing, 512 KiB).
pub const GRPC_OVERHEAD_BYTES: usize = 512 * 1024;

/// Rejects a value over the configured limit before it is proposed.
pub fn check_value(node: &CellNode, len: usize) -> Result<(), ApiError> {
    if len > node.limits.max_value_bytes {
        return Err(ApiError::value_too_large(len, node.limits.max_value_bytes));
    }
    Ok(())
}

/// Refuses a request over the size limit before anything else, with
/// etcd's errors: "request is too large" up to the transport's allowance
/// past the limit, grpc-go's "message larger than max" beyond it.
pub fn check_request_size(node: &CellNode, len: usize) -> Result<(), ApiError> {
    let limit = node.limits.max_request_bytes;
    if len > limit + GRPC_OVERHEAD_BYTES {
        return Err(ApiError::message_too_large(
            len,
            limit + GRPC_OVERHEAD_BYTES,
        ));
    }
    if len > limit {
        return Err(ApiError::request_too_large());
    }
    Ok(())
}
