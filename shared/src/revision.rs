//! [`Revision`]: a point in the keyspace's history.

use serde::{Deserialize, Serialize};
use std::fmt;

/// A keyspace revision (etcd's `int64`). Every committed write creates the
/// next one; 0 in a request means "the current revision".
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Revision(pub i64);

impl Revision {
    /// "Current", in a read or watch request.
    pub const CURRENT: Revision = Revision(0);

    pub fn get(self) -> i64 {
        self.0
    }

    /// The revision after this one.
    pub fn next(self) -> Revision {
        Revision(self.0 + 1)
    }
}

/// Decimal, as etcd prints revisions.
impl fmt::Display for Revision {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

impl fmt::Debug for Revision {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl From<i64> for Revision {
    fn from(revision: i64) -> Self {
        Revision(revision)
    }
}

impl From<Revision> for i64 {
    fn from(revision: Revision) -> Self {
        revision.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn orders_displays_and_converts() {
        let r = Revision(41);
        assert_eq!(r.next(), Revision(42));
        assert!(r < r.next());
        assert_eq!(r.to_string(), "41");
        assert_eq!(format!("{r:?}"), "41");
        assert_eq!(i64::from(Revision::from(7)), 7);
        assert_eq!(Revision::CURRENT.get(), 0);
    }

    #[test]
    fn serializes_as_a_bare_integer() {
        assert_eq!(
            serde_json::to_string(&Revision(5)).ok(),
            Some("5".to_string())
        );
        assert_eq!(
            serde_json::from_str::<Revision>("5").ok(),
            Some(Revision(5))
        );
    }
}
