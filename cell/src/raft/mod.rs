//! Consensus: openraft's type configuration and the parts the cell
//! supplies to it.
//!
//! - [`log_store`]: the Raft log and vote in RocksDB.
//! - [`proposer`]: group commit: concurrent writes share one log entry.
//! - [`log_purger`]: purging that log, never past the snapshot on disk.
//! - [`errors`]: the one map from openraft's errors to API errors.
//! - [`read_index`]: linearizable reads without a log write, one shared
//!   quorum round at a time.
//! - [`leadership`]: check-quorum: a leader cut off from its quorum does
//!   not count as leading.
//! - [`leader_contact`]: how long this member has gone without a leader
//!   (etcd's require-leader for watch streams).
//! - [`election_nudge`]: a candidate refused for a shorter log's sake
//!   campaigns again at once.
//! - [`snapshot_receipt`]: a follower receiving a snapshot does not
//!   campaign.
//! - [`command`]: what the log carries (a command) and what applying it
//!   returns.
//! - [`snapshot_data`]: a snapshot's image as openraft moves it, a region
//!   of a file.
//! - [`network`]: openraft's network: the client side of Raft RPCs (tonic);
//!   the server side is `crate::peer::server`.

pub mod command;
pub mod election_nudge;
pub mod errors;
pub mod leader_contact;
pub mod leadership;
pub mod log_purger;
pub mod log_store;
pub mod network;
pub mod proposer;
pub mod read_index;
pub mod snapshot_data;
pub mod snapshot_receipt;

use command::{Request, Response};
use serde::{Deserialize, Serialize};
use std::fmt;

pub type NodeId = u64;

/// What the membership config records about a member: where its peers reach
/// it. Client URLs are published separately through the state machine.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Member {
    pub peer_addr: String,
}

impl fmt::Display for Member {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.peer_addr)
    }
}

openraft::declare_raft_types!(
    pub TypeConfig:
        D = Request,
        R = Response,
        NodeId = NodeId,
        Node = Member,
        Entry = openraft::Entry<TypeConfig>,
        SnapshotData = snapshot_data::SnapshotData,
        AsyncRuntime = openraft::TokioRuntime,
);

pub type Raft = openraft::Raft<TypeConfig>;
pub type LogId = openraft::LogId<NodeId>;
pub type Vote = openraft::Vote<NodeId>;
pub type Entry = openraft::Entry<TypeConfig>;
pub type StoredMembership = openraft::StoredMembership<NodeId, Member>;
pub type SnapshotMeta = openraft::SnapshotMeta<NodeId, Member>;
pub type Snapshot = openraft::Snapshot<TypeConfig>;
pub type StorageError = openraft::StorageError<NodeId>;
