//! Client sessions (etcd leases) terminated at this proxy (DESIGN
//! section 3).
//!
//! - [`registry`]: [`SessionTable`], the leases clients keep alive through
//!   this proxy; a client keep-alive is answered from it at once.
//! - [`keepalive_batcher`]: [`KeepAliveBatcher`], the ONE task that sends
//!   the cell one refresh batch per tick and brings the answers back to
//!   the table, and hands the sessions extended to other cells to those
//!   cells' own batches.
//! - [`extensions`]: [`extensions::LeaseExtensions`], sessions that bind
//!   keys, locks or elections in other cells than home: the same lease id
//!   granted there, refreshed and revoked with the session.
//!
//! A keep-alive flows: client -> `SessionTable::keep_alive` (answer now,
//! mark due) -> next tick `take_due` -> one `Sessions.Refresh` batch ->
//! `SessionTable::answered` (confirmed TTL, waiters woken, gone leases
//! removed).

pub mod extensions;
pub mod keepalive_batcher;
pub mod registry;

pub use keepalive_batcher::KeepAliveBatcher;
pub use registry::{KeepAlive, SessionTable};

use latchkey_shared::{ApiError, LeaseId};
use std::time::Duration;
use tokio::time::Instant;

/// One client keep-alive through `table`: the TTL to report, waiting up to
/// `timeout` for the cell when the table cannot answer by itself.
pub async fn keep_alive(
    table: &SessionTable,
    id: LeaseId,
    timeout: Duration,
) -> Result<i64, ApiError> {
    match table.keep_alive(id, Instant::now())? {
        KeepAlive::Ttl(ttl) => Ok(ttl),
        KeepAlive::Wait(answer) => wait_for_cell(id, answer, timeout).await,
    }
}

/// A keep-alive the table could not answer by itself: the cell's verdict
/// on `id`, waited for up to `timeout`.
pub async fn wait_for_cell(
    id: LeaseId,
    answer: tokio::sync::oneshot::Receiver<Result<i64, ApiError>>,
    timeout: Duration,
) -> Result<i64, ApiError> {
    match tokio::time::timeout(timeout, answer).await {
        Ok(Ok(answer)) => answer,
        Ok(Err(_)) => Err(ApiError::unavailable("the proxy is stopping")),
        Err(_) => Err(ApiError::unavailable(format!(
            "the cell did not confirm lease {id} within {timeout:?}"
        ))),
    }
}
