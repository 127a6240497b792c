//! The leader's read index: the commit index at a moment when a quorum
//! confirmed this member still leads. A member that has applied up to it
//! reflects every write acknowledged before the read began, with no log
//! write (etcd's ReadIndex).

use super::{errors, Raft};
use latchkey_shared::ApiError;

/// The read index, on the leader. Fails `not_leader` elsewhere.
pub async fn read_index(raft: &Raft) -> Result<u64, ApiError> {
    let (read_log_id, _applied) = raft
        .get_read_log_id()
        .await
        .map_err(errors::check_is_leader)?;
    Ok(read_log_id.map_or(0, |l| l.index))
}
