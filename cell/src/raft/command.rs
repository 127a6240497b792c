//! What goes through the Raft log ([`Request`]) and what applying it
//! returns ([`Response`]).
//!
//! etcd requests travel as their protobuf encoding, so the log holds exactly
//! what the client sent and nothing is re-typed.

use latchkey_shared::etcdpb::{
    PbDeleteRequest, PbDeleteResponse, PbPutRequest, PbPutResponse, PbTxnRequest, PbTxnResponse,
};
use latchkey_shared::ApiError;
use serde::{Deserialize, Serialize};
use std::fmt;

/// A replicated command. Apply is deterministic: anything that depends on
/// time or randomness is decided by the proposer and carried here.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum Request {
    Put(#[serde(with = "pb")] PbPutRequest),
    DeleteRange(#[serde(with = "pb")] PbDeleteRequest),
    Txn(#[serde(with = "pb")] PbTxnRequest),
    Compact {
        revision: i64,
    },
    /// `id == 0` asks the state machine to choose an id.
    LeaseGrant {
        id: i64,
        ttl: i64,
    },
    LeaseRevoke {
        id: i64,
    },
    /// Leases the leader found expired; each lease's keys are deleted in
    /// one revision of its own. Leases already gone are skipped.
    LeaseExpire {
        ids: Vec<i64>,
    },
    /// The leader's lease deadlines as `(id, ms left)`, so a new leader
    /// does not start every lease over. Many leases per entry.
    LeaseCheckpoint {
        entries: Vec<(i64, i64)>,
    },
    /// A member announces the client URLs it serves on (etcd publishes
    /// member attributes the same way).
    PublishMember {
        id: u64,
        name: String,
        client_urls: Vec<String>,
    },
}

impl Request {
    /// The bytes this command may add to the keyspace, for the quota check
    /// before it is proposed (a grant counts 1 so a full cell refuses it).
    pub fn added_bytes(&self) -> u64 {
        match self {
            Request::Put(p) => (p.key.len() + p.value.len()) as u64,
            Request::Txn(t) => crate::mvcc::txn::txn_put_bytes(t),
            Request::LeaseGrant { .. } => 1,
            _ => 0,
        }
    }
}

impl fmt::Display for Request {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Request::Put(p) => write!(f, "put({} bytes key)", p.key.len()),
            Request::DeleteRange(_) => write!(f, "delete_range"),
            Request::Txn(t) => write!(f, "txn({} compares)", t.compare.len()),
            Request::Compact { revision } => write!(f, "compact({revision})"),
            Request::LeaseGrant { id, ttl } => write!(f, "lease_grant({id:x}, {ttl}s)"),
            Request::LeaseRevoke { id } => write!(f, "lease_revoke({id:x})"),
            Request::LeaseExpire { ids } => write!(f, "lease_expire({} leases)", ids.len()),
            Request::LeaseCheckpoint { entries } => {
                write!(f, "lease_checkpoint({} leases)", entries.len())
            }
            Request::PublishMember { id, .. } => write!(f, "publish_member({id})"),
        }
    }
}

/// The result of applying one entry.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Response {
    /// The store revision right after this entry was applied.
    pub revision: i64,
    pub result: Result<Reply, ApiError>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum Reply {
    /// Blank and membership entries.
    None,
    Put(#[serde(with = "pb")] PbPutResponse),
    DeleteRange(#[serde(with = "pb")] PbDeleteResponse),
    Txn(#[serde(with = "pb")] PbTxnResponse),
    Compacted,
    LeaseGranted {
        id: i64,
        ttl: i64,
    },
    LeaseRevoked,
    LeasesExpired {
        expired: Vec<i64>,
    },
    Published,
    Checkpointed,
}

/// Serde for protobuf messages: their protobuf encoding as bytes.
mod pb {
    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    pub fn serialize<M: prost::Message, S: Serializer>(m: &M, s: S) -> Result<S::Ok, S::Error> {
        m.encode_to_vec().serialize(s)
    }

    pub fn deserialize<'de, M: prost::Message + Default, D: Deserializer<'de>>(
        d: D,
    ) -> Result<M, D::Error> {
        let bytes = Vec::<u8>::deserialize(d)?;
        M::decode(bytes.as_slice()).map_err(serde::de::Error::custom)
    }
}
