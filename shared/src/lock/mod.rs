//! The lock recipe (DESIGN section 5), ONE implementation served by the
//! cell and by the proxy, as etcd's v3lock server wraps its client
//! recipes: each side gives it a [`LockBackend`] (its way to run a txn, a
//! range, a delete and to wait for a key's deletion) and answers etcd's
//! `v3lockpb.Lock` service with it.
//!
//! - [`backend`]: [`LockBackend`], the operations the recipe needs.
//! - [`mutex`]: [`mutex::acquire`] and [`mutex::release`]: a fair FIFO
//!   queue of keys `name/<lease hex>` bound to their sessions; the lowest
//!   create revision holds and is the fencing token.
//! - [`service`]: [`LockService`], etcd's `v3lockpb.Lock` gRPC service
//!   over any backend.

pub mod backend;
pub mod mutex;
pub mod service;

pub use backend::LockBackend;
pub use mutex::{acquire, release, Grant};
pub use service::LockService;
