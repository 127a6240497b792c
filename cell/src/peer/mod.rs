//! Member-to-member requests other than Raft's own.
//!
//! - [`protocol`]: what a follower forwards to the leader and the reply.
//! - [`client`]: finds the leader and forwards to it over cached channels,
//!   classifying each failure by whether the request may have arrived.
//! - [`server`]: the peer gRPC service: Raft RPCs to openraft, forwarded
//!   requests to the [`protocol::ForwardHandler`].

pub mod client;
pub mod protocol;
pub mod server;
