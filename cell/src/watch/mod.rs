//! Watches: committed changes streamed to clients from any revision still
//! in history.
//!
//! - `crate::state_machine::watch_hub`: where the state machine publishes
//!   each revision's changes; a bounded broadcast ring, so publishing never
//!   waits for a watcher.
//! - [`stream`]: one client watch stream and its many watches: catch-up
//!   from history, live delivery, lag recovery, progress notifications.
//! - [`outbound`]: its queue of responses to the client, bounded in bytes.
//! - `watch_set`: a stream's watches, those of a single key indexed by it,
//!   so a change is matched only against the watches that can want it.
//!
//! A watcher that falls behind the ring (a slow client, or a snapshot
//! installed under it) is moved back to catch-up from history, like etcd's
//! unsynced watchers; if the revisions it still needs were compacted it is
//! cancelled with the compact revision.

pub mod outbound;
pub mod stream;
mod watch_set;
