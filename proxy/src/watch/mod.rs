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
//! - [`pump`]: [`pump::Pump`], the task that feeds one shared watch from
//!   its upstream watch and resumes it elsewhere.
//!
//!   `Coalescer::subscribe` serves a start older than the history from a
//!   private upstream watch until it meets the shared one.
//!
//! Still to come (issue 12): the per-client delivery tasks with the
//! fan-out offsets; the gRPC Watch and SSE front ends on the coalescer
//! (client watch ids, create/cancel/progress per client stream, cancel
//! reasons for slow clients); metrics of client vs upstream watches; the
//! serializable read cache fed by these watches; integration tests with
//! real member failures (resume without gap or duplicate) and the 10 000
//! watcher fan-out; the benchmark.

pub mod coalescer;
pub mod fanout;
pub mod member_stream;
pub mod pump;
pub mod shared_watch;
#[cfg(test)]
mod test_cell;
pub mod upstream_answer;
pub mod watch_key;

pub use shared_watch::{Cancel, Item, Join, Revision, SharedWatch};

/// Items queued on a client watch's own channel. It only relays what the
/// shared watch queued for the client (whose bound, `--watch-buffer`, is
/// what makes a client slow), so it is short.
pub const RELAY_QUEUE: usize = 16;
pub use watch_key::WatchKey;
