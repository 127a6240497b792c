//! [`LeaseId`]: a lease's id, shown in hex everywhere (errors, logs,
//! metrics) as etcd and etcdctl show it.

use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

/// A lease id. etcd's wire type is `int64`; 0 means "no lease".
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default, Serialize, Deserialize)]
#[serde(transparent)]
pub struct LeaseId(pub i64);

impl LeaseId {
    /// "No lease", as etcd encodes it in a put or a key-value.
    pub const NONE: LeaseId = LeaseId(0);

    pub fn get(self) -> i64 {
        self.0
    }

    pub fn is_none(self) -> bool {
        self.0 == 0
    }
}

/// Sixteen lowercase hex digits, as etcdctl prints lease ids (`%016x`).
/// A negative id (never granted by etcd or latchkey) prints as Go prints
/// it: a minus sign and the magnitude.
impl fmt::Display for LeaseId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0 < 0 {
            write!(f, "-{:015x}", self.0.unsigned_abs())
        } else {
            write!(f, "{:016x}", self.0)
        }
    }
}

/// Hex too, so `?lease_id` in a log event reads like every other place.
impl fmt::Debug for LeaseId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl From<i64> for LeaseId {
    fn from(id: i64) -> Self {
        LeaseId(id)
    }
}

impl From<LeaseId> for i64 {
    fn from(id: LeaseId) -> Self {
        id.0
    }
}

/// A string that is not a lease id in hex.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0:?} is not a lease id (1 to 16 hex digits, at most 7fffffffffffffff)")]
pub struct ParseLeaseIdError(String);

/// Parses the hex form (with or without leading zeros), as a lease id in
/// an HTTP path or a command line is written.
impl FromStr for LeaseId {
    type Err = ParseLeaseIdError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let digits_only =
            !s.is_empty() && s.len() <= 16 && s.bytes().all(|b| b.is_ascii_hexdigit());
        if !digits_only {
            return Err(ParseLeaseIdError(s.to_string()));
        }
        i64::from_str_radix(s, 16)
            .map(LeaseId)
            .map_err(|_| ParseLeaseIdError(s.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn displays_as_etcdctl_does() {
        assert_eq!(LeaseId(0x694d5765fc71500b).to_string(), "694d5765fc71500b");
        assert_eq!(LeaseId(0x1f).to_string(), "000000000000001f");
        assert_eq!(LeaseId(0).to_string(), "0000000000000000");
        assert_eq!(LeaseId(-0x1f).to_string(), "-00000000000001f");
        assert_eq!(format!("{:?}", LeaseId(255)), "00000000000000ff");
    }

    #[test]
    fn parses_hex_and_round_trips() {
        for id in [1, 0x1f, 0x694d5765fc71500b, i64::MAX] {
            let id = LeaseId(id);
            assert_eq!(id.to_string().parse::<LeaseId>(), Ok(id));
        }
        assert_eq!("1F".parse::<LeaseId>(), Ok(LeaseId(0x1f)));
        for bad in [
            "",
            "-1",
            "+1",
            "0x1f",
            "g",
            "8000000000000000",
            "00000000000000001",
        ] {
            assert!(bad.parse::<LeaseId>().is_err(), "{bad:?}");
        }
    }

    #[test]
    fn converts_and_serializes_as_a_bare_integer() {
        let id: LeaseId = 42i64.into();
        assert_eq!(i64::from(id), 42);
        assert_eq!(serde_json::to_string(&id).ok(), Some("42".to_string()));
        assert_eq!(serde_json::from_str::<LeaseId>("42").ok(), Some(id));
        assert!(LeaseId::NONE.is_none() && !id.is_none());
    }
}
