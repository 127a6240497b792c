//! Encoding of everything that crosses the peer network or the disk:
//! bincode over serde. One place, so the format is changed in one place.

use serde::de::DeserializeOwned;
use serde::Serialize;

pub fn encode<T: Serialize>(value: &T) -> Result<Vec<u8>, bincode::Error> {
    bincode::serialize(value)
}

pub fn decode<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, bincode::Error> {
    bincode::deserialize(bytes)
}

/// The position bincode writes for an enum variant (a little-endian u32
/// at the start). Enums that outlive a build (the log command, the peer
/// wire) keep every variant's position; their tests pin them with this.
#[cfg(test)]
pub fn variant_position<T: Serialize>(value: &T) -> u32 {
    let bytes = encode(value).unwrap_or_default();
    match bytes.get(..4) {
        Some(&[a, b, c, d]) => u32::from_le_bytes([a, b, c, d]),
        _ => u32::MAX,
    }
}
