//! What the proxy does, in etcd's words, whichever face asked (as etcd's
//! `etcdserver` sits under its `v3rpc`): [`grpc`](crate::grpc) and
//! [`http`](crate::http) translate to and from these calls and never
//! import each other, so a check or a route added here is written once for
//! both APIs.
//!
//! Each operation takes the [`ProxyState`](crate::state::ProxyState) and
//! an etcd message and returns etcd's answer or an `ApiError`.
//!
//! - [`auth`]: the client's token, carried on calls made on its behalf,
//!   and the probes that ask the cell whether the client may do what the
//!   proxy is about to do for it with its own identity.
//! - [`directory`]: an operator's changes to the directory of cells (add
//!   a cell, assign a prefix), each cell told what it owns before the
//!   directory changes.
//! - [`prefix_move`]: a prefix moved online from its cell to another:
//!   copy, follow, fence, raise, switch.
//! - [`kv`]: ranges (read cache, client floors, member), puts, deletes,
//!   txns and compaction.
//! - [`lease`]: grant and revoke with the session table kept in step;
//!   time-to-live.
//! - [`idempotency`]: the guard of a request that names an
//!   `Idempotency-Key`, written with the proxy's retention lease.
//! - [`locks`]: the lock and election recipes' backend over the cell
//!   client and coalesced watches.
//! - [`rates`]: a request charged to its key's tenant's request rates.

pub mod auth;
pub mod directory;
pub mod idempotency;
pub mod kv;
pub mod lease;
pub mod locks;
pub mod prefix_move;
pub mod rates;
