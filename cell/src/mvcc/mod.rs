//! The MVCC keyspace ([`keyspace`]) with each key's [`versions`], its
//! snapshot form ([`image`]) and its history read in revision order
//! ([`history`]), the replicated lease table its
//! ephemeral keys are bound to ([`lease_table`]), what each tenant's keys
//! use ([`tenants`]), and etcd's KV operations over them: [`range`]
//! (reads) and [`txn`] (put, delete, txn; refused whole past a tenant's
//! quota), all deterministic.

pub mod history;
pub mod image;
pub mod keyspace;
pub mod lease_table;
pub mod range;
pub mod tenants;
pub mod txn;
pub mod versions;
