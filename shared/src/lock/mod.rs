//! The lock and election recipes (DESIGN section 5), ONE implementation
//! served by the cell and by the proxy, as etcd's v3lock and v3election
//! servers wrap their client recipes: each side gives them a
//! [`LockBackend`] (its way to run a txn, a range, a delete and to wait
//! for a change) and serves etcd's gRPC services with [`service`].
//!
//! - [`backend`]: [`LockBackend`], the operations the recipes need.
//! - [`queue`]: the queue both stand in: keys `name/<lease hex>` bound to
//!   their sessions, first by create revision, each waiter woken by its
//!   predecessor's departure only.
//! - [`mutex`]: [`mutex::acquire`] / [`mutex::release`]; the holder's
//!   create revision is its fencing token.
//! - [`delay`]: lock-delay (Chubby's): after a holder's session expires,
//!   the lock waits before its next grant.
//! - [`election`]: campaign, proclaim, resign, leader, changes.
//! - [`fenced`]: [`FencedResource`], what a protected resource keeps: the
//!   highest token accepted, so a stale holder's write is refused.
//! - [`audit`]: force-release of a stuck lock with its audit record,
//!   both in one txn.
//! - [`service`]: [`LockService`] (`v3lockpb.Lock`) and
//!   [`ElectionService`] (`v3electionpb.Election`) over any backend.

pub mod audit;
pub mod backend;
pub mod delay;
pub mod election;
pub mod fenced;
pub mod mutex;
pub mod queue;
pub mod service;

pub use backend::{Access, LockBackend, Revoked};
pub use fenced::{FencedResource, StaleToken};
pub use mutex::{acquire, release, Grant};
pub use service::{ElectionService, LockService};
