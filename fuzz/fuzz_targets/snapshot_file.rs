//! The snapshot file reader: `snapshot.bin` as a member reads it at start
//! (header, meta, then the state image), and the portable state file of
//! `--restore`. A damaged or hostile file must be refused with an error,
//! never panic, and a state restored from it must be usable: ranges,
//! writes, compaction and lease expiry run on it.
//!
//! Input: a mode byte. Even: the rest is the file. Odd: a state is built
//! from steps as in `state_apply` and written as a real `snapshot.bin`,
//! which the input then damages (byte changes and a truncation) before
//! it is read, so mutations start from well-formed files.

#![no_main]

use latchkey_cell::raft::command::Request;
use latchkey_cell::raft::SnapshotMeta;
use latchkey_cell::state_machine::backup::decode_state_file;
use latchkey_cell::state_machine::snapshot_file::{
    read_snapshot_file, write_first_snapshot, SnapshotFile,
};
use latchkey_cell::state_machine::{CellState, StateImage};
use latchkey_cell::storage::codec::{decode, encode};
use latchkey_cell::storage::keys::SNAPSHOT_FILE;
use latchkey_fuzz::requests::{build_state, run, Step};
use latchkey_fuzz::Input;
use latchkey_shared::etcdpb::{PbPutRequest, PbRangeRequest};
use libfuzzer_sys::fuzz_target;
use std::path::Path;
use std::sync::OnceLock;

/// The directory the file is written to, one per process, under $TMPDIR
/// (scripts/fuzz.sh gives each run a scratch directory and removes it).
fn dir() -> &'static Path {
    static DIR: OnceLock<tempfile::TempDir> = OnceLock::new();
    DIR.get_or_init(|| tempfile::tempdir().expect("a temp dir"))
        .path()
}

/// A well-formed `snapshot.bin` of a state built from `input`'s steps,
/// then damaged as the rest of `input` says.
fn damaged_file(input: &mut Input) -> Vec<u8> {
    let state = build_state(input, 32);
    let meta = SnapshotMeta {
        last_log_id: None,
        last_membership: Default::default(),
        snapshot_id: "fuzz".into(),
    };
    let data = encode(&state.image()).expect("an image encodes");
    let _ = std::fs::remove_file(dir().join(SNAPSHOT_FILE));
    write_first_snapshot(dir(), &SnapshotFile { meta, data }).expect("writing snapshot.bin");
    let mut file = std::fs::read(dir().join(SNAPSHOT_FILE)).expect("reading snapshot.bin");
    for _ in 0..input.byte() % 8 {
        if file.is_empty() {
            break;
        }
        let at = input.u16() as usize % file.len();
        file[at] ^= input.byte();
    }
    let keep = input.u16() as usize;
    if keep != 0 {
        file.truncate(keep);
    }
    file
}

/// What a member does with a state it restored.
fn use_state(mut state: CellState) {
    let everything = PbRangeRequest {
        key: vec![0],
        range_end: vec![0],
        ..Default::default()
    };
    run(&mut state, Step::Range(everything.clone()), 1);
    run(&mut state, Step::History(everything), 1);
    let next = state
        .last_applied
        .map_or(1, |id| id.index.saturating_add(1));
    let put = Request::Put(PbPutRequest {
        key: b"k".to_vec(),
        value: b"v".to_vec(),
        ..Default::default()
    });
    let _ = state.apply(next, &put);
    let ids: Vec<i64> = state.leases.image().iter().map(|l| l.id).collect();
    let _ = state.apply(next, &Request::LeaseExpire { ids });
    let revision = state.keys.revision();
    let _ = state.apply(next, &Request::Compact { revision });
    let _ = encode(&state.image()).expect("a restored state's image encodes");
}

fuzz_target!(|data: &[u8]| {
    let mut input = Input::new(data);
    let file = match input.byte() % 2 {
        0 => input.rest().to_vec(),
        _ => damaged_file(&mut input),
    };
    std::fs::write(dir().join(SNAPSHOT_FILE), &file).expect("writing snapshot.bin");
    if let Ok(Some(snapshot)) = read_snapshot_file(dir()) {
        if let Ok(image) = decode::<StateImage>(&snapshot.data) {
            use_state(CellState::from_image(image));
        }
    }
    if let Ok(state) = decode_state_file(&file) {
        use_state(state);
    }
});
