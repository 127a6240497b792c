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
//! - [`session`]: a client session: one lease kept alive, its state as
//!   Alive / Jeopardy / Expired.
//! - [`client`]: the Rust client of a cell, starting with the one channel
//!   builder.
//! - [`error`]: the one error table (code -> HTTP status, gRPC code, etcd text).
//! - [`limits`]: default limits shared by cells and proxies.

pub mod client;
pub mod error;
pub mod limits;
pub mod session;

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
