//! [`MemberId`]: a cell member's id, shown in hex as etcd shows member ids.

use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

/// A member's id (etcd's `uint64` member and leader ids).
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default, Serialize, Deserialize)]
#[serde(transparent)]
pub struct MemberId(pub u64);

impl MemberId {
    pub fn get(self) -> u64 {
        self.0
    }
}

/// Lowercase hex without padding, as etcd prints member ids (`%x`, e.g.
/// in `etcdctl member list`).
impl fmt::Display for MemberId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:x}", self.0)
    }
}

impl fmt::Debug for MemberId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl From<u64> for MemberId {
    fn from(id: u64) -> Self {
        MemberId(id)
    }
}

impl From<MemberId> for u64 {
    fn from(id: MemberId) -> Self {
        id.0
    }
}

/// A string that is not a member id in hex.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0:?} is not a member id (1 to 16 hex digits)")]
pub struct ParseMemberIdError(String);

/// Parses the hex form, as `etcdctl member remove <id>` takes it.
impl FromStr for MemberId {
    type Err = ParseMemberIdError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let digits_only =
            !s.is_empty() && s.len() <= 16 && s.bytes().all(|b| b.is_ascii_hexdigit());
        if !digits_only {
            return Err(ParseMemberIdError(s.to_string()));
        }
        u64::from_str_radix(s, 16)
            .map(MemberId)
            .map_err(|_| ParseMemberIdError(s.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn displays_as_etcd_does() {
        assert_eq!(MemberId(0x8e9e05c52164694d).to_string(), "8e9e05c52164694d");
        assert_eq!(MemberId(10).to_string(), "a");
        assert_eq!(format!("{:?}", MemberId(u64::MAX)), "ffffffffffffffff");
    }

    #[test]
    fn parses_hex_and_round_trips() {
        for id in [1, 0xa, 0x8e9e05c52164694d, u64::MAX] {
            let id = MemberId(id);
            assert_eq!(id.to_string().parse::<MemberId>(), Ok(id));
        }
        for bad in ["", "+1", "0x1", "z", "10000000000000000"] {
            assert!(bad.parse::<MemberId>().is_err(), "{bad:?}");
        }
    }

    #[test]
    fn converts_and_serializes_as_a_bare_integer() {
        let id: MemberId = 7u64.into();
        assert_eq!(u64::from(id), 7);
        assert_eq!(serde_json::to_string(&id).ok(), Some("7".to_string()));
        assert_eq!(serde_json::from_str::<MemberId>("7").ok(), Some(id));
    }
}
