//! Watches through the proxy (DESIGN section 4; issue 12, in progress).
//!
//! - [`shared_watch`]: [`SharedWatch`], one upstream watch and every
//!   client watch on it: history for late joiners, bounded queues, slow
//!   subscribers dropped.
//! - [`watch_key`]: [`WatchKey`], what makes two client watches one.
//! - [`upstream_answer`]: what an upstream `WatchResponse` says (created,
//!   revisions grouped, progress, compacted, cancelled).
//! - [`member_stream`]: [`member_stream::MemberStream`], ONE upstream
//!   Watch stream per member carrying many watches.
//! - [`fanout`]: each subscriber's fixed offset inside `--fanout-jitter`
//!   and the delivery that waits for it.
//!
//! - [`coalescer`]: [`coalescer::Coalescer`], one shared watch per
//!   [`WatchKey`] on a member stream, resumed on another member when that
//!   stream fails.
//!
//! Still to come: the catch-up path for joiners older than the history,
//! the per-client delivery tasks, and the gRPC and SSE front ends on top.

pub mod coalescer;
pub mod fanout;
pub mod member_stream;
pub mod shared_watch;
pub mod upstream_answer;
pub mod watch_key;

pub use shared_watch::{Cancel, Item, Join, Revision, SharedWatch};
pub use watch_key::WatchKey;
