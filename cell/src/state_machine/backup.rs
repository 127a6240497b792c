//! The portable state file: what `Maintenance.Snapshot` streams and
//! `latchkey-cell --restore FILE` starts a new cell from.
//!
//! Layout: a magic line, the length of the image (8 bytes, big-endian), the
//! bincode [`StateImage`], zero padding to a multiple of 512 bytes, then the
//! SHA-256 of everything before it. etcd's stream has the same shape (a
//! page-aligned database plus its SHA-256), and `etcdctl snapshot save`
//! checks that shape; a truncated or damaged file is refused on restore.

use super::{CellState, StateImage};
use crate::storage::codec::{decode, encode};
use anyhow::{bail, Context};
use sha2::{Digest, Sha256};

/// `v2` added each version's sub-revision (cell review M3); `v1` files
/// came from unreleased builds and are refused by name.
const MAGIC: &[u8] = b"latchkey-state-v2\n";
const MAGIC_PREFIX: &[u8] = b"latchkey-state-v";
const HASH_BYTES: usize = 32;
const ALIGN: usize = 512;

/// The state file of `state`: keys with their history, leases, members.
pub fn encode_state_file(state: &CellState) -> anyhow::Result<Vec<u8>> {
    let image = encode(&state.image()).context("encoding the state")?;
    let mut out = MAGIC.to_vec();
    out.extend_from_slice(&(image.len() as u64).to_be_bytes());
    out.extend(image);
    out.resize(out.len().div_ceil(ALIGN) * ALIGN, 0);
    let hash = Sha256::digest(&out);
    out.extend_from_slice(&hash);
    Ok(out)
}

/// The SHA-256 a well-formed state file ends with: what names its content.
pub fn state_file_digest(bytes: &[u8]) -> &[u8] {
    &bytes[bytes.len().saturating_sub(HASH_BYTES)..]
}

/// Reads a state file for a new cell: the keyspace (revision, history) and
/// leases of the old cell, without its Raft position or membership, which
/// belong to the cell it came from.
pub fn decode_state_file(bytes: &[u8]) -> anyhow::Result<CellState> {
    if !bytes.starts_with(MAGIC) && bytes.starts_with(MAGIC_PREFIX) {
        let line = bytes.split(|b| *b == b'\n').next().unwrap_or_default();
        bail!(
            "the state file is {:?}; this build reads {MAGIC:?} (a newer or an unreleased \
             older format)",
            String::from_utf8_lossy(line)
        );
    }
    if !bytes.starts_with(MAGIC) {
        bail!("not a latchkey state file (it does not start with {MAGIC:?})");
    }
    if bytes.len() < MAGIC.len() + HASH_BYTES {
        bail!("the state file is truncated");
    }
    let (body, hash) = bytes.split_at(bytes.len() - HASH_BYTES);
    if Sha256::digest(body).as_slice() != hash {
        bail!("the state file's SHA-256 does not match: it is damaged or incomplete");
    }
    let rest = &body[MAGIC.len()..];
    let len = rest
        .get(..8)
        .and_then(|b| <[u8; 8]>::try_from(b).ok())
        .map(u64::from_be_bytes)
        .context("the state file is truncated")?;
    let image_bytes = usize::try_from(len)
        .ok()
        .and_then(|len| rest.get(8..8 + len))
        .context("the state file's length field is wrong")?;
    let image: StateImage = decode(image_bytes).context("decoding the state")?;
    let mut state = CellState::from_image(image);
    state.last_applied = None;
    state.last_membership = Default::default();
    state.members = Default::default();
    Ok(state)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::raft::command::Request;
    use latchkey_shared::etcdpb::PbPutRequest;

    #[test]
    fn a_state_file_round_trips_and_damage_is_refused() {
        let mut s = CellState::default();
        for (i, k) in ["a", "b", "a"].iter().enumerate() {
            let put = Request::Put(PbPutRequest {
                key: k.as_bytes().to_vec(),
                value: vec![i as u8],
                ..Default::default()
            });
            assert!(s.apply(i as u64 + 1, &put).result.is_ok());
        }
        let file = encode_state_file(&s).expect("encode");
        assert_eq!(
            file.len() % 512,
            32,
            "the shape etcdctl snapshot save checks"
        );
        let back = decode_state_file(&file).expect("decode");
        // Revision 1 (empty, as in etcd) and three puts.
        assert_eq!(back.keys.revision(), 4);
        assert_eq!(back.keys.live_keys(), 2);
        assert_eq!(back.keys.get(b"a").map(|kv| kv.version), Some(2));
        let mut damaged = file.clone();
        let mid = damaged.len() / 2;
        damaged[mid] ^= 1;
        assert!(decode_state_file(&damaged).is_err());
        assert!(decode_state_file(&file[..file.len() - 1]).is_err());
        assert!(decode_state_file(b"SQLite format 3").is_err());
    }
}
