//! Consensus: openraft's type configuration and the parts the cell
//! supplies to it.
//!
//! - [`log_store`]: the Raft log and vote in RocksDB, with group commit.
//! - [`network`]: the client side of cell-to-cell RPCs (tonic).
//! - [`peer_service`]: the server side of the same RPCs.
//! - [`codec`]: how RPC payloads are encoded.

pub mod codec;
pub mod log_store;
pub mod network;
pub mod peer_service;

use crate::state_machine::command::{Request, Response};
use serde::{Deserialize, Serialize};
use std::fmt;
use std::io::Cursor;

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
        SnapshotData = Cursor<Vec<u8>>,
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
