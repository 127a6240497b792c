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

/// Most leases one batched refresh may name. A cell refuses larger batches
/// (and ends the stream); a proxy with more sessions splits them. Twice the
/// 100 000 sessions a proxy is built for, so one batch per tick covers them.
pub const MAX_REFRESH_BATCH: usize = 200_000;

/// Largest refresh message either way, for the client and the cell alike:
/// a lease id or TTL takes at most 11 bytes on the wire (a 10-byte varint
/// and its share of the packed field's header), plus room for the other
/// fields.
pub const MAX_REFRESH_MESSAGE_BYTES: usize = MAX_REFRESH_BATCH * 11 + 1024;
