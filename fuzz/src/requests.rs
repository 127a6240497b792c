//! Steps on a state machine, read from the fuzzer's bytes: a kind byte
//! and, for etcd's requests, a protobuf body decoded by prost as the gRPC
//! face decodes it. Writes are applied as the log applies them; reads
//! (ranges, a watch's history, a txn that may not need the log) run as
//! the cell runs them on its applied state.

use crate::Input;
use latchkey_cell::mvcc::history::History;
use latchkey_cell::mvcc::{range, txn};
use latchkey_cell::raft::command::Request;
use latchkey_cell::state_machine::CellState;
use latchkey_shared::etcdpb::{PbDeleteRequest, PbPutRequest, PbRangeRequest, PbTxnRequest};
use latchkey_shared::key_range::KeyRange;
use prost::Message;

pub enum Step {
    Apply(Request),
    Range(PbRangeRequest),
    /// The changes to the request's range since its revision, in the
    /// batches a watch catching up is sent.
    History(PbRangeRequest),
    /// A txn answered from the applied state when its branches only read.
    ReadOnlyTxn(PbTxnRequest),
}

/// A lease id from one byte: small ids, so that puts (whose lease field
/// the fuzzer also writes small) meet leases that were granted.
fn lease_id(input: &mut Input) -> i64 {
    i64::from(input.byte()) - 1
}

fn decoded<M: Message + Default>(input: &mut Input) -> Option<M> {
    M::decode(input.chunk()).ok()
}

/// A request the log may carry, or `None` where the body does not decode
/// (the gRPC face would have refused it).
fn write(input: &mut Input, depth: u8) -> Option<Request> {
    Some(match input.byte() % 9 {
        0 => Request::Put(decoded::<PbPutRequest>(input)?),
        1 => Request::DeleteRange(decoded::<PbDeleteRequest>(input)?),
        2 => Request::Txn(decoded::<PbTxnRequest>(input)?),
        3 => Request::Compact {
            revision: i64::from(input.u16() as i16),
        },
        4 => Request::LeaseGrant {
            id: lease_id(input),
            ttl: i64::from(input.u16() as i16),
        },
        5 => Request::LeaseRevoke {
            id: lease_id(input),
        },
        6 => Request::LeaseExpire {
            ids: (0..input.byte() % 8).map(|_| lease_id(input)).collect(),
        },
        7 => Request::LeaseCheckpoint {
            entries: (0..input.byte() % 8)
                .map(|_| (lease_id(input), input.i64()))
                .collect(),
        },
        // Batches are never nested.
        _ if depth > 0 => return None,
        _ => Request::Batch(
            (0..input.byte() % 6)
                .filter_map(|_| write(input, depth + 1))
                .collect(),
        ),
    })
}

/// The next step, or `None` where its body does not decode.
pub fn next_step(input: &mut Input) -> Option<Step> {
    Some(match input.byte() % 6 {
        0..=2 => Step::Apply(write(input, 0)?),
        3 => Step::Range(decoded(input)?),
        4 => Step::History(decoded(input)?),
        _ => Step::ReadOnlyTxn(decoded(input)?),
    })
}

/// Runs `step` on `state`, as the log's entry at `index` for a write.
pub fn run(state: &mut CellState, step: Step, index: u64) {
    match step {
        Step::Apply(req) => {
            // What the proposer asks of a request before it is proposed.
            let _ = (req.added_bytes(), req.size_hint(), req.writes());
            if let Request::Txn(t) = &req {
                let _ = (
                    txn::txn_writes(t),
                    txn::txn_put_bytes(t),
                    txn::txn_max_value(t),
                );
                let _ = txn::txn_path_writes(&state.keys, t);
            }
            let _ = state.apply(index, &req);
            // What the watch hub takes after each apply.
            let _ = state.keys.take_changes();
        }
        Step::Range(r) => {
            let _ = range::range(&state.keys, &r);
        }
        Step::History(r) => {
            // A watch starts no lower than what compaction kept.
            let Ok(from) = state.keys.check_readable(r.revision) else {
                return;
            };
            let range = KeyRange::new(r.key, r.range_end);
            let mut history = History::new(
                &state.keys,
                &range,
                from,
                state.keys.revision(),
                r.keys_only,
            );
            let mut batches = 0;
            while !history.is_done() {
                let batch = history.next_batch(r.limit.clamp(0, 1 << 20) as usize);
                assert!(
                    !batch.is_empty(),
                    "a history that is not done gave no events"
                );
                batches += 1;
                assert!(batches < 1 << 20, "a history that never ends");
            }
        }
        Step::ReadOnlyTxn(t) => {
            let (mut keys, mut leases) = (state.keys.clone(), state.leases.clone());
            let mut kv = txn::Kv {
                keys: &mut keys,
                leases: &mut leases,
            };
            let _ = txn::txn_if_read_only(&mut kv, &t);
        }
    }
}

/// Builds a state from the input's steps (at most `max` of them).
pub fn build_state(input: &mut Input, max: usize) -> CellState {
    let mut state = CellState::default();
    let mut index = 0;
    while !input.is_empty() && index < max as u64 {
        index += 1;
        if let Some(step) = next_step(input) {
            run(&mut state, step, index);
        }
    }
    state
}
