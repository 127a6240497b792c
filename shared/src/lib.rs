//! # latchkey-shared
//!
//! What every latchkey binary agrees on.
//!
//! ## Layout
//! - [`etcdpb`]: the etcd v3 protocol (messages and server traits), generated
//!   by the `etcd-client` crate from etcd's own protos.
//! - [`peer`]: latchkey's internal cell-to-cell service (Raft messages and
//!   forwarded requests), generated from `proto/peer.proto`.
//! - [`sessions_pb`]: the batched lease refresh service, from
//!   `proto/sessions.proto` (a latchkey extension, not etcd's API).
//! - [`client`]: the Rust client of a cell: the one channel builder, the
//!   batched refresh stream, etcd's keep-alive stream carrying many leases,
//!   and [`client::Session`] (one lease kept alive, its state as
//!   Alive / Jeopardy / Expired). [`session`] is the session's older path.
//! - [`error`]: the one error table (code -> HTTP status, gRPC code, etcd text).
//! - [`limits`]: default limits shared by cells and proxies.

pub mod client;
pub mod error;
pub mod limits;

/// The session's path before the client had a module of its own; the
/// same items as [`client::session`].
pub use client::session;

/// The etcd v3 protocol types and server traits.
pub use etcd_client::proto as etcdpb;

/// latchkey's internal cell-to-cell gRPC service.
pub mod peer {
    tonic::include_proto!("latchkey.peer.v1");
}

/// latchkey's session extension service (batched lease refresh).
pub mod sessions_pb {
    tonic::include_proto!("latchkey.sessions.v1");
}

pub use error::{ApiError, ErrorCode};
