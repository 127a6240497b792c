//! Watches through the proxy (DESIGN section 4; issue 12, in progress).
//!
//! - [`shared_watch`]: [`SharedWatch`], one upstream watch and every
//!   client watch on it: history for late joiners, bounded queues, slow
//!   subscribers dropped.
//!
//! Still to come: the coalescer (one shared watch per key range, filters
//! and prev_kv, multiplexed on one upstream stream per member, resumed on
//! another member), the catch-up path for joiners older than the history,
//! jittered fan-out, and the gRPC and SSE front ends on top.

pub mod shared_watch;

pub use shared_watch::{Cancel, Item, Join, Revision, SharedWatch};
