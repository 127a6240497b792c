//! What a member decodes from its peers: Raft's AppendEntries, vote and
//! snapshot-chunk requests and their replies, forwarded requests and
//! their replies, and log entries (also what the log store reads back).
//! A hostile peer's bytes must decode or be refused, never panic; the
//! entries that decode are then applied to a state machine, as a
//! follower would apply them.
//!
//! Input: a byte choosing the message type, then its bincode encoding.

#![no_main]

use latchkey_cell::peer::protocol::{Forward, ForwardReply};
use latchkey_cell::raft::{Entry, NodeId, TypeConfig};
use latchkey_cell::state_machine::CellState;
use latchkey_cell::storage::codec::{decode, encode};
use latchkey_shared::ApiError;
use libfuzzer_sys::fuzz_target;
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse,
    VoteRequest, VoteResponse,
};
use openraft::EntryPayload;
use serde::de::DeserializeOwned;
use serde::Serialize;

/// Decodes `bytes` as a `T` and, if they are one, encodes it again: what
/// decodes must be a value the member can also send.
fn decoded<T: DeserializeOwned + Serialize>(bytes: &[u8]) -> Option<T> {
    let value: T = decode(bytes).ok()?;
    encode(&value).expect("a decoded message encodes again");
    Some(value)
}

fn apply(entries: &[Entry]) {
    let mut state = CellState::default();
    for entry in entries {
        if let EntryPayload::Normal(request) = &entry.payload {
            let _ = (request.added_bytes(), request.size_hint(), request.writes());
            let _ = state.apply(entry.log_id.index, request);
            let _ = state.keys.take_changes();
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&kind, bytes)) = data.split_first() else {
        return;
    };
    match kind % 10 {
        0 => {
            if let Some(rpc) = decoded::<AppendEntriesRequest<TypeConfig>>(bytes) {
                apply(&rpc.entries);
            }
        }
        1 => {
            decoded::<VoteRequest<NodeId>>(bytes);
        }
        2 => {
            decoded::<InstallSnapshotRequest<TypeConfig>>(bytes);
        }
        3 => {
            if let Some(forward) = decoded::<Forward>(bytes) {
                let _ = forward.is_idempotent();
            }
        }
        4 => {
            decoded::<Result<ForwardReply, ApiError>>(bytes);
        }
        5 => {
            if let Some(entry) = decoded::<Entry>(bytes) {
                apply(std::slice::from_ref(&entry));
            }
        }
        6 => {
            decoded::<AppendEntriesResponse<NodeId>>(bytes);
        }
        7 => {
            decoded::<VoteResponse<NodeId>>(bytes);
        }
        8 => {
            decoded::<InstallSnapshotResponse<NodeId>>(bytes);
        }
        _ => {
            if let Some(entries) = decoded::<Vec<Entry>>(bytes) {
                apply(&entries);
            }
        }
    }
});
