//! # latchkey-shared
//!
//! What every latchkey binary agrees on.
//!
//! ## Layout
//! Protocols (generated):
//! - [`etcdpb`]: the etcd v3 protocol (messages and server traits), generated
//!   by the `etcd-client` crate from etcd's own protos.
//! - [`peer`]: latchkey's internal cell-to-cell service (Raft messages and
//!   forwarded requests), generated from `proto/peer.proto`.
//! - [`sessions_pb`]: the batched lease refresh service, from
//!   `proto/sessions.proto` (a latchkey extension, not etcd's API).
//! - [`tenants_pb`]: the tenants service, from `proto/tenants.proto`.
//! - [`proxy_auth_pb`]: a proxy's permission rechecks, from
//!   `proto/proxy_auth.proto`.
//! - [`moves_pb`]: what a proxy asks of a cell it moves a prefix into,
//!   from `proto/moves.proto`.
//!
//! The nouns every tier speaks, one per file:
//! - [`lease_id`] ([`LeaseId`], shown in hex), [`member_id`] ([`MemberId`],
//!   hex), [`revision`] ([`Revision`]);
//! - [`key_range`]: [`KeyRange`], etcd's `key`/`range_end` rules, shared
//!   by the cell's keyspace and the proxy's watch coalescing and read cache;
//! - [`etcd_enums`]: etcd's sort, compare, filter and event values, named
//!   once, decoded from their `i32` fields;
//! - [`etcd_methods`]: every etcd gRPC method path, named once.
//!
//! Errors: [`error`] is the one error model. A failure becomes an
//! [`ApiError`] where it happens (a named constructor per code, with a
//! [`Detail`] the caller needs); `error/code.rs` is THE table from
//! [`ErrorCode`] to HTTP status, gRPC code, etcd text and [`Retry`] class;
//! `error/grpc.rs` turns an `ApiError` into a `tonic::Status` and back, and
//! [`classify_call_failure`] decides from a failed call's error chain
//! whether the request can have left this process. The peer wire carries
//! `ApiError` in bincode, encoded by name.
//!
//! Clients and processes:
//! - [`client`]: the Rust client of a cell: the one channel builder, the
//!   batched refresh stream, etcd's keep-alive stream carrying many leases,
//!   and [`client::Session`] (one lease kept alive, its state as
//!   Alive / Jeopardy / Expired).
//! - [`lifecycle`]: a shutdown signal and the tasks that obey it.
//! - [`telemetry`]: logs, the metrics recorder and signals, installed once
//!   per process by a binary's `main`.
//! - [`metrics_catalog`]: what a catalogued metric is (name, type, unit,
//!   HELP text), the one `describe_all`, and the lock recipe's metrics; the
//!   cell's and the proxy's catalogs are their own `metrics_catalog`.
//! - [`limits`]: default limits shared by cells and proxies.
//! - [`tls`]: TLS on every listener (reloaded from its files while
//!   running) and every connection; every server takes its connections
//!   from [`tls::Incoming`] (with `TCP_NODELAY`, plain or TLS).
//! - [`reserved`]: the keys latchkey keeps for itself, which clients may
//!   read and never write (except the auth records, which they do not
//!   read either).
//! - [`auth`]: users, roles and permissions (etcd's model), signed
//!   tokens, password hashes, and the check each operation makes.
//! - [`tenant`]: tenants' records (prefixes, quotas) and their checks.
//! - [`idempotency`]: retry-safe writes (a record committed in the same
//!   txn as the write it guards).
//! - [`lock`]: the lock recipe (fair FIFO queue, fencing tokens) over a
//!   [`lock::LockBackend`], served by the cell and the proxy alike.
//! - [`range_select`]: which key-values an etcd Range returns (filters,
//!   sort, limit, count), for the cell's keyspace and the proxy's cache.

pub mod auth;
pub mod client;
pub mod directory;
pub mod error;
pub mod etcd_enums;
pub mod etcd_methods;
pub mod idempotency;
pub mod key_range;
pub mod lease_id;
pub mod lifecycle;
pub mod limits;
pub mod lock;
pub mod member_id;
pub mod metrics_catalog;
pub mod range_select;
pub mod reserved;
pub mod revision;
pub mod telemetry;
pub mod tenant;
pub mod tls;
pub mod txn_op;

/// The etcd v3 protocol types and server traits.
pub use etcd_client::proto as etcdpb;

/// latchkey's internal cell-to-cell gRPC service.
pub mod peer {
    tonic::include_proto!("latchkey.peer.v1");
}

/// etcd's v3 lock service (`v3lockpb.Lock`), from latchkey's own proto.
pub mod v3lockpb {
    tonic::include_proto!("v3lockpb");
}

/// etcd's v3 election service (`v3electionpb.Election`), from latchkey's
/// own proto.
pub mod v3electionpb {
    tonic::include_proto!("v3electionpb");
}

/// etcd's v3 Auth service (`etcdserverpb.Auth`) and its authpb messages,
/// from latchkey's own proto.
pub mod auth_pb {
    tonic::include_proto!("etcdserverpb");
}

/// etcd's `authpb` messages the Auth service carries.
pub mod authpb {
    tonic::include_proto!("authpb");
}

/// latchkey's tenants service (prefixes and quotas).
pub mod tenants_pb {
    tonic::include_proto!("latchkey.tenants.v1");
}

/// What a proxy asks a cell about its clients' permissions (watch
/// rechecks), from `proto/proxy_auth.proto`.
pub mod proxy_auth_pb {
    tonic::include_proto!("latchkey.proxyauth.v1");
}

/// What a proxy asks of a cell while it moves a prefix into it, from
/// `proto/moves.proto`.
pub mod moves_pb {
    tonic::include_proto!("latchkey.moves.v1");
}

/// latchkey's session extension service (batched lease refresh).
pub mod sessions_pb {
    tonic::include_proto!("latchkey.sessions.v1");
}

pub use error::{classify_call_failure, ApiError, Detail, ErrorCode, Retry};
pub use key_range::KeyRange;
pub use lease_id::LeaseId;
pub use member_id::MemberId;
pub use revision::Revision;
