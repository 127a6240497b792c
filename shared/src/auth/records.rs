//! The auth records: users, roles, the signing keys of tokens and the
//! on/off switch, stored as keys under [`AUTH_PREFIX`] inside the reserved
//! prefix, so that they replicate, snapshot and restore with the keyspace
//! and every change is one txn (one revision) of the log.
//!
//! They hold password hashes and token keys, so no client reads, watches
//! or writes them through the KV API ([`refuse_client_access`]): the
//! Auth API is their only door.

use crate::key_range::{prefix_end, KeyRange, RESERVED_PREFIX};
use crate::ApiError;
use serde::{Deserialize, Serialize};
use std::collections::BTreeSet;

/// Every auth record starts with this.
pub const AUTH_PREFIX: &[u8] = b"\0latchkey/auth/";
/// Present (value `1`) while authentication is on.
pub const ENABLED_KEY: &[u8] = b"\0latchkey/auth/enabled";
/// Rewritten by every auth change: its mod revision is the auth version,
/// which readers compare to know whether their cached view is current,
/// and which every change compares to apply on the view it was made on.
pub const VERSION_KEY: &[u8] = b"\0latchkey/auth/version";
pub const USER_PREFIX: &[u8] = b"\0latchkey/auth/user/";
pub const ROLE_PREFIX: &[u8] = b"\0latchkey/auth/role/";
pub const TOKEN_KEY_PREFIX: &[u8] = b"\0latchkey/auth/token-key/";

/// The role that may do everything, and the user that must hold it
/// before authentication can be turned on (etcd's rule).
pub const ROOT: &str = "root";

/// The role of the proxies' own user (`--cell-user`, given `root` too):
/// once authentication is on, only its holders write latchkey's records
/// under `\0latchkey/` (lock-delay, audit and idempotency records; never
/// the auth records). Root without it may not: no client forges them.
pub const PROXY_ROLE: &str = "latchkey-proxy";

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct UserRecord {
    pub name: String,
    /// argon2id PHC string; `None` for a user created with etcd's
    /// `no_password` (it cannot authenticate with a password).
    pub password_hash: Option<String>,
    pub roles: BTreeSet<String>,
}

impl UserRecord {
    /// A short digest of the password hash (empty without a password):
    /// tokens carry it, and one issued under another password is refused.
    pub fn fingerprint(&self) -> String {
        use sha2::Digest;
        match &self.password_hash {
            Some(h) => sha2::Sha256::digest(h.as_bytes())[..8]
                .iter()
                .map(|b| format!("{b:02x}"))
                .collect(),
            None => String::new(),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum PermKind {
    Read,
    Write,
    ReadWrite,
}

impl PermKind {
    /// From etcd's `authpb.Permission.Type` (READ 0, WRITE 1, READWRITE 2).
    pub fn from_etcd(value: i32) -> Option<PermKind> {
        match value {
            0 => Some(PermKind::Read),
            1 => Some(PermKind::Write),
            2 => Some(PermKind::ReadWrite),
            _ => None,
        }
    }

    pub fn etcd(self) -> i32 {
        match self {
            PermKind::Read => 0,
            PermKind::Write => 1,
            PermKind::ReadWrite => 2,
        }
    }
}

/// A permission on etcd's `key`/`range_end` (empty end: the one key;
/// `[0]`: every key from `key` on).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PermRecord {
    pub kind: PermKind,
    pub key: Vec<u8>,
    pub range_end: Vec<u8>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RoleRecord {
    pub name: String,
    /// Sorted by key then end; one entry per (key, end).
    pub perms: Vec<PermRecord>,
}

/// A secret that signs tokens; the newest signs, every kept one verifies.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TokenKey {
    pub id: u64,
    pub secret: Vec<u8>,
}

/// A record's stored bytes (JSON), and the audit records' encoding too.
pub fn encode(record: &impl Serialize) -> Vec<u8> {
    // Records of strings, byte vectors and integers always serialise.
    serde_json::to_vec(record).unwrap_or_default()
}

pub fn user_key(name: &str) -> Vec<u8> {
    [USER_PREFIX, name.as_bytes()].concat()
}

pub fn role_key(name: &str) -> Vec<u8> {
    [ROLE_PREFIX, name.as_bytes()].concat()
}

/// Zero-padded so that keys sort by id.
pub fn token_key_key(id: u64) -> Vec<u8> {
    [TOKEN_KEY_PREFIX, format!("{id:020}").as_bytes()].concat()
}

/// Whether `range` can select an auth record. A range that starts outside
/// the reserved prefix never selects a reserved key (`KeyRange::admits`).
pub fn touches_auth_records(range: &KeyRange) -> bool {
    if !range.start.starts_with(RESERVED_PREFIX) || range.is_empty() {
        return false;
    }
    if range.end.is_empty() {
        return range.start.starts_with(AUTH_PREFIX);
    }
    let auth_end = prefix_end(AUTH_PREFIX);
    let starts_before_end = range.start < auth_end;
    let ends_after_start = range.end == [0] || range.end.as_slice() > AUTH_PREFIX;
    starts_before_end && ends_after_start
}

/// Refuses a client's read, watch or write of a range that can select an
/// auth record, whoever the client is (root too) and whether
/// authentication is on or off.
pub fn refuse_client_access(range: &KeyRange) -> Result<(), ApiError> {
    if !touches_auth_records(range) {
        return Ok(());
    }
    Err(ApiError::permission_denied(format!(
        "keys under {:?} are latchkey's auth records (password hashes, token keys): \
         they are read and changed only through the Auth API",
        AUTH_PREFIX.escape_ascii().to_string()
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn r(start: &[u8], end: &[u8]) -> KeyRange {
        KeyRange::new(start.to_vec(), end.to_vec())
    }

    #[test]
    fn ranges_that_can_select_an_auth_record_are_the_ones_refused() {
        let touching = [
            r(b"\0latchkey/auth/user/root", b""),
            r(b"\0latchkey/auth/", b"\0latchkey/auth0"),
            r(b"\0latchkey/", b"\0latchkey0"),
            r(b"\0latchkey/", &[0]),
            r(b"\0latchkey/a", b"\0latchkey/b"),
            r(b"\0latchkey/auth/version", &[0]),
        ];
        for range in touching {
            assert!(touches_auth_records(&range), "{range:?}");
            assert!(refuse_client_access(&range).is_err(), "{range:?}");
        }
        let apart = [
            // Starts outside the reserved prefix: never selects a reserved key.
            r(b"\0", &[0]),
            r(b"a", b"z"),
            r(b"\0latchkey/audit/", b"\0latchkey/audit0"),
            r(b"\0latchkey/auth0", &[0]),
            r(b"\0latchkey/lock", b"\0latchkey/auth/"),
            r(b"\0latchkey/auth", b""),
            // Inverted: selects nothing.
            r(b"\0latchkey/auth/z", b"\0latchkey/auth/a"),
        ];
        for range in apart {
            assert!(!touches_auth_records(&range), "{range:?}");
        }
    }

    #[test]
    fn token_key_keys_sort_by_id() {
        assert!(token_key_key(9) < token_key_key(10));
        assert!(token_key_key(10).starts_with(AUTH_PREFIX));
    }
}
