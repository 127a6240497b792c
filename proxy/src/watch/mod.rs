//! Watches through the proxy (DESIGN section 4).
//!
//! - [`cell_coalescers`]: one coalescer per cell; a client watch joins
//!   the one of the cell that owns its range.
//! - [`coalescer`]: [`coalescer::Coalescer`], one shared watch per
//!   [`WatchKey`] on a member stream, resumed on another member when that
//!   stream fails; `Coalescer::subscribe` serves a start older than the
//!   history from a private upstream watch until it meets the shared one.
//! - [`shared_watch`]: [`SharedWatch`], one upstream watch and every
//!   client watch on it: history for late joiners (revisions and bytes
//!   bounded), a bounded queue per client ([`subscriber_queue`]:
//!   `--watch-buffer` revisions, `--watch-buffer-bytes`), slow subscribers
//!   dropped.
//! - [`pump`]: [`pump::Pump`], the task that feeds one shared watch from
//!   its upstream watch and resumes it elsewhere.
//! - [`upstream_watches`]: [`upstream_watches::UpstreamWatches`], the
//!   member streams and the creation of an upstream watch on a member
//!   that is up (shared, catch-up and resumed watches alike).
//! - [`member_stream`]: [`member_stream::MemberStream`], ONE upstream
//!   Watch stream to a member carrying many watches (several per member
//!   past `upstream_watches::WATCHES_PER_STREAM`).
//! - [`upstream_answer`]: what an upstream `WatchResponse` says (created,
//!   revisions grouped, progress, compacted, cancelled).
//! - [`watch_key`]: [`WatchKey`], what makes two client watches one.
//! - [`client_watches`]: [`client_watches::ClientWatches`], the limits on
//!   client watches per proxy and per gRPC stream.
//! - [`read_permits`]: [`read_permits::ReadPermits`], the user and range
//!   each client watch reads for, checked with the cell again when its
//!   auth records change; a revoked one cancels its watch.
//! - [`fanout`]: each client watch's fixed offset inside
//!   `--fanout-jitter`, and [`fanout::Paced`], its items handed out when
//!   they are due.
//!
//! Data flows: member stream -> pump -> shared watch -> one queue per
//! client watch (a `coalescer::Subscription`) -> `Paced` -> the client's
//! gRPC stream (`grpc/watch.rs`)
//! or SSE stream (`http/watch_sse.rs`). The read cache (`cache/`)
//! subscribes like any client.

pub mod cell_coalescers;
pub mod client_watches;
pub mod coalescer;
pub mod fanout;
pub mod member_stream;
pub mod pump;
pub mod read_permits;
pub mod shared_watch;
pub mod subscriber_queue;
#[cfg(test)]
mod test_cell;
pub mod upstream_answer;
pub mod upstream_watches;
pub mod watch_key;

pub use shared_watch::{Cancel, Item, Join, Revision, SharedWatch};
pub use watch_key::WatchKey;
