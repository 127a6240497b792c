//! Default limits. Every one is configurable on the command line.

/// Largest value a put may carry. Coordination data is small; etcd's
/// default request limit is 1.5 MiB, we keep values well under it.
pub const DEFAULT_MAX_VALUE_BYTES: usize = 64 * 1024;

/// Largest gRPC request a cell decodes (etcd's default, 1.5 MiB).
pub const DEFAULT_MAX_REQUEST_BYTES: usize = 3 * 512 * 1024;

/// Keyspace quota, counted as the bytes of every key and value version kept
/// in history (etcd's default backend quota is 2 GiB).
pub const DEFAULT_QUOTA_BYTES: u64 = 2 * 1024 * 1024 * 1024;

/// Shortest lease TTL a cell grants. Below a few election timeouts a lease
/// could expire during an ordinary leader change.
pub const DEFAULT_MIN_TTL_SECS: i64 = 2;

/// Longest lease TTL (etcd's MaxLeaseTTL).
pub const MAX_TTL_SECS: i64 = 9_000_000_000;

/// Most operations in one transaction (etcd's default --max-txn-ops).
pub const MAX_TXN_OPS: usize = 128;
