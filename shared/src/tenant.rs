//! Tenants: a tenant owns key prefixes and has quotas on what lives under
//! them (keys, bytes), which the cell enforces when it applies each write,
//! so two writes racing for the last unit cannot both get it.
//!
//! A tenant's record lives at `\0latchkey/tenants/<name>` (JSON), written
//! only by the cell's tenants API, with an audit record in the same txn.
//! Prefixes never overlap: every key has at most one owner, so a write is
//! counted once. A key outside every tenant's prefixes belongs to no one
//! and is bounded only by the cell's own quota.

use crate::key_range::RESERVED_PREFIX;
use crate::tenants_pb;
use crate::ApiError;
use serde::{Deserialize, Serialize};

/// Where the tenants' records live.
pub const TENANT_PREFIX: &[u8] = b"\0latchkey/tenants/";
/// Moved by every change of the tenants' records: a change is committed
/// only if no other came between its read and its txn.
pub const VERSION_KEY: &[u8] = b"\0latchkey/tenant-version";

/// Longest tenant name.
pub const MAX_NAME_CHARS: usize = 128;
/// Most prefixes one tenant owns.
pub const MAX_PREFIXES: usize = 64;
/// Longest prefix.
pub const MAX_PREFIX_BYTES: usize = 1024;

/// One tenant's settings, as stored.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TenantRecord {
    pub name: String,
    pub prefixes: Vec<Vec<u8>>,
    /// Most live keys under its prefixes; 0: no limit.
    #[serde(default)]
    pub max_keys: u64,
    /// Most bytes of live keys and values under its prefixes; 0: no limit.
    #[serde(default)]
    pub max_bytes: u64,
    /// Requests per second naming its keys, across all proxies; 0: no
    /// limit. Enforced at the proxies (each its share), not the cell.
    #[serde(default)]
    pub requests_per_second: u64,
    /// Requests per second naming its keys by one user; 0: no limit.
    #[serde(default)]
    pub user_requests_per_second: u64,
    /// Most client watches on its keys open at once through the proxies
    /// (each its share); 0: no limit.
    #[serde(default)]
    pub max_watches: u64,
}

/// The key of tenant `name`'s record.
pub fn record_key(name: &str) -> Vec<u8> {
    [TENANT_PREFIX, name.as_bytes()].concat()
}

/// Whether `key` is a tenant's record (a change to one changes who owns
/// what).
pub fn is_record(key: &[u8]) -> bool {
    key.starts_with(TENANT_PREFIX)
}

impl TenantRecord {
    pub fn decode(value: &[u8]) -> Result<TenantRecord, serde_json::Error> {
        serde_json::from_slice(value)
    }

    pub fn encode(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("a tenant record serialises")
    }

    /// Whether `key` is under one of its prefixes.
    pub fn owns(&self, key: &[u8]) -> bool {
        self.prefixes.iter().any(|p| key.starts_with(p))
    }

    pub fn from_pb(t: tenants_pb::Tenant) -> TenantRecord {
        TenantRecord {
            name: t.name,
            prefixes: t.prefixes,
            max_keys: t.max_keys,
            max_bytes: t.max_bytes,
            requests_per_second: t.requests_per_second,
            user_requests_per_second: t.user_requests_per_second,
            max_watches: t.max_watches,
        }
    }

    pub fn to_pb(&self) -> tenants_pb::Tenant {
        tenants_pb::Tenant {
            name: self.name.clone(),
            prefixes: self.prefixes.clone(),
            max_keys: self.max_keys,
            max_bytes: self.max_bytes,
            requests_per_second: self.requests_per_second,
            user_requests_per_second: self.user_requests_per_second,
            max_watches: self.max_watches,
        }
    }
}

/// Refuses a name that is empty, too long, or not visible ASCII without
/// `/`.
pub fn check_name(name: &str) -> Result<(), ApiError> {
    if name.is_empty() || name.len() > MAX_NAME_CHARS {
        return Err(ApiError::invalid(format!(
            "a tenant's name has 1 to {MAX_NAME_CHARS} characters"
        )));
    }
    if !name.bytes().all(|b| b.is_ascii_graphic() && b != b'/') {
        return Err(ApiError::invalid(format!(
            "tenant name {:?}: visible ASCII characters only, without '/'",
            name.escape_debug().to_string()
        )));
    }
    Ok(())
}

/// Whether one of two prefixes is a prefix of the other: some key would
/// be under both.
fn overlap(a: &[u8], b: &[u8]) -> bool {
    a.starts_with(b) || b.starts_with(a)
}

fn show(prefix: &[u8]) -> String {
    prefix.escape_ascii().to_string()
}

/// Refuses `record` unless its name and prefixes are well formed and no
/// prefix overlaps another of its own, latchkey's reserved prefix, or one
/// of `others` (the other tenants; a record of the same name is the one
/// it replaces and is skipped).
pub fn check(record: &TenantRecord, others: &[TenantRecord]) -> Result<(), ApiError> {
    check_name(&record.name)?;
    if record.prefixes.is_empty() || record.prefixes.len() > MAX_PREFIXES {
        return Err(ApiError::invalid(format!(
            "tenant {}: give 1 to {MAX_PREFIXES} key prefixes",
            record.name
        )));
    }
    for (i, p) in record.prefixes.iter().enumerate() {
        if p.is_empty() || p.len() > MAX_PREFIX_BYTES {
            return Err(ApiError::invalid(format!(
                "tenant {}: a prefix has 1 to {MAX_PREFIX_BYTES} bytes",
                record.name
            )));
        }
        if overlap(p, RESERVED_PREFIX) {
            return Err(ApiError::invalid(format!(
                "tenant {}: prefix {:?} overlaps latchkey's reserved {:?}",
                record.name,
                show(p),
                show(RESERVED_PREFIX)
            )));
        }
        if let Some(q) = record.prefixes[..i].iter().find(|q| overlap(p, q)) {
            return Err(ApiError::invalid(format!(
                "tenant {}: prefixes {:?} and {:?} overlap; give the shorter only",
                record.name,
                show(q),
                show(p)
            )));
        }
        for other in others.iter().filter(|o| o.name != record.name) {
            if let Some(q) = other.prefixes.iter().find(|q| overlap(p, q)) {
                return Err(ApiError::invalid(format!(
                    "tenant {}: prefix {:?} overlaps {:?} of tenant {}; a key has one owner",
                    record.name,
                    show(p),
                    show(q),
                    other.name
                )));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tenant(name: &str, prefixes: &[&str]) -> TenantRecord {
        TenantRecord {
            name: name.into(),
            prefixes: prefixes.iter().map(|p| p.as_bytes().to_vec()).collect(),
            max_keys: 10,
            ..TenantRecord::default()
        }
    }

    #[test]
    fn prefixes_have_one_owner_and_stay_out_of_latchkeys_own() {
        let acme = tenant("acme", &["acme/", "shared/acme/"]);
        let others = [acme.clone()];
        assert!(check(&tenant("globex", &["globex/"]), &others).is_ok());
        // Replacing acme's own record is not an overlap with itself.
        assert!(check(&tenant("acme", &["acme/", "acme2/"]), &others).is_ok());
        for (bad, why) in [
            (tenant("globex", &["acme/x/"]), "overlaps"),
            (tenant("globex", &["shared/"]), "overlaps"),
            (tenant("globex", &["g/", "g/sub/"]), "overlap"),
            (tenant("globex", &["\0"]), "reserved"),
            (tenant("globex", &["\0latchkey/x"]), "reserved"),
            (tenant("globex", &[""]), "1 to"),
            (tenant("globex", &[]), "1 to"),
            (tenant("", &["x/"]), "1 to"),
            (tenant("a/b", &["x/"]), "without '/'"),
            (tenant("a b", &["x/"]), "visible ASCII"),
        ] {
            let e = check(&bad, &others).expect_err(why);
            assert!(e.message.contains(why), "{why}: {}", e.message);
        }
    }

    #[test]
    fn a_record_round_trips_and_knows_its_keys() {
        let acme = tenant("acme", &["acme/"]);
        assert_eq!(TenantRecord::decode(&acme.encode()).unwrap(), acme);
        assert_eq!(TenantRecord::from_pb(acme.to_pb()), acme);
        assert!(acme.owns(b"acme/1"));
        assert!(!acme.owns(b"acm"));
        assert!(is_record(&record_key("acme")));
        assert!(crate::key_range::is_reserved(&record_key("acme")));
        assert!(crate::key_range::is_reserved(VERSION_KEY));
    }
}
