//! The MVCC keyspace ([`keyspace`]) and etcd's KV operations over it
//! ([`txn`]): range, put, delete, txn and compaction, all deterministic.

pub mod keyspace;
pub mod txn;
