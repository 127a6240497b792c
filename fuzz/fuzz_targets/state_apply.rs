//! The state machine with hostile requests: etcd's KV and lease requests
//! as their protobuf bodies (decoded by prost, as the gRPC face decodes
//! them) and the lease commands the leader proposes, applied as the log
//! applies them, between ranges, a watch's history and read-only txns.
//! Millions of inputs an hour, where the live targets run thousands.
//!
//! Fails on a panic, or when the state's image does not survive a round
//! trip (what a snapshot restores must be what was snapshotted).

#![no_main]

use latchkey_cell::state_machine::CellState;
use latchkey_cell::storage::codec::{decode, encode};
use latchkey_fuzz::requests::build_state;
use latchkey_fuzz::Input;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let state = build_state(&mut Input::new(data), 256);
    let image = encode(&state.image()).expect("a state's image encodes");
    let restored = CellState::from_image(decode(&image).expect("an image we encoded decodes"));
    let again = encode(&restored.image()).expect("a restored state's image encodes");
    assert!(
        image == again,
        "a state's image changed in a snapshot round trip"
    );
});
