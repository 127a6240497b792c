//! The MVCC keyspace ([`keyspace`]), the replicated lease table its
//! ephemeral keys are bound to ([`lease_table`]), and etcd's KV operations
//! over both ([`txn`]): range, put, delete, txn and compaction, all
//! deterministic.

pub mod keyspace;
pub mod lease_table;
pub mod txn;
