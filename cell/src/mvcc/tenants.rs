//! [`TenantBook`]: which tenant owns a key, and what each tenant's live
//! keys use now (keys, and bytes of keys and values), kept by the keyspace
//! on every put and delete and built again from the keyspace when a
//! tenant's record changes or a snapshot is loaded. Derived state: never in
//! a snapshot, the same on every member because every member applies the
//! same writes.
//!
//! A write is checked against it before anything runs ([`Deltas`],
//! [`TenantBook::check`]): a write that would take a tenant past a quota is
//! refused whole with `quota_exceeded`, and one that lowers a tenant's use
//! always passes, even past a quota lowered below what it already uses.

use imbl::OrdMap;
use latchkey_shared::tenant::TenantRecord;
use latchkey_shared::ApiError;
use std::collections::BTreeMap;
use std::sync::Arc;

/// What a tenant's live keys use.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    pub keys: u64,
    pub bytes: u64,
}

/// One tenant: its record and its use.
#[derive(Debug, Clone)]
pub struct Owned {
    pub record: Arc<TenantRecord>,
    pub usage: Usage,
}

#[derive(Debug, Clone, Default)]
pub struct TenantBook {
    tenants: OrdMap<String, Owned>,
    /// Every tenant's prefixes with its name, sorted. Prefixes never
    /// overlap, so a key's owner is the one of the last prefix not after
    /// the key, if the key starts with it.
    prefixes: Arc<Vec<(Vec<u8>, String)>>,
}

/// What one write changes, per tenant.
#[derive(Debug, Default)]
pub struct Deltas(BTreeMap<String, (i64, i64)>);

/// The bytes a live key counts for.
pub fn live_bytes(key: &[u8], value_len: usize) -> u64 {
    (key.len() + value_len) as u64
}

impl TenantBook {
    /// The book for `records` (tenants' records), with no use counted yet:
    /// the keyspace counts its live keys into it with [`Self::on_put`].
    pub fn new(records: impl IntoIterator<Item = TenantRecord>) -> TenantBook {
        let mut tenants = OrdMap::new();
        let mut prefixes = Vec::new();
        for record in records {
            prefixes.extend(
                record
                    .prefixes
                    .iter()
                    .map(|p| (p.clone(), record.name.clone())),
            );
            tenants.insert(
                record.name.clone(),
                Owned {
                    record: Arc::new(record),
                    usage: Usage::default(),
                },
            );
        }
        prefixes.sort();
        TenantBook {
            tenants,
            prefixes: Arc::new(prefixes),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.prefixes.is_empty()
    }

    /// Every tenant's prefixes (for counting their keys).
    pub fn all_prefixes(&self) -> Vec<Vec<u8>> {
        self.prefixes.iter().map(|(p, _)| p.clone()).collect()
    }

    /// The tenant owning `key`, if any.
    pub fn owner(&self, key: &[u8]) -> Option<&str> {
        if self.prefixes.is_empty() {
            return None;
        }
        let after = self.prefixes.partition_point(|(p, _)| p.as_slice() <= key);
        let (prefix, name) = self.prefixes.get(after.checked_sub(1)?)?;
        key.starts_with(prefix).then_some(name.as_str())
    }

    fn usage_mut(&mut self, key: &[u8]) -> Option<&mut Usage> {
        let name = self.owner(key)?.to_string();
        self.tenants.get_mut(&name).map(|o| &mut o.usage)
    }

    /// `key` written with a value of `new_len` bytes; `old_len` is the
    /// length of the value it replaced, if it was live.
    pub fn on_put(&mut self, key: &[u8], old_len: Option<usize>, new_len: usize) {
        if let Some(usage) = self.usage_mut(key) {
            if let Some(old) = old_len {
                usage.bytes = usage.bytes.saturating_sub(live_bytes(key, old));
            } else {
                usage.keys += 1;
            }
            usage.bytes += live_bytes(key, new_len);
        }
    }

    /// Live `key` with a value of `old_len` bytes deleted.
    pub fn on_delete(&mut self, key: &[u8], old_len: usize) {
        if let Some(usage) = self.usage_mut(key) {
            usage.keys = usage.keys.saturating_sub(1);
            usage.bytes = usage.bytes.saturating_sub(live_bytes(key, old_len));
        }
    }

    pub fn get(&self, name: &str) -> Option<&Owned> {
        self.tenants.get(name)
    }

    pub fn iter(&self) -> impl Iterator<Item = &Owned> {
        self.tenants.values()
    }

    /// Refuses `deltas` if they take a tenant past one of its quotas
    /// (only a quota a delta raises use towards).
    pub fn check(&self, deltas: &Deltas) -> Result<(), ApiError> {
        for (name, &(keys, bytes)) in &deltas.0 {
            let Some(owned) = self.tenants.get(name) else {
                continue;
            };
            let (record, usage) = (&owned.record, owned.usage);
            let over = |used: u64, delta: i64, max: u64| {
                max != 0 && delta > 0 && used.saturating_add(delta as u64) > max
            };
            if over(usage.keys, keys, record.max_keys) {
                return Err(ApiError::quota_exceeded(format!(
                    "tenant {name} holds {} of its {} keys; this write adds {keys}",
                    usage.keys, record.max_keys
                )));
            }
            if over(usage.bytes, bytes, record.max_bytes) {
                return Err(ApiError::quota_exceeded(format!(
                    "tenant {name} holds {} of its {} bytes; this write adds {bytes}",
                    usage.bytes, record.max_bytes
                )));
            }
        }
        Ok(())
    }
}

impl Deltas {
    /// A put of `key` (value `new_len` bytes) over a live value of
    /// `old_len` bytes, if any, in `book`.
    pub fn put(&mut self, book: &TenantBook, key: &[u8], old_len: Option<usize>, new_len: usize) {
        if let Some(name) = book.owner(key) {
            let d = self.0.entry(name.to_string()).or_default();
            match old_len {
                Some(old) => d.1 -= live_bytes(key, old) as i64,
                None => d.0 += 1,
            }
            d.1 += live_bytes(key, new_len) as i64;
        }
    }

    /// A delete of live `key` with a value of `old_len` bytes.
    pub fn delete(&mut self, book: &TenantBook, key: &[u8], old_len: usize) {
        if let Some(name) = book.owner(key) {
            let d = self.0.entry(name.to_string()).or_default();
            d.0 -= 1;
            d.1 -= live_bytes(key, old_len) as i64;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use latchkey_shared::ErrorCode;

    fn tenant(name: &str, prefixes: &[&str], max_keys: u64, max_bytes: u64) -> TenantRecord {
        TenantRecord {
            name: name.into(),
            prefixes: prefixes.iter().map(|p| p.as_bytes().to_vec()).collect(),
            max_keys,
            max_bytes,
            ..TenantRecord::default()
        }
    }

    #[test]
    fn a_key_belongs_to_the_tenant_whose_prefix_it_starts_with() {
        let book = TenantBook::new([
            tenant("acme", &["acme/", "z/acme"], 0, 0),
            tenant("globex", &["globex/"], 0, 0),
        ]);
        assert_eq!(book.owner(b"acme/1"), Some("acme"));
        assert_eq!(book.owner(b"acme/"), Some("acme"));
        assert_eq!(book.owner(b"z/acme-2"), Some("acme"));
        assert_eq!(book.owner(b"globex/x"), Some("globex"));
        for nobody in [&b"acme"[..], b"a", b"b", b"globex", b"zz", b""] {
            assert_eq!(book.owner(nobody), None, "{nobody:?}");
        }
        assert_eq!(TenantBook::default().owner(b"acme/1"), None);
    }

    #[test]
    fn use_follows_puts_and_deletes_and_quotas_refuse_only_growth() {
        let mut book = TenantBook::new([tenant("acme", &["a/"], 2, 100)]);
        book.on_put(b"a/1", None, 10);
        book.on_put(b"a/1", Some(10), 20);
        book.on_put(b"b/1", None, 1000);
        assert_eq!(
            book.get("acme").unwrap().usage,
            Usage { keys: 1, bytes: 23 }
        );
        let mut second = Deltas::default();
        second.put(&book, b"a/2", None, 10);
        assert!(book.check(&second).is_ok());
        book.on_put(b"a/2", None, 10);
        // A third key is past max_keys; replacing one is not.
        let mut third = Deltas::default();
        third.put(&book, b"a/3", None, 1);
        let e = book.check(&third).expect_err("a third key");
        assert_eq!(e.code, ErrorCode::QuotaExceeded);
        assert!(
            e.message.contains("tenant acme holds 2 of its 2 keys"),
            "{}",
            e.message
        );
        let mut swap = Deltas::default();
        swap.delete(&book, b"a/2", 10);
        swap.put(&book, b"a/3", None, 1);
        assert!(book.check(&swap).is_ok(), "one out, one in");
        // Bytes: 36 used of 100.
        let mut big = Deltas::default();
        big.put(&book, b"a/1", Some(20), 90);
        let e = book.check(&big).expect_err("past max_bytes");
        assert!(e.message.contains("bytes"), "{}", e.message);
        // Over a quota lowered below use, shrinking still passes.
        let mut lowered = TenantBook::new([tenant("acme", &["a/"], 1, 10)]);
        lowered.on_put(b"a/1", None, 20);
        lowered.on_put(b"a/2", None, 10);
        let mut shrink = Deltas::default();
        shrink.put(&lowered, b"a/1", Some(20), 1);
        assert!(lowered.check(&shrink).is_ok());
        book.on_delete(b"a/1", 20);
        assert_eq!(
            book.get("acme").unwrap().usage,
            Usage { keys: 1, bytes: 13 }
        );
    }
}
