//! The MVCC keyspace ([`keyspace`]) with each key's [`versions`], its
//! snapshot form ([`image`]) and its history read in revision order
//! ([`history`]), the replicated lease table its
//! ephemeral keys are bound to ([`lease_table`]), and etcd's KV operations
//! over both: [`range`] (reads) and [`txn`] (put, delete, txn), all
//! deterministic.

pub mod history;
pub mod image;
pub mod keyspace;
pub mod lease_table;
pub mod range;
pub mod txn;
pub mod versions;
