//! # latchkey-cell
//!
//! One member of a cell: a Raft-replicated MVCC store that speaks the etcd
//! v3 API, as a library ([`cell::Cell::start`] returns a handle that owns
//! everything it started) and a binary (`main.rs`).
//!
//! ## Layers
//! Each module imports only modules on lower layers (and `latchkey_shared`):
//!
//! 1. [`storage`] (the data directory: key encodings, the disk and peer
//!    codec), [`ids`] (cell and member ids), [`config`] (flags),
//!    [`batching`] (group commit's queue), [`metrics_catalog`] (every
//!    metric the cell records, named and described once).
//! 2. [`mvcc`]: the multi-version keyspace, the replicated lease table and
//!    etcd's KV operations over them; pure.
//! 3. [`raft`]: openraft's types, the log command, the RocksDB log store,
//!    the peer network, the read index and the openraft error map.
//! 4. [`state_machine`]: the deterministic apply, openraft's state machine
//!    adapter, snapshots and the watch hub apply publishes to.
//! 5. [`lease`]: the leader's lessor, the task that drives it, and the
//!    lease requests only the leader answers.
//! 6. [`peer`]: what members forward to the leader; client and server.
//! 7. [`membership`]: member add/promote/remove/update, leader transfer,
//!    `--join` discovery.
//! 8. [`node`]: a running member and where each request is served.
//! 9. [`jobs`] (auto-compaction, member publication), [`watch`] (client
//!    watch streams) and [`ops`] (the KV and lease operations and the lock
//!    recipes' backend, in etcd's words), which act through the node.
//! 10. [`api`] (the etcd gRPC services: faces that translate to [`ops`])
//!     and [`admin`] (`/metrics`, `/healthz`, `/readyz`).
//! 11. [`cell`]: starting and stopping a member.
//!
//! ## Data flow
//! A write arrives at [`api`], which calls [`ops`]; it goes to
//! [`node::CellNode::write`], which
//! proposes it on the leader (forwarding from a follower through [`peer`],
//! concurrent writes in one message); the leader's [`raft::proposer`] puts
//! concurrent writes into one log entry (group commit). openraft appends it
//! to the [`raft::log_store`] (fsynced), replicates it, and once a quorum holds it, [`state_machine::store`]
//! applies it to the [`state_machine::CellState`] and publishes its changes
//! to the watch hub; the applied [`raft::command::Response`] travels back to
//! the handler. A linearizable read asks the leader for its read index
//! (concurrent reads on a member share one request, and the leader's
//! reads share one quorum round), waits until the local state has applied
//! it, and reads locally.

pub mod admin;
pub mod api;
pub mod batching;
pub mod cell;
pub mod chaos;
pub mod config;
pub mod ids;
pub mod jobs;
pub mod lease;
pub mod membership;
pub mod metrics_catalog;
pub mod mvcc;
pub mod node;
pub mod ops;
pub mod peer;
pub mod raft;
pub mod state_machine;
pub mod storage;
pub mod watch;
