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

/// The log stores a variant by its position: add new ones at the end
/// (a test pins every position).
///
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
    /// Client writes that arrived together, committed as one log entry
    /// (group commit: one append, one fsync and one replication round for
    /// all). Each is applied in turn with its own revision and result, as
    /// if it had its own entry. Never nested.
    Batch(Vec<Request>),
    /// The keyspace's revision becomes at least `above`, so the next write
    /// gets a higher one (a prefix moved in from another cell: every
    /// revision, and so every fencing token, issued here after the move is
    /// above those the other cell issued). Writes nothing, compacts nothing.
    RaiseRevision {
        above: i64,
    },
    /// Keys a move copies in from another cell, written (or deleted) at one
    /// revision with the create revision and version they had there; the
    /// only writes a cell takes under a prefix still arriving.
    Import(Vec<Imported>),
}

/// One key of a [`Request::Import`].
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Imported {
    pub key: Vec<u8>,
    #[serde(with = "serde_bytes")]
    pub value: Vec<u8>,
    pub lease: i64,
    pub create_revision: i64,
    pub version: i64,
    /// The key is deleted instead (a move's follower bringing over a
    /// deletion in the source).
    #[serde(default)]
    pub deleted: bool,
}

impl Request {
    /// The bytes this command may add to the keyspace, for the quota check
    /// before it is proposed (a grant counts 1 so a full cell refuses it).
    pub fn added_bytes(&self) -> u64 {
        match self {
            Request::Put(p) => (p.key.len() + p.value.len()) as u64,
            Request::Import(keys) => keys
                .iter()
                .map(|k| (k.key.len() + k.value.len()) as u64)
                .sum(),
            Request::Txn(t) => crate::mvcc::txn::txn_put_bytes(t),
            Request::LeaseGrant { .. } => 1,
            Request::Batch(reqs) => reqs.iter().map(Request::added_bytes).sum(),
            _ => 0,
        }
    }

    /// About how many bytes this command takes in the log, to bound the
    /// size of a batch.
    pub fn size_hint(&self) -> usize {
        use prost::Message;
        match self {
            Request::Put(p) => p.encoded_len(),
            Request::DeleteRange(d) => d.encoded_len(),
            Request::Txn(t) => t.encoded_len(),
            Request::LeaseExpire { ids } => 8 * ids.len(),
            Request::LeaseCheckpoint { entries } => 16 * entries.len(),
            Request::Batch(reqs) => reqs.iter().map(Request::size_hint).sum(),
            _ => 32,
        }
    }

    /// How many client writes this command carries.
    pub fn writes(&self) -> usize {
        match self {
            Request::Batch(reqs) => reqs.len(),
            _ => 1,
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
            Request::Batch(reqs) => write!(f, "batch({} writes)", reqs.len()),
            Request::RaiseRevision { above } => write!(f, "raise_revision({above})"),
            Request::Import(keys) => write!(f, "import({} keys)", keys.len()),
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
/// Positions are pinned like [`Request`]'s.
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
    /// A [`Request::Batch`]'s results, one per write, in order.
    Batch(Vec<Response>),
    RevisionRaised,
    Imported,
}

/// Serde for protobuf messages: their protobuf encoding as bytes.
/// A protobuf message inside a serde type: its protobuf encoding, as
/// bytes. (Bytes, not a sequence of u8: the same bincode, but written and
/// read whole; byte by byte, decoding 32 entries of 1 MB values to send
/// them to a follower took seconds on a debug build, longer than the
/// AppendEntries timeout, and the leader retried for ever.)
mod pb {
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<M: prost::Message, S: Serializer>(m: &M, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_bytes(&m.encode_to_vec())
    }

    pub fn deserialize<'de, M: prost::Message + Default, D: Deserializer<'de>>(
        d: D,
    ) -> Result<M, D::Error> {
        let bytes = serde_bytes::ByteBuf::deserialize(d)?;
        M::decode(bytes.as_slice()).map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::codec::variant_position as position;
    use crate::storage::codec::{decode, encode};

    /// A protobuf message is stored as bytes: the same bincode as the
    /// sequence of u8 it was before, so logs written either way read alike.
    #[test]
    fn protobuf_messages_encode_as_their_bytes_did() {
        let put = PbPutRequest {
            key: b"k".to_vec(),
            value: vec![7; 1000],
            ..Default::default()
        };
        let bytes = encode(&Request::Put(put.clone())).expect("encode");
        let mut before = 0u32.to_le_bytes().to_vec();
        before.extend(encode(&prost::Message::encode_to_vec(&put)).expect("encode"));
        assert_eq!(bytes, before);
        match decode::<Request>(&bytes).expect("decode") {
            Request::Put(back) => assert_eq!(back, put),
            other => panic!("decoded {other:?}"),
        }
    }

    #[test]
    fn log_commands_keep_their_wire_positions() {
        let commands = [
            (Request::Put(Default::default()), 0),
            (Request::DeleteRange(Default::default()), 1),
            (Request::Txn(Default::default()), 2),
            (Request::Compact { revision: 1 }, 3),
            (Request::LeaseGrant { id: 1, ttl: 1 }, 4),
            (Request::LeaseRevoke { id: 1 }, 5),
            (Request::LeaseExpire { ids: vec![] }, 6),
            (Request::LeaseCheckpoint { entries: vec![] }, 7),
            (
                Request::PublishMember {
                    id: 1,
                    name: String::new(),
                    client_urls: vec![],
                },
                8,
            ),
            (Request::Batch(vec![]), 9),
            (Request::RaiseRevision { above: 1 }, 10),
            (Request::Import(vec![]), 11),
        ];
        for (command, want) in commands {
            assert_eq!(position(&command), want, "{command}");
        }
    }

    #[test]
    fn applied_replies_keep_their_wire_positions() {
        let replies = [
            (Reply::None, 0),
            (Reply::Put(Default::default()), 1),
            (Reply::DeleteRange(Default::default()), 2),
            (Reply::Txn(Default::default()), 3),
            (Reply::Compacted, 4),
            (Reply::LeaseGranted { id: 1, ttl: 1 }, 5),
            (Reply::LeaseRevoked, 6),
            (Reply::LeasesExpired { expired: vec![] }, 7),
            (Reply::Published, 8),
            (Reply::Checkpointed, 9),
            (Reply::Batch(vec![]), 10),
            (Reply::RevisionRaised, 11),
            (Reply::Imported, 12),
        ];
        for (reply, want) in replies {
            assert_eq!(position(&reply), want, "{reply:?}");
        }
    }
}
