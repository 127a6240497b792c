//! # latchkey-cell
//!
//! One member of a cell: a Raft-replicated MVCC store that speaks the etcd
//! v3 API.
//!
//! ## Layout
//! - [`config`]: flags and their `LATCHKEY_*` environment fallbacks.
//! - [`startup`]: opens storage, starts Raft, the servers and background tasks.
//! - [`raft`]: openraft types, the RocksDB log store, the peer network.
//! - [`storage`]: the data directory; every RocksDB key encoding in `keys.rs`.
//! - [`state_machine`]: what the log carries and the deterministic apply.
//! - [`mvcc`]: the multi-version keyspace and etcd's KV operations on it.
//! - [`lease`]: the replicated lease table and the leader's lessor.
//! - [`membership`]: member add/promote/remove/update and leader transfer.
//! - [`node`]: where each request is served (leader, forwarding, read index).
//! - [`watch`]: the hub applied changes are published to, and watch streams.
//! - [`api`]: the etcd gRPC services, one file each.
//! - [`auto_compaction`]: the leader compacts history by retention.
//! - [`admin`]: `/metrics`, `/healthz`, `/readyz`.
//!
//! ## Data flow
//! A write arrives at [`api`], goes to [`node::CellNode::write`], which
//! proposes it on the leader (forwarding from a follower). openraft appends
//! it to the [`raft::log_store`] (fsynced, group-committed), replicates it,
//! and once a quorum holds it, [`state_machine::store`] applies it to the
//! [`state_machine::CellState`]; the applied [`state_machine::command::Response`]
//! travels back to the handler. A linearizable read asks the leader for its
//! read index, waits until the local state has applied it, and reads locally.

pub mod admin;
pub mod api;
pub mod auto_compaction;
pub mod config;
pub mod lease;
pub mod membership;
pub mod mvcc;
pub mod node;
pub mod raft;
pub mod startup;
pub mod state_machine;
pub mod storage;
pub mod watch;
